// The batches' runner (issue 50): it runs the oldest unfinished batches of the store (store.h),
// up to max_running at once, each on its own thread, through their states: validating (the
// input file checked line by line, batch_input.h), in_progress (each line's body run on the
// endpoint, the answers appended to the output or the error file in input order), finalizing
// (the two files recorded) and completed; or failed (validation, or a file that cannot be
// written), cancelled, expired.
//
// The feeder's bounds (max_in_flight lines, max_queued_tokens tokens admitted and not yet
// answered) are for all running batches together and shared evenly among them: a batch of ten
// lines started behind one of 50,000 runs beside it at once, with half the bounds.
//
// Exactly once across a crash: the answers of lines [next_line, k) are appended in input order,
// the files fsynced, and then next_line = k and both lengths are committed together
// (Store::commit_progress). A restart resumes every unfinished batch after cutting its files back
// to their committed lengths (Store::recover_files), so the lines after the last commit run again
// and are written once.
//
// What runs a line is the front door's business (`Execute`): the runner knows no protocol, only
// the status code and the body each line's request answered.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/jobs/batch_input.h"
#include "server/jobs/store.h"

namespace fastformer::jobs {

// What running one line gave: the endpoint's status code and answer (a JSON body: the
// embeddings, or the error in the endpoint's shape), and the tokens it counted.
struct LineResult {
  int status_code = 200;
  std::string body = "{}";
  int64_t prompt_tokens = 0;
};

// Runs `line` (its body) on `batch`'s endpoint and model, and calls `done` exactly once, from any
// thread (possibly before it returns). Returns the tokens the line queued (0: none, or refused
// at once): the feeder's token bound counts them until `done`.
using Execute = std::function<int64_t(const BatchRecord& batch, const BatchLine& line,
                                      std::function<void(LineResult)> done)>;

struct RunnerOptions {
  /// The feeder's bounds, for the running batches together (each gets an even share, at least
  /// one line): lines queued and not yet written, and their tokens admitted and not yet
  /// answered (0: no token bound).
  int64_t max_in_flight = 32;
  int64_t max_queued_tokens = 0;
  int64_t max_running = 4;  ///< batches run at once, oldest first
  /// A batch whose failure could not be recorded (a full disk) is tried again this much later.
  int64_t retry_after_s = 30;
  int64_t commit_every = 64;  ///< lines between commits (each an fsync of both files)
  InputValidator::Limits limits;
  std::function<int64_t()> now;  ///< Unix seconds; default: the system clock
  /// Retention (Store::delete_expired), at most this often: expired files, and finished
  /// batches with no file left made more than batch_ttl_s ago.
  int64_t retention_every_s = 60;
  int64_t batch_ttl_s = 30 * 24 * 3600;
  /// Observers (the server's metrics): a line written (true: status 200), lines queued now
  /// (+1 when one is first run, -1 when its answer is written), a batch's status changed.
  std::function<void(bool completed)> on_line;
  std::function<void(int64_t delta)> on_in_flight;
  std::function<void(int64_t delta)> on_queued_tokens;  ///< tokens admitted, not yet answered
  std::function<void()> on_change;
  /// Tests: called at each step of a line's writing ("written", "synced", "committed") with
  /// the batch's next_line after it, for each line validated ("validating", with the lines
  /// read), and once the batch is finalizing ("finalizing").
  std::function<void(std::string_view step, int64_t next_line)> on_step;
};

class Runner {
 public:
  Runner(Store& store, Execute execute, RunnerOptions options = {});
  ~Runner();  // stop()
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Starts the thread; it resumes the unfinished batches, oldest first, then waits for more.
  // `execute` may be called from several threads at once (one a running batch).
  void start();
  // A batch was added (validating), or one was asked to cancel: look again.
  void notify();
  // Asks batch `id` to stop: cancelling now, cancelled once its lines in flight are written.
  // FAILED_PRECONDITION for a finished batch, NOT_FOUND for none.
  Status cancel(std::string_view id);
  // Stops the thread after the lines in flight are written and committed (a later start, or
  // a restart of the server, resumes the batch).
  void stop();
  // Tests: true once every batch in the store is finished.
  bool idle();

 private:
  class Lines;  // one batch's lines on their way (runner.cc)

  void loop();
  // Starts the oldest unfinished batches that are not running, up to max_running; joins the
  // runs that ended.
  void start_runs();
  void join_ended();
  // Runs `batch` until it is finished or the runner stops.
  void run(BatchRecord batch);
  Status validate(BatchRecord& batch);
  Status finalize(BatchRecord& batch, BatchStatus end);
  // Ends `batch` failed with `why`, keeping what it finished downloadable.
  void fail(const BatchRecord& batch, const Status& why);
  // Records the batch's output and error files (at their committed lengths) as files.
  Status record_files(const BatchRecord& batch, int64_t at);
  int64_t now() const;
  void changed();  // options_.on_change
  bool stopping() const { return stop_.load(); }

  Store& store_;
  Execute execute_;
  RunnerOptions options_;
  std::thread thread_;
  std::mutex mu_;  // guards poke_, runs_, ended_, retry_at_
  std::condition_variable wake_;
  bool poke_ = false;
  std::atomic<bool> stop_{false};
  int64_t retained_at_ = 0;                  // when retention last ran (the loop's thread)
  std::map<std::string, std::thread> runs_;  // the running batches, by id
  std::vector<std::string> ended_;           // runs that ended, to join
  std::map<std::string, int64_t> retry_at_;  // not before this time (a failure not recorded)
  std::atomic<int64_t> running_{0};          // runs_.size(), for the feeder's shares
};

}  // namespace fastformer::jobs
