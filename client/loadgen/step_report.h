// How a step's result is written: one JSON object per line (--json), one CSV row per step
// (--csv, for the latency-versus-throughput plot) or a line of text.
//
// Rates are per second of the measured phase (StepResult::elapsed_s) and count successful
// requests only; `requests` counts every measured answer, errors included.
#pragma once

#include <string>

#include "client/loadgen/load_runner.h"

namespace fastformer::loadgen {

// What the report says about the run besides the step itself.
struct RunInfo {
  std::string lengths;
  int sequences_per_request = 1;
};

std::string step_json(const StepResult& result, const RunInfo& run);  ///< one line, no newline
std::string step_text(const StepResult& result);                      ///< one line, no newline
// The CSV header and rows: concurrency (closed loop) or rate (open loop) first.
std::string csv_header(bool open_loop);
std::string csv_row(const StepResult& result);

}  // namespace fastformer::loadgen
