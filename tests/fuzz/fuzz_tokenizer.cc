// Fuzz target: a tokenizer.json and a text through Tokenizer::from_json and encode(), what the
// server runs at start-up and on every text request. Any tokenizer.json must either load or
// throw TokenizerError; any bytes must either encode or throw TokenizerError (invalid UTF-8),
// and the ids must be ids of the tokenizer, no more than the truncation allows. With offsets
// (late chunking, TEI's /tokenize): the same ids, one [start, end) per token inside the text.
//
// Input: the tokenizer.json text, the marker line "\n--text--\n", then the text's bytes (no
// marker: a fixed BERT-style tokenizer.json, and the whole input is the text).
#include <cstdint>
#include <string>
#include <string_view>

#include "server/text/tokenizer/tokenizer.h"
#include "server/text/tokenizer/unicode.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using fastformer::tokenizer::Tokenizer;
using fastformer::tokenizer::TokenizerError;

constexpr std::string_view kMarker = "\n--text--\n";

constexpr std::string_view kDefaultJson = R"({
  "added_tokens": [{"id": 2, "content": "[CLS]", "normalized": false, "special": true},
                   {"id": 3, "content": "[SEP]", "normalized": false, "special": true}],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "BertPreTokenizer"},
                    {"type": "Split", "pattern": {"Regex": "\\w+|[^\\w\\s]+"}, "behavior": "MergedWithNext", "invert": true}]},
  "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
  "truncation": {"direction": "Left", "max_length": 16},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 12,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "##a": 5, "ab": 6, "##b": 7, "é": 8, "##é": 9}}
})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t marker = input.find(kMarker);
  const std::string_view json =
      marker == std::string_view::npos ? kDefaultJson : input.substr(0, marker);
  const std::string_view text =
      marker == std::string_view::npos ? input : input.substr(marker + kMarker.size());
  try {
    const Tokenizer tokenizer = Tokenizer::from_json(json);
    const auto encoding = tokenizer.encode(text);
    for (int32_t id : encoding.ids) FUZZ_CHECK(id >= 0 && id <= tokenizer.max_token_id());
    if (tokenizer.truncation())
      FUZZ_CHECK(encoding.ids.size() <= tokenizer.truncation()->max_length);
    FUZZ_CHECK(encoding.ids.size() == encoding.tokens.size() &&
               encoding.ids.size() == encoding.type_ids.size());
    const auto with_offsets = tokenizer.encode(text, tokenizer.truncation(), true, true);
    FUZZ_CHECK(with_offsets.ids == encoding.ids);
    FUZZ_CHECK(with_offsets.offsets.size() == with_offsets.ids.size());
    const size_t chars = fastformer::tokenizer::code_point_count(text);
    for (const auto& [start, end] : with_offsets.offsets) FUZZ_CHECK(start <= end && end <= chars);
    const auto bytes = fastformer::tokenizer::byte_offsets(text, with_offsets.offsets);
    for (const auto& [start, end] : bytes) FUZZ_CHECK(start <= end && end <= text.size());
  } catch (const TokenizerError&) {
    // Rejected with a message: what the server turns into INVALID_ARGUMENT.
  }
  return 0;
}
