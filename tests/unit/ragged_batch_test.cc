// validate_sequence (every bad input, each message naming the sequence) and RaggedBatch.
#include "server/engine/ragged_batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fastformer::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

ModelConfig small_config() {
  ModelConfig c;
  c.hidden_size = 4;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.intermediate_size = 8;
  c.max_position_embeddings = 6;
  c.vocab_size = 10;
  c.pad_token_id = 0;
  return c;
}

// The error for `s` at request position `index`; fails the test if the sequence is valid.
std::string error_for(const SequenceInput& s, size_t index, bool has_words = true,
                      const ModelConfig& c = small_config()) {
  const auto err = validate_sequence(c, has_words, s, index);
  if (!err) {
    ADD_FAILURE() << "sequence accepted";
    return "";
  }
  EXPECT_EQ(err->sequence_index, index);
  const std::string text = err->to_string();
  EXPECT_THAT(text, StartsWith("sequence " + std::to_string(index) + ": " + err->field + ": "));
  EXPECT_EQ(text, "sequence " + std::to_string(index) + ": " + err->field + ": " + err->message);
  return text;
}

SequenceInput ids(const std::vector<int32_t>& v) { return SequenceInput{v, {}}; }
SequenceInput embeddings(const std::vector<float>& v) { return SequenceInput{{}, v}; }

TEST(ValidateSequenceTest, ValidInputs) {
  const ModelConfig c = small_config();
  const std::vector<int32_t> a = {1, 2, 0, 9};
  EXPECT_FALSE(validate_sequence(c, true, ids(a), 0));
  const std::vector<int32_t> full = {1, 2, 3, 4, 5, 6};  // exactly max_position_embeddings
  EXPECT_FALSE(validate_sequence(c, true, ids(full), 0));
  const std::vector<float> e(8, 0.5f);  // two rows of hidden_size 4
  EXPECT_FALSE(validate_sequence(c, true, embeddings(e), 0));
  EXPECT_FALSE(validate_sequence(c, false, embeddings(e), 0));  // embeddings need no word table
  const std::vector<float> max_rows(24, -1.0f);
  EXPECT_FALSE(validate_sequence(c, false, embeddings(max_rows), 0));
  // All-zero embedding rows are real tokens (the mask is 1 for embeddings).
  const std::vector<float> zeros(4, 0.0f);
  EXPECT_FALSE(validate_sequence(c, false, embeddings(zeros), 0));
}

TEST(ValidateSequenceTest, Empty) {
  const std::string msg = error_for(SequenceInput{}, 3);
  EXPECT_THAT(msg, StartsWith("sequence 3: "));
  EXPECT_THAT(msg, HasSubstr("empty sequence"));
}

TEST(ValidateSequenceTest, BothIdsAndEmbeddings) {
  const std::vector<int32_t> a = {1, 2};
  const std::vector<float> e(4, 1.0f);
  const std::string msg = error_for(SequenceInput{a, e}, 1);
  EXPECT_THAT(msg, StartsWith("sequence 1: "));
  EXPECT_THAT(msg, HasSubstr("token_ids"));
  EXPECT_THAT(msg, HasSubstr("input_embeddings"));
  EXPECT_THAT(msg, HasSubstr("not both"));
}

TEST(ValidateSequenceTest, AllPad) {
  const std::vector<int32_t> a = {0, 0, 0};
  const std::string msg = error_for(ids(a), 2);
  EXPECT_THAT(msg, StartsWith("sequence 2: token_ids: "));
  EXPECT_THAT(msg, HasSubstr("pad_token_id 0"));

  // With another pad id, 0 is a real token and the pad id is what counts.
  ModelConfig c = small_config();
  c.pad_token_id = 7;
  EXPECT_FALSE(validate_sequence(c, true, ids(a), 0));
  const std::vector<int32_t> sevens = {7, 7};
  EXPECT_THAT(error_for(ids(sevens), 0, true, c), HasSubstr("pad_token_id 7"));
}

TEST(ValidateSequenceTest, NegativeId) {
  const std::vector<int32_t> a = {1, 2, -1};
  const std::string msg = error_for(ids(a), 4);
  EXPECT_THAT(msg, StartsWith("sequence 4: token_ids: "));
  EXPECT_THAT(msg, HasSubstr("token 2 has id -1"));
  EXPECT_THAT(msg, HasSubstr("vocab_size 10"));
}

TEST(ValidateSequenceTest, IdEqualToVocabSize) {
  const std::vector<int32_t> a = {10};
  const std::string msg = error_for(ids(a), 0);
  EXPECT_THAT(msg, StartsWith("sequence 0: token_ids: "));
  EXPECT_THAT(msg, HasSubstr("token 0 has id 10"));
  EXPECT_THAT(msg, HasSubstr("vocab_size 10"));

  const std::vector<int32_t> huge = {3, std::numeric_limits<int32_t>::max()};
  EXPECT_THAT(error_for(ids(huge), 0), HasSubstr("token 1 has id 2147483647"));
}

TEST(ValidateSequenceTest, TooManyTokens) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7};
  const std::string msg = error_for(ids(a), 5);
  EXPECT_THAT(msg, StartsWith("sequence 5: token_ids: "));
  EXPECT_THAT(msg, HasSubstr("7 tokens"));
  EXPECT_THAT(msg, HasSubstr("max_position_embeddings 6"));

  const std::vector<float> e(28, 0.0f);  // 7 rows
  const std::string emsg = error_for(embeddings(e), 6);
  EXPECT_THAT(emsg, StartsWith("sequence 6: input_embeddings: "));
  EXPECT_THAT(emsg, HasSubstr("7 rows"));
  EXPECT_THAT(emsg, HasSubstr("max_position_embeddings 6"));
}

TEST(ValidateSequenceTest, EmbeddingsNotMultipleOfHidden) {
  for (size_t n : {1u, 3u, 5u, 7u}) {
    const std::vector<float> e(n, 0.25f);
    const std::string msg = error_for(embeddings(e), 7);
    EXPECT_THAT(msg, StartsWith("sequence 7: input_embeddings: "));
    EXPECT_THAT(msg, HasSubstr(std::to_string(n) + " values"));
    EXPECT_THAT(msg, HasSubstr("hidden_size 4"));
  }
}

TEST(ValidateSequenceTest, NonFiniteEmbeddings) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> e(12, 0.5f);
    e[6] = bad;  // row 1, column 2
    const std::string msg = error_for(embeddings(e), 8);
    EXPECT_THAT(msg, StartsWith("sequence 8: input_embeddings: "));
    EXPECT_THAT(msg, HasSubstr("row 1 column 2"));
    EXPECT_THAT(msg, HasSubstr("not finite"));
  }
}

TEST(ValidateSequenceTest, IdsWithoutWordEmbedding) {
  const std::vector<int32_t> a = {1, 2};
  const std::string msg = error_for(ids(a), 9, /*has_words=*/false);
  EXPECT_THAT(msg, StartsWith("sequence 9: token_ids: "));
  EXPECT_THAT(msg, HasSubstr("no word embedding"));
  EXPECT_THAT(msg, HasSubstr("input_embeddings"));
}

TEST(SequenceLengthTest, CountsIdsOrRows) {
  const std::vector<int32_t> a = {1, 2, 3};
  const std::vector<float> e(12, 0.0f);
  EXPECT_EQ(sequence_length(ids(a), 4), 3);
  EXPECT_EQ(sequence_length(embeddings(e), 4), 3);
  EXPECT_EQ(sequence_length(SequenceInput{}, 4), 0);
}

TEST(RaggedBatchTest, AddPacksSequences) {
  const ModelConfig c = small_config();
  RaggedBatch batch;
  EXPECT_EQ(batch.num_sequences(), 0);
  EXPECT_EQ(batch.num_tokens(), 0);

  const std::vector<int32_t> a = {5, 0, 3};
  const std::vector<float> e = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 rows
  const std::vector<int32_t> b = {9, 8, 7, 6, 0};
  const std::vector<float> e2 = {-1, -2, -3, -4};  // 1 row
  batch.add(ids(a), c);
  batch.add(embeddings(e), c);
  batch.add(ids(b), c);
  batch.add(embeddings(e2), c);

  EXPECT_EQ(batch.num_sequences(), 4);
  EXPECT_EQ(batch.num_tokens(), 11);
  EXPECT_THAT(batch.cu_seqlens, ElementsAre(0, 3, 5, 10, 11));
  EXPECT_THAT(batch.position_ids, ElementsAre(0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0));
  EXPECT_THAT(batch.token_ids,
              ElementsAre(5, 0, 3, kEmbeddingRow, kEmbeddingRow, 9, 8, 7, 6, 0, kEmbeddingRow));
  EXPECT_THAT(batch.embedding_index, ElementsAre(-1, -1, -1, 0, 1, -1, -1, -1, -1, -1, 2));
  EXPECT_THAT(batch.mask, ElementsAre(1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1));
  EXPECT_THAT(batch.input_embeddings, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4));

  batch.clear();
  EXPECT_EQ(batch.num_sequences(), 0);
  EXPECT_EQ(batch.num_tokens(), 0);
  EXPECT_THAT(batch.cu_seqlens, ElementsAre(0));
  EXPECT_TRUE(batch.token_ids.empty());
  EXPECT_TRUE(batch.embedding_index.empty());
  EXPECT_TRUE(batch.input_embeddings.empty());
  EXPECT_TRUE(batch.mask.empty());
  EXPECT_TRUE(batch.position_ids.empty());

  // Reusable after clear: rows restart at 0.
  batch.add(embeddings(e2), c);
  EXPECT_THAT(batch.embedding_index, ElementsAre(0));
  EXPECT_THAT(batch.cu_seqlens, ElementsAre(0, 1));
}

// A pass of the forward graph (workspace.h) is sequences first .. last-1 of a batch as a batch of
// their own: rows, input embeddings and spans renumbered from the first's first row.
TEST(RaggedBatchTest, SequencesMakeABatchOfTheirOwn) {
  const ModelConfig c = small_config();
  const std::vector<int32_t> a = {5, 0, 3};
  const std::vector<float> e = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 rows
  const std::vector<int32_t> b = {9, 8, 7, 6, 0};
  const std::vector<float> e2 = {-1, -2, -3, -4};  // 1 row
  const std::vector<TokenSpan> a_spans = {{0, 2}}, b_spans = {{1, 4}, {0, 5}};
  RaggedBatch batch;
  batch.add(SequenceInput{a, {}, a_spans}, c);
  batch.add(embeddings(e), c);
  batch.add(SequenceInput{b, {}, b_spans}, c);
  batch.add(embeddings(e2), c);
  ASSERT_THAT(batch.spans.size(), 3u);

  const RaggedBatch middle = batch.sequences(1, 3, c.hidden_size);
  EXPECT_EQ(middle.num_sequences(), 2);
  EXPECT_THAT(middle.cu_seqlens, ElementsAre(0, 2, 7));
  EXPECT_THAT(middle.token_ids, ElementsAre(kEmbeddingRow, kEmbeddingRow, 9, 8, 7, 6, 0));
  EXPECT_THAT(middle.embedding_index, ElementsAre(0, 1, -1, -1, -1, -1, -1));
  EXPECT_THAT(middle.input_embeddings, ElementsAreArray(e));
  EXPECT_THAT(middle.position_ids, ElementsAre(0, 1, 0, 1, 2, 3, 4));
  EXPECT_THAT(middle.mask, ElementsAre(1, 1, 1, 1, 1, 1, 0));
  EXPECT_THAT(middle.span_first, ElementsAre(0, 0, 2));  // b's spans, from row 2
  ASSERT_EQ(middle.spans.size(), 2u);
  EXPECT_EQ(middle.spans[0].begin, 3);
  EXPECT_EQ(middle.spans[0].end, 6);
  EXPECT_EQ(middle.spans[1].begin, 2);
  EXPECT_EQ(middle.spans[1].end, 7);

  // The last alone: its embedding row renumbered to 0; the first alone: no embeddings.
  const RaggedBatch last = batch.sequences(3, 4, c.hidden_size);
  EXPECT_THAT(last.cu_seqlens, ElementsAre(0, 1));
  EXPECT_THAT(last.embedding_index, ElementsAre(0));
  EXPECT_THAT(last.input_embeddings, ElementsAreArray(e2));
  EXPECT_THAT(last.span_first, ElementsAre(0, 0));
  const RaggedBatch first = batch.sequences(0, 1, c.hidden_size);
  EXPECT_THAT(first.token_ids, ElementsAre(5, 0, 3));
  EXPECT_THAT(first.mask, ElementsAre(1, 0, 1));
  EXPECT_TRUE(first.input_embeddings.empty());
  EXPECT_THAT(first.span_first, ElementsAre(0, 1));
  ASSERT_EQ(first.spans.size(), 1u);
  EXPECT_EQ(first.spans[0].end, 2);
  // All of them: the batch itself.
  const RaggedBatch all = batch.sequences(0, 4, c.hidden_size);
  EXPECT_EQ(all.cu_seqlens, batch.cu_seqlens);
  EXPECT_EQ(all.embedding_index, batch.embedding_index);
  EXPECT_EQ(all.input_embeddings, batch.input_embeddings);
  EXPECT_EQ(all.span_first, batch.span_first);
}

TEST(RaggedBatchTest, MaskUsesConfiguredPadId) {
  ModelConfig c = small_config();
  c.pad_token_id = 3;
  RaggedBatch batch;
  const std::vector<int32_t> a = {0, 3, 1, 3};
  batch.add(ids(a), c);
  EXPECT_THAT(batch.mask, ElementsAre(1, 0, 1, 0));
}

}  // namespace
}  // namespace fastformer::engine
