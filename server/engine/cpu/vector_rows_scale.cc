// The mix (vector_rows.h): out_j = x_j * scale_j over a row (scale_impl, in
// vector_rows_common.h: the key weights use it too).
#include "server/engine/cpu/vector_rows.h"
#include "server/engine/cpu/vector_rows_common.h"

namespace fastformer::engine::rows {

#define FF_SCALE(E)                                                                           \
  FF_BUILDS(void, scale_row, (const E* x, const float* scale, int64_t n, E* out), scale_impl, \
            (x, scale, n, out))
FF_SCALE(float)
FF_SCALE(uint16_t)

}  // namespace fastformer::engine::rows
