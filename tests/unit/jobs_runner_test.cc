// The batches' runner (server/jobs/runner.h, issue 50) over a real store and a stand-in for the
// endpoint (it answers each body's input with its length, and refuses the input "refuse"):
// a batch to completed with one answer per custom_id, validation failing it with OpenAI's errors,
// cancel and expiry with the unrun lines marked, and a runner process killed (SIGKILL) while
// writing, after syncing, after committing and while finalizing, restarted each time, ending with
// every custom_id answered exactly once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "server/jobs/runner.h"
#include "tests/support/test_models.h"

namespace fastformer::jobs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The endpoint's stand-in: answers on its own thread, in the order asked, unless held.
class FakeEndpoint {
 public:
  FakeEndpoint() : worker_([this] { serve(); }) {}
  ~FakeEndpoint() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
      held_ = false;
    }
    cv_.notify_all();
    worker_.join();
  }
  // While held, calls wait (the lines stay in flight).
  void hold(bool held) {
    {
      std::lock_guard lock(mu_);
      held_ = held;
    }
    cv_.notify_all();
  }
  int64_t calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  int64_t calls(const std::string& batch_id) {
    std::lock_guard lock(mu_);
    return calls_by_batch_[batch_id];
  }
  Execute execute() {
    return [this](const BatchRecord& b, const BatchLine& line,
                  std::function<void(LineResult)> done) -> int64_t {
      {
        std::lock_guard lock(mu_);
        queue_.emplace_back(line.body, std::move(done));
        ++calls_;
        ++calls_by_batch_[b.id];
      }
      cv_.notify_all();
      return answer(line.body).prompt_tokens;  // the tokens it queued: the input's length
    };
  }
  static LineResult answer(const std::string& body) {
    const std::string input = json::parse(body)["input"];
    if (input == "refuse") return {400, R"({"error":{"message":"input: refused"}})", 0};
    return {200, json{{"length", input.size()}}.dump(), int64_t(input.size())};
  }

 private:
  void serve() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return done_ || (!held_ && !queue_.empty()); });
      if (queue_.empty()) return;
      auto [body, done] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      done(answer(body));
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::function<void(LineResult)>>> queue_;
  bool held_ = false, done_ = false;
  int64_t calls_ = 0;
  std::map<std::string, int64_t> calls_by_batch_;
  std::thread worker_;
};

std::string request_line(int i) {
  const std::string input = i % 20 == 7 ? "refuse" : "text " + std::string(size_t(i % 13), 'x');
  return json{{"custom_id", "req-" + std::to_string(i)},
              {"method", "POST"},
              {"url", "/v1/embeddings"},
              {"body", {{"input", input}}}}
      .dump();
}

// A store in `dir` with an input file of `n` request lines (plus `extra`) and a batch over it.
BatchRecord make_batch(Store& store, int n, const std::string& extra = {}, int64_t expires_at = 0) {
  FileRecord input{Store::new_id("file-"), "in.jsonl", "batch", 0, 1, 0, "processed"};
  std::string text;
  for (int i = 0; i < n; ++i) text += request_line(i) + (i % 9 == 4 ? "\r\n\n" : "\n");
  text += extra;
  input.bytes = int64_t(text.size());
  test::write_file(*store.file_path(input.id), text);
  EXPECT_TRUE(store.add_file(input).ok());
  BatchRecord b;
  b.id = Store::new_id("batch_");
  b.endpoint = "/v1/embeddings", b.model = "m", b.input_file_id = input.id;
  b.created_at = 1, b.expires_at = expires_at;
  EXPECT_TRUE(store.add_batch(b).ok());
  return b;
}

std::vector<json> read_lines(Store& store, const std::string& file_id) {
  std::vector<json> out;
  std::ifstream in(*store.file_path(file_id));
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

bool wait_idle(Runner& runner, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!runner.idle()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Every request of an n-line batch answered once: the output holds the accepted ones with the
// endpoint's answer, the error file the refused ones (and `unrun` with that code).
void expect_each_once(Store& store, const BatchRecord& b, int n, const char* unrun = nullptr) {
  std::map<std::string, int> seen;
  for (const json& line : read_lines(store, b.output_file_id)) {
    ++seen[line["custom_id"]];
    EXPECT_EQ(line["response"]["status_code"], 200);
    EXPECT_TRUE(line["error"].is_null());
    const int i = std::stoi(line["custom_id"].get<std::string>().substr(4));
    EXPECT_EQ(line["response"]["body"],
              json::parse(FakeEndpoint::answer(json::parse(request_line(i))["body"].dump()).body));
  }
  for (const json& line : read_lines(store, b.error_file_id)) {
    ++seen[line["custom_id"]];
    if (line["response"].is_null()) {
      ASSERT_NE(unrun, nullptr) << line.dump();
      EXPECT_EQ(line["error"]["code"], unrun);
    } else {
      EXPECT_EQ(line["response"]["status_code"], 400);
      EXPECT_EQ(line["response"]["body"]["error"]["message"], "input: refused");
    }
  }
  EXPECT_EQ(int(seen.size()), n);
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << id;
}

TEST(JobsRunner, RunsABatchToCompletedWithOneAnswerPerRequest) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord made = make_batch(*store, 100);
  FakeEndpoint endpoint;
  RunnerOptions options;
  options.max_in_flight = 8, options.commit_every = 16;
  Runner runner(*store, endpoint.execute(), options);
  runner.start();
  ASSERT_TRUE(wait_idle(runner));
  const auto b = store->batch(made.id);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, BatchStatus::kCompleted);
  EXPECT_EQ(b->total, 100);
  EXPECT_EQ(b->completed, 95);  // lines 7, 27, 47, 67, 87 are refused
  EXPECT_EQ(b->failed, 5);
  EXPECT_GT(b->in_progress_at, 0);
  EXPECT_GT(b->finalizing_at, 0);
  EXPECT_GT(b->completed_at, 0);
  expect_each_once(*store, *b, 100);
  const auto output = store->file(b->output_file_id);
  ASSERT_TRUE(output);
  EXPECT_EQ(output->purpose, "batch_output");
  EXPECT_EQ(output->bytes, int64_t(fs::file_size(*store->file_path(b->output_file_id))));
  EXPECT_EQ(endpoint.calls(), 100);
}

TEST(JobsRunner, AnInputThatFailsValidationFailsTheBatch) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord made = make_batch(*store, 3, request_line(1) + "\nnot json\n");
  FakeEndpoint endpoint;
  Runner runner(*store, endpoint.execute());
  runner.start();
  ASSERT_TRUE(wait_idle(runner));
  const auto b = store->batch(made.id);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, BatchStatus::kFailed);
  const json errors = json::parse(b->errors_json);
  ASSERT_EQ(errors["data"].size(), 2u);
  EXPECT_EQ(errors["data"][0]["code"], "duplicate_custom_id");
  EXPECT_EQ(errors["data"][0]["line"], 4);
  EXPECT_EQ(errors["data"][1]["code"], "invalid_json_line");
  EXPECT_EQ(errors["data"][1]["line"], 5);
  EXPECT_TRUE(b->output_file_id.empty());
  EXPECT_EQ(endpoint.calls(), 0);
}

TEST(JobsRunner, CancelFinishesTheLinesInFlightAndMarksTheRest) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord made = make_batch(*store, 50);
  FakeEndpoint endpoint;
  endpoint.hold(true);
  RunnerOptions options;
  options.max_in_flight = 4;
  Runner runner(*store, endpoint.execute(), options);
  runner.start();
  while (endpoint.calls() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(runner.cancel(made.id).ok());
  EXPECT_EQ(store->batch(made.id)->status, BatchStatus::kCancelling);
  endpoint.hold(false);
  ASSERT_TRUE(wait_idle(runner));
  const auto b = store->batch(made.id);
  EXPECT_EQ(b->status, BatchStatus::kCancelled);
  EXPECT_EQ(endpoint.calls(), 4);  // no line fed after the cancel
  EXPECT_EQ(b->completed, 4);
  EXPECT_EQ(b->failed, 46);
  expect_each_once(*store, *b, 50, "batch_cancelled");
  const Status again = runner.cancel(made.id);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("is cancelled: only a validating or in_progress batch"),
            std::string::npos)
      << again.message();
  EXPECT_EQ(runner.cancel("batch_none").code(), StatusCode::kNotFound);
}

TEST(JobsRunner, ExpiryEndsTheBatchWithWhatItFinished) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord made = make_batch(*store, 30, {}, /*expires_at=*/1000);
  FakeEndpoint endpoint;
  std::atomic<int64_t> clock{500};
  RunnerOptions options;
  options.max_in_flight = 2, options.now = [&] { return clock.load(); };
  options.on_step = [&](std::string_view step, int64_t next_line) {
    if (step == "written" && next_line >= 10) clock = 1000;  // the window closes mid-batch
  };
  Runner runner(*store, endpoint.execute(), options);
  runner.start();
  ASSERT_TRUE(wait_idle(runner));
  const auto b = store->batch(made.id);
  EXPECT_EQ(b->status, BatchStatus::kExpired);
  EXPECT_EQ(b->expired_at, 1000);
  EXPECT_GT(b->completed, 0);
  EXPECT_EQ(b->completed + b->failed, 30);
  expect_each_once(*store, *b, 30, "batch_expired");
  EXPECT_TRUE(store->file(b->output_file_id));  // what it finished stays downloadable
}

// The runner in a child process, killed by its own hook at `step` once next_line reaches `at`
// (step "finalizing": in finalize). Returns the child's end: 0, or -SIGKILL.
int run_child(const fs::path& dir, std::string step, int64_t at) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::string why;
    auto store = Store::open(dir, &why);
    if (!store) _exit(3);
    RunnerOptions options;
    options.max_in_flight = 3, options.commit_every = 5;
    options.on_step = [&](std::string_view s, int64_t next_line) {
      if (s == step && next_line >= at) raise(SIGKILL);
    };
    // Answers at once, on the runner's thread.
    Execute inline_endpoint = [](const BatchRecord&, const BatchLine& line,
                                 std::function<void(LineResult)> done) -> int64_t {
      done(FakeEndpoint::answer(line.body));
      return 0;
    };
    Runner runner(*store, inline_endpoint, options);
    runner.start();
    const bool idle = wait_idle(runner);
    runner.stop();
    _exit(idle ? 0 : 4);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

TEST(JobsRunner, KilledAtEveryStepAndRestartedEveryRequestIsAnsweredOnce) {
  test::TempDir tmp;
  const fs::path dir = tmp / "jobs";
  std::string id;
  {
    std::string why;
    auto store = Store::open(dir, &why);
    ASSERT_TRUE(store) << why;
    id = make_batch(*store, 40).id;
  }  // closed before fork: each child is the one server
  EXPECT_EQ(run_child(dir, "written", 3), -SIGKILL);     // a line written, not synced
  EXPECT_EQ(run_child(dir, "synced", 12), -SIGKILL);     // synced, not committed
  EXPECT_EQ(run_child(dir, "committed", 25), -SIGKILL);  // just after a commit
  EXPECT_EQ(run_child(dir, "finalizing", 0), -SIGKILL);  // every line done, files not recorded
  EXPECT_EQ(run_child(dir, "never", 0), 0);
  std::string why;
  auto store = Store::open(dir, &why);
  ASSERT_TRUE(store) << why;
  const auto b = store->batch(id);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, BatchStatus::kCompleted);
  EXPECT_EQ(b->completed + b->failed, 40);
  expect_each_once(*store, *b, 40);
  EXPECT_EQ(b->output_bytes, int64_t(fs::file_size(*store->file_path(b->output_file_id))));
}

}  // namespace
}  // namespace fastformer::jobs

namespace fastformer::jobs {
namespace {

// A full queue (429) or a draining server (503) is not a line's answer: the line runs again.
TEST(JobsRunner, BusyAnswersAreRunAgainNotWritten) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord made = make_batch(*store, 20);
  FakeEndpoint endpoint;
  std::mutex mu;
  std::map<std::string, int> tries;
  Execute busy_first = [&](const BatchRecord& b, const BatchLine& line,
                           std::function<void(LineResult)> done) -> int64_t {
    int n = 0;
    {
      std::lock_guard lock(mu);
      n = tries[line.custom_id]++;
    }
    if (n < 2 && line.custom_id.back() % 3 == 0) {  // req-0, req-3, ...: busy twice
      done({n == 0 ? 429 : 503, R"({"error":{"message":"queue full"}})", 0});
      return 0;
    }
    return endpoint.execute()(b, line, std::move(done));
  };
  Runner runner(*store, busy_first);
  runner.start();
  ASSERT_TRUE(wait_idle(runner));
  const auto b = store->batch(made.id);
  EXPECT_EQ(b->status, BatchStatus::kCompleted);
  EXPECT_EQ(b->completed + b->failed, 20);
  expect_each_once(*store, *b, 20);
  EXPECT_EQ(tries["req-3"], 3);
  EXPECT_EQ(tries["req-1"], 1);
}

}  // namespace
}  // namespace fastformer::jobs

namespace fastformer::jobs {
namespace {

// Two batches run at once and share the feeder's line bound evenly (the older does not hold
// every slot), and each still answers every request once.
TEST(JobsRunner, BatchesRunSideBySideSharingTheLinesInFlight) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord big = make_batch(*store, 60), small = make_batch(*store, 10);
  FakeEndpoint endpoint;
  endpoint.hold(true);
  RunnerOptions options;
  options.max_in_flight = 4, options.max_running = 2;
  Runner runner(*store, endpoint.execute(), options);
  runner.start();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (endpoint.calls() < 4 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // nothing more is fed
  EXPECT_EQ(endpoint.calls(big.id), 2);
  EXPECT_EQ(endpoint.calls(small.id), 2);
  endpoint.hold(false);
  ASSERT_TRUE(wait_idle(runner));
  for (const auto& [made, n] : {std::pair(big, 60), std::pair(small, 10)}) {
    const auto b = store->batch(made.id);
    EXPECT_EQ(b->status, BatchStatus::kCompleted);
    expect_each_once(*store, *b, n);
  }
  // One at a time (max_running 1): the older first.
  const BatchRecord first = make_batch(*store, 5), second = make_batch(*store, 5);
  RunnerOptions one;
  one.max_running = 1;
  endpoint.hold(true);
  Runner serial(*store, endpoint.execute(), one);
  serial.start();
  while (endpoint.calls(first.id) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(endpoint.calls(second.id), 0);
  endpoint.hold(false);
  ASSERT_TRUE(wait_idle(serial));
}

// The token bound: with max_queued_tokens 1 a line runs only once the one before is answered;
// the observer's count goes back to 0.
TEST(JobsRunner, TheTokenBoundHoldsLinesBack) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const BatchRecord made = make_batch(*store, 30);
  FakeEndpoint endpoint;
  endpoint.hold(true);
  std::atomic<int64_t> queued{0}, most{0};
  RunnerOptions options;
  options.max_in_flight = 8, options.max_queued_tokens = 1;
  options.on_queued_tokens = [&](int64_t delta) {
    const int64_t now = queued += delta;
    int64_t seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
  };
  Runner runner(*store, endpoint.execute(), options);
  runner.start();
  while (endpoint.calls() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(endpoint.calls(), 1);  // the line bound (8) would have let 8 run
  endpoint.hold(false);
  ASSERT_TRUE(wait_idle(runner));
  EXPECT_EQ(endpoint.calls(), 30);
  EXPECT_EQ(queued.load(), 0);
  EXPECT_LE(most.load(), 17);  // one line at a time: the longest input, "text " and 12 x
  EXPECT_GE(most.load(), 5);
  expect_each_once(*store, *store->batch(made.id), 30);
}

// A disk that fills up while a batch writes (here a file size limit, RLIMIT_FSIZE: writes past it
// fail as on a full disk): the batch fails with an error naming the file, never completed; what
// it committed stays downloadable, in whole lines, each request at most once.
TEST(JobsRunner, AFullDiskFailsTheBatchAndKeepsWhatItCommitted) {
  test::TempDir tmp;
  const fs::path dir = tmp / "jobs";
  std::string id;
  {
    std::string why;
    auto store = Store::open(dir, &why);
    ASSERT_TRUE(store) << why;
    id = make_batch(*store, 3000).id;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
    const rlimit limit{200 << 10, 200 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(5);
    std::string why;
    auto store = Store::open(dir, &why);
    if (!store) _exit(3);
    RunnerOptions options;
    options.commit_every = 500;
    Runner runner(
        *store,
        [](const BatchRecord&, const BatchLine& line,
           std::function<void(LineResult)> done) -> int64_t {
          done(FakeEndpoint::answer(line.body));
          return 0;
        },
        options);
    runner.start();
    const bool idle = wait_idle(runner);
    runner.stop();
    _exit(idle ? 0 : 4);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::string why;
  auto store = Store::open(dir, &why);
  ASSERT_TRUE(store) << why;
  const auto b = store->batch(id);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, BatchStatus::kFailed);
  const json errors = json::parse(b->errors_json);
  const std::string message = errors["data"][0]["message"];
  EXPECT_EQ(errors["data"][0]["code"], "server_error");
  EXPECT_NE(message.find("write " + store->file_path(b->output_file_id)->string()),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_GT(b->next_line, 0);
  EXPECT_LT(b->next_line, 3000);
  // What it committed is downloadable: whole lines, each once, as many as it counted.
  const auto output = store->file(b->output_file_id);
  ASSERT_TRUE(output);
  EXPECT_EQ(output->bytes, int64_t(fs::file_size(*store->file_path(b->output_file_id))));
  std::set<std::string> seen;
  int64_t lines = 0;
  for (const std::string& file : {b->output_file_id, b->error_file_id}) {
    for (const json& line : read_lines(*store, file)) {
      EXPECT_TRUE(seen.insert(line["custom_id"].get<std::string>()).second);
      ++lines;
    }
  }
  EXPECT_EQ(lines, b->completed + b->failed);
}

}  // namespace
}  // namespace fastformer::jobs
