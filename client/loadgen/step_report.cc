#include "client/loadgen/step_report.h"

#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

namespace fastformer::loadgen {
namespace {

using nlohmann::json;

double ms(int64_t ns) { return double(ns) / 1e6; }

// Percentiles in milliseconds; null values when nothing was recorded.
json percentiles_ms(const LatencyHistogram& h) {
  const auto value = [&](double p) {
    return h.count() ? json(ms(h.percentile(p))) : json(nullptr);
  };
  return {{"p50", value(50)},
          {"p90", value(90)},
          {"p99", value(99)},
          {"p999", value(99.9)},
          {"max", h.count() ? json(ms(h.max())) : json(nullptr)},
          {"mean", h.count() ? json(h.mean() / 1e6) : json(nullptr)},
          {"min", h.count() ? json(ms(h.min())) : json(nullptr)}};
}

double per_second(int64_t n, const StepResult& r) {
  return r.elapsed_s > 0 ? double(n) / r.elapsed_s : 0.0;
}

int64_t error_total(const StepResult& r) {
  int64_t n = 0;
  for (const auto& [code, count] : r.errors) n += count;
  return n;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string shortest(double v) {
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

}  // namespace

std::string step_json(const StepResult& r, const RunInfo& run) {
  const LoadStep& s = r.step;
  json j;
  j["mode"] = s.open_loop ? "open" : "closed";
  j["stream"] = s.stream;
  if (!s.open_loop || s.stream) j["concurrency"] = s.concurrency;
  if (s.open_loop) {
    j["rate"] = s.rate;
    j["arrivals"] = s.poisson ? "poisson" : "constant";
    j["max_send_lag_ms"] = ms(r.max_send_lag_ns);
  }
  j["lengths"] = run.lengths;
  j["sequences_per_request"] = run.sequences_per_request;
  j["warmup_s"] = s.warmup_s;
  j["duration_s"] = s.duration_s;
  j["elapsed_s"] = r.elapsed_s;
  j["requests"] = r.requests;
  j["succeeded"] = r.succeeded;
  j["warmup_requests"] = r.warmup_requests;
  j["sequences"] = r.sequences;
  j["tokens"] = r.tokens;
  j["requests_per_second"] = per_second(r.succeeded, r);
  j["sequences_per_second"] = per_second(r.sequences, r);
  j["tokens_per_second"] = per_second(r.tokens, r);
  j["latency_ms"] = percentiles_ms(r.latency);
  j["server_queue_ms"] = percentiles_ms(r.server_queue);
  j["server_compute_ms"] = percentiles_ms(r.server_compute);
  j["errors"] = json::object();
  for (const auto& [code, count] : r.errors) j["errors"][code] = count;
  j["warmup_errors"] = json::object();
  for (const auto& [code, count] : r.warmup_errors) j["warmup_errors"][code] = count;
  return j.dump();
}

std::string step_text(const StepResult& r) {
  const LoadStep& s = r.step;
  std::string line =
      s.open_loop ? "rate " + shortest(s.rate) + "/s" + (s.poisson ? " poisson" : " constant")
                  : "concurrency " + std::to_string(s.concurrency);
  if (s.stream)
    line += s.open_loop ? " (" + std::to_string(s.concurrency) + " streams)" : " (streams)";
  line += ": " + fixed(per_second(r.succeeded, r), 1) + " req/s, " +
          fixed(per_second(r.sequences, r), 1) + " seq/s, " + fixed(per_second(r.tokens, r), 0) +
          " tokens/s";
  const LatencyHistogram& h = r.latency;
  if (h.count()) {
    line += " | latency ms p50 " + fixed(ms(h.percentile(50)), 2) + " p90 " +
            fixed(ms(h.percentile(90)), 2) + " p99 " + fixed(ms(h.percentile(99)), 2) + " p99.9 " +
            fixed(ms(h.percentile(99.9)), 2) + " max " + fixed(ms(h.max()), 2);
    line += " | server queue p50 " + fixed(ms(r.server_queue.percentile(50)), 2) + " compute p50 " +
            fixed(ms(r.server_compute.percentile(50)), 2);
  }
  line += " | " + std::to_string(r.requests) + " requests";
  if (r.errors.empty()) {
    line += ", no errors";
  } else {
    for (const auto& [code, count] : r.errors) line += ", " + code + " " + std::to_string(count);
  }
  if (s.open_loop && r.max_send_lag_ns > 1'000'000) {
    line +=
        " (the generator fell up to " + fixed(ms(r.max_send_lag_ns), 1) + " ms behind schedule)";
  }
  return line;
}

std::string csv_header(bool open_loop) {
  return std::string(open_loop ? "rate" : "concurrency") +
         ",requests_per_second,tokens_per_second,p50_ms,p90_ms,p99_ms,p999_ms,max_ms,errors";
}

std::string csv_row(const StepResult& r) {
  const LatencyHistogram& h = r.latency;
  const auto latency_cell = [&](double p) {
    return h.count() ? fixed(ms(p < 100 ? h.percentile(p) : h.max()), 3) : std::string();
  };
  const std::vector<std::string> cells = {
      r.step.open_loop ? shortest(r.step.rate) : std::to_string(r.step.concurrency),
      fixed(per_second(r.succeeded, r), 3),
      fixed(per_second(r.tokens, r), 1),
      latency_cell(50),
      latency_cell(90),
      latency_cell(99),
      latency_cell(99.9),
      latency_cell(100),
      std::to_string(error_total(r))};
  std::string row;
  for (const auto& cell : cells) {
    if (&cell != &cells.front()) row.push_back(',');
    row.append(cell);
  }
  return row;
}

}  // namespace fastformer::loadgen
