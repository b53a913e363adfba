#include "server/repository/served_model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "server/repository/layout.h"

namespace fastformer::repository {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Bytes this process may still allocate: MemAvailable, or less under a cgroup v2 limit.
int64_t available_memory() {
  int64_t available = INT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
    meminfo.ignore(64, '\n');
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    int64_t limit = 0;
    if (std::from_chars(max_text.data(), max_text.data() + max_text.size(), limit).ec ==
        std::errc()) {
      available = std::min(available, limit - current);
    }
  }
  if (const char* test = std::getenv("FASTFORMER_TEST_AVAILABLE_MEMORY_BYTES")) {
    available = std::min<int64_t>(available, std::atoll(test));  // tests/repository only
  }
  return available;
}

// One short sequence through the engine, so the first request does not pay for cold caches
// and lazy initialisation. Every output is asked for, so every op and GEMM shape runs (the
// CUDA engine plans its GEMMs on their first run, and a shape cuBLASLt cannot run fails
// here, not mid-serving).
void warm_up(engine::Engine& eng) {
  const engine::Model& model = eng.model();
  const auto& c = model.config();
  const int64_t n = std::min<int64_t>(16, c.max_position_embeddings);
  std::vector<int32_t> ids(size_t(n), (c.pad_token_id + 1) % int32_t(c.vocab_size));
  std::vector<float> embeddings(size_t(n * c.hidden_size), 0.5f);
  engine::RaggedBatch batch;
  if (model.has_word_embedding())
    batch.add({ids, {}}, c);
  else
    batch.add({{}, embeddings}, c);
  OutputOptions options;
  options.token_embeddings = options.logits = options.normalize = true;
  eng.encode(batch, {&options, 1});
}

batching::QueueObserver queue_observer(const std::shared_ptr<metrics::ModelSeries>& series) {
  metrics::QueueRecorders record = metrics::queue_recorders(series);
  batching::QueueObserver observer;
  observer.on_depth = std::move(record.depth);
  observer.on_dropped = [dropped = std::move(record.dropped)](const batching::QueueEntry&,
                                                              batching::Outcome reason) {
    // The queue reports only these two reasons.
    dropped(reason == batching::Outcome::kDeadlineExceeded ? metrics::DropReason::kDeadline
                                                           : metrics::DropReason::kCancelled);
  };
  observer.on_batched = [batched = std::move(record.batched),
                         by_class = std::move(record.class_batched)](const batching::QueueEntry& e,
                                                                     double seconds) {
    batched(seconds);
    by_class(int(e.priority), seconds);
  };
  observer.on_class_depth = [depth = std::move(record.class_depth)](
                                batching::Priority p, int64_t tokens, int64_t sequences) {
    depth(int(p), tokens, sequences);
  };
  observer.on_promoted = [promoted = std::move(record.promoted)](const batching::QueueEntry&) {
    promoted();
  };
  return observer;
}

}  // namespace

std::shared_ptr<ServedModel> ServedModel::load(const std::string& name, int64_t version,
                                               const std::string& dir,
                                               const ModelSettings& settings,
                                               const LoadContext& context) {
  const auto started = Clock::now();
  auto served = std::make_shared<ServedModel>();
  served->name = name;
  served->version = std::to_string(version);
  served->version_number = version;
  served->dir = dir;
  served->settings = settings;
  // Two copies must fit while the old one serves: check before reading the weights.
  std::error_code ec;
  const int64_t file_bytes = int64_t(fs::file_size(fs::path(dir) / "model.safetensors", ec));
  if (!ec) {
    // The weights as served, and as much again for packed GEMM copies and buffers.
    const int64_t need = 2 * file_bytes;
    const int64_t available = available_memory();
    if (need > available) {
      throw std::runtime_error("not enough memory to load it beside what serves: it needs about " +
                               std::to_string(need >> 20) + " MiB (twice model.safetensors), " +
                               std::to_string(std::max<int64_t>(0, available) >> 20) +
                               " MiB are available");
    }
  }
  served->model = engine::Model::load(dir);
  if (served->name.empty()) served->name = served->model->config().model_name;  // --model-dir
  const auto& c = served->model->config();
  served->config.tokenizer = text::load_tokenizer(dir, *served->model);
  served->config.labels = read_labels(dir);
  served->config.quantization = read_quantization(dir, c.hidden_size);
  served->config.quantization_file = (std::filesystem::path(dir) / "quantization.json").string();
  served->config.prompts = read_prompts(dir, settings.prompts);
  const int64_t max_request_tokens = settings.request_tokens(c);
  if (max_request_tokens > settings.max_queue_tokens) {
    throw std::invalid_argument(
        "max_request_tokens " + std::to_string(max_request_tokens) + " exceeds max_queue_tokens " +
        std::to_string(settings.max_queue_tokens) + ": such requests could never be admitted");
  }
  std::string why;
  served->engine = engine::create_engine(served->model, settings.engine_options(c), &why);
  const auto loaded = Clock::now();
  warm_up(*served->engine);
  const auto warm = Clock::now();

  served->config.limits = settings.request_limits(c);
  served->config.version = context.server_version;

  metrics::ModelLabels labels{served->name,
                              served->version,
                              engine::dtype_name(served->engine->dtype().dtype),
                              served->engine->backend_name(),
                              served->engine->device_name(),
                              context.server_version};
  served->series = context.metrics.add_model(labels);
  served->queue = std::make_unique<batching::BatchQueue>(
      settings.queue_limits(), c, queue_observer(served->series), context.budget);
  metrics::BatchRecorders record = metrics::batch_recorders(served->series);
  batching::BatchObserver observer;
  InferenceStatistics* statistics = &served->statistics;
  observer.on_batch = [computed = std::move(record.computed), statistics](
                          int64_t tokens, int64_t sequences, double seconds) {
    computed(tokens, sequences, seconds);
    statistics->execution_count.fetch_add(1, std::memory_order_relaxed);
  };
  observer.on_failure = [failed = std::move(record.failed), hook = context.on_batch_failure,
                         name = served->name](const std::string& reason, int64_t sequences) {
    failed();
    if (hook) hook(name, reason, sequences);
  };
  observer.before_compute = context.before_compute;
  served->scheduler = std::make_unique<batching::Scheduler>(context.pool, *served->queue,
                                                            *served->engine, std::move(observer));
  context.metrics.set_model_info(*served->series, labels);
  const auto [device_used, device_total] = served->engine->device_memory();
  if (device_total > 0)
    context.metrics.set_device_memory(double(device_used), double(device_total));

  const double load_s = std::chrono::duration<double>(loaded - started).count();
  const double warm_s = std::chrono::duration<double>(warm - loaded).count();
  const double total_s = std::chrono::duration<double>(Clock::now() - started).count();
  context.metrics.record_model_load(served->name, true, total_s);
  spdlog::info(
      "model {} version {} from {}: hidden {}, {} layers, {} heads, {} positions, {} parameters "
      "stored as {}{}; backend {} on {} ({}); buffers for {} tokens",
      served->name, served->version, dir, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
      c.max_position_embeddings, served->model->parameter_count(), served->model->stored_dtype(),
      served->model->num_labels()
          ? ", classifier head with " + std::to_string(served->model->num_labels()) + " labels"
          : "",
      served->engine->backend_name(), served->engine->device_name(), why,
      served->engine->max_batch_tokens());
  // What --dtype auto (the default) chose, and why: what this hardware offers.
  if (settings.dtype == engine::Dtype::kAuto) {
    spdlog::info("model {} version {}: dtype auto: {} ({})", served->name, served->version,
                 engine::dtype_name(served->engine->dtype().dtype), served->engine->dtype().why);
  }
  for (const std::string& site : served->engine->gemm_report()) spdlog::info("GEMM {}", site);
  if (const size_t packed = served->engine->packed_weight_bytes(); packed > 0) {
    spdlog::info("packed GEMM weights: {:.1f} MiB beside the model's {:.1f} MiB",
                 double(packed) / (1 << 20), double(served->model->weight_bytes()) / (1 << 20));
  }
  // A mis-detected CPU (a BLAS or oneDNN on generic kernels) shows here, not in production.
  if (const engine::SpeedCheck speed = served->engine->speed_check(); speed.ran) {
    if (speed.warning)
      spdlog::warn("{}", speed.message);
    else
      spdlog::info("{}", speed.message);
  }
  spdlog::info("model {} version {} READY in {:.3f} s (load {:.3f} s, warm-up {:.3f} s)",
               served->name, served->version, total_s, load_s, warm_s);
  return served;
}

}  // namespace fastformer::repository
