// What an ops implementation can tell about itself beside the math and memory of ops.h: a
// start-up speed check of its GEMMs, the kernel each GEMM ran, the weight copies it keeps.
// The CPU ops report these (the server's start-up lines, fastformer-bench's --profile kernel
// column and JSON); an engine over ops without a report answers {}, "" and 0.
#pragma once

#include <cstddef>
#include <string>

#include "server/engine/ops.h"
#include "server/engine/speed_check.h"

namespace fastformer::engine {

class OpsReport {
 public:
  virtual ~OpsReport() = default;
  // A short timing of the ops' GEMMs against the floor for the hardware.
  virtual SpeedCheck speed_check() = 0;
  // The kernel the GEMMs over `w` ran (oneDNN's implementation name), once they have run;
  // "" where the ops do not know.
  virtual std::string gemm_kernel(const WeightRef& w) const = 0;
  // Bytes of weight copies the ops keep beside the model's arrays (the CPU's packed bfloat16
  // weights); 0 where the weights are served in place.
  virtual size_t packed_weight_bytes() const = 0;
};

}  // namespace fastformer::engine
