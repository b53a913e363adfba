// --dtype, as every program spells it (fastformer-server, fastformer-encode, fastformer-bench):
// the name on the command line (and in its environment variable), engine::Dtype in the options.
// "auto" (the engine picks for its hardware, engine.h) is offered by the programs whose default
// it is (what `*dtype` holds when the flag is added): the server and fastformer-encode.
// fastformer-bench measures the dtype it names (float32 unless told), so its figures never
// depend on the machine.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "server/engine/engine.h"

namespace fastformer {

inline CLI::Option* add_dtype_flag(CLI::App& app, engine::Dtype* dtype, const std::string& help) {
  std::vector<std::string> names = {"float32", "float16", "bfloat16"};
  if (*dtype == engine::Dtype::kAuto) names.insert(names.begin(), "auto");
  return app
      .add_option_function<std::string>(
          "--dtype", [dtype](const std::string& name) { *dtype = engine::dtype_from_name(name); },
          help)
      ->check(CLI::IsMember(names))
      ->default_str(engine::dtype_name(*dtype));
}

// --cpu-gemm (fastformer-server, fastformer-bench): who runs the CPU engine's bfloat16 GEMMs,
// by name ("auto", "onednn", "amx"; engine.h, CpuGemm).
inline CLI::Option* add_cpu_gemm_flag(CLI::App& app, engine::CpuGemm* gemm) {
  return app
      .add_option_function<std::string>(
          "--cpu-gemm", [gemm](const std::string& name) { engine::parse_cpu_gemm(name, gemm); },
          "the CPU engine's bfloat16 GEMMs: auto (per GEMM shape, the faster of oneDNN and the "
          "hand-written AMX kernel, timed at load; oneDNN where the kernel cannot run, and the log "
          "says why), onednn, or amx (the AMX kernel where the CPU has AMX and grants the tiles, "
          "else onednn and the log says why)")
      ->check(CLI::IsMember({"auto", "onednn", "amx"}))
      ->default_str(engine::cpu_gemm_name(*gemm));
}

}  // namespace fastformer
