// The ISA dispatch of the CPU row passes (vector_rows.h): which of the three builds this CPU
// runs. The passes themselves are one file per kernel family, each compiling its template for
// every build with FF_BUILDS (vector_rows_common.h):
//   vector_rows_layernorm.cc   embed_row, residual_layernorm_row
//   vector_rows_scale.cc       scale_row (the mix)
//   vector_rows_key_scores.cc  transpose_key_att, key_weight, key_scores (float32 weights)
//   vector_rows_key_pairs.cc   key_weight_pairs, key_scores_pairs (VDPBF16PS and its model)
//   vector_rows_pool.cc        pool_chunk
//   vector_rows_tanh.cc        tanh_scores
#include "server/engine/cpu/vector_rows.h"

namespace fastformer::engine::rows {

bool isa_supported(Isa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kBaseline:
      return true;
  }
  return false;
#else
  return isa == Isa::kBaseline;
#endif
}

Isa detected_isa() {
  static const Isa isa = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                         : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                                     : Isa::kBaseline;
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

}  // namespace fastformer::engine::rows
