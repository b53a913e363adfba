// Model::load: complete models in every storage dtype and naming, shared layers, and the
// all-problems-at-once error report.
#include "server/engine/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/half.h"
#include "server/engine/error.h"
#include "tests/support/test_models.h"

namespace fastformer::engine {
namespace {

using test::error_of;
using test::TensorSpec;
using test::TinyModel;
using test::TinyModelSpec;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelTest : public ::testing::Test {
 protected:
  std::string load_error(const std::filesystem::path& dir) {
    return error_of<ModelError>([&] { Model::load(dir); });
  }
  test::TempDir root_;
};

// Expects `got[0..n)` to equal the tensor `name` of `m` exactly.
void expect_tensor(const TinyModel& m, const std::string& name, const float* got) {
  ASSERT_NE(got, nullptr) << name;
  const auto it = m.tensors.find(name);
  ASSERT_NE(it, m.tensors.end()) << name;
  const std::vector<float>& want = it->second.values;
  size_t mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) mismatches += got[i] != want[i];
  EXPECT_EQ(mismatches, 0u) << name;
}

void expect_linear(const TinyModel& m, const std::string& name, const Linear& l, int64_t out,
                   int64_t in) {
  EXPECT_EQ(l.out, out) << name;
  EXPECT_EQ(l.in, in) << name;
  expect_tensor(m, name + ".weight", l.weight);
  expect_tensor(m, name + ".bias", l.bias);
}

void expect_layernorm(const TinyModel& m, const std::string& name, const LayerNorm& ln) {
  expect_tensor(m, name + ".weight", ln.gamma);
  expect_tensor(m, name + ".bias", ln.beta);
}

// Every weight of the loaded model equals what was written.
void expect_weights(const TinyModel& m, const TinyModelSpec& s, const Model& model) {
  const ModelWeights& w = model.weights();
  const std::string p = s.bare ? "" : "fastformer_model.";
  const int64_t D = s.hidden, H = s.heads, I = s.intermediate;
  if (s.word_embedding) expect_tensor(m, "word_embedding.weight", w.word_embedding);
  expect_tensor(m, p + "position_embeddings.weight", w.position_embeddings);
  expect_layernorm(m, p + "LayerNorm", w.embedding_layernorm);
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), s.layers);
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string l = p + "encoders." + std::to_string(s.shared_layers ? 0 : i) + ".";
    const LayerWeights& lw = w.layers[size_t(i)];
    expect_linear(m, l + "attention.self.query", lw.query, D, D);
    expect_linear(m, l + "attention.self.query_att", lw.query_att, H, D);
    expect_linear(m, l + "attention.self.key", lw.key, D, D);
    expect_linear(m, l + "attention.self.key_att", lw.key_att, H, D);
    expect_linear(m, l + "attention.self.transform", lw.transform, D, D);
    expect_linear(m, l + "attention.output.dense", lw.attention_output, D, D);
    expect_layernorm(m, l + "attention.output.LayerNorm", lw.attention_layernorm);
    expect_linear(m, l + "intermediate.dense", lw.intermediate, I, D);
    expect_linear(m, l + "output.dense", lw.output, D, I);
    expect_layernorm(m, l + "output.LayerNorm", lw.output_layernorm);
  }
  expect_linear(m, p + "poolers.0.att_fc1", w.pooler_fc1, D, D);
  expect_linear(m, p + "poolers.0.att_fc2", w.pooler_fc2, 1, D);
  if (s.num_labels > 0) {
    expect_linear(m, "dense_linear", w.classifier, s.num_labels, D);
  } else {
    EXPECT_EQ(w.classifier.weight, nullptr);
  }
}

int64_t parameter_count(const TinyModel& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.tensors) n += static_cast<int64_t>(t.values.size());
  return n;
}

class ModelDtypeTest : public ModelTest, public ::testing::WithParamInterface<DType> {};

TEST_P(ModelDtypeTest, CompleteModelLoads) {
  TinyModelSpec s;
  s.dtype = GetParam();
  s.num_labels = 3;
  s.vocab = 50;
  TinyModel m = test::make_tiny_model(s);
  // A few hand-picked values at the start of word_embedding, exactly representable in
  // every dtype: their loaded float32 values are known without any conversion code.
  std::vector<float>& we = m.tensors["word_embedding.weight"].values;
  const float exact[] = {1.0f, -2.0f, 0.5f, -0.375f, 0.0f, -0.0f, 3.0f, 0.25f};
  std::copy(std::begin(exact), std::end(exact), we.begin());
  if (s.dtype == DType::kF16) {
    we[8] = 0.333251953125f;        // 0x3555
    we[9] = std::ldexp(1.0f, -24);  // the smallest subnormal half, 0x0001
    we[10] = 65504.0f;              // 0x7BFF
  } else if (s.dtype == DType::kBF16) {
    we[8] = 0.333984375f;             // 0x3EAB
    we[9] = std::ldexp(1.0f, -133);   // the smallest subnormal bfloat16, 0x0001
    we[10] = 3.3895313892515355e38f;  // largest finite bfloat16, 0x7F7F
  }
  const auto dir = root_ / "m";
  test::write_model(dir, m);

  const auto model = Model::load(dir);
  EXPECT_EQ(model->stored_dtype(), dtype_name(s.dtype));
  EXPECT_EQ(model->parameter_count(), parameter_count(m));
  EXPECT_EQ(model->weight_bytes(), parameter_count(m) * 4);
  EXPECT_TRUE(model->has_word_embedding());
  EXPECT_EQ(model->num_labels(), 3);
  EXPECT_EQ(model->config().hidden_size, 32);
  EXPECT_EQ(model->config().model_name, "tiny");

  const float* loaded = model->weights().word_embedding;
  for (size_t i = 0; i < std::size(exact); ++i) EXPECT_EQ(loaded[i], exact[i]) << i;
  EXPECT_TRUE(std::signbit(loaded[5]));  // -0.0 keeps its sign
  if (s.dtype == DType::kF16) {
    EXPECT_EQ(loaded[8], 0.333251953125f);
    EXPECT_EQ(loaded[9], std::ldexp(1.0f, -24));
    EXPECT_EQ(loaded[10], 65504.0f);
  } else if (s.dtype == DType::kBF16) {
    EXPECT_EQ(loaded[8], 0.333984375f);
    EXPECT_EQ(loaded[9], std::ldexp(1.0f, -133));
    EXPECT_EQ(loaded[10], 3.3895313892515355e38f);
  }
  expect_weights(m, s, *model);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, ModelDtypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_F(ModelTest, F16ValuesConvertFromWrittenBits) {
  // Write raw half bit patterns for position_embeddings and compare with hand-computed floats.
  TinyModelSpec s;
  s.dtype = DType::kF16;
  TinyModel m = test::make_tiny_model(s);
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  const TensorSpec& pos = m.tensors.at("fastformer_model.position_embeddings.weight");
  const float* got = model->weights().position_embeddings;
  for (size_t i = 0; i < pos.values.size(); ++i) {
    // The value written is float_to_half(v); loading must give back exactly v (v is a half).
    ASSERT_EQ(got[i], half_to_float(float_to_half(pos.values[i]))) << i;
  }
}

TEST_F(ModelTest, MixedDtypesLoad) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  auto& ln = m.tensors["fastformer_model.LayerNorm.weight"];
  ln.dtype = DType::kBF16;
  for (float& v : ln.values) v = test::round_to_dtype(v, DType::kBF16);
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  EXPECT_EQ(model->stored_dtype(), "mixed");
  expect_weights(m, s, *model);
}

TEST_F(ModelTest, UnalignedF32DataLoads) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  const auto dir = root_ / "m";
  std::filesystem::create_directories(dir);
  test::write_file(dir / "config.json", m.config.dump());
  test::write_safetensors(dir / "model.safetensors", m.tensors, /*align=*/false);
  const auto model = Model::load(dir);
  expect_weights(m, s, *model);
}

TEST_F(ModelTest, BareEncoderNamesLoad) {
  TinyModelSpec s;
  s.bare = true;
  s.word_embedding = false;
  TinyModel m = test::make_tiny_model(s);
  ASSERT_TRUE(m.tensors.count("position_embeddings.weight"));
  const auto dir = root_ / "bare";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  EXPECT_FALSE(model->has_word_embedding());
  expect_weights(m, s, *model);

  // A bare encoder with a top-level word embedding loads too.
  s.word_embedding = true;
  m = test::make_tiny_model(s);
  test::write_model(dir, m);
  const auto with_words = Model::load(dir);
  EXPECT_TRUE(with_words->has_word_embedding());
  expect_weights(m, s, *with_words);
}

TEST_F(ModelTest, SharedLayersPointAtLayerZero) {
  TinyModelSpec s;
  s.shared_layers = true;
  s.layers = 3;
  TinyModel m = test::make_tiny_model(s);
  ASSERT_FALSE(m.tensors.count("fastformer_model.encoders.1.attention.self.query.weight"));
  const auto dir = root_ / "shared";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  EXPECT_TRUE(model->config().share_layer_parameters);
  const auto& layers = model->weights().layers;
  ASSERT_EQ(layers.size(), 3u);
  for (size_t i = 1; i < layers.size(); ++i) {
    const LayerWeights& a = layers[0];
    const LayerWeights& b = layers[i];
    for (auto [x, y] : {std::pair{a.query, b.query},
                        {a.query_att, b.query_att},
                        {a.key, b.key},
                        {a.key_att, b.key_att},
                        {a.transform, b.transform},
                        {a.attention_output, b.attention_output},
                        {a.intermediate, b.intermediate},
                        {a.output, b.output}}) {
      EXPECT_EQ(x.weight, y.weight) << i;
      EXPECT_EQ(x.bias, y.bias) << i;
    }
    EXPECT_EQ(a.attention_layernorm.gamma, b.attention_layernorm.gamma);
    EXPECT_EQ(a.attention_layernorm.beta, b.attention_layernorm.beta);
    EXPECT_EQ(a.output_layernorm.gamma, b.output_layernorm.gamma);
    EXPECT_EQ(a.output_layernorm.beta, b.output_layernorm.beta);
  }
  expect_weights(m, s, *model);
  EXPECT_EQ(model->parameter_count(), parameter_count(m));  // stored once, counted once
}

TEST_F(ModelTest, SharedConfigWithPerLayerTensorsReportsUnexpected) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);  // two stored layers
  m.config["share_layer_parameters"] = true;
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("unexpected tensors"));
  EXPECT_THAT(msg, HasSubstr("fastformer_model.encoders.1.attention.self.query.weight"));
}

TEST_F(ModelTest, MissingMisshapedAndUnexpectedAreAllListed) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  m.tensors.erase("fastformer_model.encoders.1.attention.self.key.bias");
  m.tensors.erase("fastformer_model.poolers.0.att_fc2.weight");
  m.tensors["fastformer_model.encoders.0.attention.output.dense.weight"] = {
      {31, 32}, std::vector<float>(31 * 32, 0.0f), DType::kF32};
  m.tensors["fastformer_model.encoders.2.attention.self.query.weight"] = {
      {32, 32}, std::vector<float>(32 * 32, 0.0f), DType::kF32};
  m.tensors["extra.tensor"] = {{3}, {1, 2, 3}, DType::kF32};
  const auto dir = root_ / "broken";
  test::write_model(dir, m);

  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr((dir / "model.safetensors").string()));
  EXPECT_THAT(msg, HasSubstr("missing tensors (2)"));
  EXPECT_THAT(
      msg, HasSubstr("fastformer_model.encoders.1.attention.self.key.bias (expected shape [32])"));
  EXPECT_THAT(msg, HasSubstr("fastformer_model.poolers.0.att_fc2.weight (expected shape [1, 32])"));
  EXPECT_THAT(msg, HasSubstr("mis-shaped tensors (1)"));
  EXPECT_THAT(msg, HasSubstr("fastformer_model.encoders.0.attention.output.dense.weight: "
                             "expected shape [32, 32], found [31, 32]"));
  EXPECT_THAT(msg, HasSubstr("unexpected tensors (2)"));
  EXPECT_THAT(msg, HasSubstr("fastformer_model.encoders.2.attention.self.query.weight [32, 32]"));
  EXPECT_THAT(msg, HasSubstr("extra.tensor [3]"));
}

TEST_F(ModelTest, WordEmbeddingRowsMustMatchVocab) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  m.config["vocab_size"] = 120;  // the table has 100 rows
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr((dir / "model.safetensors").string()));
  EXPECT_THAT(msg, HasSubstr("word_embedding.weight has 100 rows"));
  EXPECT_THAT(msg, HasSubstr("vocab_size is 120"));
}

TEST_F(ModelTest, WordEmbeddingWrongWidth) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  m.tensors["word_embedding.weight"] = {{100, 16}, std::vector<float>(1600, 0.0f), DType::kF32};
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("mis-shaped tensors"));
  EXPECT_THAT(msg, HasSubstr("word_embedding.weight: expected shape [N, 32], found [100, 16]"));
  EXPECT_THAT(msg, Not(HasSubstr("unexpected tensors")));
}

TEST_F(ModelTest, NumLabelsMustMatchDenseLinear) {
  TinyModelSpec s;
  s.num_labels = 3;
  TinyModel m = test::make_tiny_model(s);
  m.config["num_labels"] = 5;
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("num_labels is 5"));
  EXPECT_THAT(msg, HasSubstr("dense_linear has 3 outputs"));

  // num_labels given but no head at all.
  s.num_labels = 0;
  m = test::make_tiny_model(s);
  m.config["num_labels"] = 2;
  test::write_model(dir, m);
  msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("num_labels is 2"));
  EXPECT_THAT(msg, HasSubstr("dense_linear has 0 outputs"));

  // num_labels 0 and no head is consistent.
  m.config["num_labels"] = 0;
  test::write_model(dir, m);
  EXPECT_EQ(Model::load(dir)->num_labels(), 0);
}

TEST_F(ModelTest, DenseLinearBiasWithoutWeight) {
  TinyModelSpec s;
  s.num_labels = 3;
  TinyModel m = test::make_tiny_model(s);
  m.config.erase("num_labels");
  m.tensors.erase("dense_linear.weight");
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("dense_linear.bias is present without dense_linear.weight"));
}

TEST_F(ModelTest, DenseLinearWithoutConfigNumLabelsLoads) {
  TinyModelSpec s;
  s.num_labels = 7;
  TinyModel m = test::make_tiny_model(s);
  m.config.erase("num_labels");
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  EXPECT_EQ(model->num_labels(), 7);
  expect_weights(m, s, *model);
}

TEST_F(ModelTest, WithoutWordEmbeddingLoads) {
  TinyModelSpec s;
  s.word_embedding = false;
  TinyModel m = test::make_tiny_model(s);
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  EXPECT_FALSE(model->has_word_embedding());
  EXPECT_EQ(model->weights().word_embedding, nullptr);
  EXPECT_EQ(model->num_labels(), 0);
  expect_weights(m, s, *model);
}

TEST_F(ModelTest, ModelNameDefaultsToDirectoryName) {
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  m.config.erase("model_name");
  const auto dir = root_ / "news-encoder";
  test::write_model(dir, m);
  EXPECT_EQ(Model::load(dir)->config().model_name, "news-encoder");
}

TEST_F(ModelTest, MissingDirectory) {
  const auto dir = root_ / "nope";
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr(dir.string()));
  EXPECT_THAT(msg, HasSubstr("does not exist"));

  // A regular file is not a model directory.
  test::write_file(root_ / "file", "x");
  EXPECT_THAT(load_error(root_ / "file"), HasSubstr("not a directory"));
}

TEST_F(ModelTest, MissingConfigJson) {
  const auto dir = test::write_tiny_model(root_.path(), "m", TinyModelSpec{});
  std::filesystem::remove(dir / "config.json");
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr((dir / "config.json").string()));
  EXPECT_THAT(msg, HasSubstr("cannot open"));
}

TEST_F(ModelTest, MissingSafetensors) {
  const auto dir = test::write_tiny_model(root_.path(), "m", TinyModelSpec{});
  std::filesystem::remove(dir / "model.safetensors");
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr((dir / "model.safetensors").string()));
  EXPECT_THAT(msg, HasSubstr("cannot open"));
}

TEST_F(ModelTest, ModelOutlivesItsDirectory) {
  // The mapping keeps the weights readable after the files are deleted.
  TinyModelSpec s;
  TinyModel m = test::make_tiny_model(s);
  const auto dir = root_ / "m";
  test::write_model(dir, m);
  const auto model = Model::load(dir);
  std::filesystem::remove_all(dir);
  expect_weights(m, s, *model);
}

}  // namespace
}  // namespace fastformer::engine
