// fastformer-json-bench: the HTTP layer's JSON against the obvious alternatives, on what its
// routes carry: rows of 768 float32 (an embedding response), printed and parsed back.
//   print: json::Writer::floats (std::to_chars, shortest round-trip) vs nlohmann::json::dump
//          vs snprintf("%.9g")
//   parse: simdjson (DOM) vs nlohmann::json::parse
// Prints one JSON line per case with microseconds per row and MB/s (docs/benchmarks.md).
#include <simdjson.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/http/json.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void report(const char* what, double seconds, size_t rows, size_t bytes) {
  std::printf("{\"case\":\"%s\",\"us_per_row\":%.2f,\"MB_per_s\":%.1f,\"bytes\":%zu}\n", what,
              seconds * 1e6 / double(rows), double(bytes) / seconds / 1e6, bytes);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t rows = argc > 1 ? std::stoul(argv[1]) : 64, D = argc > 2 ? std::stoul(argv[2]) : 768;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::vector<std::vector<float>> data(rows, std::vector<float>(D));
  for (auto& row : data)
    for (float& x : row) x = normal(rng);
  const int repeats = 20;

  std::string ours;
  const double t_ours = best_seconds(repeats, [&] {
    fastformer::http::json::Writer w;
    w.ch('[');
    for (size_t i = 0; i < rows; ++i) {
      if (i > 0) w.ch(',');
      w.floats(data[i]);
    }
    w.ch(']');
    ours = w.take();
  });
  report("print to_chars (json::Writer)", t_ours, rows, ours.size());

  std::string theirs;
  const double t_nlohmann = best_seconds(repeats, [&] { theirs = nlohmann::json(data).dump(); });
  report("print nlohmann::json::dump", t_nlohmann, rows, theirs.size());

  std::string printed;
  const double t_printf = best_seconds(repeats, [&] {
    printed.clear();
    char buf[32];
    printed.push_back('[');
    for (size_t i = 0; i < rows; ++i) {
      printed.append(i ? ",[" : "[");
      for (size_t k = 0; k < D; ++k) {
        const int n = std::snprintf(buf, sizeof buf, k ? ",%.9g" : "%.9g", double(data[i][k]));
        printed.append(buf, size_t(n));
      }
      printed.push_back(']');
    }
    printed.push_back(']');
  });
  report("print snprintf %.9g", t_printf, rows, printed.size());

  simdjson::dom::parser parser;
  double sum = 0;
  const double t_simdjson = best_seconds(repeats, [&] {
    simdjson::dom::element root = parser.parse(ours);
    for (simdjson::dom::array row : root.get_array())
      for (double x : row) sum += x;
  });
  report("parse simdjson (dom)", t_simdjson, rows, ours.size());
  const double t_nparse = best_seconds(repeats, [&] {
    const nlohmann::json j = nlohmann::json::parse(ours);
    for (const auto& row : j)
      for (const auto& x : row) sum += x.get<double>();
  });
  report("parse nlohmann::json::parse", t_nparse, rows, ours.size());

  // The round trip is exact: every float32 reads back as itself.
  simdjson::dom::element root = parser.parse(ours);
  size_t i = 0, mismatches = 0;
  for (simdjson::dom::array row : root.get_array()) {
    size_t k = 0;
    for (double x : row) mismatches += float(x) != data[i][k++];
    ++i;
  }
  std::printf("{\"case\":\"round trip\",\"mismatches\":%zu,\"checksum\":%.3f}\n", mismatches, sum);
  return mismatches == 0 ? 0 : 1;
}
