#include "server/cmd/test_faults.h"

#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "server/engine/error.h"

namespace fastformer {
namespace {

template <typename T>
T parse_number(std::string_view text, std::string_view entry) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    throw std::invalid_argument("bad number '" + std::string(text) + "' in '" + std::string(entry) +
                                "'");
  }
  return value;
}

// Does `batch` hold a sequence whose first token id is `token`?
bool holds_first_token(const batching::Batch& batch, int32_t token) {
  for (const batching::QueueEntry& e : batch.entries) {
    const auto& ids = e.request->sequences[size_t(e.index)].token_ids;
    if (!ids.empty() && ids.front() == token) return true;
  }
  return false;
}

}  // namespace

std::string TestFaults::describe() const {
  std::string out;
  if (fail_first_token) {
    out += "batches holding a sequence whose first token id is " +
           std::to_string(*fail_first_token) + " fail";
  }
  if (stall_first_token) {
    if (!out.empty()) out += "; ";
    out += "batches holding a sequence whose first token id is " +
           std::to_string(*stall_first_token) + " stall " + std::to_string(stall.count()) + " ms";
  }
  return out.empty() ? "no faults" : out;
}

std::optional<TestFaults> test_faults_from_env() {
  const char* value = std::getenv(kTestFaultsEnv);
  if (value == nullptr) return std::nullopt;
  TestFaults faults;
  std::string_view rest(value);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = entry.find('=');
    const std::string_view key = entry.substr(0, eq);
    const std::string_view arg =
        eq == std::string_view::npos ? std::string_view() : entry.substr(eq + 1);
    if (key == "fail_first_token" && !arg.empty()) {
      faults.fail_first_token = parse_number<int32_t>(arg, entry);
    } else if (key == "stall_first_token" && arg.find(':') != std::string_view::npos) {
      const size_t colon = arg.find(':');
      faults.stall_first_token = parse_number<int32_t>(arg.substr(0, colon), entry);
      faults.stall = std::chrono::milliseconds(parse_number<int64_t>(arg.substr(colon + 1), entry));
    } else {
      throw std::invalid_argument("unknown entry '" + std::string(entry) +
                                  "' (expected fail_first_token=N or stall_first_token=N:MS)");
    }
  }
  return faults;
}

std::function<void(const batching::Batch&)> test_fault_hook(const TestFaults& faults) {
  return [faults](const batching::Batch& batch) {
    if (faults.stall_first_token && holds_first_token(batch, *faults.stall_first_token)) {
      std::this_thread::sleep_for(faults.stall);
    }
    if (faults.fail_first_token && holds_first_token(batch, *faults.fail_first_token)) {
      throw engine::EngineError(
          "injected test fault: the batch holds a sequence whose first token id is " +
          std::to_string(*faults.fail_first_token) + " (" + kTestFaultsEnv + ")");
    }
  };
}

}  // namespace fastformer
