// The per-op profile (Engine::set_profiling, fastformer-bench --profile) of the CPU engine
// and of the CUDA engine on the host emulation: every op of the forward once per layer, the
// GEMMs' FLOPs and bytes as counted by hand, the ops' times adding up to the batch's, and
// outputs bit-identical with profiling on and off. A GEMM whose bias and activation run as a
// pass of their own (the CUDA engine's exact-erf GELU) is two rows, the GEMM's and the pass's
// (ffn_in_gemm, ffn_in_bias_gelu: the cost model's, tools/cost_model.py); one where the GEMM's
// epilogue does it all.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cuda/emulated_engine.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

// D = 64, H = 16: the fused Q|K|s width 2D + H = 144 is a multiple of 16, so no padding of it
// changes the by-hand counts below.
constexpr int64_t D = 64, H = 16, I = 96, kLayers = 2, kLabels = 3;

using MakeEngine =
    std::function<std::unique_ptr<engine::Engine>(std::shared_ptr<const engine::Model>)>;

struct Case {
  std::string name;
  MakeEngine make;
  size_t element_size;
  size_t table_element_size;  // the embedding tables as the engine keeps them
  double min_covered;         // the least share of the encode() wall time the ops' times must cover
  bool attention_in_one_pass;  // the CPU engine's: one "attention" row for its three ops
  bool gelu_pass;  // the CUDA engine's: the erf-GELU after ffn_in_gemm is a pass of its own
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

class EngineProfileTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    test::TinyModelSpec spec;
    spec.hidden = D;
    spec.heads = H;
    spec.layers = kLayers;
    spec.intermediate = I;
    spec.max_positions = 512;
    spec.vocab = 200;
    spec.num_labels = kLabels;
    model_ = engine::Model::load(test::write_tiny_model(dir_.path(), "m", spec));
    for (int n : {300, 45, 1}) {  // a sequence over one 256-token pooling chunk, and short ones
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1 + int32_t((i * 37 + size_t(n)) % 199);
      batch_.add({ids, {}}, model_->config());
    }
    options_.logits = options_.normalize = options_.token_embeddings = true;  // every op runs
  }
  std::vector<EncodedSequence> encode(engine::Engine& eng) {
    return eng.encode(batch_, {&options_, 1});
  }

  test::TempDir dir_;
  std::shared_ptr<const engine::Model> model_;
  engine::RaggedBatch batch_;
  OutputOptions options_;
};

void expect_identical(const std::vector<EncodedSequence>& a,
                      const std::vector<EncodedSequence>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].embedding, b[s].embedding) << "sequence " << s;
    EXPECT_EQ(a[s].token_embeddings, b[s].token_embeddings) << "sequence " << s;
    EXPECT_EQ(a[s].logits, b[s].logits) << "sequence " << s;
  }
}

TEST_P(EngineProfileTest, EveryOpOncePerLayerWithItsCost) {
  auto eng = GetParam().make(model_);
  EXPECT_TRUE(eng->profile().empty()) << "profiling is off until turned on";
  const auto plain = encode(*eng);

  eng->set_profiling(true);
  constexpr int kBatches = 2;
  double wall_ms = 0;
  for (int i = 0; i < kBatches; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto profiled = encode(*eng);
    wall_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    expect_identical(profiled, plain);
  }
  const std::vector<engine::OpProfile> rows = eng->profile();
  eng->set_profiling(false);
  expect_identical(encode(*eng), plain);
  EXPECT_TRUE(eng->profile().empty());

  std::vector<std::pair<std::string, int>> expected = {{"begin_batch", -1}, {"embed", -1}};
  for (int l = 0; l < kLayers; ++l) {
    expected.emplace_back("qks_gemm", l);
    if (GetParam().attention_in_one_pass) {
      expected.emplace_back("attention", l);
    } else {
      for (const char* name : {"query_pool", "key_pool", "mix"}) expected.emplace_back(name, l);
    }
    for (const char* name : {"transform_gemm", "attn_out_gemm", "attn_ln", "ffn_in_gemm"})
      expected.emplace_back(name, l);
    if (GetParam().gelu_pass) expected.emplace_back("ffn_in_bias_gelu", l);
    for (const char* name : {"ffn_out_gemm", "ffn_ln"}) expected.emplace_back(name, l);
  }
  for (const char* name :
       {"pooler_fc1_gemm", "attention_pool", "classifier_gemm", "download_logits",
        "download_pooled", "l2_normalize", "download_normalized", "download_tokens"}) {
    expected.emplace_back(name, -1);
  }
  ASSERT_EQ(rows.size(), expected.size());
  const double T = double(batch_.num_tokens()), B = double(batch_.num_sequences());
  const double e = double(GetParam().element_size);
  // By hand: 2 M N K for C[M, N] = A[M, K] W[N, K]^T.
  const std::map<std::string, double> gemm_flops = {
      {"qks_gemm", 2 * T * (2 * D + H) * D},   {"transform_gemm", 2 * T * D * D},
      {"attn_out_gemm", 2 * T * D * D},        {"ffn_in_gemm", 2 * T * I * D},
      {"ffn_out_gemm", 2 * T * D * I},         {"pooler_fc1_gemm", 2 * T * D * D},
      {"classifier_gemm", 2 * B * kLabels * D}};
  double total_ms = 0;
  int gemms = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const engine::OpProfile& row = rows[i];
    SCOPED_TRACE(row.name + " layer " + std::to_string(row.layer));
    EXPECT_EQ(row.name, expected[i].first);
    EXPECT_EQ(row.layer, expected[i].second);
    EXPECT_EQ(row.calls, 1.0) << "calls per batch";
    EXPECT_GE(row.ms, 0.0);
    EXPECT_GT(row.bytes, 0.0);
    if (auto it = gemm_flops.find(row.name); it != gemm_flops.end()) {
      EXPECT_EQ(row.flops, it->second);
      ++gemms;
    }
    total_ms += row.ms;
  }
  EXPECT_EQ(gemms, 5 * kLayers + 2);
  // ffn_in: X1 and Wi read, H [T, I] written, by the GEMM; bi read in its epilogue, or by the
  // pass after it, which reads H and writes it again (and computes a bias add and a GELU an
  // element): the two rows move the one row's bytes and [T, I] twice more.
  const double fused_ffn_in = e * (T * D + I * D + T * I + I);
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("ffn_in of layer " + std::to_string(l));
    auto row = [&](const std::string& name) {
      for (const engine::OpProfile& r : rows)
        if (r.name == name && r.layer == l) return r;
      return engine::OpProfile{};
    };
    const engine::OpProfile gemm = row("ffn_in_gemm"), pass = row("ffn_in_bias_gelu");
    if (GetParam().gelu_pass) {
      EXPECT_EQ(gemm.bytes, e * (T * D + I * D + T * I));
      EXPECT_EQ(pass.bytes, e * (2 * T * I + I));
      EXPECT_EQ(pass.flops, 2 * T * I);
      EXPECT_EQ(pass.kernel, "");
      EXPECT_EQ(gemm.bytes + pass.bytes, fused_ffn_in + 2 * e * T * I);
    } else {
      EXPECT_EQ(gemm.bytes, fused_ffn_in);
      EXPECT_EQ(pass.name, "") << "no pass row";
    }
  }
  // A += U Wt^T reads A, U and Wt and writes A: (T D + D D + 2 T D) elements.
  const size_t transform = GetParam().attention_in_one_pass ? 4 : 6;
  EXPECT_EQ(rows[transform].name, "transform_gemm");
  EXPECT_EQ(rows[transform].bytes, e * (T * D + D * D + 2 * T * D));
  if (GetParam().attention_in_one_pass) {
    // The three ops' bytes: s and Q in, pq out; K in, pq in, pk out, Wka and its bias; Q in, pk
    // in, U out.
    EXPECT_EQ(rows[3].name, "attention");
    EXPECT_EQ(rows[3].bytes, e * ((T * H + T * D + B * D) + (T * D + 2 * B * D + H * D + H) +
                                  (2 * T * D + B * D)));
  }
  // embed reads a word and a position row a token (and an id and a position id), LN's gamma
  // and beta once, in the tables' element size, and writes x in the serving dtype.
  const double p = double(GetParam().table_element_size);
  EXPECT_EQ(rows[1].name, "embed");
  EXPECT_EQ(rows[1].bytes, T * (8 + 2 * D * p + D * e) + 2 * D * p);
  // The timestamps span the batch: the ops' times add up to (most of) encode()'s, never more.
  const double batch_ms = wall_ms / kBatches;
  EXPECT_GT(total_ms, 0.0);
  EXPECT_LE(total_ms, batch_ms);
  EXPECT_GE(total_ms, GetParam().min_covered * batch_ms);
}

INSTANTIATE_TEST_SUITE_P(
    Engines, EngineProfileTest,
    ::testing::Values(Case{"cpu",
                           [](std::shared_ptr<const engine::Model> model) {
                             engine::EngineOptions options;
                             options.backend = engine::Backend::kCpu;
                             options.threads = 2;
                             options.max_batch_tokens = 512;
                             return engine::create_engine(std::move(model), options);
                           },
                           sizeof(float), sizeof(float), 0.7, true, false},
                      Case{"cpu_bfloat16",
                           [](std::shared_ptr<const engine::Model> model) {
                             engine::EngineOptions options;
                             options.backend = engine::Backend::kCpu;
                             options.dtype = engine::Dtype::kBfloat16;
                             options.threads = 2;
                             options.max_batch_tokens = 512;
                             // bfloat16 buffers on any CPU (the tests'
                             // emulation where the CPU has no bf16 GEMMs)
                             const bool emulate = !engine::cpu_gemm_info().has_bf16;
                             if (emulate) ::setenv("FASTFORMER_CPU_BFLOAT16", "emulate", 1);
                             auto engine = engine::create_engine(std::move(model), options);
                             if (emulate) ::unsetenv("FASTFORMER_CPU_BFLOAT16");
                             return engine;
                           },
                           2, sizeof(float), 0.7, true, false},
                      Case{"emulated_cuda_bfloat16",
                           [](std::shared_ptr<const engine::Model> model) {
                             engine::EngineOptions options;
                             options.dtype = engine::Dtype::kBfloat16;
                             options.max_batch_tokens = 512;
                             return engine::cuda::create_emulated_cuda_engine(std::move(model),
                                                                              options);
                           },
                           2, 2, 0.9, false, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The CUDA engine on the host emulation, which runs our kernels and the GEMMs with cuBLASLt's
// epilogues: ReLU and the tanh GELU ride on the GEMM (one row, ffn_in_gemm, its bias
// included), the exact-erf GELU and SiLU are a pass after a GEMM that stores (two rows:
// ffn_in_gemm, then ffn_in_bias_gelu or ffn_in_bias_silu). Outputs bit-identical with
// profiling on and off, in float32 and bfloat16.
TEST(EngineProfilePasses, AGemmAndItsPassAreTwoRowsWhereTheEpilogueCannotFuse) {
  struct Act {
    const char* name;
    const char* pass;  // the row after ffn_in_gemm's, "" where the GEMM's epilogue applies it
  };
  for (const Act act : {Act{"gelu", "ffn_in_bias_gelu"}, Act{"silu", "ffn_in_bias_silu"},
                        Act{"gelu_new", ""}, Act{"relu", ""}}) {
    test::TempDir dir;
    test::TinyModelSpec spec;
    spec.hidden = D, spec.heads = H, spec.layers = kLayers, spec.intermediate = I;
    spec.max_positions = 128, spec.vocab = 50, spec.num_labels = kLabels;
    spec.activation = act.name;
    auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
    engine::RaggedBatch batch;
    for (int n : {40, 7}) batch.add({std::vector<int32_t>(size_t(n), 3), {}}, model->config());
    OutputOptions all;
    all.logits = all.normalize = all.token_embeddings = true;
    for (const engine::Dtype dtype : {engine::Dtype::kFloat32, engine::Dtype::kBfloat16}) {
      SCOPED_TRACE(std::string(act.name) + ", " + engine::dtype_name(dtype));
      engine::EngineOptions options;
      options.dtype = dtype;
      options.max_batch_tokens = 64;
      auto eng = engine::cuda::create_emulated_cuda_engine(model, options);
      const auto plain = eng->encode(batch, {&all, 1});
      eng->set_profiling(true);
      expect_identical(eng->encode(batch, {&all, 1}), plain);
      const std::vector<engine::OpProfile> rows = eng->profile();
      const double T = double(batch.num_tokens());
      const double e = dtype == engine::Dtype::kFloat32 ? 4 : 2;
      for (int l = 0; l < kLayers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        size_t at = 0;  // ffn_in_gemm's row; the next rows follow it in issue order
        while (at < rows.size() && !(rows[at].name == "ffn_in_gemm" && rows[at].layer == l)) ++at;
        ASSERT_LT(at + 2, rows.size());
        const engine::OpProfile& gemm = rows[at];
        if (*act.pass != 0) {
          const engine::OpProfile& pass = rows[at + 1];
          EXPECT_EQ(pass.name, act.pass);
          EXPECT_EQ(pass.layer, l);
          EXPECT_EQ(rows[at + 2].name, "ffn_out_gemm");
          EXPECT_EQ(gemm.bytes, e * (T * D + I * D + T * I));  // X1, Wi in; H out
          EXPECT_EQ(pass.bytes, e * (2 * T * I + I));          // H in and out, bi in
          EXPECT_EQ(pass.flops, 2 * T * I);
          EXPECT_EQ(pass.calls, 1.0);
        } else {
          EXPECT_EQ(rows[at + 1].name, "ffn_out_gemm");
          EXPECT_EQ(gemm.bytes, e * (T * D + I * D + T * I + I));  // bi in the epilogue
        }
        EXPECT_EQ(gemm.flops, 2 * T * I * D);
      }
      // Every other GEMM with a bias has cuBLASLt's bias epilogue here (its operands aligned):
      // no other pass row.
      for (const engine::OpProfile& row : rows) {
        if (row.name.find("_bias") != std::string::npos) {
          EXPECT_EQ(row.name, act.pass);
        }
      }
    }
  }
}

// Where a GEMM's operands are not 16-byte aligned (a hidden size of 12 in bfloat16: 24-byte
// rows), the CUDA engine asks cuBLASLt for no bias epilogue: the GEMM stores and the pass adds
// the bias, a row "<x>_bias" after "<x>_gemm" (the feed-forward's "ffn_in_bias_gelu").
TEST(EngineProfilePasses, AnUnalignedGemmsBiasPassIsARowOfItsOwn) {
  test::TempDir dir;
  test::TinyModelSpec spec;
  spec.hidden = 12, spec.heads = 2, spec.layers = 1, spec.intermediate = 20;
  spec.max_positions = 64, spec.vocab = 50, spec.num_labels = 3;
  auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
  engine::RaggedBatch batch;
  for (int n : {9, 4}) batch.add({std::vector<int32_t>(size_t(n), 3), {}}, model->config());
  OutputOptions all;
  all.logits = true;
  engine::EngineOptions options;
  options.dtype = engine::Dtype::kBfloat16;
  options.max_batch_tokens = 32;
  auto eng = engine::cuda::create_emulated_cuda_engine(model, options);
  const auto plain = eng->encode(batch, {&all, 1});
  eng->set_profiling(true);
  expect_identical(eng->encode(batch, {&all, 1}), plain);
  std::vector<std::string> names;
  for (const engine::OpProfile& row : eng->profile()) {
    if (row.name.ends_with("_gemm") || row.name.find("_bias") != std::string::npos)
      names.push_back(row.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"qks_gemm", "qks_bias", "transform_gemm",
                                             "attn_out_gemm", "ffn_in_gemm", "ffn_in_bias_gelu",
                                             "ffn_out_gemm", "pooler_fc1_gemm", "pooler_fc1_bias",
                                             "classifier_gemm", "classifier_bias"}));
}

// A profile has no fixed count of timestamps: a 12-layer model issues 2 + 11 x 12 + 8 = 142 ops a
// batch on the CUDA engine (its erf-GELU pass an op of its own; 2 + 8 x 12 + 8 = 106 on the CPU
// engine, whose attention is one op),
// over the first reservation (64), and still gets every op once per layer with the ops' times
// inside the batch's.
TEST(EngineProfileDeep, TimestampsGrowWithTheGraph) {
  test::TempDir dir;
  test::TinyModelSpec spec;
  spec.hidden = 8, spec.heads = 2, spec.layers = 12, spec.intermediate = 8, spec.vocab = 50;
  spec.num_labels = 2;
  auto model = engine::Model::load(test::write_tiny_model(dir.path(), "deep", spec));
  engine::RaggedBatch batch;
  const std::vector<int32_t> ids{3, 4, 5, 6, 7};
  batch.add({ids, {}}, model->config());
  OutputOptions all;
  all.logits = all.normalize = all.token_embeddings = true;
  engine::EngineOptions options;
  options.backend = engine::Backend::kCpu;
  options.threads = 1;
  options.max_batch_tokens = 64;
  std::vector<std::unique_ptr<engine::Engine>> engines;
  engines.push_back(engine::create_engine(model, options));
  engines.push_back(engine::cuda::create_emulated_cuda_engine(model, options));
  for (auto& eng : engines) {
    SCOPED_TRACE(eng->device_name());
    const auto plain = eng->encode(batch, {&all, 1});
    eng->set_profiling(true);
    const auto t0 = std::chrono::steady_clock::now();
    expect_identical(eng->encode(batch, {&all, 1}), plain);
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<engine::OpProfile> rows = eng->profile();
    const size_t per_layer = eng.get() == engines.front().get() ? 8 : 11;
    ASSERT_EQ(rows.size(), size_t(2 + per_layer * spec.layers + 8));
    EXPECT_EQ(rows[2].name, "qks_gemm");
    EXPECT_EQ(rows[2 + per_layer * 11].name, "qks_gemm");
    EXPECT_EQ(rows[2 + per_layer * 11].layer, 11);
    EXPECT_EQ(rows[2 + per_layer * 11 + per_layer - 1].name, "ffn_ln");
    EXPECT_EQ(rows.back().name, "download_tokens");
    double total_ms = 0;
    for (const engine::OpProfile& row : rows) {
      EXPECT_EQ(row.calls, 1.0) << row.name << " layer " << row.layer;
      total_ms += row.ms;
    }
    EXPECT_GT(total_ms, 0.0);
    EXPECT_LE(total_ms, wall_ms);
  }
}

}  // namespace
}  // namespace fastformer
