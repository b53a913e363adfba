// --dtype, as every program spells it (fastformer-server, fastformer-encode, fastformer-bench):
// the name on the command line (and in its environment variable), engine::Dtype in the options.
// "auto" is not offered yet (engine.h says what it will mean).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "server/engine/engine.h"

namespace fastformer {

inline CLI::Option* add_dtype_flag(CLI::App& app, engine::Dtype* dtype, const std::string& help) {
  return app
      .add_option_function<std::string>(
          "--dtype", [dtype](const std::string& name) { *dtype = engine::dtype_from_name(name); },
          help)
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}))
      ->default_str(engine::dtype_name(*dtype));
}

}  // namespace fastformer
