// Reads a fuzz input as a stream of small decisions. Past the end every read returns 0, so
// any byte string decodes to some valid sequence of operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fastformer::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  // A value in [lo, hi] from one byte (uniform enough for fuzzing).
  int64_t range(int64_t lo, int64_t hi) { return lo + byte() % (hi - lo + 1); }

  // Whatever is left, as bytes.
  std::string_view rest() {
    std::string_view out(reinterpret_cast<const char*>(data_ + pos_),
                         pos_ < size_ ? size_ - pos_ : 0);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Stops the process when a checked invariant fails: libFuzzer records the input as a crash.
[[noreturn]] void invariant_failed(const char* file, int line, const char* what);

}  // namespace fastformer::fuzz

#define FUZZ_CHECK(cond) \
  ((cond) ? (void)0 : ::fastformer::fuzz::invariant_failed(__FILE__, __LINE__, #cond))
