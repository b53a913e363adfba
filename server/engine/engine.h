// The engine API: encode one ragged batch of validated sequences. Nothing here knows gRPC.
//
// An Engine runs the forward graph (forward.cc) over an Ops implementation: the CPU ops
// (oneDNN + threads) or, in CUDA builds, the CUDA ops. It is not thread-safe: one
// batch at a time per Engine. The server builds one Engine per process and runs every
// batch on the Scheduler's single compute thread (after a warm-up batch on the main
// thread); the CPU engine spreads each batch over its own thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/defaults.h"
#include "common/sequence.h"  // SequenceInput, OutputOptions, EncodedSequence
#include "server/engine/model.h"
#include "server/engine/ragged_batch.h"
#include "server/engine/speed_check.h"

namespace fastformer::engine {

enum class Backend { kAuto, kCpu, kCuda };

// One op of the forward graph in a profile (fastformer-bench --profile), per batch, averaged
// over the batches profiled. `bytes` and `flops` are what the op must move and compute, by the
// formulas beside the forward graph (forward.cc), not what a kernel happens to do.
struct OpProfile {
  std::string name;    ///< the op, e.g. "qks_gemm", "key_pool", "ffn_ln"
  int layer = -1;      ///< the encoder layer, -1 outside the layers
  double calls = 0;    ///< calls per batch
  double ms = 0;       ///< time per batch (all its calls)
  double bytes = 0;    ///< per batch
  double flops = 0;    ///< per batch
  std::string kernel;  ///< a GEMM op's kernel (oneDNN's implementation on the CPU); "" otherwise
};

bool parse_backend(const std::string& name, Backend* out);

// The serving dtype, one value from the flag (--dtype) and config.pbtxt to the engine. kAuto
// (the programs' default, defaults::kDtype): the engine picks for its hardware, bfloat16 where
// its GEMMs are fast in bfloat16 (a CPU with AVX512_BF16 or AMX, a GPU of compute capability
// 8.0 or later), float32 elsewhere.
enum class Dtype { kAuto, kFloat32, kFloat16, kBfloat16 };
// "auto", "float32", "float16", "bfloat16"; false for anything else.
bool parse_dtype(std::string_view name, Dtype* out);
const char* dtype_name(Dtype dtype);
// parse_dtype, or std::invalid_argument naming `name` (for callers that hold a name already
// checked, as the tests' parameters).
Dtype dtype_from_name(std::string_view name);

// The dtype an engine serves for the one it was asked for, and why when it picked (kAuto).
struct DtypeChoice {
  Dtype dtype = Dtype::kFloat32;  ///< never kAuto
  /// kAuto only: what the hardware offers, for the start-up log's "dtype auto: bfloat16 (...)",
  /// e.g. "oneDNN 2.6.3 finds avx512_core_bf16: bfloat16 GEMMs on AVX512_BF16, no AMX"; "" else
  std::string why;
};

struct CpuGemmInfo;  // what oneDNN runs on this CPU (cpu/onednn_gemm.h)
// The CPU engine's dtype for `requested`: kAuto is bfloat16 where oneDNN finds bfloat16 GEMMs
// in hardware (`gemm.has_bf16`: AVX512_BF16 or AMX), float32 elsewhere, never the emulated
// bfloat16 (FASTFORMER_CPU_BFLOAT16=emulate is for tests, and only for an explicit bfloat16);
// any other value is itself. The one place the CPU's rule is written (the CUDA engine's:
// cuda::choose_cuda_dtype, which the plugin applies to its device).
DtypeChoice choose_cpu_dtype(Dtype requested, const CpuGemmInfo& gemm);

// Who runs the CPU engine's bfloat16 GEMMs (--cpu-gemm): auto (the default: per GEMM shape and
// row bucket, the faster of oneDNN and the hand-written AMX kernel, timed at load; oneDNN where
// the AMX kernel cannot run, the device string saying why), oneDNN's kernels, or the AMX kernel
// (cpu/amx_gemm.h) where the CPU has AMX and the kernel grants the tiles (else oneDNN, and the
// device string says why). float32 always runs oneDNN.
enum class CpuGemm { kAuto, kOnednn, kAmx };
// "auto", "onednn", "amx"; false for anything else.
bool parse_cpu_gemm(std::string_view name, CpuGemm* out);
const char* cpu_gemm_name(CpuGemm gemm);

struct EngineOptions {
  Backend backend = Backend::kAuto;  ///< defaults::kBackend
  int threads = defaults::kThreads;  ///< CPU threads; 0 = all cores
  int64_t max_batch_tokens =
      defaults::kMaxBatchTokens;  ///< buffers are sized for this many tokens at start-up
  /// Serving dtype. float32 unless asked: a program's default is kAuto (defaults::kDtype), but
  /// an engine built in code (fastformer-bench, the tests) serves the dtype it names.
  Dtype dtype = Dtype::kFloat32;
  int device = defaults::kDevice;  ///< CUDA device ordinal
  bool allow_tf32 = false;         ///< TF32 GEMMs for float32 on the CUDA engine
  /// The CUDA engine's opt-in kernels, comma-separated (--cuda-opt-in; docs/kernels.md, "Opt-in
  /// kernels"): "" takes FASTFORMER_CUDA_OPT_IN from the environment, "none" none.
  std::string cuda_opt_in;
  CpuGemm cpu_gemm = CpuGemm::kAuto;  ///< the CPU engine's bfloat16 GEMMs
  /// The CPU engine's passes (pass_tokens, workspace.h): at most this many tokens a pass of
  /// the forward graph; -1 sizes them to the CPU's cache, 0 runs every batch in one pass.
  int64_t pass_tokens = -1;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Encodes `batch` (built from sequences validate_sequence accepted). `options` has one
  // entry per sequence, or a single entry for all. Throws EngineError when the batch does
  // not fit the buffers (more than max_batch_tokens tokens).
  virtual std::vector<EncodedSequence> encode(const RaggedBatch& batch,
                                              std::span<const OutputOptions> options) = 0;

  // The host off the critical path (issue 48): stage() copies a formed batch's inputs to the
  // device while the batch before it computes, and encode_staged() then runs it without
  // waiting for that copy. The batch former calls stage() on its own thread, at most one call
  // at a time, concurrently with encode() on the compute thread; encode_staged() takes the
  // ticket stage() returned, and only for the very batch staged, unchanged since (the
  // scheduler passes 0 when refresh() changed it). Engines that read host memory (the CPU
  // engine) stage nothing: stage() returns 0 and encode_staged() is encode().
  virtual uint64_t stage(const RaggedBatch& batch) {
    (void)batch;
    return 0;
  }
  virtual std::vector<EncodedSequence> encode_staged(const RaggedBatch& batch,
                                                     std::span<const OutputOptions> options,
                                                     uint64_t staged) {
    (void)staged;
    return encode(batch, options);
  }

  virtual std::string backend_name() const = 0;  ///< "cpu" or "cuda"
  virtual std::string device_name() const = 0;   ///< e.g. "cpu (2 threads)"
  // The dtype it serves (what --dtype auto resolved to, and why), for every report of it.
  virtual const DtypeChoice& dtype() const = 0;
  virtual int64_t max_batch_tokens() const = 0;
  // The most tokens one pass of the forward graph holds (workspace.h); 0: a batch is one pass.
  virtual int64_t pass_tokens() const { return 0; }
  virtual const Model& model() const = 0;
  // Device memory held by the engine and the device's total, for metrics (0, 0 on CPU).
  virtual std::pair<size_t, size_t> device_memory() const { return {0, 0}; }
  // Times the engine's GEMMs briefly against the floor for its hardware (server start-up).
  virtual SpeedCheck speed_check() { return {}; }
  // Bytes of weight copies the engine keeps beside the model's arrays (the CPU's packed
  // bfloat16 weights, made at the warm-up batch); 0 if none.
  virtual size_t packed_weight_bytes() const { return 0; }
  // One line per GEMM site of the forward graph, after the first batch: its name, shape and
  // the kernel that ran it (for the start-up log); {} where the engine does not know.
  virtual std::vector<std::string> gemm_report() const { return {}; }
  // Profiling, off until turned on: each op of every batch timed (CUDA events on a GPU, the
  // wall clock on the host). Turning it on starts a new profile.
  virtual void set_profiling(bool /*on*/) {}
  // The ops of the batches encoded since profiling was turned on, in forward order; {} if none.
  virtual std::vector<OpProfile> profile() const { return {}; }
};

// Creates the engine `options.backend` asks for. kAuto picks CUDA when this build has it
// and a usable device exists, else the CPU engine; `why` (if given) receives the reason.
std::unique_ptr<Engine> create_engine(std::shared_ptr<const Model> model,
                                      const EngineOptions& options, std::string* why = nullptr);

}  // namespace fastformer::engine
