// The row kernels (kernels/embedding_layernorm.cu, residual_layernorm.cu, bias_activation.cu,
// elementwise.cu) on the host emulation, each against a double-precision reference computed
// here from the same inputs rounded to the storage dtype, in float32, float16 and bfloat16.
// Every shape runs one of the two paths, and the test checks which: widths 768 and 256 with
// dense or padded rows take the 16-byte vector kernels (768 in float32 and 3072 in every
// dtype give a row more than a warp); a width of 36 (not a multiple of 8), a leading
// dimension of width + 1 or a pointer one element past an aligned one take the scalar
// kernels, except that bias + activation moves vectors along rows of 36 padded to 40 and
// ends each with 4 single columns. Padding columns must come back untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "tests/emulation/device_buffer.h"
#include "tests/support/random_values.h"

namespace fastformer {
namespace {

namespace k = ::fastformer::kernels;
using emulation_test::DeviceBuffer;

// A row shape: `width` columns, rows `ld = width + pad` apart, the data `offset` elements past
// an aligned allocation.
struct Shape {
  int32_t width;
  int32_t pad = 0;
  int32_t offset = 0;
  int64_t ld() const { return width + pad; }
  // any_width: the kernel ends a row with single columns past its last whole vector.
  template <class T>
  bool vector_path(bool any_width = false) const {
    return (any_width || width % k::kVecSize<T> == 0) && ld() % k::kVecSize<T> == 0 &&
           offset % k::kVecSize<T> == 0;
  }
  std::string name() const {
    return "width " + std::to_string(width) + ", ld " + std::to_string(ld()) + ", offset " +
           std::to_string(offset);
  }
};
const std::vector<Shape> kShapes = {{768}, {256, 8}, {36}, {36, 4}, {768, 1}, {256, 0, 1}, {3072}};

// |got - want| allowed: float32's arithmetic, or the rounding of the output to T (at most
// half an ulp: 2^-11 relative in float16, 2^-8 in bfloat16), with a quarter to spare.
template <class T>
double tolerance(double want) {
  const double relative = std::is_same_v<T, float>     ? 1e-5
                          : std::is_same_v<T, ff_half> ? 0x1p-11
                                                       : 0x1p-8;
  return 1.25 * relative * std::abs(want) + 1e-5;
}

using ::fastformer::test::random_floats;

// Host values in dtype T, and the doubles the kernels see in them.
template <class T>
struct HostValues {
  std::vector<T> stored;
  std::vector<double> exact;
  HostValues(size_t n, float lo, float hi, uint32_t seed) {
    for (const float x : random_floats(n, lo, hi, seed)) {
      stored.push_back(from_float<T>(x));
      exact.push_back(to_float(stored.back()));
    }
  }
};

// A [rows, ld] matrix plus the shape's offset on the device; padding filled with a marker.
constexpr float kPadding = 12345.0f;
template <class T>
struct DeviceRows {
  Shape shape;
  int32_t rows;
  HostValues<T> host;
  DeviceBuffer<T> buffer;
  DeviceRows(Shape s, int32_t r, float lo, float hi, uint32_t seed)
      : shape(s),
        rows(r),
        host(size_t(s.offset + r * s.ld()), lo, hi, seed),
        buffer(host.stored.size()) {
    for (int32_t i = 0; i < r; ++i) {
      for (int64_t j = s.width; j < s.ld(); ++j) {
        host.stored[size_t(s.offset + i * s.ld() + j)] = from_float<T>(kPadding);
      }
    }
    buffer.upload(host.stored);
  }
  T* get() const { return buffer.get() + shape.offset; }
  double at(int32_t r, int32_t j) const {
    return host.exact[size_t(shape.offset + r * shape.ld() + j)];
  }
  // The device values, checking the padding is untouched.
  std::vector<std::vector<double>> download() const {
    const std::vector<T> all = buffer.download();
    std::vector<std::vector<double>> out(static_cast<size_t>(rows));
    for (int32_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < shape.ld(); ++j) {
        const float x = to_float(all[size_t(shape.offset + r * shape.ld() + j)]);
        if (j < shape.width) {
          out[size_t(r)].push_back(x);
        } else {
          EXPECT_EQ(x, to_float(from_float<T>(kPadding)))
              << "padding overwritten at row " << r << ", column " << j;
        }
      }
    }
    return out;
  }
};

// The names of the kernels launched while it lives.
class LaunchedKernels {
 public:
  LaunchedKernels() {
    ff_emu::set_launch_observer(
        [this](const ff_emu::LaunchInfo& info) { names_.emplace_back(info.kernel_name); });
  }
  ~LaunchedKernels() { ff_emu::set_launch_observer(nullptr); }
  // Exactly one launch, of the scalar kernel or not as `vector` says.
  void expect_one(bool vector, const std::string& context) const {
    ASSERT_EQ(names_.size(), 1u) << context;
    EXPECT_EQ(names_[0].find("scalar") == std::string::npos, vector)
        << context << ": launched " << names_[0];
  }

 private:
  std::vector<std::string> names_;
};

std::vector<double> layernorm(std::vector<double> x, const std::vector<double>& gamma,
                              const std::vector<double>& beta, double eps) {
  double mean = 0.0, var = 0.0;
  for (const double v : x) mean += v;
  mean /= double(x.size());
  for (const double v : x) var += (v - mean) * (v - mean);
  const double rstd = 1.0 / std::sqrt(var / double(x.size()) + eps);
  for (size_t j = 0; j < x.size(); ++j) x[j] = (x[j] - mean) * rstd * gamma[j] + beta[j];
  return x;
}

template <class T>
class RowKernels : public ::testing::Test {};
using Dtypes = ::testing::Types<float, ff_half, ff_bfloat16>;
class DtypeNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float>     ? "float32"
           : std::is_same_v<T, ff_half> ? "float16"
                                        : "bfloat16";
  }
};
TYPED_TEST_SUITE(RowKernels, Dtypes, DtypeNames);

TYPED_TEST(RowKernels, EmbeddingLayerNormMatchesTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    if (shape.pad != 0) continue;  // the tables and the output are dense
    const int32_t D = shape.width, vocab = 11, positions = 13, tokens = 9;
    const Shape dense{D, 0, shape.offset};
    DeviceRows<T> word(dense, vocab, -1.0f, 1.0f, 1), position(dense, positions, -0.5f, 0.5f, 2);
    DeviceRows<T> gamma(dense, 1, 0.5f, 1.5f, 3), beta(dense, 1, -0.2f, 0.2f, 4),
        x(dense, tokens, 0.0f, 0.0f, 5);
    const std::vector<float> input = random_floats(size_t(2 * D), -1.0f, 1.0f, 6);
    const std::vector<int32_t> ids = {3, 0, -1, 10, 7, -1, 3, 5, 1},
                               index = {-1, -1, 1, -1, -1, 0, -1, -1, -1};
    const std::vector<int32_t> position_ids = {0, 1, 2, 3, 12, 0, 1, 2, 4};
    DeviceBuffer<int32_t> d_ids(ids), d_index(index), d_positions(position_ids);
    DeviceBuffer<float> d_input(input);
    k::BatchArgs batch;
    batch.num_tokens = tokens;
    batch.token_ids = d_ids.get();
    batch.embedding_index = d_index.get();
    batch.position_ids = d_positions.get();
    batch.input_embeddings = d_input.get();
    const float eps = 1e-12f;
    {
      LaunchedKernels launched;
      k::launch_embedding_layernorm<T>(batch, word.get(), position.get(), gamma.get(), beta.get(),
                                       eps, D, x.get(), nullptr);
      launched.expect_one(shape.vector_path<T>(), shape.name());
    }
    const std::vector<double> g(gamma.host.exact.begin() + shape.offset, gamma.host.exact.end());
    const std::vector<double> b(beta.host.exact.begin() + shape.offset, beta.host.exact.end());
    const auto got = x.download();
    for (int32_t t = 0; t < tokens; ++t) {
      std::vector<double> sum(static_cast<size_t>(D));
      for (int32_t j = 0; j < D; ++j) {
        const double e = ids[size_t(t)] >= 0 ? word.at(ids[size_t(t)], j)
                                             : input[size_t(index[size_t(t)] * D + j)];
        sum[size_t(j)] = e + position.at(position_ids[size_t(t)], j);
      }
      const std::vector<double> want = layernorm(sum, g, b, eps);
      for (int32_t j = 0; j < D; ++j) {
        ASSERT_NEAR(got[size_t(t)][size_t(j)], want[size_t(j)], tolerance<T>(want[size_t(j)]))
            << shape.name() << ", token " << t << ", column " << j;
      }
    }
  }
}

TYPED_TEST(RowKernels, BiasResidualLayerNormMatchesTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    for (const bool in_place : {false, true}) {
      for (const bool with_bias : {true, false}) {
        const int32_t D = shape.width, rows = 7;
        const Shape dense{D, 0, shape.offset};
        DeviceRows<T> c(shape, rows, -2.0f, 2.0f, 10), residual(shape, rows, -1.0f, 1.0f, 11);
        DeviceRows<T> bias(dense, 1, -0.5f, 0.5f, 12), gamma(dense, 1, 0.5f, 1.5f, 13),
            beta(dense, 1, -0.2f, 0.2f, 14);
        DeviceRows<T> separate_out(shape, rows, 0.0f, 0.0f, 15);
        const DeviceRows<T>& out = in_place ? residual : separate_out;
        const std::string context =
            shape.name() + (in_place ? ", in place" : "") + (with_bias ? "" : ", no bias");
        const float eps = 1e-5f;
        {
          LaunchedKernels launched;
          k::launch_bias_residual_layernorm<T>(c.get(), c.shape.ld(),
                                               with_bias ? bias.get() : nullptr, residual.get(),
                                               residual.shape.ld(), gamma.get(), beta.get(), eps,
                                               rows, D, out.get(), out.shape.ld(), nullptr);
          launched.expect_one(shape.vector_path<T>(), context);
        }
        const std::vector<double> g(gamma.host.exact.begin() + shape.offset,
                                    gamma.host.exact.end());
        const std::vector<double> b(beta.host.exact.begin() + shape.offset, beta.host.exact.end());
        const auto got = out.download();
        for (int32_t r = 0; r < rows; ++r) {
          std::vector<double> sum(static_cast<size_t>(D));
          for (int32_t j = 0; j < D; ++j) {
            sum[size_t(j)] = c.at(r, j) + (with_bias ? bias.at(0, j) : 0.0) + residual.at(r, j);
          }
          const std::vector<double> want = layernorm(sum, g, b, eps);
          for (int32_t j = 0; j < D; ++j) {
            ASSERT_NEAR(got[size_t(r)][size_t(j)], want[size_t(j)], tolerance<T>(want[size_t(j)]))
                << context << ", row " << r << ", column " << j;
          }
        }
      }
    }
  }
}

double activate(double x, k::Act act) {
  switch (act) {
    case k::Act::kGeluErf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case k::Act::kGeluTanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case k::Act::kRelu:
      return x > 0.0 ? x : 0.0;
    case k::Act::kSilu:
      return x / (1.0 + std::exp(-x));
  }
  return x;
}

TYPED_TEST(RowKernels, BiasActivationMatchesTheReferenceForEveryActivation) {
  using T = TypeParam;
  struct Mode {
    bool bias, apply;
    k::Act act;
    std::string name;
  };
  const std::vector<Mode> modes = {{true, false, k::Act::kGeluErf, "bias only"},
                                   {true, true, k::Act::kGeluErf, "bias + erf GELU"},
                                   {true, true, k::Act::kGeluTanh, "bias + tanh GELU"},
                                   {true, true, k::Act::kRelu, "bias + ReLU"},
                                   {true, true, k::Act::kSilu, "bias + SiLU"},
                                   {false, true, k::Act::kGeluErf, "erf GELU only"}};
  for (const Shape& shape : kShapes) {
    for (const Mode& mode : modes) {
      const int32_t rows = 5;
      DeviceRows<T> c(shape, rows, -4.0f, 4.0f, 20),
          bias(Shape{shape.width, 0, shape.offset}, 1, -1.0f, 1.0f, 21);
      const std::string context = shape.name() + ", " + mode.name;
      {
        LaunchedKernels launched;
        k::launch_bias_activation<T>(c.get(), shape.ld(), mode.bias ? bias.get() : nullptr, rows,
                                     shape.width, mode.apply, mode.act, nullptr);
        launched.expect_one(shape.vector_path<T>(/*any_width=*/true), context);
      }
      const auto got = c.download();
      for (int32_t r = 0; r < rows; ++r) {
        for (int32_t j = 0; j < shape.width; ++j) {
          // The kernel rounds c + b to float, not to T, before the activation.
          const double v = c.at(r, j) + (mode.bias ? bias.at(0, j) : 0.0);
          const double want = mode.apply ? activate(v, mode.act) : v;
          ASSERT_NEAR(got[size_t(r)][size_t(j)], want, tolerance<T>(want))
              << context << ", row " << r << ", column " << j;
        }
      }
    }
  }
}

TYPED_TEST(RowKernels, MixMatchesTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    const int32_t D = shape.width, tokens = 9, sequences = 3;
    const std::vector<int32_t> token_seq = {0, 0, 0, 0, 1, 2, 2, 2, 2};
    DeviceBuffer<int32_t> d_token_seq(token_seq);
    k::BatchArgs batch;
    batch.num_tokens = tokens;
    batch.num_sequences = sequences;
    batch.token_seq = d_token_seq.get();
    DeviceRows<T> q(shape, tokens, -2.0f, 2.0f, 30),
        pk(Shape{D, 0, shape.offset}, sequences, -2.0f, 2.0f, 31);
    DeviceRows<T> u(shape, tokens, 0.0f, 0.0f, 32);
    {
      LaunchedKernels launched;
      k::launch_mix<T>(batch, q.get(), shape.ld(), pk.get(), D, u.get(), shape.ld(), nullptr);
      launched.expect_one(shape.vector_path<T>(), shape.name());
    }
    const auto got = u.download();
    for (int32_t t = 0; t < tokens; ++t) {
      for (int32_t j = 0; j < D; ++j) {
        const double want = q.at(t, j) * pk.at(token_seq[size_t(t)], j);
        ASSERT_NEAR(got[size_t(t)][size_t(j)], want, tolerance<T>(want))
            << shape.name() << ", token " << t;
      }
    }
  }
}

TYPED_TEST(RowKernels, PoolerScoresMatchTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    const int32_t D = shape.width, tokens = 9;
    k::BatchArgs batch;
    batch.num_tokens = tokens;
    DeviceRows<T> e(shape, tokens, -3.0f, 3.0f, 40),
        w2(Shape{D, 0, shape.offset}, 1, -1.0f, 1.0f, 41);
    DeviceRows<T> b2(Shape{1, 0, 0}, 1, -1.0f, 1.0f, 42);
    DeviceBuffer<float> z(static_cast<size_t>(tokens));
    {
      LaunchedKernels launched;
      k::launch_pooler_scores<T>(batch, e.get(), shape.ld(), w2.get(), b2.get(), D, z.get(),
                                 nullptr);
      launched.expect_one(shape.vector_path<T>(), shape.name());
    }
    const std::vector<float> got = z.download();
    for (int32_t t = 0; t < tokens; ++t) {
      double want = b2.at(0, 0), magnitude = 1.0;
      for (int32_t j = 0; j < D; ++j) {
        want += std::tanh(e.at(t, j)) * w2.at(0, j);
        magnitude += std::abs(w2.at(0, j));
      }
      // z is float in every dtype: float32's rounding over D terms.
      EXPECT_NEAR(got[size_t(t)], want, 1e-6 * magnitude) << shape.name() << ", token " << t;
    }
  }
}

TYPED_TEST(RowKernels, L2NormalizeMatchesTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    if (shape.pad != 0) continue;  // pooled rows are dense
    const int32_t D = shape.width, rows = 5;
    DeviceRows<T> x(shape, rows, -2.0f, 2.0f, 50);
    {
      LaunchedKernels launched;
      k::launch_l2_normalize<T>(x.get(), rows, D, nullptr);
      launched.expect_one(shape.vector_path<T>(), shape.name());
    }
    const auto got = x.download();
    for (int32_t r = 0; r < rows; ++r) {
      double norm = 0.0;
      for (int32_t j = 0; j < D; ++j) norm += x.at(r, j) * x.at(r, j);
      norm = std::sqrt(norm);
      for (int32_t j = 0; j < D; ++j) {
        const double want = x.at(r, j) / norm;
        ASSERT_NEAR(got[size_t(r)][size_t(j)], want, tolerance<T>(want))
            << shape.name() << ", row " << r;
      }
    }
  }
}

TYPED_TEST(RowKernels, DtypeConversionsAreExactAndRoundToNearestEven) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    const int32_t rows = 6;
    DeviceRows<T> src(shape, rows, -100.0f, 100.0f, 60);
    DeviceBuffer<float> dense(size_t(rows * shape.width));
    {
      LaunchedKernels launched;
      k::launch_to_float<T>(src.get(), shape.ld(), rows, shape.width, dense.get(), nullptr);
      launched.expect_one(shape.vector_path<T>(), shape.name());
    }
    const std::vector<float> floats = dense.download();
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t j = 0; j < shape.width; ++j) {
        ASSERT_EQ(floats[size_t(r * shape.width + j)], src.at(r, j))
            << shape.name() << ", row " << r;
      }
    }
  }
  // from_float: a count that is not a multiple of the vector (a scalar tail), and an
  // unaligned destination (the scalar kernel).
  for (const int32_t offset : {0, 1}) {
    const int64_t count = 1001;
    const std::vector<float> input = random_floats(size_t(count), -1000.0f, 1000.0f, 61);
    DeviceBuffer<float> d_input(input);
    DeviceBuffer<T> out(size_t(count + offset));
    {
      LaunchedKernels launched;
      k::launch_from_float<T>(d_input.get(), count, out.get() + offset, nullptr);
      launched.expect_one(offset == 0, "offset " + std::to_string(offset));
    }
    const std::vector<T> got = out.download();
    for (int64_t i = 0; i < count; ++i) {
      const T want = from_float<T>(input[size_t(i)]);
      ASSERT_EQ(std::memcmp(&got[size_t(offset + i)], &want, sizeof(T)), 0)
          << "element " << i << ", offset " << offset;
    }
  }
}

}  // namespace
}  // namespace fastformer
