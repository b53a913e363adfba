#include "server/jobs/runner.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

namespace fastformer::jobs {
namespace {

constexpr int64_t kOutputTtlSeconds = 30 * 24 * 3600;  // OpenAI keeps a batch's files 30 days

// An output or error line: OpenAI's batch request output object.
std::string answer_line(const std::string& custom_id, const LineResult& r) {
  const std::string id = Store::new_id("batch_req_");
  return R"({"id":")" + id + R"(","custom_id":)" + nlohmann::json(custom_id).dump() +
         R"(,"response":{"status_code":)" + std::to_string(r.status_code) + R"(,"request_id":")" +
         Store::new_id("req_") + R"(","body":)" + r.body + R"(},"error":null})" + "\n";
}

// A line the batch did not run (cancelled, expired): no response, OpenAI's error code.
std::string unrun_line(const std::string& custom_id, const char* code, const std::string& message) {
  return R"({"id":")" + Store::new_id("batch_req_") + R"(","custom_id":)" +
         nlohmann::json(custom_id).dump() + R"(,"response":null,"error":{"code":")" + code +
         R"(","message":)" + nlohmann::json(message).dump() + "}}\n";
}

// An append-only file of a batch (its output or its errors).
class Appender {
 public:
  Status open(const std::filesystem::path& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    return fd_ < 0 ? failure("open") : Status();
  }
  ~Appender() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status append(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return failure("write");
      bytes.remove_prefix(size_t(n));
      length_ += n;
    }
    return Status();
  }
  Status sync() { return ::fsync(fd_) == 0 ? Status() : failure("fsync"); }
  void set_length(int64_t n) { length_ = n; }
  int64_t length() const { return length_; }

 private:
  Status failure(const char* what) const {
    return {StatusCode::kInternal,
            what + std::string(" ") + path_.string() + ": " + std::strerror(errno)};
  }
  std::filesystem::path path_;
  int fd_ = -1;
  int64_t length_ = 0;
};

// One line on its way: where it is in the input, its custom_id, and its answer once it came.
struct Slot {
  int64_t line = 0;  ///< 0-based physical line of the input file
  std::string custom_id;
  std::optional<BatchLine> request;  ///< kept to run it again when the server was busy
  std::optional<LineResult> result;
  std::string unrun_code;  ///< set for a line not run (cancelled, expired)
  bool busy = false;       ///< answered 429 or 503: the queue was full; run it again
};

// The queue or the server was busy (429, 503): not the request's answer; run it again.
bool busy_answer(const LineResult& r) { return r.status_code == 429 || r.status_code == 503; }

}  // namespace

Runner::Runner(Store& store, Execute execute, RunnerOptions options)
    : store_(store), execute_(std::move(execute)), options_(std::move(options)) {}

Runner::~Runner() { stop(); }

int64_t Runner::now() const {
  if (options_.now) return options_.now();
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Runner::changed() {
  if (options_.on_change) options_.on_change();
}

void Runner::start() {
  stop_.store(false);
  changed();
  thread_ = std::thread([this] { loop(); });
}

void Runner::notify() {
  {
    std::lock_guard lock(mu_);
    poke_ = true;
  }
  wake_.notify_all();
}

void Runner::stop() {
  stop_.store(true);
  notify();
  if (thread_.joinable()) thread_.join();
}

bool Runner::idle() { return store_.unfinished().empty(); }

Status Runner::cancel(std::string_view id) {
  const std::optional<BatchRecord> batch = store_.batch(id);
  if (!batch) return {StatusCode::kNotFound, "no batch '" + std::string(id) + "'"};
  if (batch->status == BatchStatus::kCancelling) return Status();
  // Only from validating or in_progress, in the same statement that checks it: a batch that
  // reached finalizing meanwhile is not turned back.
  if (Status s = store_.request_cancel(id, now()); !s.ok()) return s;
  spdlog::info("batch {}: cancelling", id);
  changed();
  notify();
  return Status();
}

void Runner::loop() {
  while (!stopping()) {
    if (const int64_t t = now(); t - retained_at_ >= options_.retention_every_s) {
      retained_at_ = t;
      const auto [files, batches] = store_.delete_expired(t, options_.batch_ttl_s);
      if (files + batches > 0) {
        spdlog::info("jobs: retention deleted {} expired files and {} finished batches", files,
                     batches);
        changed();
      }
    }
    const std::vector<BatchRecord> batches = store_.unfinished();
    if (batches.empty()) {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, std::chrono::seconds(options_.retention_every_s),
                     [&] { return poke_ || stopping(); });
      poke_ = false;
      continue;
    }
    run(batches.front());  // oldest first
  }
}

void Runner::run(BatchRecord batch) {
  auto fail = [&](const Status& s) {
    spdlog::error("batch {}: failed: {}", batch.id, s.message());
    const std::string errors = errors_json({{"server_error", s.message(), std::nullopt, 0}});
    if (!store_.set_status(batch.id, BatchStatus::kFailed, now(), errors).ok())
      spdlog::error("batch {}: cannot record its failure", batch.id);
    changed();
  };
  if (batch.status == BatchStatus::kValidating) {
    if (Status s = validate(batch); !s.ok()) return fail(s);
    changed();
    if (batch_finished(batch.status)) return;
  }
  if (batch.status == BatchStatus::kCancelling && batch.output_file_id.empty()) {
    // Cancelled before it ran a line: nothing to write.
    if (!store_.set_status(batch.id, BatchStatus::kCancelled, now()).ok())
      spdlog::error("batch {}: cannot record its cancel", batch.id);
    changed();
    return;
  }
  if (batch.status == BatchStatus::kInProgress || batch.status == BatchStatus::kCancelling) {
    if (batch.next_line > 0) {
      spdlog::info("batch {}: resuming {} at input line {} ({} done: output {} bytes, errors {})",
                   batch.id, batch_status_name(batch.status), batch.next_line + 1,
                   batch.completed + batch.failed, batch.output_bytes, batch.error_bytes);
    }
    if (Status s = store_.recover_files(batch); !s.ok()) return fail(s);
    if (Status s = run_lines(batch); !s.ok()) return fail(s);
    if (stopping()) return;
  }
  // A batch that ran to its end goes through finalizing (and a crash there resumes at
  // finalize); a cancelled or expired one ends at once.
  const BatchStatus end = batch.status == BatchStatus::kCancelling ? BatchStatus::kCancelled
                          : batch.status == BatchStatus::kExpired  ? BatchStatus::kExpired
                                                                   : BatchStatus::kCompleted;
  if (Status s = finalize(batch, end); !s.ok()) return fail(s);
  changed();
}

Status Runner::validate(BatchRecord& batch) {
  const auto path = store_.file_path(batch.input_file_id);
  std::ifstream in(path ? *path : std::filesystem::path(), std::ios::binary);
  std::vector<LineError> errors;
  InputValidator validator(batch.endpoint, options_.limits);
  if (!path || !in) {
    errors.push_back({"input_file_missing", "The input file '" + batch.input_file_id + "' is gone.",
                      "input_file_id", 0});
  } else {
    std::string line;
    while (std::getline(in, line)) validator.add_line(line);
    errors = validator.finish();
  }
  if (!errors.empty()) {
    spdlog::info("batch {}: failed validation ({} errors, the first on line {}: {})", batch.id,
                 errors.size(), errors[0].line, errors[0].message);
    batch.status = BatchStatus::kFailed;
    return store_.set_status(batch.id, BatchStatus::kFailed, now(), errors_json(errors));
  }
  batch.total = validator.requests();
  batch.output_file_id = Store::new_id("file-");
  batch.error_file_id = Store::new_id("file-");
  if (Status s = store_.start_batch(batch.id, batch.total, batch.output_file_id,
                                    batch.error_file_id, now());
      !s.ok())
    return s;
  // A cancel that came while it validated wins: the start above left it in_progress.
  if (const auto again = store_.batch(batch.id); again) batch = *again;
  spdlog::info("batch {}: in_progress, {} requests", batch.id, batch.total);
  return Status();
}

Status Runner::run_lines(BatchRecord& batch) {
  const auto input_path = store_.file_path(batch.input_file_id);
  std::ifstream in(input_path ? *input_path : std::filesystem::path(), std::ios::binary);
  if (!input_path || !in)
    return {StatusCode::kInternal, "the input file '" + batch.input_file_id + "' is gone"};
  Appender output, errors;
  if (Status s = output.open(*store_.file_path(batch.output_file_id)); !s.ok()) return s;
  if (Status s = errors.open(*store_.file_path(batch.error_file_id)); !s.ok()) return s;
  output.set_length(batch.output_bytes);
  errors.set_length(batch.error_bytes);
  std::string line;
  for (int64_t skipped = 0; skipped < batch.next_line && std::getline(in, line); ++skipped) {
  }
  int64_t read = batch.next_line;  // physical lines of the input read so far
  Progress progress{batch.next_line,    batch.completed,    batch.failed,     batch.prompt_tokens,
                    batch.total_tokens, batch.output_bytes, batch.error_bytes};

  std::mutex mu;  // guards the slots' results
  std::condition_variable answered;
  std::deque<std::shared_ptr<Slot>> slots;
  const char* unrun = nullptr;  // set once the batch stops feeding: cancelled or expired
  bool input_done = false;
  int64_t since_commit = 0;

  // Runs a slot's request; a busy answer marks it to run again (the loop resubmits it).
  auto run_slot = [&](const std::shared_ptr<Slot>& s) {
    // Notified under the lock: once it is released, run_lines (and `mu`, `answered`) may end.
    execute_(batch, *s->request, [s, &mu, &answered](LineResult r) {
      std::lock_guard lock(mu);
      if (busy_answer(r)) {
        s->busy = true;
      } else {
        s->result = std::move(r);
      }
      answered.notify_all();
    });
  };
  auto check_stop = [&]() {
    if (unrun != nullptr) return;
    const auto now_record = store_.batch(batch.id);
    if (now_record && now_record->status == BatchStatus::kCancelling) {
      batch.status = BatchStatus::kCancelling;
      unrun = "batch_cancelled";
    } else if (batch.expires_at > 0 && now() >= batch.expires_at) {
      batch.status = BatchStatus::kExpired;
      unrun = "batch_expired";
    }
  };
  auto commit = [&]() -> Status {
    if (Status s = output.sync(); !s.ok()) return s;
    if (Status s = errors.sync(); !s.ok()) return s;
    if (options_.on_step) options_.on_step("synced", progress.next_line);
    progress.output_bytes = output.length();
    progress.error_bytes = errors.length();
    if (Status s = store_.commit_progress(batch.id, progress); !s.ok()) return s;
    since_commit = 0;
    if (options_.on_step) options_.on_step("committed", progress.next_line);
    return Status();
  };
  // Writes the answered lines at the front, in input order.
  auto write_ready = [&]() -> Status {
    for (;;) {
      std::shared_ptr<Slot> front;
      {
        std::lock_guard lock(mu);
        if (slots.empty() || (!slots.front()->result && slots.front()->unrun_code.empty()))
          return Status();
        front = slots.front();
        slots.pop_front();
      }
      if (!front->unrun_code.empty()) {
        const std::string message = front->unrun_code == "batch_cancelled"
                                        ? "The batch was cancelled before this request ran."
                                        : "The batch expired before this request ran.";
        if (Status s =
                errors.append(unrun_line(front->custom_id, front->unrun_code.c_str(), message));
            !s.ok())
          return s;
        ++progress.failed;
      } else {
        const LineResult& r = *front->result;
        const bool ok = r.status_code == 200;
        if (Status s = (ok ? output : errors).append(answer_line(front->custom_id, r)); !s.ok())
          return s;
        ++(ok ? progress.completed : progress.failed);
        if (options_.on_in_flight && front->request) options_.on_in_flight(-1);
        progress.prompt_tokens += r.prompt_tokens;
        progress.total_tokens += r.prompt_tokens;
      }
      if (options_.on_line) options_.on_line(front->result && front->result->status_code == 200);
      progress.next_line = front->line + 1;
      if (options_.on_step) options_.on_step("written", progress.next_line);
      if (++since_commit >= options_.commit_every) {
        if (Status s = commit(); !s.ok()) return s;
      }
    }
  };

  for (;;) {
    check_stop();
    // Feed: up to max_in_flight lines of the batch at once; once it stops feeding, the rest of
    // the input is written as unrun lines.
    while (!input_done && !stopping()) {
      {
        std::lock_guard lock(mu);
        if (unrun == nullptr && int64_t(slots.size()) >= options_.max_in_flight) break;
      }
      if (!std::getline(in, line)) {
        input_done = true;
        break;
      }
      const int64_t index = read++;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank: no request
      LineError error;
      std::optional<BatchLine> parsed = parse_batch_line(line, batch.endpoint, &error);
      auto slot = std::make_shared<Slot>();
      slot->line = index;
      slot->custom_id = parsed ? parsed->custom_id : "";
      {
        std::lock_guard lock(mu);
        slots.push_back(slot);
      }
      if (unrun != nullptr) {
        slot->unrun_code = unrun;
        continue;
      }
      if (!parsed) {  // validated before it ran: only a changed file gets here
        slot->result = LineResult{
            400, R"({"error":{"message":)" + nlohmann::json(error.message).dump() + "}}"};
        continue;
      }
      // Notified under the lock: once it is released, run_lines (and `mu`, `answered`) may end.
      slot->request = std::move(parsed);
      if (options_.on_in_flight) options_.on_in_flight(1);
      run_slot(slot);
    }
    if (Status s = write_ready(); !s.ok()) return s;
    std::vector<std::shared_ptr<Slot>> again;  // answered busy: after a pause, once more
    {
      std::lock_guard lock(mu);
      for (const auto& s : slots) {
        if (s->busy) {
          s->busy = false;
          again.push_back(s);
        }
      }
    }
    if (!again.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (const auto& s : again) run_slot(s);
    }
    {
      std::unique_lock lock(mu);
      if (slots.empty() && (input_done || stopping())) break;
      if (!slots.empty() && !slots.front()->result && slots.front()->unrun_code.empty()) {
        answered.wait_for(lock, std::chrono::milliseconds(200), [&] {
          if (slots.front()->result.has_value()) return true;
          for (const auto& s : slots)
            if (s->busy) return true;
          return false;
        });
      }
    }
  }
  if (Status s = commit(); !s.ok()) return s;
  batch.next_line = progress.next_line;
  batch.completed = progress.completed;
  batch.failed = progress.failed;
  batch.output_bytes = progress.output_bytes;
  batch.error_bytes = progress.error_bytes;
  return Status();
}

Status Runner::finalize(BatchRecord& batch, BatchStatus end) {
  const int64_t at = now();
  if (end == BatchStatus::kCompleted) {
    if (Status s = store_.set_status(batch.id, BatchStatus::kFinalizing, at); !s.ok()) return s;
    if (options_.on_step) options_.on_step("finalizing", batch.next_line);
  }
  const std::optional<BatchRecord> done = store_.batch(batch.id);
  if (!done) return {StatusCode::kNotFound, "no batch '" + batch.id + "'"};
  const std::pair<const std::string*, int64_t> files[] = {
      {&done->output_file_id, done->output_bytes}, {&done->error_file_id, done->error_bytes}};
  const char* names[] = {"output", "errors"};
  for (size_t i = 0; i < 2; ++i) {
    if (files[i].first->empty() || store_.file(*files[i].first)) continue;  // made before a crash
    FileRecord f{*files[i].first,
                 "batch_" + batch.id + "_" + names[i] + ".jsonl",
                 "batch_output",
                 files[i].second,
                 at,
                 at + kOutputTtlSeconds,
                 "processed"};
    if (Status s = store_.add_file(f); !s.ok()) return s;
  }
  if (Status s = store_.set_status(batch.id, end, at); !s.ok()) return s;
  spdlog::info("batch {}: {}, {} completed, {} failed of {}", batch.id, batch_status_name(end),
               done->completed, done->failed, done->total);
  batch.status = end;
  return Status();
}

}  // namespace fastformer::jobs
