// The durable state of bulk embedding jobs (issue 50: OpenAI's Files and Batch API): one data
// directory (--jobs-dir) holding a SQLite database in WAL mode, the uploaded and produced files
// (files/<id>, named by their id, never by the caller's file name) and a lock file that keeps a
// second server out.
//
// Nothing a batch has finished is lost across a crash, and nothing is written twice: a batch's
// runner appends finished lines to its output and error files, fsyncs them, and then commits, in
// one transaction, the lines done (next_line), their counts and both files' byte lengths
// (commit_progress). A restart truncates each file to its committed length (recover_files) and
// resumes at next_line: bytes written after the last commit are the lines that are run again.
//
// One connection, serialized by a mutex: every call is a short statement or transaction.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct sqlite3;

namespace fastformer::jobs {

// A stored file, in OpenAI's words (object "file"). Times are Unix seconds; 0: none.
struct FileRecord {
  std::string id;        ///< "file-" and 24 hex digits
  std::string filename;  ///< as uploaded (shown, never used as a path)
  std::string purpose;   ///< "batch" (uploaded), "batch_output" (made by a batch)
  int64_t bytes = 0;
  int64_t created_at = 0;
  int64_t expires_at = 0;
  std::string status = "processed";
};

// OpenAI's batch statuses: validating -> in_progress -> finalizing -> completed, or failed,
// expired, and cancelling -> cancelled.
enum class BatchStatus {
  kValidating,
  kInProgress,
  kFinalizing,
  kCompleted,
  kFailed,
  kExpired,
  kCancelling,
  kCancelled
};
// "validating", "in_progress", ...: OpenAI's spelling.
const char* batch_status_name(BatchStatus status);
std::optional<BatchStatus> parse_batch_status(std::string_view name);
// A status a batch never leaves: completed, failed, expired, cancelled.
bool batch_finished(BatchStatus status);

// A batch, in OpenAI's words (object "batch"), and where its runner stands.
struct BatchRecord {
  std::string id;  ///< "batch_" and 24 hex digits
  std::string endpoint;
  std::string model;
  std::string input_file_id;
  std::string output_file_id;  ///< empty until the batch makes one
  std::string error_file_id;
  BatchStatus status = BatchStatus::kValidating;
  std::string errors_json = "null";              ///< OpenAI's errors object, as JSON
  std::string metadata_json = "null";            ///< the caller's metadata, as JSON
  int64_t total = 0, completed = 0, failed = 0;  ///< request_counts
  int64_t prompt_tokens = 0, total_tokens = 0;   ///< usage
  int64_t created_at = 0, in_progress_at = 0, finalizing_at = 0, completed_at = 0, failed_at = 0,
          expired_at = 0, cancelling_at = 0, cancelled_at = 0, expires_at = 0;
  /// The runner's place: input lines [0, next_line) are in the output or the error file, whose
  /// committed lengths are output_bytes and error_bytes.
  int64_t next_line = 0;
  int64_t output_bytes = 0, error_bytes = 0;
};

// What a batch's runner commits after fsyncing its output and error files.
struct Progress {
  int64_t next_line = 0;
  int64_t completed = 0, failed = 0;
  int64_t prompt_tokens = 0, total_tokens = 0;
  int64_t output_bytes = 0, error_bytes = 0;
};

class Store {
 public:
  // Opens the data directory `dir` (creating it and its files/ folder): takes its lock (LOCK,
  // held until the Store goes), opens or creates jobs.sqlite3 in WAL mode with synchronous=FULL,
  // and checks that it is ours, of a schema this build knows, and sound (quick_check). Null and
  // `why` (naming the path and what to do) when any of that fails: another server holds the
  // directory, the database is another program's, newer, corrupt or not a database, the disk
  // is full or not writable.
  static std::unique_ptr<Store> open(const std::filesystem::path& dir, std::string* why);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  // A fresh id: `prefix` ("file-", "batch_", "batch_req_") and 24 random hex digits.
  static std::string new_id(std::string_view prefix);
  // Where the file of `id` lives (dir/files/<id>), or nothing when `id` is not of our form
  // ("file-" and 24 hex digits): a caller's id never becomes a path outside the directory.
  std::optional<std::filesystem::path> file_path(std::string_view id) const;

  // Files. Errors are INTERNAL naming the database and SQLite's message (disk full included).
  Status add_file(const FileRecord& file);
  std::optional<FileRecord> file(std::string_view id);
  // Oldest first; after `after` (an id; empty: from the start); at most `limit`.
  std::vector<FileRecord> files(std::string_view after, int64_t limit);
  // The bytes of every stored file together (what --jobs-max-stored-bytes bounds).
  int64_t stored_bytes();
  // Retention: deletes the files whose expires_at has passed (records and bytes), and the
  // finished batches none of whose files is left and that were made more than `batch_ttl_s`
  // ago. Returns how many files and batches it deleted.
  std::pair<int64_t, int64_t> delete_expired(int64_t now, int64_t batch_ttl_s);
  // Deletes the record and the stored file; false when there was none.
  bool delete_file(std::string_view id);

  // Batches.
  Status add_batch(const BatchRecord& batch);
  std::optional<BatchRecord> batch(std::string_view id);
  // Newest first, as OpenAI lists them; after `after` (an id); at most `limit`.
  std::vector<BatchRecord> batches(std::string_view after, int64_t limit);
  // How many batches are in each status (every status, 0 included), OpenAI's names.
  std::vector<std::pair<std::string, int64_t>> count_by_status();
  // The batches a restart resumes (validating, in_progress, finalizing, cancelling), oldest first.
  std::vector<BatchRecord> unfinished();
  // Records `progress` for batch `id` in one transaction: call it once the output and error files
  // are fsynced to progress.output_bytes and progress.error_bytes. NOT_FOUND for no such batch.
  Status commit_progress(std::string_view id, const Progress& progress);
  // Moves batch `id` to `status` at `at` (its *_at field), with `errors_json` when given.
  Status set_status(std::string_view id, BatchStatus status, int64_t at,
                    std::optional<std::string> errors_json = std::nullopt);
  // Moves batch `id` to cancelling at `at` if it is validating or in_progress;
  // FAILED_PRECONDITION naming its status otherwise, NOT_FOUND for none.
  Status request_cancel(std::string_view id, int64_t at);
  // A validated batch starts: its request count, the ids of the output and error files it will
  // write, and status in_progress at `at` (unless a cancel came meanwhile), in one transaction.
  Status start_batch(std::string_view id, int64_t total, const std::string& output_file_id,
                     const std::string& error_file_id, int64_t at);
  // After a crash: cuts the batch's output and error files back to their committed lengths
  // (creating an empty one where none is), so that the lines after next_line are run again and
  // written once. An error names the file.
  Status recover_files(const BatchRecord& batch);

 private:
  Store(std::filesystem::path dir, int lock_fd, sqlite3* db)
      : dir_(std::move(dir)), lock_fd_(lock_fd), db_(db) {}

  std::filesystem::path dir_;
  int lock_fd_ = -1;
  sqlite3* db_ = nullptr;
  std::mutex mu_;
};

}  // namespace fastformer::jobs
