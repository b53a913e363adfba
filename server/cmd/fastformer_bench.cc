// fastformer-bench: runs an engine on the synthetic workload of common/workload.h,
// with no server, and prints throughput, batch latency percentiles and peak memory.
// tools/bench_pytorch.py runs the reference model on the same sequences.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/workload.h"
#include "server/cmd/dtype_flag.h"
#include "server/engine/cpu/amx_gemm.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cpu/peak_probe.h"
#include "server/engine/engine.h"
#include "server/engine/forward.h"
#include "server/engine/model.h"

namespace {

using namespace fastformer;
using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {  // nearest rank
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

// The engine's profile as JSON rows: per batch, averaged over the batches profiled, with the
// achieved rates and each op's share of the batch time (the ops' times add up to it).
nlohmann::ordered_json profile_rows(const std::vector<engine::OpProfile>& ops) {
  double total_ms = 0;
  for (const auto& op : ops) total_ms += op.ms;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& op : ops) {
    const double seconds = op.ms / 1e3;
    rows.push_back({{"name", op.name},
                    {"layer", op.layer},
                    {"calls", op.calls},
                    {"ms", op.ms},
                    {"bytes", op.bytes},
                    {"flops", op.flops},
                    {"gbps", seconds > 0 ? op.bytes / seconds / 1e9 : 0.0},
                    {"tflops", seconds > 0 ? op.flops / seconds / 1e12 : 0.0},
                    {"share", total_ms > 0 ? op.ms / total_ms : 0.0},
                    {"kernel", op.kernel}});
  }
  return rows;
}

void print_rows(const nlohmann::ordered_json& rows, std::ostream& out);

void print_profile(const nlohmann::ordered_json& rows, const nlohmann::ordered_json& roofline,
                   std::ostream& out) {
  char line[400];
  std::snprintf(line, sizeof line,
                "%-20s %5s %6s %10s %12s %12s %9s %8s %7s %9s %9s %8s %8s %8s  %s\n", "op", "layer",
                "calls", "ms", "MB", "GFLOP", "GB/s", "TFLOP/s", "share", "ceiling", "bound ms",
                "x bound", "of peak", "of L2fed", "kernel");
  const size_t rounds =
      rows.empty() || !rows[0].contains("ms_rounds") ? 1 : rows[0]["ms_rounds"].size();
  out << "profile (per batch, the median of " << rounds
      << " rounds; ceiling: the GEMM probe's N-thread TFLOP/s for the op's shape";
  if (!roofline.is_null()) {
    out << "; bound: the larger of bytes / copy rate and FLOPs / multiply-add peak, for ops "
           "other than GEMMs; of peak: a GEMM's share of the hardware's peak; of L2fed: an AMX "
           "GEMM's share of the L2-fed tile loop's ceiling)\n"
        << "roofline: memcpy (GB/s copied)";
    for (const auto& copy : roofline["copy"])
      out << " " << (copy["bytes"].get<size_t>() >> 20) << " MiB " << copy["gbps"].get<double>();
    out << "; multiply-add peak " << roofline["fma_gflops"].get<double>() << " GFLOP/s ("
        << roofline["fma_how"].get<std::string>() << ")";
    if (roofline["bf16_gflops"].get<double>() > 0)
      out << ", bfloat16 peak " << roofline["bf16_gflops"].get<double>() << " GFLOP/s ("
          << roofline["bf16_how"].get<std::string>() << ")";
    if (roofline["amx_gflops"].get<double>() > 0)
      out << ", AMX peak " << roofline["amx_gflops"].get<double>() << " GFLOP/s ("
          << roofline["amx_how"].get<std::string>() << ")";
    out << "\n" << line;
    return print_rows(rows, out);
  }
  out << ")\n" << line;
  print_rows(rows, out);
}

// The profile's rows and their total (print_profile's table body).
void print_rows(const nlohmann::ordered_json& rows, std::ostream& out) {
  char line[400];
  double total_ms = 0;
  for (const auto& r : rows) {
    char ceiling[32] = "", bound[32] = "", of_bound[32] = "", of_peak[32] = "", of_l2[32] = "";
    if (r.contains("of_l2_fed"))
      std::snprintf(of_l2, sizeof of_l2, "%.0f%%", 100 * r["of_l2_fed"].get<double>());
    if (r.contains("of_ceiling"))
      std::snprintf(ceiling, sizeof ceiling, "%.0f%%", 100 * r["of_ceiling"].get<double>());
    if (r.contains("bound_ms")) {
      std::snprintf(bound, sizeof bound, "%.4f", r["bound_ms"].get<double>());
      std::snprintf(of_bound, sizeof of_bound, "%.2fx", r["of_bound"].get<double>());
    }
    if (r.contains("of_peak"))
      std::snprintf(of_peak, sizeof of_peak, "%.0f%%", 100 * r["of_peak"].get<double>());
    std::snprintf(
        line, sizeof line,
        "%-20s %5d %6.1f %10.4f %12.3f %12.3f %9.1f %8.2f %6.1f%% %9s %9s %8s %8s %8s  %s\n",
        r["name"].get<std::string>().c_str(), r["layer"].get<int>(), r["calls"].get<double>(),
        r["ms"].get<double>(), r["bytes"].get<double>() / 1e6, r["flops"].get<double>() / 1e9,
        r["gbps"].get<double>(), r["tflops"].get<double>(), 100 * r["share"].get<double>(), ceiling,
        bound, of_bound, of_peak, of_l2, r["kernel"].get<std::string>().c_str());
    out << line;
    total_ms += r["ms"].get<double>();
  }
  std::snprintf(line, sizeof line, "%-20s %5s %6s %10.4f\n", "batch", "", "", total_ms);
  out << line;
}

// The hardware peak (GFLOP/s) of a GEMM kernel by its name: AMX's tiles for an AMX kernel
// (oneDNN's "avx512_core_amx_bf16", ours "amx:"), AVX512_BF16's dot product for another
// bfloat16 one, else the float32 multiply-add peak.
double kernel_peak(const std::string& kernel, const nlohmann::ordered_json& roofline) {
  const double amx = roofline["amx_gflops"].get<double>();
  const double dot = roofline["bf16_gflops"].get<double>();
  if (kernel.find("amx") != std::string::npos && amx > 0) return amx;
  if (kernel.find("bf16") != std::string::npos && dot > 0) return dot;
  return roofline["fma_gflops"].get<double>();
}

// The AMX kernel's epilogue alone (engine::epilogue_ns_per_element: finish_block on one
// thread), per epilogue: ns per output element; it needs no AMX (vector code).
nlohmann::ordered_json epilogue_probe(std::ostream& out) {
  using engine::Activation;
  using engine::Epilogue;
  const std::pair<const char*, std::pair<Epilogue, Activation>> epilogues[] = {
      {"store", {Epilogue::kStore, Activation::kGeluErf}},
      {"bias", {Epilogue::kBias, Activation::kGeluErf}},
      {"accumulate", {Epilogue::kAccumulate, Activation::kGeluErf}},
      {"bias+gelu_erf", {Epilogue::kBiasAct, Activation::kGeluErf}},
      {"bias+gelu_tanh", {Epilogue::kBiasAct, Activation::kGeluTanh}},
      {"bias+silu", {Epilogue::kBiasAct, Activation::kSilu}},
      {"bias+relu", {Epilogue::kBiasAct, Activation::kRelu}},
  };
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  out << "AMX kernel's epilogue (finish_block, one thread, 32 x 32 blocks), ns per element:";
  for (const auto& [name, e] : epilogues) {
    const double ns = engine::epilogue_ns_per_element(e.first, e.second, 0.2);
    char cell[64];
    std::snprintf(cell, sizeof cell, " %s %.3f", name, ns);
    out << cell;
    rows.push_back({{"epilogue", name}, {"ns_per_element", ns}});
  }
  out << "\n";
  return rows;
}

// The GEMM probe: each GEMM site's shape (as the graph ran it, M = the largest batch's
// tokens) timed alone with oneDNN's packed, fixed-M primitive, on one thread and on all of
// the engine's threads (oneDNN's own team): the ceiling for that op on this CPU.
nlohmann::ordered_json gemm_probe(const engine::ForwardEngine& eng, bool bf16, int64_t m,
                                  int threads, const nlohmann::ordered_json& roofline,
                                  std::ostream& out) {
  // The hardware's peak for each probed kernel on `threads` threads (measure_roofline).
  if (!roofline.is_null()) {
    out << "hardware peak on " << threads << " threads: float32 "
        << roofline["fma_gflops"].get<double>() << " GFLOP/s ("
        << roofline["fma_how"].get<std::string>() << ")";
    if (bf16)
      out << "; bfloat16 AVX512_BF16 " << roofline["bf16_gflops"].get<double>() << " ("
          << roofline["bf16_how"].get<std::string>() << "); AMX "
          << roofline["amx_gflops"].get<double>() << " (" << roofline["amx_how"].get<std::string>()
          << ")";
    out << "\n";
    for (const auto& c : roofline["amx_ceilings"]) {
      out << "AMX tile loop, one core, " << c["name"].get<std::string>() << ": ";
      if (c["gflops_1_thread"].get<double>() > 0) {
        out << c["gflops_1_thread"].get<double>() << " GFLOP/s (" << c["how"].get<std::string>()
            << ")\n";
      } else {
        out << "not measured (" << c["how"].get<std::string>() << ")\n";
      }
    }
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<std::string> seen;
  char line[320];
  const engine::CpuGemmInfo& info = engine::cpu_gemm_info();
  out << "GEMM probe (oneDNN " << info.version << " " << info.isa << ", "
      << (bf16 ? "bfloat16" : "float32") << ", M fixed at " << m
      << ", packed weights; bfloat16 GEMMs here: " << engine::bf16_hardware(info.isa) << ")\n";
  std::snprintf(line, sizeof line, "%-20s %6s %6s %6s %12s %12s %8s  %s\n", "op", "M", "N", "K",
                "1 thread", (std::to_string(threads) + " threads").c_str(), "of peak",
                "kernel (GFLOP/s)");
  out << line;
  for (const engine::GemmSite& site : eng.gemm_sites()) {
    const std::string name = site.name;
    if (name == "classifier_gemm" || std::find(seen.begin(), seen.end(), name) != seen.end())
      continue;
    seen.push_back(name);
    const engine::PackedMatmul::Shape shape{site.weight->out, site.weight->in, site.lda, site.ldc,
                                            site.epilogue,    site.act,        bf16,     false};
    std::string kernel;
    const double one = engine::probe_gflops(shape, m, 1, 0.3, &kernel);
    const double all = engine::probe_gflops(shape, m, threads, 0.3, nullptr);
    const double peak = roofline.is_null() ? 0 : kernel_peak(kernel, roofline);
    char of_peak[32] = "";
    if (peak > 0) std::snprintf(of_peak, sizeof of_peak, "%.0f%%", 100 * all / peak);
    std::snprintf(line, sizeof line, "%-20s %6lld %6lld %6lld %12.1f %12.1f %8s  %s\n",
                  name.c_str(), (long long)m, (long long)shape.n, (long long)shape.k, one, all,
                  of_peak, kernel.c_str());
    out << line;
    rows.push_back({{"name", name},
                    {"m", m},
                    {"n", shape.n},
                    {"k", shape.k},
                    {"dtype", bf16 ? "bfloat16" : "float32"},
                    {"kernel", kernel},
                    {"gflops_1_thread", one},
                    {"threads", threads},
                    {"gflops_n_threads", all},
                    {"peak_gflops", peak},
                    {"of_peak", peak > 0 ? all / peak : 0.0}});
    const double l2_fed = roofline.is_null() ? 0 : roofline.value("amx_l2_fed_gflops", 0.0);
    if (kernel.find("amx") != std::string::npos && l2_fed > 0)
      rows.back()["of_l2_fed"] = all / l2_fed;  // the share of the L2-fed tile loop's ceiling
  }
  return rows;
}

// The flags, one field each; their help text is in add_flags.
struct BenchOptions {
  std::string model_dir;                        ///< --model-dir
  std::string backend_name = "cpu";             ///< --backend: cpu, cuda or auto
  std::string lengths_text = "uniform:16:256";  ///< --lengths: fixed:L or uniform:MIN:MAX
  engine::EngineOptions engine;                 ///< --dtype, --threads, --device, --allow-tf32
  int64_t batch_tokens = 8192;                  ///< --batch-tokens: tokens per ragged batch
  double seconds = 10;                          ///< --seconds: timed duration
  uint64_t seed = 1;                            ///< --seed: workload seed
  int pool_batches = 8;                         ///< --pool-batches: distinct batches, cycled
  int warmup_batches = 2;                       ///< --warmup-batches: untimed batches first
  bool json_output = false;                     ///< --json
  bool print_workload = false;                  ///< --print-workload
  bool profile = false;                         ///< --profile
  int profile_rounds = 3;                       ///< --profile-rounds
  bool gemm_probe = false;                      ///< --gemm-probe
  bool no_staging = false;                      ///< --no-staging
};

void add_flags(CLI::App& app, BenchOptions* o) {
  app.add_option("--model-dir", o->model_dir, "model directory")->required();
  app.add_option("--backend", o->backend_name, "cpu, cuda or auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  add_dtype_flag(app, &o->engine.dtype, "float32, float16 or bfloat16");
  app.add_option("--threads", o->engine.threads, "CPU threads, 0 = all cores")
      ->capture_default_str();
  app.add_option("--device", o->engine.device, "CUDA device ordinal")->capture_default_str();
  app.add_flag("--allow-tf32", o->engine.allow_tf32, "TF32 GEMMs for float32 on the CUDA engine");
  app.add_option("--cuda-opt-in", o->engine.cuda_opt_in,
                 "the CUDA engine's opt-in kernels, comma-separated: cutlass-gelu, fused-key-pool, "
                 "gemm-timing, cuda-graphs, "
                 "all or none (docs/kernels.md); default: FASTFORMER_CUDA_OPT_IN, else none");
  add_cpu_gemm_flag(app, &o->engine.cpu_gemm);
  app.add_flag("--no-staging", o->no_staging,
               "do not stage each next batch's inputs while the batch before runs (the server's "
               "scheduler does; the CUDA engine copies them ahead, docs/kernels.md)");
  app.add_option("--batch-tokens", o->batch_tokens, "tokens per ragged batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--pass-tokens", o->engine.pass_tokens,
                 "CPU engine: the most tokens a pass of the forward graph holds; -1 sizes passes "
                 "to the CPU's cache, 0 runs every batch in one pass")
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  app.add_option("--lengths", o->lengths_text, "fixed:L or uniform:MIN:MAX")->capture_default_str();
  app.add_option("--seconds", o->seconds, "timed duration (at least one pass over the pool)")
      ->capture_default_str();
  app.add_option("--seed", o->seed, "workload seed")->capture_default_str();
  app.add_option("--pool-batches", o->pool_batches, "distinct batches, cycled")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup-batches", o->warmup_batches, "untimed batches first")
      ->capture_default_str();
  app.add_flag("--json", o->json_output, "print one JSON object");
  app.add_flag(
      "--profile", o->profile,
      "after the timed run, time every op of the forward over one pass of the pool (CUDA events on "
      "a GPU, the wall clock on the CPU): a \"profile\" array in the JSON, a table on stderr");
  app.add_option("--profile-rounds", o->profile_rounds,
                 "--profile: passes over the pool, each timed on its own; each op's time is the "
                 "median of its rounds (one round's stall, the host taking the CPU, moves no row), "
                 "every round's kept in the JSON as ms_rounds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--gemm-probe", o->gemm_probe,
               "CPU engine: after the timed run, time oneDNN's packed fixed-M primitive alone on "
               "each GEMM shape the model ran (M = the largest batch), on 1 and on --threads "
               "threads: a \"gemm_probe\" array in the JSON, a table on stderr, and with --profile "
               "each GEMM op's share of its ceiling; and the AMX kernel's epilogue alone, ns per "
               "element for each epilogue (\"epilogue_probe\"; any CPU)");
  app.add_flag("--print-workload", o->print_workload,
               "print the workload's batches as JSON (token ids) and exit");
}

// False (after saying why on stderr) when the model cannot run the workload --lengths asks for.
bool model_fits_workload(const engine::Model& model, const LengthSpec& lengths,
                         const std::string& lengths_text) {
  const auto& config = model.config();
  if (lengths.max > config.max_position_embeddings) {
    std::cerr << "fastformer-bench: --lengths " << lengths_text
              << " exceeds max_position_embeddings " << config.max_position_embeddings << "\n";
    return false;
  }
  if (!model.has_word_embedding()) {
    std::cerr << "fastformer-bench: the model has no word embedding; the workload is token ids\n";
    return false;
  }
  return true;
}

// The workload's pool as the engine takes it: one ragged batch per pool batch.
struct BatchPool {
  std::vector<engine::RaggedBatch> batches;
  int64_t largest_batch_tokens = 0;  ///< the engine's buffers and the GEMM probe's M
};

BatchPool make_batches(const std::vector<WorkloadBatch>& pool, const engine::ModelConfig& config) {
  BatchPool result;
  result.batches.resize(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) {
    for (const auto& seq : pool[i]) result.batches[i].add({seq, {}}, config);
    result.largest_batch_tokens =
        std::max<int64_t>(result.largest_batch_tokens, result.batches[i].num_tokens());
  }
  return result;
}

// What the timed run measured.
struct TimedRun {
  std::vector<double> latencies_ms;  ///< one per batch, in the order run
  int64_t tokens = 0;                ///< real tokens encoded
  int64_t sequences = 0;             ///< sequences encoded
  double seconds = 0;                ///< wall time from the first timed batch to the last's end

  double tokens_per_second() const { return double(tokens) / seconds; }
  double sequences_per_second() const { return double(sequences) / seconds; }
};

// Engine::stage on a thread of its own, as the server's batch former calls it: the next batch's
// inputs go to the device while the current one encodes (the CUDA engine; the CPU engine
// stages nothing and returns 0).
class Stager {
 public:
  explicit Stager(engine::Engine& eng) : eng_(eng), thread_([this] { loop(); }) {}
  ~Stager() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(const engine::RaggedBatch* batch) {
    std::lock_guard lock(mu_);
    pending_ = batch;
    done_ = false;
    cv_.notify_all();
  }
  uint64_t ticket() {  // waits for the stage() start() asked for
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return ticket_;
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || pending_ != nullptr; });
      if (stopping_) return;
      const engine::RaggedBatch* batch = std::exchange(pending_, nullptr);
      lock.unlock();
      uint64_t ticket = 0;
      try {
        ticket = eng_.stage(*batch);
      } catch (const std::exception&) {
        ticket = 0;  // encode copies the inputs itself
      }
      lock.lock();
      ticket_ = ticket;
      done_ = true;
      cv_.notify_all();
    }
  }
  engine::Engine& eng_;
  std::mutex mu_;
  std::condition_variable cv_;
  const engine::RaggedBatch* pending_ = nullptr;
  uint64_t ticket_ = 0;
  bool done_ = true, stopping_ = false;
  std::thread thread_;
};

// The warm-up batches untimed, then the pool cycled until `seconds` have passed and every
// batch has run at least once; unless `no_staging`, each next batch staged while one encodes.
TimedRun run_timed(engine::Engine& eng, const std::vector<engine::RaggedBatch>& batches,
                   int warmup_batches, double seconds, bool no_staging) {
  const OutputOptions out_options;
  for (int i = 0; i < warmup_batches; ++i)
    eng.encode(batches[size_t(i) % batches.size()], {&out_options, 1});
  Stager stager(eng);
  uint64_t ticket = no_staging ? 0 : eng.stage(batches[0]);
  TimedRun run;
  const auto start = Clock::now();
  for (size_t i = 0;; ++i) {
    const auto& batch = batches[i % batches.size()];
    const auto t0 = Clock::now();
    if (!no_staging) stager.start(&batches[(i + 1) % batches.size()]);
    eng.encode_staged(batch, {&out_options, 1}, ticket);
    ticket = no_staging ? 0 : stager.ticket();
    const auto t1 = Clock::now();
    run.latencies_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    run.tokens += batch.num_tokens();
    run.sequences += batch.num_sequences();
    run.seconds = std::chrono::duration<double>(t1 - start).count();
    if (run.seconds >= seconds && i + 1 >= batches.size()) break;
  }
  return run;
}

// The JSON result of the timed run, with what the engine reports about its GEMMs after it.
nlohmann::ordered_json result_json(const BenchOptions& options, engine::Engine& eng,
                                   const engine::Model& model, const TimedRun& run) {
  nlohmann::ordered_json result = {
      {"backend", eng.backend_name()},
      {"device", eng.device_name()},
      {"dtype", engine::dtype_name(eng.dtype().dtype)},
      {"model", model.config().model_name},
      {"lengths", options.lengths_text},
      {"batch_tokens", options.batch_tokens},
      {"pass_tokens", eng.pass_tokens()},
      {"seed", options.seed},
      {"staging", !options.no_staging},
      {"tokens_per_second", run.tokens_per_second()},
      {"sequences_per_second", run.sequences_per_second()},
      {"batches", run.latencies_ms.size()},
      {"tokens", run.tokens},
      {"sequences", run.sequences},
      {"seconds", run.seconds},
      {"batch_latency_p50_ms", percentile(run.latencies_ms, 50)},
      {"batch_latency_p99_ms", percentile(run.latencies_ms, 99)},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"weight_bytes", model.weight_bytes()},
  };
  // After the timed run: what the GEMMs reach on one thread, and which kernel (CPU engine).
  if (const engine::SpeedCheck speed = eng.speed_check(); speed.ran)
    result["gemm_self_check"] = speed.message;
  result["packed_weight_bytes"] = eng.packed_weight_bytes();
  result["gemm_sites"] = eng.gemm_report();
  return result;
}

// The CPU engine's threads: --threads, or every core.
int bench_threads(const engine::EngineOptions& options) {
  return options.threads > 0 ? options.threads
                             : int(std::max(1u, std::thread::hardware_concurrency()));
}

// --gemm-probe: the probe's rows into `rows` (left null where the CPU cannot run bfloat16
// GEMMs); false, after saying why, when the engine is not the CPU engine.
bool run_gemm_probe(const engine::Engine& eng, const engine::EngineOptions& options, int64_t m,
                    const nlohmann::ordered_json& roofline, nlohmann::ordered_json* rows) {
  const auto* forward = dynamic_cast<const engine::ForwardEngine*>(&eng);
  const bool bf16 = eng.dtype().dtype == engine::Dtype::kBfloat16;
  if (eng.backend_name() != "cpu" || forward == nullptr) {
    std::cerr << "fastformer-bench: --gemm-probe times oneDNN's kernels: the CPU engine only\n";
    return false;
  }
  if (bf16 && !engine::cpu_gemm_info().has_bf16) {
    std::cerr << "GEMM probe: not run (no bfloat16 matmul in oneDNN on this CPU: "
              << engine::bf16_hardware(engine::cpu_gemm_info().isa) << ")\n";
    return true;
  }
  *rows = gemm_probe(*forward, bf16, m, bench_threads(options), roofline, std::cerr);
  return true;
}

// The hardware's bounds on the CPU engine's `threads` threads (peak_probe.h): the copy rate,
// the float32 multiply-add peak, and for a bfloat16 engine the bfloat16 peaks its GEMMs may run
// on (AVX512_BF16's dot product, AMX's tiles; 0 with the reason where the CPU has none).
nlohmann::ordered_json measure_roofline(int threads, bool bf16) {
  const engine::HardwarePeak fma = engine::fma_peak(threads);
  const engine::HardwarePeak dot =
      bf16 ? engine::avx512_bf16_peak(threads) : engine::HardwarePeak{0, "float32 engine"};
  const engine::HardwarePeak amx =
      bf16 ? engine::amx_bf16_peak(threads) : engine::HardwarePeak{0, "float32 engine"};
  // The copy rate at sizes from the L2s to well past the L3: an op's bytes are costed at the
  // rate of a copy of its own size (the smallest measured size that holds them).
  nlohmann::ordered_json copies = nlohmann::ordered_json::array();
  for (const size_t mib : {4, 16, 64, 256})
    copies.push_back({{"bytes", mib << 20}, {"gbps", engine::copy_gbps(threads, mib << 20)}});
  nlohmann::ordered_json out = {{"threads", threads}};
  out["copy"] = copies;
  out["fma_gflops"] = fma.gflops;
  out["fma_how"] = fma.how;
  out["bf16_gflops"] = dot.gflops;
  out["bf16_how"] = dot.how;
  out["amx_gflops"] = amx.gflops;
  out["amx_how"] = amx.how;
  // The tile loop's ceilings on one core (issue 51): no loads, fed from L1, fed from L2; the
  // L2-fed one on the engine's threads is what an AMX GEMM's share is taken of.
  nlohmann::ordered_json ceilings = nlohmann::ordered_json::array();
  double l2_fed = 0;
  if (bf16) {
    for (const engine::TileCeiling& c : engine::amx_tile_ceilings()) {
      ceilings.push_back({{"name", c.name},
                          {"bytes", c.bytes},
                          {"gflops_1_thread", c.peak.gflops},
                          {"how", c.peak.how}});
      if (std::string(c.name) == "L2-fed") l2_fed = c.peak.gflops * threads;
    }
  }
  out["amx_ceilings"] = ceilings;
  out["amx_l2_fed_gflops"] = l2_fed;
  return out;
}

// A profile row's bounds: for a GEMM (it names a kernel) its share of the hardware's peak for
// its dtype; for any other op the roofline time (the larger of the time to copy its bytes, at
// the rate of a copy of that size, and its FLOPs at the multiply-add peak) and how many times
// that it took.
void add_bounds(nlohmann::ordered_json& row, const nlohmann::ordered_json& roofline) {
  const std::string kernel = row["kernel"].get<std::string>();
  if (!kernel.empty()) {
    const double peak = kernel_peak(kernel, roofline);
    row["peak_tflops"] = peak / 1e3;
    row["of_peak"] = row["tflops"].get<double>() / (peak / 1e3);
    const double l2_fed = roofline.value("amx_l2_fed_gflops", 0.0);
    if (kernel.find("amx") != std::string::npos && l2_fed > 0)
      row["of_l2_fed"] = row["tflops"].get<double>() / (l2_fed / 1e3);
    return;
  }
  const double bytes = row["bytes"].get<double>();
  double gbps = 0;
  for (const auto& copy : roofline["copy"]) {
    gbps = copy["gbps"].get<double>();
    if (copy["bytes"].get<double>() >= bytes) break;
  }
  const double copy_ms = bytes / (gbps * 1e6);
  const double fma_ms = row["flops"].get<double>() / (roofline["fma_gflops"].get<double>() * 1e6);
  const double bound = std::max(copy_ms, fma_ms);
  if (bound <= 0) return;
  row["bound_ms"] = bound;
  row["bound"] = copy_ms >= fma_ms ? "bytes" : "flops";
  row["of_bound"] = row["ms"].get<double>() / bound;
}

// Each op's time per batch, the median of the rounds' (every round issues the same rows in the
// same order; an even count takes the mean of the middle two).
std::vector<engine::OpProfile> median_rounds(const std::vector<std::vector<engine::OpProfile>>& r,
                                             std::vector<std::vector<double>>* ms_rounds) {
  std::vector<engine::OpProfile> out = r.front();
  ms_rounds->assign(out.size(), {});
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<double> ms;
    for (const auto& round : r) {
      if (round.size() != out.size() || round[i].name != out[i].name ||
          round[i].layer != out[i].layer)
        throw std::runtime_error("--profile-rounds: the rounds issued different ops");
      ms.push_back(round[i].ms);
    }
    (*ms_rounds)[i] = ms;
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    out[i].ms = n % 2 == 1 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  }
  return out;
}

// --profile: more passes over the pool (--profile-rounds) with every op timed, apart from the
// timed run so the timestamps between ops cost it nothing; each op's median over the rounds,
// and each GEMM op's share of its probed ceiling, if any.
nlohmann::ordered_json run_profile(engine::Engine& eng,
                                   const std::vector<engine::RaggedBatch>& batches, int rounds,
                                   const nlohmann::ordered_json& probe_rows,
                                   const nlohmann::ordered_json& roofline) {
  const OutputOptions out_options;
  std::vector<std::vector<engine::OpProfile>> each;
  for (int r = 0; r < rounds; ++r) {
    eng.set_profiling(true);
    for (const auto& batch : batches) eng.encode(batch, {&out_options, 1});
    each.push_back(eng.profile());
    eng.set_profiling(false);
  }
  std::vector<std::vector<double>> ms_rounds;
  nlohmann::ordered_json rows = profile_rows(median_rounds(each, &ms_rounds));
  for (size_t i = 0; i < rows.size(); ++i) rows[i]["ms_rounds"] = ms_rounds[i];
  for (auto& row : rows) {
    for (const auto& p : probe_rows) {
      if (p["name"] == row["name"] && p["gflops_n_threads"].get<double>() > 0) {
        row["ceiling_tflops"] = p["gflops_n_threads"].get<double>() / 1e3;
        row["of_ceiling"] = row["tflops"].get<double>() / row["ceiling_tflops"].get<double>();
      }
    }
    if (!roofline.is_null()) add_bounds(row, roofline);
  }
  print_profile(rows, roofline, std::cerr);
  return rows;
}

// The one line printed without --json.
void print_summary(const engine::Engine& eng, const std::string& lengths_text,
                   const TimedRun& run) {
  std::printf(
      "%s %s: %.0f tokens/s, %.1f sequences/s, %zu batches, p50 %.2f ms, p99 %.2f ms, peak RSS "
      "%.1f MiB\n",
      eng.backend_name().c_str(), lengths_text.c_str(), run.tokens_per_second(),
      run.sequences_per_second(), run.latencies_ms.size(), percentile(run.latencies_ms, 50),
      percentile(run.latencies_ms, 99), double(peak_rss_bytes()) / (1 << 20));
}

// Loads the model, builds the workload and the engine, runs and reports; the exit code.
int run(const BenchOptions& options, const LengthSpec& lengths) {
  const auto model = engine::Model::load(options.model_dir);
  const auto& config = model->config();
  if (!model_fits_workload(*model, lengths, options.lengths_text)) return 2;
  const auto pool = make_workload(lengths, config.vocab_size, config.pad_token_id,
                                  options.batch_tokens, options.pool_batches, options.seed);
  if (options.print_workload) {
    std::cout << nlohmann::json(pool).dump() << "\n";
    return 0;
  }
  const BatchPool ragged = make_batches(pool, config);
  engine::EngineOptions engine_options = options.engine;
  engine_options.max_batch_tokens = std::max(options.batch_tokens, ragged.largest_batch_tokens);
  auto eng = engine::create_engine(model, engine_options);

  const TimedRun timed =
      run_timed(*eng, ragged.batches, options.warmup_batches, options.seconds, options.no_staging);
  nlohmann::ordered_json result = result_json(options, *eng, *model, timed);
  nlohmann::ordered_json probe_rows;
  nlohmann::ordered_json roofline;  // the hardware's bounds, beside the probe and the profile
  if ((options.profile || options.gemm_probe) && eng->backend_name() == "cpu") {
    roofline = measure_roofline(bench_threads(options.engine),
                                eng->dtype().dtype == engine::Dtype::kBfloat16);
    result["roofline"] = roofline;
  }
  if (options.gemm_probe) {
    if (!run_gemm_probe(*eng, options.engine, ragged.largest_batch_tokens, roofline, &probe_rows))
      return 2;
    if (!probe_rows.is_null()) result["gemm_probe"] = probe_rows;
    if (eng->backend_name() == "cpu") result["epilogue_probe"] = epilogue_probe(std::cerr);
  }
  if (options.profile)
    result["profile"] =
        run_profile(*eng, ragged.batches, options.profile_rounds, probe_rows, roofline);
  if (options.json_output) {
    std::cout << result.dump() << "\n";
  } else {
    print_summary(*eng, options.lengths_text, timed);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fastformer-bench: engine throughput on a synthetic workload, no server"};
  BenchOptions options;
  add_flags(app, &options);
  CLI11_PARSE(app, argc, argv);

  LengthSpec lengths;
  std::string error;
  if (!parse_lengths(options.lengths_text, &lengths, &error)) {
    std::cerr << "fastformer-bench: --" << error << "\n";
    return 2;
  }
  engine::parse_backend(options.backend_name, &options.engine.backend);
  try {
    return run(options, lengths);
  } catch (const std::exception& e) {
    std::cerr << "fastformer-bench: " << e.what() << "\n";
    return 1;
  }
}
