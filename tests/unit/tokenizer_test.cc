// The tokenizer's components on hand-made cases; the expected values are what the
// `tokenizers` Python package (0.23) gives for the same inputs. The whole-pipeline parity over
// real texts is tests/tokenizer/compare_hf.py.
#include "server/text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {
namespace {

std::string normalize(const Normalizer& n, const std::string& text) {
  std::u32string t = decode_utf8(text);
  n.normalize(t);
  return encode_utf8(t);
}

std::vector<std::string> pre_tokenize(const PreTokenizer& p, const std::string& text) {
  std::vector<std::u32string> words{decode_utf8(text)};
  p.pre_tokenize(words);
  std::vector<std::string> out;
  for (const auto& w : words) out.push_back(encode_utf8(w));
  return out;
}

using Words = std::vector<std::string>;

TEST(TokenizerUtf8, RejectsInvalidSequences) {
  EXPECT_EQ(decode_utf8("a\xC3\xA9\xF0\x9F\x98\x80"), (std::u32string{U'a', 0xE9, 0x1F600}));
  for (const std::string bad :
       {"\xC3", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "a\xFF", "\x80"}) {
    EXPECT_THROW(decode_utf8(bad), TokenizerError) << bad;
  }
  try {
    decode_utf8("ab\xFF");
    FAIL();
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
}

TEST(TokenizerNormalizers, LowercaseIsPerCharFullMapping) {
  // İ -> i + U+0307; a lone final Σ -> σ (no final-sigma rule, as Rust's char::to_lowercase).
  EXPECT_EQ(normalize(LowercaseNormalizer(), "HeLLo İ ΟΔΟΣ"), "hello i\u0307 οδοσ");
}

TEST(TokenizerNormalizers, UnicodeForms) {
  EXPECT_EQ(normalize(UnicodeNormalizer(NormalForm::kNFD), "\u00E9"), "e\u0301");
  EXPECT_EQ(normalize(UnicodeNormalizer(NormalForm::kNFC), "e\u0301"), "\u00E9");
  EXPECT_EQ(normalize(UnicodeNormalizer(NormalForm::kNFKC), "\uFB01 \u00B2 \uFF21"), "fi 2 A");
}

TEST(TokenizerNormalizers, StripAccentsDropsEveryMarkButDoesNotDecompose) {
  EXPECT_EQ(normalize(StripAccentsNormalizer(), "e\u0301 \u00E9 \u0A15\u0A40"), "e \u00E9 \u0A15");
}

TEST(TokenizerNormalizers, BertNormalizer) {
  // clean_text: controls and U+FFFD dropped, whitespace -> ' '; CJK padded; accents (Mn only,
  // after NFD) stripped because lowercase is on and strip_accents is null; lowercased.
  const BertNormalizer bert(true, true, true, true);
  EXPECT_EQ(normalize(bert, "Caf\u00E9\tA\u0001\uFFFD\u4E2Dx \u0A15\u0A40"),
            "cafe a \u4E2D x \u0A15\u0A40");
  const BertNormalizer cased(false, false, false, false);
  EXPECT_EQ(normalize(cased, "Caf\u00E9\t\u4E2D"), "Caf\u00E9\t\u4E2D");
}

TEST(TokenizerNormalizers, SequenceAppliesInOrder) {
  std::vector<std::unique_ptr<Normalizer>> parts;
  parts.push_back(std::make_unique<UnicodeNormalizer>(NormalForm::kNFD));
  parts.push_back(std::make_unique<StripAccentsNormalizer>());
  parts.push_back(std::make_unique<LowercaseNormalizer>());
  EXPECT_EQ(normalize(SequenceNormalizer(std::move(parts)), "\u00C9T\u00C9"), "ete");
}

TEST(TokenizerPreTokenizers, Bert) {
  const CharSplitPreTokenizer bert(CharSplitPreTokenizer::Kind::kBert);
  EXPECT_EQ(pre_tokenize(bert, "Hello, world!  a$b\u00BFc"),
            (Words{"Hello", ",", "world", "!", "a", "$", "b", "\u00BF", "c"}));
}

TEST(TokenizerPreTokenizers, WhitespaceUsesRustRegexClasses) {
  // Rust's \w: Ⓐ (Alphabetic) and ZWJ are word characters, ½ is not.
  EXPECT_EQ(pre_tokenize(*make_whitespace_pre_tokenizer(), "a\u24B6b \u00BDx a\u200Db x\u000Bx"),
            (Words{"a\u24B6b", "\u00BD", "x", "a\u200Db", "x", "x"}));
  EXPECT_EQ(pre_tokenize(*make_whitespace_pre_tokenizer(), "don't stop--now"),
            (Words{"don", "'", "t", "stop", "--", "now"}));
}

TEST(TokenizerPreTokenizers, WhitespaceSplit) {
  const CharSplitPreTokenizer ws(CharSplitPreTokenizer::Kind::kWhitespaceSplit);
  EXPECT_EQ(pre_tokenize(ws, " a\u3000b\u0085c,d "), (Words{"a", "b", "c,d"}));
}

TEST(TokenizerPreTokenizers, PunctuationBehaviors) {
  using B = SplitBehavior;
  auto run = [](B b) {
    return pre_tokenize(CharSplitPreTokenizer(CharSplitPreTokenizer::Kind::kPunctuation, b),
                        "a..b!c");
  };
  EXPECT_EQ(run(B::kIsolated), (Words{"a", ".", ".", "b", "!", "c"}));
  EXPECT_EQ(run(B::kRemoved), (Words{"a", "b", "c"}));
  EXPECT_EQ(run(B::kContiguous), (Words{"a", "..", "b", "!", "c"}));
  EXPECT_EQ(run(B::kMergedWithPrevious), (Words{"a.", ".", "b!", "c"}));
  EXPECT_EQ(run(B::kMergedWithNext), (Words{"a", ".", ".b", "!c"}));
}

TEST(TokenizerPreTokenizers, SplitRegexUsesOnigurumaClasses) {
  // The notebook's wordpunct: matches kept (removed + invert). Oniguruma's \w has ² but not ⁰.
  const RegexSplitPreTokenizer wordpunct("\\w+|[^\\w\\s]+", true, SplitBehavior::kRemoved, true);
  EXPECT_EQ(pre_tokenize(wordpunct, "(2\u00B9\u2070) Don't!"),
            (Words{"(", "2\u00B9", "\u2070)", "Don", "'", "t", "!"}));
  // Inside a bracket class Oniguruma's \w lacks ¹ ² ³ ¼ ½ ¾: [^\w\s]+ takes "-¹" whole.
  EXPECT_EQ(pre_tokenize(wordpunct, "x\u00B9 x-\u00B9b"), (Words{"x\u00B9", "x", "-\u00B9", "b"}));
  const RegexSplitPreTokenizer isolated("\\w+|[^\\w\\s]+", true, SplitBehavior::kIsolated, false);
  EXPECT_EQ(pre_tokenize(isolated, "a b\u000Bc"), (Words{"a", " ", "b", "\u000B", "c"}));
}

TEST(TokenizerPreTokenizers, SplitLiteralStringAndInvert) {
  const RegexSplitPreTokenizer dash("-", false, SplitBehavior::kMergedWithPrevious, false);
  EXPECT_EQ(pre_tokenize(dash, "a-b--c."), (Words{"a-", "b-", "-", "c."}));
  const RegexSplitPreTokenizer dot(".", false, SplitBehavior::kRemoved, false);  // a literal '.'
  EXPECT_EQ(pre_tokenize(dot, "a.bc"), (Words{"a", "bc"}));
  const RegexSplitPreTokenizer vowels("[aeiou]+", true, SplitBehavior::kIsolated, true);
  EXPECT_EQ(pre_tokenize(vowels, "tokenizer"),
            (Words{"t", "o", "k", "e", "n", "i", "z", "e", "r"}));
  const RegexSplitPreTokenizer contiguous("\\d", true, SplitBehavior::kContiguous, false);
  EXPECT_EQ(pre_tokenize(contiguous, "ab123c4"), (Words{"ab", "123", "c", "4"}));
}

TEST(TokenizerModels, WordLevel) {
  const WordLevelModel m({{"PADDING", 0}, {"[UNK]", 1}, {"the", 2}}, "[UNK]");
  Encoding e;
  for (const char* w : {"the", "cat", "PADDING"}) m.tokenize(w, e);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{2, 1, 0}));
  const WordLevelModel no_unk({{"the", 0}}, "[UNK]");
  EXPECT_THROW(no_unk.tokenize("cat", e), TokenizerError);
}

TEST(TokenizerModels, WordPieceGreedyLongestMatch) {
  const WordPieceModel m({{"[UNK]", 0},
                          {"un", 1},
                          {"##aff", 2},
                          {"##able", 3},
                          {"u", 4},
                          {"##n", 5},
                          {"##a", 6},
                          {"\u00E9", 7},
                          {"##\u00E9", 8}},
                         "[UNK]", "##", 6);
  auto ids = [&](const std::string& w) {
    Encoding e;
    m.tokenize(w, e);
    return e.ids;
  };
  EXPECT_EQ(ids("unaffable"), (std::vector<int32_t>{0}));  // 9 chars > max_input_chars_per_word 6
  EXPECT_EQ(ids("unaff"), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ids("una"), (std::vector<int32_t>{1, 6}));
  EXPECT_EQ(ids("\u00E9\u00E9"), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(ids("unx"), (std::vector<int32_t>{0}));  // one piece fails: the whole word is unknown
}

void expect_load_error(const std::string& json, const std::string& message) {
  try {
    Tokenizer::from_json(json);
    FAIL() << "loaded: " << json;
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

const char* kBertJson = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
  "decoder": null,
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "!": 6, "play": 7, "##ing": 8, "cafe": 9}}
})";

TEST(TokenizerPipeline, BertEndToEnd) {
  const auto t = Tokenizer::from_json(kBertJson);
  EXPECT_EQ(t.encode("Hello CAFÉ, playing!").ids, (std::vector<int32_t>{2, 4, 9, 1, 7, 8, 6, 3}));
  EXPECT_EQ(t.encode("hello", false).ids, (std::vector<int32_t>{4}));
  // A special token in the raw text is matched before normalization.
  EXPECT_EQ(t.encode("hello[SEP]world").ids, (std::vector<int32_t>{2, 4, 3, 5, 3}));
  EXPECT_EQ(t.encode("").ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(t.num_special_tokens_added(), 2u);
  EXPECT_EQ(t.max_token_id(), 9);
  // The post-processor's ids count: they may lie outside the vocabulary.
  EXPECT_EQ(
      Tokenizer::from_json(
          R"({"post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 7], "cls": ["[CLS]", 2]},
      "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}})")
          .max_token_id(),
      7);
  expect_load_error(
      R"({"post_processor": {"type": "BertProcessing", "sep": ["[SEP]", -1], "cls": ["[CLS]", 2]}, "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}})",
      "post_processor.sep[1] is not a token id");
  EXPECT_EQ(t.description(), "WordPiece (BertNormalizer, BertPreTokenizer, BertProcessing)");
  EXPECT_THROW(t.encode("bad \xFF"), TokenizerError);
}

// Character offsets, worked out by hand as `tokenizers` gives them (its Encoding.offsets): the
// original's characters through lower-casing, accent stripping (NFD, then the mark dropped),
// WordPiece pieces and an unknown word; special tokens (0, 0); an added token in the text its
// own span; bytes for the C++ API; truncation keeps them in step.
TEST(TokenizerPipeline, OffsetsFollowTheOriginalCharacters) {
  auto t = Tokenizer::from_json(kBertJson);
  using O = std::vector<Offsets>;
  //                         0    5 7   11   16      24
  const std::string text = "Hello CAF\xC3\x89, playing!";  // "Hello CAFÉ, playing!"
  const Encoding e = t.encode(text, nullptr, true, true);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{2, 4, 9, 1, 7, 8, 6, 3}));
  EXPECT_EQ(e.offsets,
            (O{{0, 0}, {0, 5}, {6, 10}, {10, 11}, {12, 16}, {16, 19}, {19, 20}, {0, 0}}));
  EXPECT_EQ(byte_offsets(text, e.offsets),
            (O{{0, 0}, {0, 5}, {6, 11}, {11, 12}, {13, 17}, {17, 20}, {20, 21}, {0, 0}}));
  // A decomposed accent (e + U+0301) that the normalizer drops falls in no token's range:
  // tokenizers' filter keeps the kept character's own alignment.
  const Encoding d = t.encode("cafe\xCC\x81 world", nullptr, false, true);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{9, 5}));
  EXPECT_EQ(d.offsets, (O{{0, 4}, {6, 11}}));
  const Encoding s = t.encode("hello[SEP]world", nullptr, true, true);
  EXPECT_EQ(s.offsets, (O{{0, 0}, {0, 5}, {5, 10}, {10, 15}, {0, 0}}));
  t.set_truncation({4, TruncationDirection::kLeft});
  const Encoding cut = t.encode("hello world hello cafe", t.truncation(), true, true);
  EXPECT_EQ(cut.ids, (std::vector<int32_t>{2, 4, 9, 3}));
  EXPECT_EQ(cut.offsets, (O{{0, 0}, {12, 17}, {18, 22}, {0, 0}}));
  // Without offsets asked, none are made.
  EXPECT_TRUE(t.encode(text).offsets.empty());
}

TEST(TokenizerPipeline, TruncationLeavesRoomForSpecialTokens) {
  auto t = Tokenizer::from_json(kBertJson);
  t.set_truncation({4, TruncationDirection::kRight});
  EXPECT_EQ(t.encode("hello world hello world").ids, (std::vector<int32_t>{2, 4, 5, 3}));
  t.set_truncation({4, TruncationDirection::kLeft});
  EXPECT_EQ(t.encode("hello world hello cafe").ids, (std::vector<int32_t>{2, 4, 9, 3}));
  EXPECT_EQ(t.encode("hello world hello cafe", false).ids,
            (std::vector<int32_t>{4, 5, 4, 9}));  // no room taken
}

TEST(TokenizerPipeline, TemplateProcessingAndWordLevel) {
  const auto t = Tokenizer::from_json(R"({
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+|[^\\w\\s]+"}, "behavior": "Removed", "invert": true},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]},
                                     "</s>": {"id": "</s>", "ids": [8], "tokens": ["</s>"]}}},
    "truncation": {"direction": "Right", "max_length": 5, "strategy": "LongestFirst", "stride": 0},
    "model": {"type": "WordLevel", "vocab": {"PADDING": 0, "[UNK]": 1, "the": 2, "cat": 3, "'": 4, "s": 5}, "unk_token": "[UNK]"}
  })");
  EXPECT_EQ(t.encode("The ＣＡＴ's hat").ids, (std::vector<int32_t>{7, 2, 3, 4, 8}));
  EXPECT_EQ(t.encode("cat").ids, (std::vector<int32_t>{7, 3, 8}));
}

TEST(TokenizerLoading, UnsupportedComponentsNameThePathAndType) {
  expect_load_error(
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})",
      "tokenizer.json: model.type BPE is not supported (supported: WordLevel, WordPiece)");
  const std::string model =
      R"("model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"})";
  expect_load_error(
      R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, {"type": "Replace"}]}, )" +
          model + "}",
      "normalizer.normalizers[1].type Replace is not supported");
  expect_load_error(R"({"pre_tokenizer": {"type": "ByteLevel"}, )" + model + "}",
                    "pre_tokenizer.type ByteLevel is not supported");
  expect_load_error(R"({"post_processor": {"type": "RobertaProcessing"}, )" + model + "}",
                    "post_processor.type RobertaProcessing is not supported");
  expect_load_error(
      R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated", "invert": false}, )" +
          model + "}",
      "pre_tokenizer.pattern invalid regular expression");
  expect_load_error(
      R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false}, )" +
          model + "}",
      "pre_tokenizer.behavior Sideways is not a split behavior");
  expect_load_error(
      R"({"added_tokens": [{"id": 0, "content": "a", "lstrip": true, "normalized": false}], )" +
          model + "}",
      "added_tokens[0].lstrip true is not supported");
  expect_load_error("{}", "(top level).model is missing");
  expect_load_error("{", "not valid JSON");
  expect_load_error(R"({"model": {"type": "WordLevel", "vocab": {"a": "x"}, "unk_token": "a"}})",
                    "model.vocab[\"a\"] must be an integer");
}

}  // namespace
}  // namespace fastformer::tokenizer
