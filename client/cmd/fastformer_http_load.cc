// fastformer-http-load: a closed-loop load generator for the HTTP routes, the twin of
// fastformer-loadgen's closed loop for gRPC. `--concurrency` connections (one thread each,
// keep-alive, Boost.Beast) each send their next request when the last one is answered, for
// `--warmup-s` then `--duration-s`. The sequences are fastformer-loadgen's (common/workload.h,
// the same seed and lengths give the same token ids), so the two compare one server's
// protocols on the same work (tools/bench_http.py runs them side by side).
//
//   --mode openai-float | openai-base64 | tei | kserve-binary | kserve-json
//
// A request counts as answered when its whole response has been read with status 200; the
// body is not parsed (a client's JSON parsing would share the cores with the server).
// Prints one JSON object: requests, errors, throughput and latency percentiles.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/workload.h"

namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Built {
  std::string target;
  std::string body;
  std::string header_length;  // Inference-Header-Content-Length, kserve-binary only
};

std::string ids_json(const std::vector<fastformer::TokenSequence>& seqs) {
  std::string out = "[";
  for (size_t i = 0; i < seqs.size(); ++i) {
    out += i ? ",[" : "[";
    for (size_t k = 0; k < seqs[i].size(); ++k) {
      if (k) out += ',';
      out += std::to_string(seqs[i][k]);
    }
    out += ']';
  }
  return out + "]";
}

Built build(const std::string& mode, const std::string& model,
            const std::vector<fastformer::TokenSequence>& seqs) {
  Built b;
  if (mode == "openai-float" || mode == "openai-base64") {
    b.target = "/v1/embeddings";
    b.body = "{\"model\":\"" + model + "\",\"input\":" + ids_json(seqs) +
             ",\"encoding_format\":\"" + (mode == "openai-float" ? "float" : "base64") + "\"}";
  } else if (mode == "tei") {
    b.target = "/embed";
    b.body = "{\"inputs\":" + ids_json(seqs) + ",\"normalize\":false}";
  } else if (mode == "kserve-json" || mode == "kserve-binary") {
    // One [rows, length] tensor: the rows must be of one length (fixed: lengths).
    const size_t L = seqs.front().size();
    for (const auto& s : seqs) {
      if (s.size() != L) throw std::runtime_error("kserve modes need fixed: lengths");
    }
    b.target = "/v2/models/" + model + "/infer";
    const std::string shape = "[" + std::to_string(seqs.size()) + "," + std::to_string(L) + "]";
    if (mode == "kserve-json") {
      std::string flat = ids_json(seqs);
      b.body = "{\"inputs\":[{\"name\":\"input_ids\",\"shape\":" + shape +
               ",\"datatype\":\"INT64\",\"data\":" + flat +
               "}],\"outputs\":[{\"name\":\"embedding\",\"parameters\":{\"binary_data\":false}}]}";
    } else {
      std::string raw;
      for (const auto& s : seqs) {
        for (const int32_t id : s) {
          const int64_t v = id;
          raw.append(reinterpret_cast<const char*>(&v), 8);
        }
      }
      const std::string json = "{\"inputs\":[{\"name\":\"input_ids\",\"shape\":" + shape +
                               ",\"datatype\":\"INT64\",\"parameters\":{\"binary_data_size\":" +
                               std::to_string(raw.size()) +
                               "}}],\"outputs\":[{\"name\":\"embedding\",\"parameters\":{"
                               "\"binary_data\":true}}]}";
      b.header_length = std::to_string(json.size());
      b.body = json + raw;
    }
  } else {
    throw std::runtime_error("unknown --mode " + mode);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "127.0.0.1:8000", mode = "openai-float", model = "demo", lengths = "fixed:64";
  int concurrency = 1, per_request = 1, pool_requests = 64;
  int64_t vocab = 1000;
  int32_t pad = 0;
  double warmup_s = 1, duration_s = 5;
  uint64_t seed = 1;
  CLI::App app{"fastformer-http-load: closed-loop load on the HTTP routes"};
  app.add_option("--target", url, "host:port of --http-listen")->capture_default_str();
  app.add_option("--mode", mode, "openai-float, openai-base64, tei, kserve-binary, kserve-json")
      ->capture_default_str();
  app.add_option("--model", model, "model name (OpenAI model field, KServe route)")
      ->capture_default_str();
  app.add_option("--lengths", lengths, "fixed:L or uniform:MIN:MAX")->capture_default_str();
  app.add_option("--vocab-size", vocab, "the model's vocab_size")->capture_default_str();
  app.add_option("--pad-token-id", pad, "the model's pad_token_id")->capture_default_str();
  app.add_option("--sequences-per-request", per_request)->capture_default_str();
  app.add_option("--pool-requests", pool_requests)->capture_default_str();
  app.add_option("--concurrency", concurrency, "connections, one request in flight each")
      ->capture_default_str();
  app.add_option("--warmup-s", warmup_s)->capture_default_str();
  app.add_option("--duration-s", duration_s)->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  fastformer::LengthSpec spec;
  std::string error;
  if (!fastformer::parse_lengths(lengths, &spec, &error)) {
    std::fprintf(stderr, "--lengths: %s\n", error.c_str());
    return 2;
  }
  // fastformer-loadgen's pool: a batch budget of 1 token makes every batch one sequence.
  std::vector<fastformer::TokenSequence> sequences;
  for (auto& batch :
       fastformer::make_workload(spec, vocab, pad, 1, per_request * pool_requests, seed))
    sequences.push_back(std::move(batch.front()));
  std::vector<Built> pool;
  for (int r = 0; r < pool_requests; ++r) {
    std::vector<fastformer::TokenSequence> seqs(sequences.begin() + r * per_request,
                                                sequences.begin() + (r + 1) * per_request);
    pool.push_back(build(mode, model, seqs));
  }
  const size_t colon = url.rfind(':');
  const std::string host = url.substr(0, colon), port = url.substr(colon + 1);

  std::mutex mu;
  std::vector<double> latencies_ms;
  std::vector<double> overheads_ms;  // latency less the server's x-fastformer-compute-us
  std::map<std::string, int64_t> errors;
  int64_t requests = 0, warmup = 0;
  std::atomic<uint64_t> next{0};
  const auto start = Clock::now();
  const auto measure_from =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup_s));
  const auto stop_at = measure_from + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(duration_s));
  Clock::time_point last_answer = measure_from;
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      net::io_context ioc;
      tcp::resolver resolver(ioc);
      beast::tcp_stream stream(ioc);
      bool connected = false;
      beast::flat_buffer buffer;
      while (Clock::now() < stop_at) {
        const Built& b = pool[next.fetch_add(1) % pool.size()];
        const auto sent = Clock::now();
        std::string outcome = "OK";
        double compute_us = -1;
        try {
          if (!connected) {
            stream.connect(resolver.resolve(host, port));
            stream.socket().set_option(tcp::no_delay(true));
            connected = true;
          }
          bhttp::request<bhttp::string_body> req{bhttp::verb::post, b.target, 11};
          req.set(bhttp::field::host, host);
          req.set(bhttp::field::content_type, "application/json");
          if (!b.header_length.empty()) req.set("Inference-Header-Content-Length", b.header_length);
          req.body() = b.body;
          req.prepare_payload();
          bhttp::write(stream, req);
          bhttp::response<bhttp::string_body> res;
          bhttp::read(stream, buffer, res);
          if (res.result() != bhttp::status::ok)
            outcome = "HTTP " + std::to_string(res.result_int());
          const auto compute = res.find("x-fastformer-compute-us");
          compute_us = compute == res.end() ? -1 : std::stod(std::string(compute->value()));
          if (!res.keep_alive()) {
            beast::error_code ec;
            stream.socket().close(ec);
            connected = false;
          }
        } catch (const std::exception& e) {
          outcome = std::string("transport: ") + e.what();
          beast::error_code ec;
          stream.socket().close(ec);
          connected = false;
        }
        const auto now = Clock::now();
        std::lock_guard lock(mu);
        if (sent < measure_from) {
          ++warmup;
          continue;
        }
        ++requests;
        last_answer = std::max(last_answer, now);
        if (outcome != "OK") {
          ++errors[outcome];
          continue;
        }
        const double latency = std::chrono::duration<double, std::milli>(now - sent).count();
        latencies_ms.push_back(latency);
        if (compute_us >= 0) overheads_ms.push_back(latency - compute_us / 1000);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::max(stop_at, last_answer) - measure_from).count();
  std::sort(latencies_ms.begin(), latencies_ms.end());
  std::sort(overheads_ms.begin(), overheads_ms.end());
  auto pick = [](const std::vector<double>& v, double p) {
    if (v.empty()) return 0.0;
    return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
  };
  auto pct = [&](double p) { return pick(latencies_ms, p); };
  const double ok = double(latencies_ms.size());
  std::printf(
      "{\"mode\":\"%s\",\"concurrency\":%d,\"sequences_per_request\":%d,\"lengths\":\"%s\","
      "\"requests\":%lld,\"succeeded\":%lld,\"warmup_requests\":%lld,\"elapsed_s\":%.3f,"
      "\"requests_per_s\":%.2f,\"sequences_per_s\":%.2f,\"p50_ms\":%.3f,\"p90_ms\":%.3f,"
      "\"p99_ms\":%.3f,\"overhead_p50_ms\":%.3f,\"overhead_p99_ms\":%.3f,\"errors\":{",
      mode.c_str(), concurrency, per_request, lengths.c_str(), (long long)requests,
      (long long)latencies_ms.size(), (long long)warmup, elapsed, ok / elapsed,
      ok * per_request / elapsed, pct(0.5), pct(0.9), pct(0.99), pick(overheads_ms, 0.5),
      pick(overheads_ms, 0.99));
  bool first = true;
  for (const auto& [what, n] : errors) {
    std::printf("%s\"%s\":%lld", first ? "" : ",", what.c_str(), (long long)n);
    first = false;
  }
  std::printf("}}\n");
  return errors.empty() ? 0 : 1;
}
