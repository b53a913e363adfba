#include "server/engine/engine.h"

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "server/engine/cpu/cpu_ops.h"
#include "server/engine/cuda/cuda_ops.h"
#include "server/engine/error.h"
#include "server/engine/forward.h"
#include "server/engine/workspace.h"

#if defined(FASTFORMER_HAVE_CUDA_ENGINE)
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "server/engine/cuda/plugin.h"
#endif

namespace fastformer::engine {

#if defined(FASTFORMER_HAVE_CUDA_ENGINE)
namespace {

// Opens the CUDA engine plugin once: beside the executable (build/lib next to build/bin,
// or lib/ next to bin/ when installed), else through the loader's search path.
cuda::MakeCudaOpsFn cuda_plugin(std::string* why) {
  static std::once_flag once;
  static cuda::MakeCudaOpsFn fn = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      candidates.push_back((exe.parent_path() / ".." / "lib" / cuda::kPluginLibrary).string());
      candidates.push_back((exe.parent_path() / cuda::kPluginLibrary).string());
    }
    candidates.push_back(cuda::kPluginLibrary);
    std::string errors;
    for (const auto& path : candidates) {
      if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        fn = reinterpret_cast<cuda::MakeCudaOpsFn>(dlsym(lib, cuda::kPluginSymbol));
        if (fn == nullptr) error = path + " has no " + cuda::kPluginSymbol;
        return;
      }
      errors += std::string(errors.empty() ? "" : "; ") + dlerror();
    }
    error = "cannot load the CUDA engine plugin (" + errors + ")";
  });
  if (fn == nullptr) *why = error;
  return fn;
}

}  // namespace
#endif

namespace {

// Who runs the CPU engine's bfloat16 GEMMs for --cpu-gemm (pick_bf16_gemm, cpu_ops.h), and a
// note for the device string. FASTFORMER_AMX_TILES=model (tests only): the AMX kernel on the
// portable model of the tiles, on any CPU (slow; never a serving choice).
Bf16Gemm choose_bf16_gemm(CpuGemm requested, CpuDtype dtype, std::string* note) {
  const char* env = std::getenv("FASTFORMER_AMX_TILES");
  std::string why;
  if (dtype != CpuDtype::kFloat32 && requested != CpuGemm::kOnednn) amx_available(&why);
  return pick_bf16_gemm(cpu_gemm_name(requested), dtype, why,
                        env != nullptr && std::string(env) == "model", note);
}

}  // namespace

bool parse_cpu_gemm(std::string_view name, CpuGemm* out) {
  for (const CpuGemm g : {CpuGemm::kAuto, CpuGemm::kOnednn, CpuGemm::kAmx}) {
    if (name == cpu_gemm_name(g)) {
      *out = g;
      return true;
    }
  }
  return false;
}

const char* cpu_gemm_name(CpuGemm gemm) {
  return gemm == CpuGemm::kAmx ? "amx" : gemm == CpuGemm::kAuto ? "auto" : "onednn";
}

bool parse_backend(const std::string& name, Backend* out) {
  if (name == "auto")
    *out = Backend::kAuto;
  else if (name == "cpu")
    *out = Backend::kCpu;
  else if (name == "cuda")
    *out = Backend::kCuda;
  else
    return false;
  return true;
}

bool parse_dtype(std::string_view name, Dtype* out) {
  for (const Dtype d : {Dtype::kAuto, Dtype::kFloat32, Dtype::kFloat16, Dtype::kBfloat16}) {
    if (name == dtype_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

Dtype dtype_from_name(std::string_view name) {
  Dtype dtype;
  if (!parse_dtype(name, &dtype))
    throw std::invalid_argument("dtype \"" + std::string(name) + "\" is not a dtype");
  return dtype;
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kAuto:
      return "auto";
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kFloat16:
      return "float16";
    case Dtype::kBfloat16:
      return "bfloat16";
  }
  return "auto";
}

DtypeChoice choose_cpu_dtype(Dtype requested, const CpuGemmInfo& gemm) {
  if (requested != Dtype::kAuto) return {requested, ""};
  const std::string found = "oneDNN " + gemm.version + " finds " + gemm.isa;
  if (gemm.has_bf16)
    return {Dtype::kBfloat16, found + ": bfloat16 GEMMs on " + bf16_hardware(gemm.isa)};
  return {Dtype::kFloat32,
          found + ": no AVX512_BF16 or AMX on this CPU" +
              (std::getenv("ONEDNN_MAX_CPU_ISA") ? " (ONEDNN_MAX_CPU_ISA is set)" : "")};
}

std::unique_ptr<Engine> create_engine(std::shared_ptr<const Model> model,
                                      const EngineOptions& options, std::string* why) {
  if (options.max_batch_tokens <= 0) {
    throw EngineError("max_batch_tokens must be positive, got " +
                      std::to_string(options.max_batch_tokens));
  }
  // The CUDA engine's opt-in list (the flag, else the environment), checked on every backend and
  // build: a misspelt name is an error on a CPU machine too, never a setting silently ignored.
  std::string opt_in = options.cuda_opt_in;
  if (const char* env = std::getenv("FASTFORMER_CUDA_OPT_IN"); opt_in.empty() && env != nullptr)
    opt_in = env;
  (void)cuda::parse_cuda_opt_in(opt_in);
  std::string cuda_why =
      "this build has no CUDA engine (configured with FASTFORMER_CUDA=OFF or without nvcc)";
#if defined(FASTFORMER_HAVE_CUDA_ENGINE)
  if (options.backend != Backend::kCpu) {
    cuda::CudaOpsOptions cuda_options;
    cuda_options.dtype = dtype_name(options.dtype);  // the plugin resolves auto for its device
    cuda_options.device = options.device;
    cuda_options.allow_tf32 = options.allow_tf32;
    cuda_options.opt_in = opt_in;
    cuda::CudaOpsChoice chosen;
    Ops* raw_ops = nullptr;
    int status = cuda::kPluginNoDevice;
    if (auto make = cuda_plugin(&cuda_why))
      status = make(model.get(), &cuda_options, &raw_ops, &chosen, &cuda_why);
    if (status == cuda::kPluginError) throw EngineError("CUDA engine: " + cuda_why);
    if (std::unique_ptr<Ops> ops(raw_ops); status == cuda::kPluginOk) {
      if (why != nullptr)
        *why = options.backend == Backend::kAuto
                   ? "auto: CUDA device " + chosen.device_name + " is usable"
                   : "cuda requested";
      const std::string name = chosen.device_name + " (device " + std::to_string(options.device) +
                               ", " + chosen.dtype +
                               (chosen.opt_in.empty() ? "" : ", opt-in " + chosen.opt_in) + ")";
      OpsReport* report = ops->report();
      return std::make_unique<ForwardEngine>(
          std::move(model), std::move(ops), options.max_batch_tokens, "cuda", name,
          DtypeChoice{dtype_from_name(chosen.dtype), chosen.dtype_why}, report);
    }
  }
#endif
  if (options.backend == Backend::kCuda) {
    throw EngineError("backend cuda: " + cuda_why + "; use --backend cpu or auto");
  }
  const CpuGemmInfo& gemm = cpu_gemm_info();
  DtypeChoice choice = choose_cpu_dtype(options.dtype, gemm);
  const std::string dtype = dtype_name(choice.dtype);
  // FASTFORMER_CPU_BFLOAT16=emulate (tests only): the bfloat16 engine over float32
  // primitives, so its storage and rounding are tested on every CPU, with or without
  // bfloat16 GEMMs. Slower than float32; never a serving choice, so never auto's.
  const char* bf16_env = std::getenv("FASTFORMER_CPU_BFLOAT16");
  const bool emulate_bf16 = options.dtype == Dtype::kBfloat16 && bf16_env != nullptr &&
                            std::string(bf16_env) == "emulate";
  if (dtype == "bfloat16" && !gemm.has_bf16 && !emulate_bf16) {
    throw EngineError("dtype bfloat16 on the CPU needs AVX512_BF16 or AMX, and oneDNN " +
                      gemm.version + " finds only " + gemm.isa + " on this CPU" +
                      (std::getenv("ONEDNN_MAX_CPU_ISA") ? " (ONEDNN_MAX_CPU_ISA is set)" : "") +
                      "; serve float32 here, or bfloat16 on such a CPU or with --backend cuda");
  }
  if (dtype != "float32" && dtype != "bfloat16") {
    throw EngineError("dtype " + dtype +
                      ": the CPU engine serves float32, and bfloat16 where the CPU "
                      "has AVX512_BF16 or AMX (the CUDA engine serves float16 and bfloat16)");
  }
  if (why != nullptr) {
    *why = options.backend == Backend::kAuto ? "auto: " + cuda_why + "; using the CPU engine"
                                             : "cpu requested";
  }
  const int threads =
      options.threads > 0 ? options.threads : std::max(1, int(std::thread::hardware_concurrency()));
  const CpuDtype cpu_dtype = dtype == "float32" ? CpuDtype::kFloat32
                             : emulate_bf16     ? CpuDtype::kBfloat16Emulated
                                                : CpuDtype::kBfloat16;
  std::string gemm_note;
  const Bf16Gemm bf16_gemm = choose_bf16_gemm(options.cpu_gemm, cpu_dtype, &gemm_note);
  auto ops = std::make_unique<CpuOps>(threads, model->config(), cpu_dtype, bf16_gemm);
  int64_t pass_tokens = options.pass_tokens >= 0
                            ? options.pass_tokens
                            : engine::pass_tokens(model->config(), model->num_labels(),
                                                  ops->element_size(), last_level_cache_bytes());
  if (pass_tokens >= options.max_batch_tokens) pass_tokens = 0;  // every batch fits one pass
  OpsReport* report = ops.get();
  const std::string bf16_note =
      cpu_dtype == CpuDtype::kBfloat16Emulated ? ", bfloat16 emulated over float32 GEMMs (tests)"
      : cpu_dtype == CpuDtype::kBfloat16       ? ", bfloat16 GEMMs on " + bf16_hardware(gemm.isa)
                                               : "";
  const std::string passes =
      pass_tokens > 0 ? ", passes of " + std::to_string(pass_tokens) + " tokens" : "";
  const std::string device = "cpu (" + std::to_string(threads) + " threads, " + dtype +
                             ", oneDNN " + gemm.version + " " + gemm.isa + bf16_note + gemm_note +
                             passes + ")";
  return std::make_unique<ForwardEngine>(std::move(model), std::move(ops), options.max_batch_tokens,
                                         "cpu", device, std::move(choice), report, pass_tokens);
}

}  // namespace fastformer::engine
