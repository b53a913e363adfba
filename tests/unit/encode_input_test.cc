// The request layer (server/request/encode_input.h): every rule, one table of cases, each
// with the message written out by hand (in fastformer.v1's wording, format_v1, and the offline
// encoder's, describe) or the rows it must keep. The e2e and KServe suites assert the same
// messages through each protocol's own wording.
#include "server/request/encode_input.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/test_models.h"

namespace fastformer::request {
namespace {

// Model "words": ids (vocab 100, pad 0), 8 positions, hidden 4, a 2-label head, a WordLevel
// tokenizer.json. Model "embeddings": no word embedding, no head, no tokenizer.
struct Served {
  std::shared_ptr<const engine::Model> model;
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

const char* const kTokenizer = R"({"truncation": null,
  "pre_tokenizer": {"type": "WhitespaceSplit"},
  "model": {"type": "WordLevel", "unk_token": "[UNK]",
            "vocab": {"PADDING": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4}}})";

const Served& served(bool words) {
  static test::TempDir dir;
  static const Served models[2] = {[] {
                                     test::TinyModelSpec s;
                                     s.hidden = 4, s.heads = 2, s.layers = 1, s.intermediate = 4;
                                     s.max_positions = 8, s.vocab = 100;
                                     s.word_embedding = false;
                                     const auto d = test::write_tiny_model(dir.path(), "emb", s);
                                     return Served{engine::Model::load(d), nullptr};
                                   }(),
                                   [] {
                                     test::TinyModelSpec s;
                                     s.hidden = 4, s.heads = 2, s.layers = 1, s.intermediate = 4;
                                     s.max_positions = 8, s.vocab = 100, s.num_labels = 2;
                                     const auto d = test::write_tiny_model(dir.path(), "words", s);
                                     std::ofstream(d / "tokenizer.json") << kTokenizer;
                                     auto m = engine::Model::load(d);
                                     auto t = text::load_tokenizer(d, *m);
                                     return Served{m, t};
                                   }()};
  return models[words ? 1 : 0];
}

// One row of a case, owning its values.
struct RowSpec {
  Field field = Field::kTokenIds;
  std::vector<int32_t> ids;
  std::vector<int64_t> wide;  ///< a 64-bit id row (KServe v2's tensors)
  std::vector<float> embeddings;
  std::string text;
  std::vector<TokenSpan> spans = {};  ///< late chunking's token ranges

  Row row() const {
    switch (field) {
      case Field::kText:
        return Row::from_text(text).with_spans(spans);
      case Field::kInputEmbeddings:
        return Row::embeddings(embeddings).with_spans(spans);
      case Field::kTokenIds:
      case Field::kSpans:
      case Field::kMacroChunks:
      case Field::kPrompt:
      case Field::kDimensions:
      case Field::kEmbeddingTypes:
        break;
    }
    return (wide.empty() ? Row::ids(ids) : Row::wide_ids(wide)).with_spans(spans);
  }
};

RowSpec spanned(RowSpec row, std::vector<TokenSpan> spans) {
  row.spans = std::move(spans);
  return row;
}

RowSpec ids(std::vector<int32_t> v) { return {Field::kTokenIds, std::move(v), {}, {}, {}}; }
RowSpec wide(std::vector<int64_t> v) { return {Field::kTokenIds, {}, std::move(v), {}, {}}; }
RowSpec emb(std::vector<float> v) { return {Field::kInputEmbeddings, {}, {}, std::move(v), {}}; }
RowSpec txt(std::string v) { return {Field::kText, {}, {}, {}, std::move(v)}; }

std::vector<int32_t> count(int32_t from, int32_t to) {  // from, from + 1, ..., to - 1
  std::vector<int32_t> v;
  for (int32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::vector<float> rows_of(int64_t rows) {  // rows x hidden 4: row r holds r*4 .. r*4+3
  std::vector<float> v(size_t(rows * 4));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return v;
}

// What an accepted row must be: its length and its first and last value (a token id, or an
// embedding value).
struct Kept {
  int64_t length;
  float first, last;
};

struct Case {
  const char* name;
  bool words;  ///< the "words" model, else "embeddings"
  std::vector<RowSpec> rows;
  Truncate truncate = Truncate::kNone;
  int64_t max_request_tokens = 1000;
  std::string v1;            ///< format_v1 of the refusal; empty: accepted
  std::string described;     ///< describe() of the refusal (fastformer-encode's words)
  std::vector<Kept> kept{};  ///< accepted: per row
};

constexpr auto kNone = Truncate::kNone, kRight = Truncate::kRight, kLeft = Truncate::kLeft;

std::vector<float> with_nan() {
  std::vector<float> v = rows_of(2);
  v[6] = std::nanf("");  // row 1, column 2
  return v;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"no rows",
       true,
       {},
       kNone,
       1000,
       "sequences: the request has no sequences",
       "token_ids: the request has no sequences"},
      {"id over the vocabulary",
       true,
       {ids({5, 100, 3})},
       kNone,
       1000,
       "sequence 0: token_ids: token 1 has id 100, outside [0, vocab_size 100)",
       "token_ids: token 1 has id 100, outside [0, vocab_size 100)"},
      {"negative id, second row",
       true,
       {ids({1}), ids({5, 6, -1})},
       kNone,
       1000,
       "sequence 1: token_ids: token 2 has id -1, outside [0, vocab_size 100)",
       "token_ids: token 2 has id -1, outside [0, vocab_size 100)"},
      {"64-bit id checked before narrowing",
       true,
       {wide({3, int64_t(1) << 32})},
       kNone,
       1000,
       "sequence 0: token_ids: token 1 has id 4294967296, outside [0, vocab_size 100)",
       "token_ids: token 1 has id 4294967296, outside [0, vocab_size 100)"},
      {"64-bit ids accepted", true, {wide({7, 8, 99})}, kNone, 1000, "", "", {{3, 7, 99}}},
      {"too many ids",
       true,
       {ids(count(1, 10))},
       kNone,
       1000,
       "sequence 0: token_ids: 9 tokens exceed max_position_embeddings 8",
       "token_ids: 9 tokens exceed max_position_embeddings 8"},
      {"truncation right keeps the first 8",
       true,
       {ids(count(1, 11))},
       kRight,
       1000,
       "",
       "",
       {{8, 1, 8}}},
      {"truncation left keeps the last 8",
       true,
       {ids(count(1, 11))},
       kLeft,
       1000,
       "",
       "",
       {{8, 3, 10}}},
      {"a bad id cut off by truncation is not checked",
       true,
       {ids({-5, 1, 2, 3, 4, 5, 6, 7, 8})},
       kLeft,
       1000,
       "",
       "",
       {{8, 1, 8}}},
      {"a bad id kept is named at its position as sent",
       true,
       {ids({1, 2, 3, 4, 5, 6, 7, 8, 9, 500})},
       kLeft,
       1000,
       "sequence 0: token_ids: token 9 has id 500, outside [0, vocab_size 100)",
       "token_ids: token 9 has id 500, outside [0, vocab_size 100)"},
      {"64-bit ids truncated",
       true,
       {wide({1, 2, 3, 4, 5, 6, 7, 8, 9})},
       kRight,
       1000,
       "",
       "",
       {{8, 1, 8}}},
      {"every id the pad",
       true,
       {ids({0, 0, 0})},
       kNone,
       1000,
       "sequence 0: token_ids: every token is the pad token (pad_token_id 0): nothing to encode",
       "token_ids: every token is the pad token (pad_token_id 0): nothing to encode"},
      {"an empty id row",
       true,
       {ids({})},
       kNone,
       1000,
       "sequence 0: token_ids: empty sequence: send at least one token id or embedding row",
       "token_ids: empty sequence: send at least one token id or embedding row"},
      {"ids for a model with no word embedding",
       false,
       {ids({1, 2})},
       kNone,
       1000,
       "sequence 0: token_ids: this model has no word embedding table; send input_embeddings "
       "instead",
       "token_ids: this model has no word embedding table; send input_embeddings instead"},
      {"embeddings not whole rows",
       false,
       {emb({1, 2, 3, 4, 5})},
       kNone,
       1000,
       "sequence 0: input_embeddings: 5 values is not a whole number of rows of hidden_size 4",
       "input_embeddings: 5 values is not a whole number of rows of hidden_size 4"},
      {"embeddings not whole rows are not truncated",
       false,
       {emb(std::vector<float>(37, 1))},
       kLeft,
       1000,
       "sequence 0: input_embeddings: 37 values is not a whole number of rows of hidden_size 4",
       "input_embeddings: 37 values is not a whole number of rows of hidden_size 4"},
      {"embeddings not finite",
       false,
       {emb(with_nan())},
       kNone,
       1000,
       "sequence 0: input_embeddings: row 1 column 2 is not finite (NaN or Inf)",
       "input_embeddings: row 1 column 2 is not finite (NaN or Inf)"},
      {"too many embedding rows",
       false,
       {emb(rows_of(9))},
       kNone,
       1000,
       "sequence 0: input_embeddings: 9 rows exceed max_position_embeddings 8",
       "input_embeddings: 9 rows exceed max_position_embeddings 8"},
      {"embeddings truncated right", false, {emb(rows_of(9))}, kRight, 1000, "", "", {{8, 0, 31}}},
      {"embeddings truncated left", false, {emb(rows_of(9))}, kLeft, 1000, "", "", {{8, 4, 35}}},
      {"text for a model with no tokenizer",
       false,
       {txt("a b")},
       kNone,
       1000,
       "sequence 0: text: this model takes no text: its model directory has no tokenizer.json "
       "(send token_ids)",
       "text: this model takes no text: its model directory has no tokenizer.json (send "
       "token_ids)"},
      {"an empty text",
       true,
       {ids({1}), txt("")},
       kNone,
       1000,
       "sequence 1: text: the text is empty",
       "text: the text is empty"},
      {"a text of no tokens",
       true,
       {txt(" \t  ")},
       kNone,
       1000,
       "sequence 0: text: the text tokenizes to no tokens (its 4 bytes are whitespace or "
       "characters the tokenizer drops)",
       "text: the text tokenizes to no tokens (its 4 bytes are whitespace or characters the "
       "tokenizer drops)"},
      {"a text of pads",
       true,
       {txt("PADDING PADDING")},
       kNone,
       1000,
       "sequence 0: text: the text's tokens are all the pad token (id 0), which the model skips",
       "text: the text's tokens are all the pad token (id 0), which the model skips"},
      {"a text over the positions",
       true,
       {txt("a b c a b c a b c")},
       kNone,
       1000,
       "sequence 0: text: the text is 9 tokens, over max_position_embeddings 8 (truncation right "
       "or left keeps the first or last 8)",
       "text: the text is 9 tokens, over max_position_embeddings 8 (truncation right or left "
       "keeps the first or last 8)"},
      {"a text truncated left", true, {txt("a b c a b c a b c")}, kLeft, 1000, "", "", {{8, 3, 4}}},
      {"a text, ids and embeddings rows",
       true,
       {txt("c a"), ids({9}), emb(rows_of(2))},
       kNone,
       1000,
       "",
       "",
       {{2, 4, 2}, {1, 9, 9}, {2, 0, 7}}},
      {"the token budget, rows left",
       true,
       {ids({1, 2, 3, 4}), ids({1, 2, 3, 4}), ids({1, 2, 3, 4}), ids({1})},
       kNone,
       10,
       "sequences: the request has at least 12 tokens, over max_request_tokens 10",
       "token_ids: the request has at least 12 tokens, over max_request_tokens 10"},
      {"the token budget, the last row",
       true,
       {ids({1, 2, 3, 4}), txt("a b c a b c a")},
       kNone,
       10,
       "sequences: the request has 11 tokens, over max_request_tokens 10",
       "text: the request has 11 tokens, over max_request_tokens 10"},
      {"spans inside a row of ids, overlapping, are kept",
       true,
       {spanned(ids({1, 2, 3, 4}), {{0, 4}, {1, 2}, {0, 2}})},
       kNone,
       1000,
       "",
       "",
       {{4, 1, 4}}},
      {"a span past the row's end",
       true,
       {ids({1}), spanned(ids({1, 2, 3, 4}), {{0, 2}, {2, 5}})},
       kNone,
       1000,
       "sequence 1: spans: span 1 [2, 5) is outside the sequence's 4 tokens [0, 4)",
       "spans: span 1 [2, 5) is outside the sequence's 4 tokens [0, 4)"},
      {"a reversed span",
       true,
       {spanned(ids({1, 2, 3, 4}), {{3, 1}})},
       kNone,
       1000,
       "sequence 0: spans: span 0 [3, 1) is reversed (end before begin)",
       "spans: span 0 [3, 1) is reversed (end before begin)"},
      {"an empty span",
       true,
       {spanned(ids({1, 2, 3, 4}), {{2, 2}})},
       kNone,
       1000,
       "sequence 0: spans: span 0 [2, 2) is empty",
       "spans: span 0 [2, 2) is empty"},
      {"a span of pad tokens only",
       true,
       {spanned(ids({5, 0, 0, 6}), {{0, 4}, {1, 3}})},
       kNone,
       1000,
       "sequence 0: spans: span 1 [1, 3) holds only pad tokens (pad_token_id 0): nothing to pool",
       "spans: span 1 [1, 3) holds only pad tokens (pad_token_id 0): nothing to pool"},
      {"a span checked against the row as truncated",
       true,
       {spanned(ids(count(1, 11)), {{0, 10}})},
       kRight,
       1000,
       "sequence 0: spans: span 0 [0, 10) is outside the sequence's 8 tokens [0, 8)",
       "spans: span 0 [0, 10) is outside the sequence's 8 tokens [0, 8)"},
      {"a span past a text's tokens",
       true,
       {spanned(txt("a b"), {{0, 40}})},
       kNone,
       1000,
       "sequence 0: spans: span 0 [0, 40) is outside",
       "spans: span 0 [0, 40) is outside"},
      {"spans over input embeddings",
       false,
       {spanned(emb(rows_of(3)), {{0, 1}, {1, 3}, {-1, 2}})},
       kNone,
       1000,
       "sequence 0: spans: span 2 [-1, 2) is outside the sequence's 3 tokens [0, 3)",
       "spans: span 2 [-1, 2) is outside the sequence's 3 tokens [0, 3)"},
      {"the token budget counts kept tokens",
       true,
       {ids(count(1, 11)), ids({1, 2})},
       kRight,
       10,
       "",
       "",
       {{8, 1, 8}, {2, 1, 2}}},
  };
  return all;
}

class EncodeInputRules : public testing::TestWithParam<Case> {};

// build_request into a fresh Prepared, as every caller makes one; `out` holds it after.
std::optional<Problem> prepare(const EncodeInput& input, const engine::Model& model,
                               const text::Tokenizer* tokenizer, const Limits& limits,
                               std::unique_ptr<Prepared>* out,
                               const VersionFiles* files = nullptr) {
  *out = std::make_unique<Prepared>();
  return build_request(input, model, tokenizer, limits, out->get(), files);
}

TEST_P(EncodeInputRules, AnswersAsTheRuleSays) {
  const Case& c = GetParam();
  const Served& s = served(c.words);
  EncodeInput input;
  for (const RowSpec& r : c.rows) input.rows.push_back(r.row());
  input.truncate = c.truncate;
  input.options.normalize = true;
  std::unique_ptr<Prepared> out;
  const std::optional<Problem> problem =
      prepare(input, *s.model, s.tokenizer.get(), Limits{c.max_request_tokens}, &out);
  if (!c.v1.empty()) {
    ASSERT_TRUE(problem.has_value()) << "accepted";
    if (c.v1.ends_with("is outside")) {  // the rest names the text's token count
      EXPECT_TRUE(format_v1(*problem).starts_with(c.v1)) << format_v1(*problem);
      EXPECT_TRUE(describe(*problem).starts_with(c.described)) << describe(*problem);
      return;
    }
    EXPECT_EQ(format_v1(*problem), c.v1);
    EXPECT_EQ(describe(*problem), c.described);
    return;
  }
  ASSERT_FALSE(problem.has_value()) << format_v1(*problem);
  ASSERT_EQ(out->sequences.size(), c.kept.size());
  for (size_t i = 0; i < c.kept.size(); ++i)  // the row's spans ride on its sequence
    EXPECT_EQ(out->sequences[i].spans.size(), c.rows[i].spans.size()) << "row " << i;
  EXPECT_TRUE(out->options.normalize);
  for (size_t i = 0; i < c.kept.size(); ++i) {
    const SequenceInput& seq = out->sequences[i];
    SCOPED_TRACE("row " + std::to_string(i));
    EXPECT_EQ(engine::sequence_length(seq, 4), c.kept[i].length);
    if (!seq.token_ids.empty()) {
      EXPECT_EQ(seq.token_ids.front(), int32_t(c.kept[i].first));
      EXPECT_EQ(seq.token_ids.back(), int32_t(c.kept[i].last));
    } else {
      EXPECT_EQ(seq.input_embeddings.front(), c.kept[i].first);
      EXPECT_EQ(seq.input_embeddings.back(), c.kept[i].last);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryRule, EncodeInputRules, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string name;
                           for (const char ch : std::string(info.param.name))
                             name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

TEST(EncodeInput, TextsAreCountedAndEveryIdOwnedByTheRequest) {
  const Served& s = served(true);
  const std::string first = "a b", second = "c";
  EncodeInput input;
  input.rows = {Row::from_text(first), Row::ids(std::vector<int32_t>{}), Row::from_text(second)};
  const std::vector<int32_t> nine{9};
  input.rows[1] = Row::ids(nine);
  std::unique_ptr<Prepared> out;
  ASSERT_FALSE(prepare(input, *s.model, s.tokenizer.get(), Limits{100}, &out));
  EXPECT_EQ(out->texts, 2);
  ASSERT_EQ(out->ids.size(), 3u);  // tokenized, or copied as sent: the caller's may go
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(out->sequences[i].token_ids.data(), out->ids[i].data()) << "row " << i;
  EXPECT_EQ(out->ids[1], std::vector<int32_t>{9});
  EXPECT_EQ(out->ids[2], std::vector<int32_t>{4});
}

// What a Prepared's sequences view is its own: the caller's ids, embeddings and spans may be
// overwritten and freed once build_request returns (ASan sees any view left into them), and
// the job made over it holds it until the job goes.
TEST(Prepared, OwnsWhatItsSequencesViewAndTheJobHoldsIt) {
  auto wide = std::make_unique<std::vector<int64_t>>(std::vector<int64_t>{5, 6, 7});
  auto ids = std::make_unique<std::vector<int32_t>>(std::vector<int32_t>{8, 9});
  auto spans = std::make_unique<std::vector<TokenSpan>>(std::vector<TokenSpan>{{0, 2}, {1, 3}});
  EncodeInput input;
  input.rows = {Row::wide_ids(*wide).with_spans(*spans), Row::ids(*ids)};
  std::unique_ptr<Prepared> out;
  const Served& words = served(true);
  ASSERT_FALSE(prepare(input, *words.model, words.tokenizer.get(), Limits{100}, &out));
  std::fill(wide->begin(), wide->end(), 1);
  std::fill(ids->begin(), ids->end(), 1);
  std::fill(spans->begin(), spans->end(), TokenSpan{0, 1});
  wide.reset(), ids.reset(), spans.reset(), input = {};
  auto as_vector = [](std::span<const int32_t> v) {
    return std::vector<int32_t>(v.begin(), v.end());
  };
  ASSERT_EQ(out->sequences.size(), 2u);
  EXPECT_EQ(as_vector(out->sequences[0].token_ids), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(as_vector(out->sequences[1].token_ids), (std::vector<int32_t>{8, 9}));
  ASSERT_EQ(out->sequences[0].spans.size(), 2u);
  EXPECT_EQ(out->sequences[0].spans[1].begin, 1);
  EXPECT_EQ(out->sequences[0].spans[1].end, 3);

  // Input embeddings (hidden_size 4): two tokens, copied.
  auto floats = std::make_unique<std::vector<float>>(8, 0.5f);
  EncodeInput embedded;
  embedded.rows = {Row::embeddings(*floats)};
  std::unique_ptr<Prepared> rows;
  ASSERT_FALSE(prepare(embedded, *served(false).model, nullptr, Limits{100}, &rows));
  floats.reset();
  ASSERT_EQ(rows->sequences[0].input_embeddings.size(), 8u);
  EXPECT_EQ(rows->sequences[0].input_embeddings[7], 0.5f);

  // The job views the Prepared's storage and keeps it alive, alone once the caller lets go.
  std::shared_ptr<const Prepared> held(std::move(out));
  const std::weak_ptr<const Prepared> watch = held;
  std::shared_ptr<batching::Job> job = make_job(std::move(held));
  EXPECT_EQ(job->sequences[1].token_ids.data(), watch.lock()->ids[1].data());
  EXPECT_FALSE(watch.expired());
  job.reset();
  EXPECT_TRUE(watch.expired());
}

TEST(EncodeInput, InputsPerRequestAreLimited) {
  const Served& s = served(true);
  const std::vector<int32_t> a{5}, b{6}, c{7};
  EncodeInput input;
  input.rows = {Row::ids(a), Row::ids(b), Row::ids(c)};
  Limits limits{100};
  limits.max_request_inputs = 2;
  std::unique_ptr<Prepared> out;
  const std::optional<Problem> problem = prepare(input, *s.model, s.tokenizer.get(), limits, &out);
  ASSERT_TRUE(problem.has_value());
  EXPECT_FALSE(problem->row.has_value());
  EXPECT_EQ(format_v1(*problem),
            "sequences: the request has 3 sequences, over max_request_inputs 2");
  limits.max_request_inputs = 3;  // at the limit
  EXPECT_FALSE(prepare(input, *s.model, s.tokenizer.get(), limits, &out));
  EXPECT_EQ(out->sequences.size(), 3u);
  limits.max_request_inputs = 0;  // no limit
  EXPECT_FALSE(prepare(input, *s.model, s.tokenizer.get(), limits, &out));
}

// Prompts (issue 49) on the "words" model: WordLevel, whitespace split, no special tokens, 8
// positions; "a" 2, "b" 3, "c" 4. The prompt "a b " is two tokens before the text's.
struct Prompted {
  Prompts prompts = Prompts::parse(
      R"({"prompts": {"query": "a b ", "none": ""}, "default_prompt_name": null, "x": 1})", "test");
  VersionFiles files{&prompts, nullptr, {}};
  std::unique_ptr<Prepared> out;
  std::optional<Problem> build(const EncodeInput& input, int64_t tokens = 100) {
    const Served& s = served(true);
    return prepare(input, *s.model, s.tokenizer.get(), Limits{tokens}, &out, &files);
  }
};

EncodeInput text_input(std::string_view text, std::optional<std::string> prompt,
                       Truncate truncate = Truncate::kNone) {  // `text` outlives the input
  EncodeInput input;
  input.rows = {Row::from_text(text)};
  input.prompt_name = std::move(prompt);
  input.truncate = truncate;
  return input;
}

TEST(Prompts, ThePromptIsTokenizedFirstAndACutTakesOnlyTheText) {
  Prompted p;
  const std::string text = "c c c a a a b b b";  // 9 tokens: with the prompt's 2, 11 of 8
  ASSERT_FALSE(p.build(text_input("c a", "query")));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 4, 2}));
  ASSERT_FALSE(p.build(text_input(text, "query", Truncate::kRight)));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 4, 4, 4, 2, 2, 2}));
  ASSERT_FALSE(p.build(text_input(text, "query", Truncate::kLeft)));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 2, 2, 2, 3, 3, 3}));
  const auto refused = p.build(text_input(text, "query"));
  ASSERT_TRUE(refused);
  EXPECT_EQ(format_v1(*refused),
            "sequence 0: text: the prompt and the text are 11 tokens, over "
            "max_position_embeddings 8 (truncation right or left cuts the text, never the "
            "prompt)");
  // The prompt counts toward the request's token budget.
  const auto budget = p.build(text_input("c a", "query"), 3);
  ASSERT_TRUE(budget);
  EXPECT_EQ(format_v1(*budget), "sequences: the request has 4 tokens, over max_request_tokens 3");
  // An empty prompt is no prompt.
  ASSERT_FALSE(p.build(text_input("c a", "none")));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{4, 2}));
  EXPECT_TRUE(p.out->prompt_tokens.empty());
}

TEST(Prompts, AnUnknownNameIsRefusedWithTheModelsPromptsAndAHintNever) {
  Prompted p;
  auto refused = p.build(text_input("c", "passage"));
  ASSERT_TRUE(refused);
  EXPECT_EQ(format_v1(*refused),
            "prompt_name: 'passage' is not a prompt of this model; its prompts: 'none', 'query'");
  const Served& s = served(true);
  refused = prepare(text_input("c", "query"), *s.model, s.tokenizer.get(), Limits{100},
                    &p.out);  // no files: the model has no prompts
  ASSERT_TRUE(refused);
  EXPECT_EQ(describe(*refused),
            "prompt_name: 'query' is not a prompt of this model: it has none "
            "(config_sentence_transformers.json)");
  EncodeInput hinted = text_input("c", std::nullopt);
  hinted.prompt_hint = "clustering";  // Cohere's input_type the model does not name: no prompt
  ASSERT_FALSE(p.build(hinted));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{4}));
  hinted.prompt_hint = "query";
  ASSERT_FALSE(p.build(hinted));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 4}));
}

TEST(Prompts, TheDefaultAppliesToTextAndANamedPromptRefusesTokenIds) {
  Prompted p;
  p.prompts.default_name = "query";
  const std::vector<int32_t> ids{4, 4};
  EncodeInput input = text_input("c", std::nullopt);
  input.rows.push_back(Row::ids(ids));
  ASSERT_FALSE(p.build(input));  // the default: text rows only
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(p.out->sequences[1].token_ids.begin(),
                                 p.out->sequences[1].token_ids.end()),
            ids);
  input.prompt_name = "query";
  const auto refused = p.build(input);
  ASSERT_TRUE(refused);
  EXPECT_EQ(format_v1(*refused),
            "sequence 1: prompt_name: the prompt 'query' is put before text, and this row is "
            "token ids (send the text, or tokenize the prompt and the text yourself)");
}

TEST(Prompts, SpansAndCharactersStayTheCallersText) {
  Prompted p;
  const std::vector<TokenSpan> tokens{{0, 1}, {1, 3}};  // "c", "a b" of the text as sent
  const std::vector<TokenSpan> chars{{2, 3}};           // "a"
  EncodeInput input = text_input("c a b", "query");
  input.rows[0] = input.rows[0].with_spans(tokens).with_char_chunks(chars, false);
  ASSERT_FALSE(p.build(input));
  ASSERT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 4, 2, 3}));
  const std::span<const TokenSpan> run = p.out->sequences[0].spans;
  ASSERT_EQ(run.size(), 3u);
  EXPECT_EQ(run[0].begin, 2);  // past the prompt's two tokens
  EXPECT_EQ(run[0].end, 3);
  EXPECT_EQ(run[1].begin, 3);
  EXPECT_EQ(run[1].end, 5);
  EXPECT_EQ(run[2].begin, 3);  // the character span's token
  EXPECT_EQ(run[2].end, 4);
  for (size_t k = 0; k < 2; ++k) {
    const TokenSpan back = caller_tokens(*p.out, 0, run[k]);
    EXPECT_EQ(back.begin, tokens[k].begin);
    EXPECT_EQ(back.end, tokens[k].end);
  }
  const auto range = chunk_characters(*p.out, 0, run[2]);
  ASSERT_TRUE(range);
  EXPECT_EQ(range->first, 2u);
  EXPECT_EQ(range->second, 3u);
  // Windows cover the text's tokens only: 2 a window over "c a b".
  EncodeInput windows = text_input("c a b", "query");
  windows.rows[0] = windows.rows[0].with_windows(2, 0);
  ASSERT_FALSE(p.build(windows));
  const std::span<const TokenSpan> w = p.out->sequences[0].spans;
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].begin, 2);
  EXPECT_EQ(w[0].end, 4);
  EXPECT_EQ(w[1].begin, 4);
  EXPECT_EQ(w[1].end, 5);
}

TEST(Prompts, LateChunkingPutsThePromptBeforeTheDocumentInNoChunk) {
  Prompted p;
  const std::string a = "c", b = "a b";
  EncodeInput input;
  input.rows = {Row::from_text(a), Row::from_text(b)};
  input.late_chunking = true;
  input.prompt_name = "query";
  ASSERT_FALSE(p.build(input));
  EXPECT_EQ(p.out->ids[0], (std::vector<int32_t>{2, 3, 4, 2, 3}));
  const std::span<const TokenSpan> spans = p.out->sequences[0].spans;
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].begin, 2);
  EXPECT_EQ(spans[0].end, 3);
  EXPECT_EQ(spans[1].begin, 3);
  EXPECT_EQ(spans[1].end, 5);
}

TEST(Prompts, AMalformedFileIsRefusedNamingIt) {
  EXPECT_THROW(Prompts::parse(R"({"prompts": {"q": 1}})", "f.json"), std::invalid_argument);
  try {
    Prompts::parse(R"({"prompts": {"q": "x"}, "default_prompt_name": "p"})", "f.json");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "f.json: default_prompt_name \"p\" names no prompt ('q')");
  }
  const Prompts p = Prompts::parse(R"({"prompts": {"q": "x: "}, "default_prompt_name": "q"})", "f");
  EXPECT_EQ(Prompts::parse(p.to_json(), "again").by_name, p.by_name);
  EXPECT_EQ(Prompts::parse(p.to_json(), "again").default_name, "q");
}

TEST(EncodeInput, LogitsNeedAClassifierHead) {
  OutputOptions logits;
  logits.logits = true;
  EXPECT_EQ(check_options(logits, *served(false).model),
            std::optional<std::string>("this model has no classifier head (dense_linear)"));
  EXPECT_EQ(check_options(logits, *served(true).model), std::nullopt);
  EXPECT_EQ(check_options(OutputOptions{}, *served(false).model), std::nullopt);
}

// dimensions (OpenAI's today; the request layer's rule for every protocol): the first values,
// re-normalised to length 1 when normalize; checked against the hidden size.
TEST(OutputOptionsTest, DimensionsCutAndRenormalise) {
  std::vector<EncodedSequence> results(2);
  results[0].embedding = {3, 4, 12};  // the first two: (3, 4) / 5
  results[1].embedding = {0, 0, 1};   // a zero cut stays zero
  OutputOptions options;
  options.normalize = true;
  options.dimensions = 2;
  apply_dimensions(options, &results);
  EXPECT_EQ(results[0].embedding, (std::vector<float>{0.6f, 0.8f}));
  EXPECT_EQ(results[1].embedding, (std::vector<float>{0, 0}));
  std::vector<EncodedSequence> raw(1);
  raw[0].embedding = {3, 4, 12};
  options.normalize = false;  // cut only
  apply_dimensions(options, &raw);
  EXPECT_EQ(raw[0].embedding, (std::vector<float>{3, 4}));
  options.dimensions = 0;  // all of it
  raw[0].embedding = {3, 4, 12};
  apply_dimensions(options, &raw);
  EXPECT_EQ(raw[0].embedding.size(), 3u);
  // Span embeddings are cut the same way, each row of the pooled embedding's width.
  std::vector<EncodedSequence> spans(1);
  spans[0].embedding = {3, 4, 12};
  spans[0].span_embeddings = {3, 4, 12, 0, 5, 1, 6, 8, 0};
  options.normalize = true;
  options.dimensions = 2;
  apply_dimensions(options, &spans);
  EXPECT_EQ(spans[0].span_embeddings, (std::vector<float>{0.6f, 0.8f, 0, 1, 0.6f, 0.8f}));
  const engine::Model& model = *served(false).model;
  const int64_t hidden = model.config().hidden_size;
  EXPECT_EQ(check_dimensions(hidden, model), std::nullopt);
  EXPECT_EQ(
      check_dimensions(hidden + 1, model),
      std::to_string(hidden + 1) + " is over the model's hidden_size " + std::to_string(hidden));
}

// The C++ API's byte spans: whole characters only ("é" is 2 bytes, "€" 3).
TEST(LateChunkingText, ByteSpansBecomeCharacterSpansOrAreRefused) {
  const std::string text = "a\xC3\xA9 \xE2\x82\xAC!";  // a é space € !
  std::vector<TokenSpan> chars;
  const std::vector<TokenSpan> good{{0, 3}, {4, 7}, {0, 8}, {3, 3}};
  ASSERT_EQ(text::char_spans_of_bytes(text, good, &chars), std::nullopt);
  ASSERT_EQ(chars.size(), 4u);
  EXPECT_EQ(chars[0].begin, 0);
  EXPECT_EQ(chars[0].end, 2);
  EXPECT_EQ(chars[1].begin, 3);
  EXPECT_EQ(chars[1].end, 4);
  EXPECT_EQ(chars[2].end, 5);
  EXPECT_EQ(chars[3].begin, 2);
  const std::vector<TokenSpan> cut{{0, 2}};
  EXPECT_EQ(text::char_spans_of_bytes(text, cut, &chars),
            "byte span 0 [0, 2) cuts a character (byte 2 is inside the one at byte 1)");
  const std::vector<TokenSpan> inside{{5, 7}};
  EXPECT_EQ(text::char_spans_of_bytes(text, inside, &chars),
            "byte span 0 [5, 7) cuts a character (byte 5 is inside the one at byte 4)");
  const std::vector<TokenSpan> past{{0, 9}};
  EXPECT_EQ(text::char_spans_of_bytes(text, past, &chars),
            "byte span 0 [0, 9) is outside the text's 8 bytes");
}

// The sentence rule (docs/api.md): terminators and closers, the whitespace between left out.
TEST(LateChunkingText, SentencesEndAtTerminatorsBeforeWhitespace) {
  auto spans = [](std::u32string_view t) {
    std::vector<std::pair<int, int>> out;
    for (const TokenSpan s : text::sentence_spans(t)) out.emplace_back(s.begin, s.end);
    return out;
  };
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(spans(U"One. Two!  (Three?) four"), (P{{0, 4}, {5, 9}, {11, 19}, {20, 24}}));
  EXPECT_EQ(spans(U"3.14 is pi. Done."), (P{{0, 11}, {12, 17}}));
  EXPECT_EQ(spans(U"He said \"Go.\" Then left."), (P{{0, 13}, {14, 24}}));
  EXPECT_EQ(spans(U"\u4F60\u597D\u3002\u518D\u89C1\u3002"), (P{{0, 6}}));  // no space between
  EXPECT_EQ(spans(U"  no end  "), (P{{2, 8}}));
  EXPECT_EQ(spans(U""), P{});
}

}  // namespace
}  // namespace fastformer::request

namespace fastformer::request {
namespace {

// Macro-chunks on the 8-position model, overlap 2: a 20-token row runs as passes starting at
// 0, 6 and 12 (the last ending at the row's end); each span goes to the pass that holds it with
// the most context on both sides, the earlier on a tie (worked out by hand below).
TEST(MacroChunks, PassesStartEveryPMinusOverlapAndEachSpanGoesWhereItHasMostContext) {
  const Served& s = served(true);
  std::vector<int32_t> ids(20);
  for (int i = 0; i < 20; ++i) ids[size_t(i)] = 10 + i;
  const std::vector<TokenSpan> spans{{5, 7}, {7, 9}, {10, 13}, {6, 8}, {13, 20}, {0, 1}};
  const std::vector<int32_t> short_row{3, 4};
  EncodeInput input;
  input.rows = {Row::ids(short_row), Row::ids(ids).with_spans(spans)};
  // Without macro-chunks: refused, naming the limit.
  std::unique_ptr<Prepared> refused;
  auto problem = prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &refused);
  ASSERT_TRUE(problem);
  EXPECT_EQ(format_v1(*problem),
            "sequence 1: token_ids: 20 tokens exceed max_position_embeddings 8");
  input.macro_overlap_tokens = 2;
  std::unique_ptr<Prepared> out;
  ASSERT_FALSE(prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out));
  ASSERT_EQ(out->passes.size(), 2u);
  ASSERT_EQ(out->rows.size(), 2u);
  EXPECT_EQ(out->passes[0].first, 0);
  EXPECT_EQ(out->passes[0].count, 1);
  const RowPasses& plan = out->passes[1];
  EXPECT_EQ(plan.first, 1);
  EXPECT_EQ(plan.count, 3);
  EXPECT_EQ(plan.starts, (std::vector<int32_t>{0, 6, 12}));
  // [5,7): only pass 0 ([0,8)); [7,9): pass 1 (context 1 and 5); [10,13): pass 1 (4 and 1;
  // pass 2 starts at 12); [6,8): passes 0 and 1 both give context 0, the earlier wins;
  // [13,20): pass 2 only; [0,1): pass 0.
  EXPECT_EQ(plan.span_pass, (std::vector<int32_t>{0, 1, 1, 0, 2, 0}));
  EXPECT_EQ(plan.span_index, (std::vector<int32_t>{0, 0, 1, 1, 0, 2}));
  ASSERT_EQ(out->sequences.size(), 4u);
  EXPECT_EQ(out->sequences[2].token_ids.front(), 16);  // pass 1 starts at token 6
  EXPECT_EQ(out->sequences[3].token_ids.size(), 8u);
  EXPECT_EQ(out->sequences[3].token_ids.back(), 29);
  ASSERT_EQ(out->sequences[2].spans.size(), 2u);
  EXPECT_EQ(out->sequences[2].spans[0].begin, 1);  // [7,9) in pass 1's positions
  EXPECT_EQ(out->sequences[2].spans[1].end, 7);    // [10,13) -> [4,7)
  EXPECT_EQ(out->rows[1].token_ids.size(), 20u);
  // A span of more than overlap + 1 tokens that crosses a pass boundary fits no pass.
  const std::vector<TokenSpan> wide{{5, 10}};
  input.rows[1] = Row::ids(ids).with_spans(wide);
  problem = prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out);
  ASSERT_TRUE(problem);
  EXPECT_EQ(format_v1(*problem),
            "sequence 1: spans: span 0 [5, 10) lies in no single macro-chunk: passes of "
            "max_position_embeddings 8 tokens start every 6 tokens (macro_overlap_tokens 2), so a "
            "chunk of at most 3 tokens always fits one; raise macro_overlap_tokens or cut the "
            "chunk");
  // The token budget counts what the passes compute (3 passes of 8) beside the 2-token row.
  input.rows[1] = Row::ids(ids);
  problem = prepare(input, *s.model, s.tokenizer.get(), Limits{25}, &out);
  ASSERT_TRUE(problem);
  EXPECT_EQ(format_v1(*problem),
            "sequences: the request has 26 tokens, over max_request_tokens 25");
  EXPECT_FALSE(prepare(input, *s.model, s.tokenizer.get(), Limits{26}, &out));
  // The overlap must leave a pass room to move; truncation and logits are refused with them.
  input.macro_overlap_tokens = 8;
  problem = prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out);
  ASSERT_TRUE(problem);
  EXPECT_EQ(format_v1(*problem),
            "macro_overlap_tokens: 8 must be in [0, max_position_embeddings 8)");
  input.macro_overlap_tokens = 0;
  input.truncate = Truncate::kRight;
  problem = prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out);
  ASSERT_TRUE(problem);
  EXPECT_EQ(describe(*problem),
            "macro_overlap_tokens: macro-chunks keep the whole row, truncation cuts it: ask for "
            "one of them");
  input.truncate = Truncate::kNone;
  input.options.logits = true;
  problem = prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out);
  ASSERT_TRUE(problem);
  EXPECT_EQ(format_v1(*problem),
            "sequence 1: macro_overlap_tokens: logits are not served for a row over "
            "max_position_embeddings 8 run as macro-chunks (a classification is one pass)");
  // Overlap 0: passes 0, 8 and 12 (the last one ends at 20).
  input.options.logits = false;
  ASSERT_FALSE(prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out));
  EXPECT_EQ(out->passes[1].starts, (std::vector<int32_t>{0, 8, 12}));
  // Rows that all fit one pass leave the request as it was.
  input.rows = {Row::ids(short_row)};
  ASSERT_FALSE(prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out));
  EXPECT_TRUE(out->passes.empty());
  ASSERT_EQ(out->rows.size(), 1u);  // the rows as sent, here the sequences
  EXPECT_EQ(out->rows[0].token_ids.data(), out->sequences[0].token_ids.data());
}

// A late-chunked (Jina form) document over the positions runs as passes too.
TEST(MacroChunks, LateChunkedDocumentsOverThePositions) {
  const Served& s = served(true);
  const std::string a = "a b c a b", b = "c a b c a";  // 10 tokens (no special tokens here)
  EncodeInput input;
  input.rows = {Row::from_text(a), Row::from_text(b)};
  input.late_chunking = true;
  std::unique_ptr<Prepared> out;
  auto problem = prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out);
  ASSERT_TRUE(problem);
  EXPECT_NE(describe(*problem).find("over max_position_embeddings 8"), std::string::npos);
  input.macro_overlap_tokens = 4;  // passes at 0 and 2 (the last ends at token 10)
  ASSERT_FALSE(prepare(input, *s.model, s.tokenizer.get(), Limits{1000}, &out));
  ASSERT_EQ(out->passes.size(), 1u);
  EXPECT_EQ(out->passes[0].starts, (std::vector<int32_t>{0, 2}));
  // Chunk 0 [0,5): pass 0 (context 0 and 3); chunk 1 [5,10): pass 1 ([2,10): 3 and 0).
  EXPECT_EQ(out->passes[0].span_pass, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(out->rows.size(), 1u);
}

// merge_passes by hand: the row's embedding is the mean of its passes' (re-normalised when
// normalize), each chunk comes from its pass, each token from the pass with most context.
TEST(MacroChunks, MergeMakesOneResultPerRow) {
  batching::Job r;
  Prepared prepared;
  const std::vector<int32_t> ids(12, 5);
  const std::vector<TokenSpan> row_spans{{0, 2}, {9, 12}};
  SequenceInput row;
  row.token_ids = ids;
  row.spans = row_spans;
  prepared.rows = {row};
  RowPasses plan;
  plan.first = 0;
  plan.count = 2;
  plan.starts = {0, 4};  // passes of 8 tokens: [0,8) and [4,12)
  plan.span_pass = {0, 1};
  plan.span_index = {0, 0};
  prepared.passes = {plan};
  r.sequences.resize(2);
  r.results.resize(2);
  for (int w = 0; w < 2; ++w) {
    EncodedSequence& e = r.results[size_t(w)];
    e.num_tokens = 8;
    e.embedding = w == 0 ? std::vector<float>{1, 0} : std::vector<float>{0, 1};
    e.span_embeddings = w == 0 ? std::vector<float>{7, 7} : std::vector<float>{9, 9};
    for (int t = 0; t < 8; ++t)
      e.token_embeddings.insert(e.token_embeddings.end(), {float(w), float(t)});
  }
  r.options.normalize = true;
  merge_passes(prepared, &r);
  ASSERT_EQ(r.results.size(), 1u);
  ASSERT_EQ(r.sequences.size(), 1u);
  EXPECT_EQ(r.sequences[0].token_ids.size(), 12u);
  const float h = float(1 / std::sqrt(2.0));
  EXPECT_FLOAT_EQ(r.results[0].embedding[0], h);
  EXPECT_FLOAT_EQ(r.results[0].embedding[1], h);
  EXPECT_EQ(r.results[0].span_embeddings, (std::vector<float>{7, 7, 9, 9}));
  EXPECT_EQ(r.results[0].num_tokens, 12);
  // Tokens 0-5 from pass 0 (token 5: context 5 and 2 there, 1 and 6 in pass 1; token 6: 6 and 1
  // against 2 and 5, so pass 1), 6-11 from pass 1 at their positions minus 4.
  std::vector<float> expect;
  for (int t = 0; t < 12; ++t) {
    if (t < 6)
      expect.insert(expect.end(), {0.0f, float(t)});
    else
      expect.insert(expect.end(), {1.0f, float(t - 4)});
  }
  EXPECT_EQ(r.results[0].token_embeddings, expect);
}

}  // namespace
}  // namespace fastformer::request
