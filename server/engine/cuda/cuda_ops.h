// The CUDA implementation of Ops: weights and activations in the serving dtype (float32,
// float16 or bfloat16) in device memory sized once at start-up, GEMMs through cuBLASLt,
// every other step a kernel of kernels/.
//
// The same source builds twice: against the CUDA runtime (namespace cuda::device) and,
// with FF_EMULATION, against the host emulation of kernels/runtime.h
// (namespace cuda::emulated), which is how `make test` runs this engine on a CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/engine/model.h"
#include "server/engine/ops.h"

namespace fastformer::engine::cuda {

struct CudaOpsOptions {
  std::string dtype = "float32";  ///< float32, float16 or bfloat16
  int device = 0;
  bool allow_tf32 = false;  ///< TF32 tensor-core GEMMs for float32
};

namespace device {
// Null (and `why` set) when no usable device exists; throws when one exists but
// the engine cannot be built on it (out of memory, ...).
std::unique_ptr<Ops> make_cuda_ops(const Model& model, const CudaOpsOptions& options,
                                   std::string* device_name, std::string* why);
}  // namespace device

namespace emulated {
std::unique_ptr<Ops> make_cuda_ops(const Model& model, const CudaOpsOptions& options,
                                   std::string* device_name, std::string* why);
}  // namespace emulated

}  // namespace fastformer::engine::cuda
