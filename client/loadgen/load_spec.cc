#include "client/loadgen/load_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>

namespace fastformer::loadgen {
namespace {

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(*out);
}

}  // namespace

int64_t LengthsSpec::max_length() const {
  if (!from_file) return range.max;
  return file_lengths.empty() ? 0 : *std::max_element(file_lengths.begin(), file_lengths.end());
}

bool parse_lengths_spec(const std::string& text, LengthsSpec* out, std::string* error) {
  out->text = text;
  if (!text.starts_with("file:")) {
    out->from_file = false;
    if (parse_lengths(text, &out->range, error)) return true;
    *error += " or file:PATH";
    return false;
  }
  const std::string path = text.substr(5);
  std::ifstream in(path);
  if (!in) {
    *error = "lengths \"" + text + "\": cannot read " + path;
    return false;
  }
  out->from_file = true;
  out->file_lengths.clear();
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    const std::string item = line.substr(first, last - first + 1);
    int64_t length = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), length);
    if (ec != std::errc() || ptr != item.data() + item.size() || length < 1) {
      *error = path + ": line " + std::to_string(number) + ": \"" + item +
               "\" is not a positive integer length";
      return false;
    }
    out->file_lengths.push_back(length);
  }
  if (out->file_lengths.empty()) {
    *error = "lengths \"" + text + "\": " + path + " holds no lengths";
    return false;
  }
  return true;
}

bool parse_sweep(const std::string& text, bool integers, std::vector<double>* values,
                 std::string* error) {
  values->clear();
  const auto bad = [&](const std::string& why) {
    *error = "sweep \"" + text + "\": " + why + " (expected A:B:xF or A:B:+S)";
    return false;
  };
  const size_t c1 = text.find(':');
  double first = 0, last = 0, step = 0;
  bool multiply = false;
  if (c1 == std::string::npos) {
    if (!parse_double(text, &first)) return bad("not a number");
    last = first;
  } else {
    const size_t c2 = text.find(':', c1 + 1);
    if (c2 == std::string::npos) return bad("missing the step");
    const std::string step_text = text.substr(c2 + 1);
    if (!parse_double(text.substr(0, c1), &first) ||
        !parse_double(text.substr(c1 + 1, c2 - c1 - 1), &last)) {
      return bad("A and B must be numbers");
    }
    if (step_text.size() < 2 || (step_text[0] != 'x' && step_text[0] != '+') ||
        !parse_double(step_text.substr(1), &step)) {
      return bad("the step must be xF or +S");
    }
    multiply = step_text[0] == 'x';
    if (multiply ? step <= 1.0 : step <= 0.0) return bad("the step must grow (F > 1, S > 0)");
  }
  if (first <= 0 || last < first) return bad("needs 0 < A <= B");
  if (integers && first < 1) return bad("values must be at least 1");
  const double tolerance = 1e-9 * last;  // A*F^k may land a hair beside B
  for (double v = first; v <= last + tolerance; v = multiply ? v * step : v + step) {
    const double value = integers ? std::round(v) : v;
    if (values->empty() || value > values->back()) values->push_back(value);
    if (c1 == std::string::npos) break;
  }
  return true;
}

}  // namespace fastformer::loadgen
