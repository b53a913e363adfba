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
// `pending`, `busy`, `result` and `tokens` are guarded by the Lines' mutex.
struct Slot {
  int64_t line = 0;  ///< 0-based physical line of the input file
  std::string custom_id;
  std::optional<BatchLine> request;  ///< kept to run it again when the server was busy
  std::optional<LineResult> result;
  std::string unrun_code;  ///< set for a line not run (cancelled, expired)
  bool busy = false;       ///< answered 429 or 503: the queue was full; run it again
  bool pending = false;    ///< submitted, not yet answered
  int64_t tokens = 0;      ///< queued (counted in the feeder's token bound) until answered
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
    join_ended();
    start_runs();
    std::unique_lock lock(mu_);
    // Woken by a new batch, a cancel or a run's end; else it looks again every few seconds
    // (retention, a batch waiting to be tried again).
    wake_.wait_for(lock, std::chrono::seconds(std::min<int64_t>(options_.retention_every_s, 5)),
                   [&] { return poke_ || stopping(); });
    poke_ = false;
  }
  // Stopping: each run writes and commits its lines in flight, then ends.
  std::map<std::string, std::thread> runs;
  {
    std::lock_guard lock(mu_);
    runs.swap(runs_);
    ended_.clear();
  }
  for (auto& [id, thread] : runs) thread.join();
}

void Runner::start_runs() {
  const std::vector<BatchRecord> batches = store_.unfinished();  // oldest first
  const int64_t t = now();
  std::lock_guard lock(mu_);
  std::vector<const BatchRecord*> starting;
  for (const BatchRecord& batch : batches) {
    if (int64_t(runs_.size() + starting.size()) >= std::max<int64_t>(1, options_.max_running))
      break;
    if (runs_.count(batch.id) != 0) continue;
    if (const auto again = retry_at_.find(batch.id); again != retry_at_.end()) {
      if (t < again->second) continue;
      retry_at_.erase(again);
    }
    starting.push_back(&batch);
  }
  // Counted before any starts, so that batches started together share the bounds from their
  // first line.
  running_.fetch_add(int64_t(starting.size()));
  for (const BatchRecord* started : starting) {
    runs_.emplace(started->id, std::thread([this, batch = *started] {
                    run(batch);
                    // Still unfinished without a stop: its failure could not be recorded (a
                    // full disk). It is tried again later, not at once.
                    const auto after = stopping() ? std::nullopt : store_.batch(batch.id);
                    {
                      std::lock_guard ended(mu_);
                      if (after && !batch_finished(after->status)) {
                        retry_at_[batch.id] = now() + options_.retry_after_s;
                        spdlog::warn("batch {}: trying it again in {} s", batch.id,
                                     options_.retry_after_s);
                      }
                      ended_.push_back(batch.id);
                      poke_ = true;
                    }
                    running_.fetch_sub(1);
                    wake_.notify_all();
                  }));
  }
}

void Runner::join_ended() {
  std::vector<std::thread> ended;
  {
    std::lock_guard lock(mu_);
    for (const std::string& id : ended_) {
      if (auto it = runs_.find(id); it != runs_.end()) {
        ended.push_back(std::move(it->second));
        runs_.erase(it);
      }
    }
    ended_.clear();
  }
  for (std::thread& thread : ended) thread.join();
}

void Runner::fail(const BatchRecord& batch, const Status& why) {
  spdlog::error("batch {}: failed: {}", batch.id, why.message());
  const int64_t at = now();
  const std::string errors = errors_json({{"server_error", why.message(), std::nullopt, 0}});
  if (Status s = store_.set_status(batch.id, BatchStatus::kFailed, at, errors); !s.ok()) {
    spdlog::error("batch {}: cannot record its failure: {}", batch.id, s.message());
    return;  // still unfinished: tried again later (start_runs)
  }
  // What it finished stays downloadable: its files cut back to what was committed.
  const std::optional<BatchRecord> committed = store_.batch(batch.id);
  if (committed && !committed->output_file_id.empty()) {
    Status kept = store_.recover_files(*committed);
    if (kept.ok()) kept = record_files(*committed, at);
    if (!kept.ok())
      spdlog::error("batch {}: its finished lines are not downloadable: {}", batch.id,
                    kept.message());
  }
  changed();
}

// One batch's lines on their way: the feeder (its share of the runner's bounds), the answers
// written in input order, the commits.
class Runner::Lines {
 public:
  Lines(Runner& runner, BatchRecord& batch) : r_(runner), batch_(batch) {}

  // Runs the batch's lines from next_line to the end of its input (or until it stops, is
  // cancelled or expires); returns once every line it ran is answered.
  Status run() {
    if (Status s = open(); !s.ok()) return s;
    Status status;
    for (;;) {
      check_stop();
      if (status.ok()) feed();
      const Status wrote = write_ready();
      if (status.ok() && !wrote.ok()) {
        status = wrote;  // the lines in flight are still waited for, and dropped
        failed_ = true;
      }
      run_busy_again();
      if (!wait()) break;
    }
    if (status.ok()) status = commit();
    batch_.next_line = progress_.next_line;
    batch_.completed = progress_.completed;
    batch_.failed = progress_.failed;
    batch_.output_bytes = progress_.output_bytes;
    batch_.error_bytes = progress_.error_bytes;
    return status;
  }

 private:
  Status open() {
    Store& store = r_.store_;
    const auto input = store.file_path(batch_.input_file_id);
    if (input) in_.open(*input, std::ios::binary);
    if (!input || !in_)
      return {StatusCode::kInternal, "the input file '" + batch_.input_file_id + "' is gone"};
    if (Status s = output_.open(*store.file_path(batch_.output_file_id)); !s.ok()) return s;
    if (Status s = errors_.open(*store.file_path(batch_.error_file_id)); !s.ok()) return s;
    output_.set_length(batch_.output_bytes);
    errors_.set_length(batch_.error_bytes);
    std::string line;
    for (int64_t skipped = 0; skipped < batch_.next_line && std::getline(in_, line); ++skipped) {
    }
    read_ = batch_.next_line;
    progress_ = {batch_.next_line,    batch_.completed,    batch_.failed,     batch_.prompt_tokens,
                 batch_.total_tokens, batch_.output_bytes, batch_.error_bytes};
    return Status();
  }

  // Cancelled or expired: it stops feeding, and the rest of the input is written as unrun.
  void check_stop() {
    if (unrun_ != nullptr) return;
    const auto now_record = r_.store_.batch(batch_.id);
    if (now_record && now_record->status == BatchStatus::kCancelling) {
      batch_.status = BatchStatus::kCancelling;
      unrun_ = "batch_cancelled";
    } else if (batch_.expires_at > 0 && r_.now() >= batch_.expires_at) {
      batch_.status = BatchStatus::kExpired;
      unrun_ = "batch_expired";
    }
  }

  // Whether one more line may run: within this batch's share of the lines and tokens.
  bool may_feed() {
    if (unrun_ != nullptr) return true;  // an unrun line runs nothing
    const RunnerOptions& o = r_.options_;
    const int64_t running = std::max<int64_t>(1, r_.running_.load());
    std::lock_guard lock(mu_);
    if (int64_t(slots_.size()) >= std::max<int64_t>(1, o.max_in_flight / running)) return false;
    return o.max_queued_tokens <= 0 || queued_tokens_ == 0 ||
           queued_tokens_ < std::max<int64_t>(1, o.max_queued_tokens / running);
  }

  void feed() {
    std::string line;
    while (!input_done_ && !failed_ && !r_.stopping() && may_feed()) {
      if (!std::getline(in_, line)) {
        input_done_ = true;
        break;
      }
      const int64_t index = read_++;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank: no request
      LineError error;
      std::optional<BatchLine> parsed = parse_batch_line(line, batch_.endpoint, &error);
      auto slot = std::make_shared<Slot>();
      slot->line = index;
      slot->custom_id = parsed ? parsed->custom_id : "";
      if (unrun_ != nullptr) {
        slot->unrun_code = unrun_;
      } else if (!parsed) {  // validated before it ran: only a changed file gets here
        slot->result = LineResult{
            400, R"({"error":{"message":)" + nlohmann::json(error.message).dump() + "}}"};
      } else {
        slot->request = std::move(parsed);
      }
      {
        std::lock_guard lock(mu_);
        slots_.push_back(slot);
      }
      if (slot->request) {
        if (r_.options_.on_in_flight) r_.options_.on_in_flight(1);
        submit(slot);
      }
    }
  }

  void submit(const std::shared_ptr<Slot>& s) {
    {
      std::lock_guard lock(mu_);
      s->pending = true;
    }
    // Answered under the lock: once it is released, run() (and the Lines) may end.
    const int64_t tokens = r_.execute_(batch_, *s->request, [this, s](LineResult r) {
      std::lock_guard lock(mu_);
      s->pending = false;
      count_tokens(*s, -s->tokens);
      if (busy_answer(r)) {
        s->busy = true;
      } else {
        s->result = std::move(r);
      }
      answered_.notify_all();
    });
    std::lock_guard lock(mu_);
    if (s->pending && tokens > 0) count_tokens(*s, tokens);  // not answered yet
  }

  // Under mu_: the slot's tokens in the feeder's count change by `delta`.
  void count_tokens(Slot& s, int64_t delta) {
    if (delta == 0) return;
    s.tokens += delta;
    queued_tokens_ += delta;
    if (r_.options_.on_queued_tokens) r_.options_.on_queued_tokens(delta);
  }

  static bool ready(const Slot& s) { return s.result.has_value() || !s.unrun_code.empty(); }

  // Writes the answered lines at the front, in input order (after a failure: drops them).
  Status write_ready() {
    for (;;) {
      std::shared_ptr<Slot> front;
      {
        std::lock_guard lock(mu_);
        if (slots_.empty() || !ready(*slots_.front())) return Status();
        front = slots_.front();
        slots_.pop_front();
      }
      if (front->request && r_.options_.on_in_flight) r_.options_.on_in_flight(-1);
      if (failed_) continue;
      if (Status s = write(*front); !s.ok()) return s;
    }
  }

  Status write(const Slot& slot) {
    const RunnerOptions& o = r_.options_;
    if (!slot.unrun_code.empty()) {
      const std::string message = slot.unrun_code == "batch_cancelled"
                                      ? "The batch was cancelled before this request ran."
                                      : "The batch expired before this request ran.";
      if (Status s = errors_.append(unrun_line(slot.custom_id, slot.unrun_code.c_str(), message));
          !s.ok())
        return s;
      ++progress_.failed;
    } else {
      const LineResult& r = *slot.result;
      const bool ok = r.status_code == 200;
      if (Status s = (ok ? output_ : errors_).append(answer_line(slot.custom_id, r)); !s.ok())
        return s;
      ++(ok ? progress_.completed : progress_.failed);
      progress_.prompt_tokens += r.prompt_tokens;
      progress_.total_tokens += r.prompt_tokens;
    }
    if (o.on_line) o.on_line(slot.result && slot.result->status_code == 200);
    progress_.next_line = slot.line + 1;
    if (o.on_step) o.on_step("written", progress_.next_line);
    if (++since_commit_ >= o.commit_every) return commit();
    return Status();
  }

  Status commit() {
    const RunnerOptions& o = r_.options_;
    if (Status s = output_.sync(); !s.ok()) return s;
    if (Status s = errors_.sync(); !s.ok()) return s;
    if (o.on_step) o.on_step("synced", progress_.next_line);
    progress_.output_bytes = output_.length();
    progress_.error_bytes = errors_.length();
    if (Status s = r_.store_.commit_progress(batch_.id, progress_); !s.ok()) return s;
    since_commit_ = 0;
    if (o.on_step) o.on_step("committed", progress_.next_line);
    return Status();
  }

  // Lines answered busy run again after a pause (after a failure: dropped as answered).
  void run_busy_again() {
    std::vector<std::shared_ptr<Slot>> again;
    {
      std::lock_guard lock(mu_);
      for (const auto& s : slots_) {
        if (!s->busy) continue;
        s->busy = false;
        if (failed_) {
          s->result = LineResult{503, "{}", 0};
        } else {
          again.push_back(s);
        }
      }
    }
    if (again.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (const auto& s : again) submit(s);
  }

  // Waits a while for the front line's answer (or a busy one); false once nothing is left to
  // wait for or feed.
  bool wait() {
    std::unique_lock lock(mu_);
    if (slots_.empty()) return !(input_done_ || failed_ || r_.stopping());
    if (!ready(*slots_.front())) {
      answered_.wait_for(lock, std::chrono::milliseconds(200), [&] {
        if (ready(*slots_.front())) return true;
        for (const auto& s : slots_)
          if (s->busy) return true;
        return false;
      });
    }
    return true;
  }

  Runner& r_;
  BatchRecord& batch_;
  std::ifstream in_;
  Appender output_, errors_;
  Progress progress_;
  int64_t read_ = 0;  // physical lines of the input read so far
  int64_t since_commit_ = 0;
  const char* unrun_ = nullptr;  // set once the batch stops feeding: cancelled or expired
  bool input_done_ = false;
  bool failed_ = false;  // a write failed: nothing more is fed or written

  std::mutex mu_;  // guards slots_ (the deque), each slot's answer, queued_tokens_
  std::condition_variable answered_;
  std::deque<std::shared_ptr<Slot>> slots_;
  int64_t queued_tokens_ = 0;
};

void Runner::run(BatchRecord batch) {
  if (batch.status == BatchStatus::kValidating) {
    if (Status s = validate(batch); !s.ok()) return fail(batch, s);
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
    if (Status s = store_.recover_files(batch); !s.ok()) return fail(batch, s);
    if (Status s = Lines(*this, batch).run(); !s.ok()) return fail(batch, s);
    if (stopping()) return;
  }
  // A batch that ran to its end goes through finalizing (and a crash there resumes at
  // finalize); a cancelled or expired one ends at once.
  const BatchStatus end = batch.status == BatchStatus::kCancelling ? BatchStatus::kCancelled
                          : batch.status == BatchStatus::kExpired  ? BatchStatus::kExpired
                                                                   : BatchStatus::kCompleted;
  if (Status s = finalize(batch, end); !s.ok()) return fail(batch, s);
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
    for (int64_t n = 1; std::getline(in, line); ++n) {
      validator.add_line(line);
      if (options_.on_step) options_.on_step("validating", n);
    }
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

Status Runner::record_files(const BatchRecord& batch, int64_t at) {
  const std::pair<const std::string*, int64_t> files[] = {
      {&batch.output_file_id, batch.output_bytes}, {&batch.error_file_id, batch.error_bytes}};
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
  if (Status s = record_files(*done, at); !s.ok()) return s;
  if (Status s = store_.set_status(batch.id, end, at); !s.ok()) return s;
  spdlog::info("batch {}: {}, {} completed, {} failed of {}", batch.id, batch_status_name(end),
               done->completed, done->failed, done->total);
  batch.status = end;
  return Status();
}

}  // namespace fastformer::jobs
