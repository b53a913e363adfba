// The durable state of bulk jobs (server/jobs/store.h, issue 50): the data directory's lock, a
// foreign, newer, corrupt or non-SQLite database refused with its path, files and batches kept
// across a reopen, and crash safety: a writer process killed with SIGKILL at each point of
// appending, syncing and committing a batch's lines, restarted each time, ends with exactly one
// line per request.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "server/jobs/store.h"
#include "tests/support/test_models.h"

namespace fastformer::jobs {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Store> open_ok(const fs::path& dir) {
  std::string why;
  auto store = Store::open(dir, &why);
  EXPECT_TRUE(store) << why;
  return store;
}

std::string refusal(const fs::path& dir) {
  std::string why;
  auto store = Store::open(dir, &why);
  EXPECT_FALSE(store) << "opened";
  return why;
}

// Runs `sql` on the database file directly, as another program would.
void run_sql(const fs::path& file, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(file.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string message = error ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << message;
}

TEST(JobsStore, OneServerADirectoryAndTheDatabaseInWal) {
  test::TempDir tmp;
  const fs::path dir = tmp / "jobs";
  auto first = open_ok(dir);
  ASSERT_TRUE(first);
  EXPECT_TRUE(fs::is_directory(dir / "files"));
  const std::string why = refusal(dir);
  EXPECT_NE(why.find("is in use by another fastformer-server"), std::string::npos) << why;
  EXPECT_NE(why.find((dir / "LOCK").string()), std::string::npos) << why;
  // WAL, as another connection sees it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "jobs.sqlite3").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  first.reset();  // the lock goes with it
  EXPECT_TRUE(open_ok(dir));
}

TEST(JobsStore, ADatabaseNotOursIsRefusedNamingIt) {
  test::TempDir tmp;
  {
    const fs::path dir = tmp / "garbage";
    fs::create_directories(dir);
    test::write_file(dir / "jobs.sqlite3", std::string(4096, 'x'));
    const std::string why = refusal(dir);
    EXPECT_NE(why.find((dir / "jobs.sqlite3").string()), std::string::npos) << why;
    EXPECT_NE(why.find("file is not a database"), std::string::npos) << why;
  }
  {
    const fs::path dir = tmp / "foreign";
    fs::create_directories(dir);
    run_sql(dir / "jobs.sqlite3", "CREATE TABLE notes (text TEXT)");
    const std::string why = refusal(dir);
    EXPECT_NE(why.find("not a fastformer jobs database"), std::string::npos) << why;
  }
  {
    const fs::path dir = tmp / "newer";
    ASSERT_TRUE(open_ok(dir));
    run_sql(dir / "jobs.sqlite3", "PRAGMA user_version=2");
    const std::string why = refusal(dir);
    EXPECT_NE(why.find("schema version 2, and this fastformer-server knows version 1 (a newer"),
              std::string::npos)
        << why;
  }
}

// A disk with no room at start-up (here a file size limit, RLIMIT_FSIZE, in a child process:
// every write past it fails as on a full disk) is a clear error naming the database, never a
// crash and never a store that seems to work.
TEST(JobsStore, AFullDiskAtStartUpIsAClearError) {
  test::TempDir tmp;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(out[0]);
    ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
    const rlimit limit{1024, 1024};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(5);
    std::string why;
    const bool opened = Store::open(tmp / "jobs", &why) != nullptr;
    if (::write(out[1], why.data(), why.size()) < 0) _exit(6);
    _exit(opened ? 1 : 0);
  }
  ::close(out[1]);
  std::string why;
  char buffer[4096];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) > 0;) why.append(buffer, size_t(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the store opened on a full disk";
  EXPECT_NE(why.find((tmp / "jobs" / "jobs.sqlite3").string()), std::string::npos) << why;
  EXPECT_NE(why.find("check that the disk has room and is writable"), std::string::npos) << why;
}

TEST(JobsStore, FilesAndBatchesOutliveTheServer) {
  test::TempDir tmp;
  const fs::path dir = tmp / "jobs";
  std::vector<std::string> ids;
  {
    auto store = open_ok(dir);
    ASSERT_TRUE(store);
    for (int i = 0; i < 3; ++i) {
      const std::string id = Store::new_id("file-");
      ids.push_back(id);
      ASSERT_TRUE(store
                      ->add_file({id, "part" + std::to_string(i) + ".jsonl", "batch", 10 + i,
                                  1000 + i, 2000 + i, "processed"})
                      .ok());
      test::write_file(*store->file_path(id), "x");
    }
    BatchRecord b;
    b.id = "batch_one", b.endpoint = "/v1/embeddings", b.model = "m", b.input_file_id = ids[0];
    b.total = 5, b.created_at = 1000, b.expires_at = 90000;
    ASSERT_TRUE(store->add_batch(b).ok());
    b.id = "batch_two";
    ASSERT_TRUE(store->add_batch(b).ok());
    ASSERT_TRUE(store->set_status("batch_one", BatchStatus::kInProgress, 1005).ok());
    ASSERT_TRUE(store->set_status("batch_two", BatchStatus::kCompleted, 1010).ok());
    EXPECT_EQ(store->commit_progress("batch_none", {}).code(), StatusCode::kNotFound);
    ASSERT_TRUE(store->commit_progress("batch_one", {3, 2, 1, 30, 30, 120, 40}).ok());
  }
  auto store = open_ok(dir);
  ASSERT_TRUE(store);
  const auto files = store->files("", 2);  // oldest first, paginated
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].id, ids[0]);
  EXPECT_EQ(files[1].filename, "part1.jsonl");
  const auto rest = store->files(files[1].id, 10);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].id, ids[2]);
  EXPECT_EQ(rest[0].bytes, 12);
  EXPECT_TRUE(store->files("file-000000000000000000000000", 10).empty());  // unknown cursor
  ASSERT_TRUE(store->delete_file(ids[1]));
  EXPECT_FALSE(fs::exists(dir / "files" / ids[1]));
  EXPECT_FALSE(store->delete_file(ids[1]));
  EXPECT_FALSE(store->file(ids[1]));
  // A caller's id never becomes a path out of the directory.
  for (const char* bad : {"../LOCK", "file-../../../../etc/pas", "file-ABCDEF0123456789abcdef01",
                          "file-0123", "batch_0123456789abcdef01234567"})
    EXPECT_FALSE(store->file_path(bad)) << bad;

  const auto batches = store->batches("", 10);  // newest first
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].id, "batch_two");
  EXPECT_EQ(batches[0].status, BatchStatus::kCompleted);
  EXPECT_EQ(batches[0].completed_at, 1010);
  EXPECT_EQ(store->batches("batch_two", 10).size(), 1u);
  const auto one = store->batch("batch_one");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, BatchStatus::kInProgress);
  EXPECT_EQ(one->in_progress_at, 1005);
  EXPECT_EQ(one->next_line, 3);
  EXPECT_EQ(one->completed, 2);
  EXPECT_EQ(one->failed, 1);
  EXPECT_EQ(one->output_bytes, 120);
  EXPECT_EQ(one->error_bytes, 40);
  EXPECT_EQ(one->expires_at, 90000);
  const auto resume = store->unfinished();
  ASSERT_EQ(resume.size(), 1u);
  EXPECT_EQ(resume[0].id, "batch_one");
}

// Where the writer kills itself (SIGKILL) on its chosen line.
enum class Stage { kAfterWrite, kAfterSync, kAfterCommit, kNever };

constexpr int64_t kLines = 40;
constexpr int64_t kEvery = 4;  // lines a commit

std::string line_of(int64_t i) {
  return "{\"custom_id\": \"request-" + std::to_string(i) + "\"}\n";
}

// A batch's runner, in a child process: resumes as a restarted server does (recover_files, then
// from next_line), appends each line's result, and every kEvery lines fsyncs and commits. Kills
// itself at `stage` of line `die_line`.
[[noreturn]] void writer(const fs::path& dir, int64_t die_line, Stage stage) {
  std::string why;
  auto store = Store::open(dir, &why);
  if (!store) _exit(3);
  const auto b = store->batch("batch_crash");
  if (!b || !store->recover_files(*b).ok()) _exit(4);
  const int fd = ::open(store->file_path(b->output_file_id)->c_str(), O_WRONLY | O_APPEND);
  if (fd < 0) _exit(5);
  Progress p{b->next_line, b->completed, 0, 0, 0, b->output_bytes, 0};
  for (int64_t i = b->next_line; i < kLines; ++i) {
    const std::string line = line_of(i);
    if (::write(fd, line.data(), line.size()) != ssize_t(line.size())) _exit(6);
    if (i == die_line && stage == Stage::kAfterWrite) raise(SIGKILL);
    if ((i + 1) % kEvery != 0 && i + 1 != kLines) continue;
    if (::fsync(fd) != 0) _exit(7);
    if (i == die_line && stage == Stage::kAfterSync) raise(SIGKILL);
    p.next_line = p.completed = i + 1;
    p.output_bytes = ::lseek(fd, 0, SEEK_END);
    if (!store->commit_progress(b->id, p).ok()) _exit(8);
    if (i == die_line && stage == Stage::kAfterCommit) raise(SIGKILL);
  }
  _exit(0);
}

// Runs the writer in a child; `kill_after` (not zero): SIGKILL from here after that long.
// The child's exit: 0, or -SIGKILL.
int run_writer(const fs::path& dir, int64_t die_line, Stage stage,
               std::chrono::microseconds kill_after = {}) {
  const pid_t pid = fork();
  if (pid == 0) writer(dir, die_line, stage);
  if (kill_after.count() > 0) {
    std::this_thread::sleep_for(kill_after);
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

TEST(JobsStore, AKilledWriterResumesWithEveryLineOnce) {
  test::TempDir tmp;
  const fs::path dir = tmp / "jobs";
  std::string output_id;
  {
    auto store = open_ok(dir);
    ASSERT_TRUE(store);
    output_id = Store::new_id("file-");
    BatchRecord b;
    b.id = "batch_crash", b.endpoint = "/v1/embeddings", b.status = BatchStatus::kInProgress;
    b.output_file_id = output_id, b.total = kLines;
    ASSERT_TRUE(store->add_batch(b).ok());
    ASSERT_TRUE(store->recover_files(b).ok());  // creates the empty output file
  }  // the store (and its lock) closed before fork: each child is the one server
  // Killed after writing a line of the first commit, after syncing the second commit's lines,
  // just after the third commit, and at some moment from outside; then to the end.
  EXPECT_EQ(run_writer(dir, 2, Stage::kAfterWrite), -SIGKILL);
  EXPECT_EQ(run_writer(dir, 7, Stage::kAfterSync), -SIGKILL);
  EXPECT_EQ(run_writer(dir, 11, Stage::kAfterCommit), -SIGKILL);
  const int outside = run_writer(dir, -1, Stage::kNever, std::chrono::microseconds(1500));
  EXPECT_TRUE(outside == -SIGKILL || outside == 0) << outside;
  EXPECT_EQ(run_writer(dir, -1, Stage::kNever), 0);

  auto store = open_ok(dir);
  ASSERT_TRUE(store);
  const auto b = store->batch("batch_crash");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->next_line, kLines);
  EXPECT_EQ(b->completed, kLines);
  std::ifstream in(*store->file_path(output_id), std::ios::binary);
  std::stringstream got;
  got << in.rdbuf();
  std::string want;
  for (int64_t i = 0; i < kLines; ++i) want += line_of(i);
  EXPECT_EQ(got.str(), want);  // every line once, in order: none lost, none twice
  EXPECT_EQ(b->output_bytes, int64_t(want.size()));
}

TEST(JobsStore, AFileShorterThanItsCommitIsAnErrorNotASilentGap) {
  test::TempDir tmp;
  auto store = open_ok(tmp / "jobs");
  ASSERT_TRUE(store);
  BatchRecord b;
  b.id = "batch_short", b.output_file_id = Store::new_id("file-"), b.output_bytes = 100;
  test::write_file(*store->file_path(b.output_file_id), "only these bytes\n");
  const Status s = store->recover_files(b);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("holds 17 bytes, fewer than the 100 committed"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace fastformer::jobs

namespace fastformer::jobs {
namespace {

// Retention: expired files go (records and bytes); a finished batch goes once none of its files
// is left and its age passed the batch ttl; an unfinished one stays.
TEST(JobsStore, RetentionDeletesExpiredFilesThenTheirFinishedBatches) {
  test::TempDir tmp;
  std::string why;
  auto store = Store::open(tmp / "jobs", &why);
  ASSERT_TRUE(store) << why;
  const std::string input = Store::new_id("file-"), output = Store::new_id("file-");
  ASSERT_TRUE(store->add_file({input, "in.jsonl", "batch", 1, 100, 200, "processed"}).ok());
  ASSERT_TRUE(
      store->add_file({output, "out.jsonl", "batch_output", 1, 150, 500, "processed"}).ok());
  test::write_file(*store->file_path(input), "x");
  test::write_file(*store->file_path(output), "y");
  BatchRecord done;
  done.id = "batch_done", done.input_file_id = input, done.output_file_id = output;
  done.status = BatchStatus::kCompleted, done.created_at = 100;
  ASSERT_TRUE(store->add_batch(done).ok());
  BatchRecord running = done;
  running.id = "batch_running", running.status = BatchStatus::kInProgress;
  ASSERT_TRUE(store->add_batch(running).ok());

  EXPECT_EQ(store->delete_expired(199, 50), std::make_pair(int64_t(0), int64_t(0)));
  EXPECT_EQ(store->delete_expired(200, 50), std::make_pair(int64_t(1), int64_t(0)));  // the input
  EXPECT_FALSE(store->file(input));
  EXPECT_FALSE(std::filesystem::exists(tmp / "jobs" / "files" / input));
  EXPECT_TRUE(store->batch("batch_done"));  // its output is still there
  EXPECT_EQ(store->delete_expired(500, 50), std::make_pair(int64_t(1), int64_t(1)));
  EXPECT_FALSE(store->batch("batch_done"));
  EXPECT_TRUE(store->batch("batch_running"));  // never while it runs
}

}  // namespace
}  // namespace fastformer::jobs
