// The CPU engine's attention (CpuOps::attention): sequence by sequence where the batch's
// sequences balance over the workers, it must give what the three ops it stands for give in
// turn (query_pool, key_pool, mix: each checked against double precision in engine_test.cc),
// bit for bit, in float32 and bfloat16.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/cpu_ops.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/workspace.h"
#include "tests/support/random_values.h"

namespace fastformer::engine {
namespace {

TEST(AttentionBySequence, WholeSequencesWhereTheyBalanceOverTheWorkers) {
  // base-long's batches: 32 sequences of 512 tokens on 2 workers, 512 * 4 * 2 <= 16,384.
  std::vector<int32_t> offsets{0};
  for (int i = 0; i < 32; ++i) offsets.push_back(offsets.back() + 512);
  EXPECT_TRUE(attention_by_sequence(offsets, 2));
  EXPECT_TRUE(attention_by_sequence(offsets, 8));            // 512 * 32 = 16,384: on the line
  EXPECT_FALSE(attention_by_sequence(offsets, 9));           // 512 * 36 > 16,384
  EXPECT_FALSE(attention_by_sequence({{0, 512, 1024}}, 2));  // two sequences: the chunks
  EXPECT_FALSE(attention_by_sequence({{0, 100}}, 1));        // 400 > 100
  // One long sequence among short ones: it alone decides.
  std::vector<int32_t> skewed{0, 3000};
  for (int i = 0; i < 100; ++i) skewed.push_back(skewed.back() + 100);
  EXPECT_FALSE(attention_by_sequence(skewed, 2));  // 3000 * 8 > 13,000
  EXPECT_TRUE(attention_by_sequence(skewed, 1));   // 3000 * 4 <= 13,000
  EXPECT_FALSE(attention_by_sequence({{0}}, 2));   // no sequence
}

struct AttentionCase {
  const char* name;
  int64_t hidden, heads;
  CpuDtype dtype;
};

class CpuAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CpuAttentionTest, SequenceBySequenceIsTheThreeOpsBitForBit) {
  const AttentionCase& p = GetParam();
  if (p.dtype == CpuDtype::kBfloat16 && !cpu_gemm_info().has_bf16)
    GTEST_SKIP() << "no bfloat16 GEMMs on this CPU (" << cpu_gemm_info().isa
                 << "); the emulated bfloat16 case runs the same passes";
  ModelConfig config;
  config.hidden_size = p.hidden;
  config.num_attention_heads = p.heads;
  config.num_hidden_layers = 1;
  config.intermediate_size = 2 * p.hidden;
  config.max_position_embeddings = 1024;
  const int64_t D = p.hidden, H = p.heads;
  const int threads = 2;

  // A 530-token sequence whose middle chunk (256..511) is padding, one of 300 with interior
  // pads (two chunks), a one-token sequence and 40 of 90..129 tokens: 530 * 4 * 2 <= T.
  RaggedBatch batch;
  auto add = [&](int32_t n) {
    batch.cu_seqlens.push_back(batch.cu_seqlens.back() + n);
    batch.mask.insert(batch.mask.end(), size_t(n), uint8_t{1});
  };
  add(530);
  std::fill(batch.mask.begin() + 256, batch.mask.begin() + 512, uint8_t{0});
  add(300);
  batch.mask[530 + 17] = batch.mask[530 + 299] = 0;
  add(1);
  for (int i = 0; i < 40; ++i) add(90 + i);
  const int64_t T = batch.num_tokens();
  ASSERT_TRUE(attention_by_sequence(batch.cu_seqlens, threads));

  CpuOps ops(threads, config, p.dtype);
  const size_t e = ops.element_size();
  const WorkspacePlan plan = plan_workspace(config, 0, T, batch.num_sequences(), e);
  ops.reserve(plan);
  PoolingChunks chunks;
  plan_chunks(batch, chunks);
  const BatchRef ref = ops.begin_batch(batch, plan, chunks, 0);
  char* const ws = static_cast<char*>(ops.workspace());
  auto mat = [&](const WorkspacePlan::Buffer& b) {
    return Mat{ws + b.offset, b.rows, b.cols, b.ld};
  };
  const Mat qks = mat(plan.qks), pq = mat(plan.pq), pk = mat(plan.pk);
  const Mat q = columns(qks, 0, D, e), k = columns(qks, D, D, e), s = columns(qks, 2 * D, H, e);
  // Q, K and scores of a few units (the scores as the GEMM's scaled ones), in the serving dtype.
  const std::vector<float> values = test::random_values(size_t(T * qks.ld), 7, 2.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < qks.ld; ++j) {
      const float v = values[size_t(t * qks.ld + j)];
      char* at = ws + plan.qks.offset + (t * qks.ld + j) * int64_t(e);
      if (e == sizeof(float)) {
        std::memcpy(at, &v, sizeof v);
      } else {
        const uint16_t b = float_to_bfloat16(v);
        std::memcpy(at, &b, sizeof b);
      }
    }
  }
  const std::vector<float> wka = test::random_values(size_t(H * D), 8, 0.3f);
  const std::vector<float> bka = test::random_values(size_t(H), 9, 0.1f);
  const WeightRef key_att{wka.data(), bka.data(), H, D};

  const size_t qks_bytes = size_t(T * qks.ld) * e;
  const std::vector<char> before(ws + plan.qks.offset, ws + plan.qks.offset + qks_bytes);
  auto snapshot = [&]() {
    std::vector<char> out(ws + plan.qks.offset, ws + plan.qks.offset + qks_bytes);  // U over K
    out.insert(out.end(), ws + plan.pq.offset, ws + plan.pq.offset + pq.rows * pq.ld * e);
    out.insert(out.end(), ws + plan.pk.offset, ws + plan.pk.offset + pk.rows * pk.ld * e);
    return out;
  };
  ops.query_pool(ref, s, q, pq);
  ops.key_pool(ref, k, pq, key_att, pk);
  ops.mix(ref, q, pk, k);
  const std::vector<char> three = snapshot();
  ASSERT_NE(std::memcmp(three.data(), before.data(), qks_bytes), 0) << "the mix wrote nothing";

  std::memcpy(ws + plan.qks.offset, before.data(), qks_bytes);
  std::memset(ws + plan.pq.offset, 0, size_t(pq.rows * pq.ld) * e);
  std::memset(ws + plan.pk.offset, 0, size_t(pk.rows * pk.ld) * e);
  ops.attention(ref, s, q, k, key_att, pq, pk, k);
  const std::vector<char> one = snapshot();
  ASSERT_EQ(one.size(), three.size());
  size_t first_diff = one.size();
  for (size_t i = 0; i < one.size() && first_diff == one.size(); ++i)
    if (one[i] != three[i]) first_diff = i;
  EXPECT_EQ(first_diff, one.size()) << "first differing byte " << first_diff << " of " << one.size()
                                    << " (Q|K|s " << qks_bytes << ", then pq, pk)";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuAttentionTest,
    ::testing::Values(AttentionCase{"f32_d64_h16", 64, 16, CpuDtype::kFloat32},
                      AttentionCase{"f32_d48_h12", 48, 12, CpuDtype::kFloat32},  // heads padded
                      AttentionCase{"f32_d32_h4", 32, 4, CpuDtype::kFloat32},
                      AttentionCase{"bf16emu_d64_h16", 64, 16, CpuDtype::kBfloat16Emulated},
                      AttentionCase{"bf16emu_d48_h12", 48, 12, CpuDtype::kBfloat16Emulated},
                      AttentionCase{"bf16emu_d32_h4", 32, 4, CpuDtype::kBfloat16Emulated},
                      AttentionCase{"bf16_d48_h12", 48, 12, CpuDtype::kBfloat16}),
    [](const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; });

}  // namespace
}  // namespace fastformer::engine
