// A Hugging Face `tokenizer.json` loaded in C++: text (UTF-8) -> token ids, the same ids as the
// `tokenizers` Python package (tests/tokenizer compares them over 50,000+ real texts).
//
// The pipeline is the package's: added (special) tokens are split out of the raw text, each
// remaining span is normalized, pre-tokenized into words, each word is mapped to ids by the
// model, the sequence is truncated (leaving room for the special tokens), and the
// post-processor adds the special tokens. The supported components are in components.h;
// anything else fails at load time with an error naming the JSON path and the type.
// Thread-safe: encode() is const and keeps no state between calls.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fastformer::tokenizer {

// Every error of this library: an unsupported or malformed tokenizer.json, or bad text.
class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Normalizer;
class PreTokenizer;
class Model;
class PostProcessor;

enum class TruncationDirection { kRight, kLeft };

struct Truncation {
  size_t max_length = 0;  // of the final sequence, special tokens included
  TruncationDirection direction = TruncationDirection::kRight;
};

// A token's [start, end) in the original text, in code points (as `tokenizers`' Python
// Encoding.offsets), or in UTF-8 bytes (byte_offsets()).
using Offsets = std::pair<uint32_t, uint32_t>;

struct Encoding {
  std::vector<int32_t> ids;
  std::vector<std::string> tokens;
  std::vector<int32_t> type_ids;
  /// Filled when asked (encode's `offsets`): each token's range in the original text, in code
  /// points, exact to `tokenizers`' Encoding.offsets (through the normalizers' alignments);
  /// the post-processor's special tokens get (0, 0).
  std::vector<Offsets> offsets;
};

// Code-point offsets of `utf8_text` as UTF-8 byte offsets.
std::vector<Offsets> byte_offsets(std::string_view utf8_text, const std::vector<Offsets>& offsets);

// A token in tokenizer.json's "added_tokens", matched in the raw text before normalization.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
};

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names it in errors (e.g. the file path).
  static Tokenizer from_json(std::string_view json_text,
                             const std::string& source = "tokenizer.json");
  static Tokenizer from_file(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Throws TokenizerError on invalid UTF-8. Truncates by truncation() (tokenizer.json's).
  Encoding encode(std::string_view utf8_text, bool add_special_tokens = true) const;
  // The same with another truncation rule for this call (null: none), e.g. a request's;
  // `offsets`: also each token's character range (Encoding::offsets), tracked through the
  // normalizer's changes (a little slower on non-ASCII text).
  Encoding encode(std::string_view utf8_text, const Truncation* truncation,
                  bool add_special_tokens = true, bool offsets = false) const;

  // tokenizer.json's "truncation" (nullptr when absent); set_truncation replaces it (e.g. with
  // the model's number of positions), clear_truncation removes it.
  const Truncation* truncation() const { return truncation_ ? &*truncation_ : nullptr; }
  void set_truncation(Truncation t);
  void clear_truncation() { truncation_.reset(); }

  size_t vocab_size() const;     // the model's vocabulary plus added tokens not in it
  int32_t max_token_id() const;  // the largest id encode() can return
  std::string description()
      const;  // e.g. "WordPiece (BertNormalizer, BertPreTokenizer, BertProcessing)"
  size_t num_special_tokens_added() const;  // by the post-processor to a single sequence
  bool is_special(int32_t id) const;        // an added token marked "special" in tokenizer.json

 private:
  Tokenizer();
  std::vector<AddedToken> added_tokens_;
  std::vector<std::u32string> added_text_;  // added_tokens_' contents as code points, for encode()
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Truncation> truncation_;
};

}  // namespace fastformer::tokenizer
