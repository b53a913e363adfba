// The load generator's specifications from the command line: sequence lengths
// (fixed:L, uniform:MIN:MAX as fastformer-bench, or file:PATH) and sweeps (A:B:xF or A:B:+S).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/workload.h"

namespace fastformer::loadgen {

struct LengthsSpec {
  std::string text;                   ///< as given
  LengthSpec range;                   ///< fixed:L / uniform:MIN:MAX
  std::vector<int64_t> file_lengths;  ///< file:PATH, one length a line (drawn uniformly)
  bool from_file = false;

  int64_t max_length() const;
};

// On failure returns false and sets `error`.
bool parse_lengths_spec(const std::string& text, LengthsSpec* out, std::string* error);

// "A:B:xF" (A, A*F, A*F^2, ... up to B, F > 1) or "A:B:+S" (A, A+S, ... up to B, S > 0);
// "A" alone is one step. `integers`: values are rounded to whole numbers (repeats dropped),
// and must be at least 1. On failure returns false and sets `error`.
bool parse_sweep(const std::string& text, bool integers, std::vector<double>* values,
                 std::string* error);

}  // namespace fastformer::loadgen
