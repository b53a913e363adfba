#include "server/jobs/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <system_error>
#include <utility>

namespace fastformer::jobs {
namespace {

// SQLite's message, and the system's error behind it where there was one ("disk I/O error
// (No space left on device)").
std::string sqlite_error(sqlite3* db, const char* message) {
  std::string text = message != nullptr ? message : "unknown error";
  if (const int err = sqlite3_system_errno(db); err != 0)
    text += std::string(" (") + std::strerror(err) + ")";
  return text;
}

namespace fs = std::filesystem;

constexpr int32_t kApplicationId = 0x46464a42;  // "FFJB": a fastformer jobs database
constexpr int kSchemaVersion = 1;
constexpr const char* kDatabase = "jobs.sqlite3";

constexpr std::array<const char*, 8> kStatusNames = {"validating", "in_progress", "finalizing",
                                                     "completed",  "failed",      "expired",
                                                     "cancelling", "cancelled"};

const char* const kSchema = R"sql(
CREATE TABLE files (
  id TEXT PRIMARY KEY NOT NULL,
  filename TEXT NOT NULL,
  purpose TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  status TEXT NOT NULL
);
CREATE TABLE batches (
  id TEXT PRIMARY KEY NOT NULL,
  endpoint TEXT NOT NULL, model TEXT NOT NULL, input_file_id TEXT NOT NULL,
  output_file_id TEXT NOT NULL, error_file_id TEXT NOT NULL, status TEXT NOT NULL,
  errors_json TEXT NOT NULL, metadata_json TEXT NOT NULL,
  total INTEGER NOT NULL, completed INTEGER NOT NULL, failed INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL, total_tokens INTEGER NOT NULL,
  created_at INTEGER NOT NULL, in_progress_at INTEGER NOT NULL, finalizing_at INTEGER NOT NULL,
  completed_at INTEGER NOT NULL, failed_at INTEGER NOT NULL, expired_at INTEGER NOT NULL,
  cancelling_at INTEGER NOT NULL, cancelled_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
  next_line INTEGER NOT NULL, output_bytes INTEGER NOT NULL, error_bytes INTEGER NOT NULL
);
)sql";

// The batch's integer columns, in the table's order after the text ones.
constexpr std::array<int64_t BatchRecord::*, 17> kBatchNumbers = {
    &BatchRecord::total,          &BatchRecord::completed,     &BatchRecord::failed,
    &BatchRecord::prompt_tokens,  &BatchRecord::total_tokens,  &BatchRecord::created_at,
    &BatchRecord::in_progress_at, &BatchRecord::finalizing_at, &BatchRecord::completed_at,
    &BatchRecord::failed_at,      &BatchRecord::expired_at,    &BatchRecord::cancelling_at,
    &BatchRecord::cancelled_at,   &BatchRecord::expires_at,    &BatchRecord::next_line,
    &BatchRecord::output_bytes,   &BatchRecord::error_bytes};
constexpr const char* kBatchColumns =
    "id, endpoint, model, input_file_id, output_file_id, error_file_id, status, errors_json, "
    "metadata_json, total, completed, failed, prompt_tokens, total_tokens, created_at, "
    "in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, "
    "cancelled_at, expires_at, next_line, output_bytes, error_bytes";
constexpr int kBatchTexts = 9;  // id .. metadata_json
constexpr const char* kFileColumns = "id, filename, purpose, bytes, created_at, expires_at, status";

// One prepared statement: bound by position from 1, stepped, finalized when it goes.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), int(sql.size()), &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return rc_ == SQLITE_OK || rc_ == SQLITE_ROW || rc_ == SQLITE_DONE; }
  Statement& bind(int i, std::string_view v) {
    if (ok()) rc_ = sqlite3_bind_text(stmt_, i, v.data(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, int64_t v) {
    if (ok()) rc_ = sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  // True while there is a row; false at the end or on an error (ok() then says which).
  bool step() {
    if (!ok()) return false;
    rc_ = sqlite3_step(stmt_);
    return rc_ == SQLITE_ROW;
  }
  std::string text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           size_t(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }
  int64_t number(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string error() const { return sqlite_error(db_, sqlite3_errmsg(db_)); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

std::string database_path(const fs::path& dir) { return (dir / kDatabase).string(); }

FileRecord read_file(const Statement& s) {
  return {s.text(0), s.text(1), s.text(2), s.number(3), s.number(4), s.number(5), s.text(6)};
}

BatchRecord read_batch(const Statement& s) {
  BatchRecord b;
  b.id = s.text(0), b.endpoint = s.text(1), b.model = s.text(2), b.input_file_id = s.text(3);
  b.output_file_id = s.text(4), b.error_file_id = s.text(5);
  b.status = parse_batch_status(s.text(6)).value_or(BatchStatus::kFailed);
  b.errors_json = s.text(7), b.metadata_json = s.text(8);
  for (size_t i = 0; i < kBatchNumbers.size(); ++i)
    b.*kBatchNumbers[i] = s.number(kBatchTexts + int(i));
  return b;
}

// The one value of a PRAGMA (or another one-row query) as text, or nothing with `why`.
std::optional<std::string> query_one(sqlite3* db, const std::string& sql, std::string* why) {
  Statement s(db, sql);
  if (s.step()) return s.text(0);
  if (!s.ok())
    *why = s.error();
  else
    *why = "no result";
  return std::nullopt;
}

// Why `db` (at `path`) cannot serve as this build's jobs database, or nothing: it is ours (and
// initialized here when it is new and empty), of a schema this build knows, in WAL mode, sound.
std::optional<std::string> prepare_database(sqlite3* db, const std::string& path) {
  std::string why;
  auto fail = [&](const std::string& what) -> std::optional<std::string> {
    return "jobs database " + path + ": " + what;
  };
  const auto app = query_one(db, "PRAGMA application_id", &why);
  if (!app) {
    return fail(why +
                " (it is not a SQLite database, or it is corrupt: move it away and restart, "
                "or give --jobs-dir another directory)");
  }
  const auto objects = query_one(db, "SELECT count(*) FROM sqlite_master", &why);
  if (!objects) return fail(why);
  const bool empty = *objects == "0";
  if (std::stoll(*app) != kApplicationId && !empty) {
    return fail("not a fastformer jobs database (application_id " + *app +
                "): another program's file; give --jobs-dir a directory of its own");
  }
  const auto mode = query_one(db, "PRAGMA journal_mode=WAL", &why);
  if (!mode) return fail("cannot switch to WAL: " + why);
  if (*mode != "wal") {
    return fail("journal mode '" + *mode +
                "' instead of WAL (WAL needs a local file system with shared memory: not NFS)");
  }
  char* error = nullptr;
  if (empty) {
    const std::string init = std::string("BEGIN IMMEDIATE;") + kSchema +
                             "PRAGMA application_id=" + std::to_string(kApplicationId) +
                             ";PRAGMA user_version=" + std::to_string(kSchemaVersion) + ";COMMIT;";
    if (sqlite3_exec(db, init.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = sqlite_error(db, error);
      sqlite3_free(error);
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      return fail("cannot create its tables: " + message +
                  "; check that the disk has room and is writable");
    }
  }
  const auto version = query_one(db, "PRAGMA user_version", &why);
  if (!version) return fail(why);
  if (std::stoll(*version) != kSchemaVersion) {
    return fail("schema version " + *version + ", and this fastformer-server knows version " +
                std::to_string(kSchemaVersion) +
                (std::stoll(*version) > kSchemaVersion ? " (a newer server made it)" : ""));
  }
  if (sqlite3_exec(db, "PRAGMA synchronous=FULL", nullptr, nullptr, &error) != SQLITE_OK) {
    const std::string message = error ? error : "unknown error";
    sqlite3_free(error);
    return fail(message);
  }
  const auto check = query_one(db, "PRAGMA quick_check", &why);
  if (!check) return fail(why);
  if (*check != "ok")
    return fail("corrupt (quick_check: " + *check + "): restore it from a backup");
  return std::nullopt;
}

}  // namespace

const char* batch_status_name(BatchStatus status) { return kStatusNames[size_t(status)]; }

std::optional<BatchStatus> parse_batch_status(std::string_view name) {
  for (size_t i = 0; i < kStatusNames.size(); ++i)
    if (name == kStatusNames[i]) return BatchStatus(i);
  return std::nullopt;
}

bool batch_finished(BatchStatus s) {
  return s == BatchStatus::kCompleted || s == BatchStatus::kFailed || s == BatchStatus::kExpired ||
         s == BatchStatus::kCancelled;
}

std::unique_ptr<Store> Store::open(const fs::path& dir, std::string* why) {
  std::error_code ec;
  fs::create_directories(dir / "files", ec);
  if (ec) {
    *why = "--jobs-dir " + dir.string() + ": cannot create it: " + ec.message();
    return nullptr;
  }
  const fs::path lock = dir / "LOCK";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = "--jobs-dir " + dir.string() + ": cannot open " + lock.string() + ": " +
           std::strerror(errno);
    return nullptr;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    *why = "--jobs-dir " + dir.string() +
           (err == EWOULDBLOCK ? " is in use by another fastformer-server (it holds " +
                                     lock.string() + "); give each server a directory of its own"
                               : ": cannot lock " + lock.string() + ": " + std::strerror(err));
    return nullptr;
  }
  const std::string path = database_path(dir);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    *why = "jobs database " + path + ": " + (db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    ::close(fd);
    return nullptr;
  }
  sqlite3_busy_timeout(db, 5000);
  if (auto problem = prepare_database(db, path)) {
    *why = std::move(*problem);
    sqlite3_close(db);
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<Store>(new Store(dir, fd, db));
}

Store::~Store() {
  sqlite3_close(db_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

std::string Store::new_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

std::optional<fs::path> Store::file_path(std::string_view id) const {
  constexpr std::string_view kPrefix = "file-";
  if (id.size() != kPrefix.size() + 24 || !id.starts_with(kPrefix)) return std::nullopt;
  for (const char c : id.substr(kPrefix.size()))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  return dir_ / "files" / std::string(id);
}

Status Store::add_file(const FileRecord& f) {
  std::lock_guard lock(mu_);
  Statement s(db_, std::string("INSERT INTO files (") + kFileColumns + ") VALUES (?,?,?,?,?,?,?)");
  s.bind(1, f.id).bind(2, f.filename).bind(3, f.purpose).bind(4, f.bytes).bind(5, f.created_at);
  s.bind(6, f.expires_at).bind(7, f.status).step();
  if (!s.ok())
    return {StatusCode::kInternal, "jobs database " + database_path(dir_) + ": " + s.error()};
  return Status();
}

std::optional<FileRecord> Store::file(std::string_view id) {
  std::lock_guard lock(mu_);
  Statement s(db_, std::string("SELECT ") + kFileColumns + " FROM files WHERE id = ?");
  if (!s.bind(1, id).step()) return std::nullopt;
  return read_file(s);
}

std::vector<FileRecord> Store::files(std::string_view after, int64_t limit) {
  std::lock_guard lock(mu_);
  Statement s(db_,
              std::string("SELECT ") + kFileColumns +
                  " FROM files WHERE rowid > coalesce((SELECT rowid FROM files WHERE id = ?), "
                  "CASE WHEN ? = '' THEN 0 ELSE 9223372036854775807 END) ORDER BY rowid LIMIT ?");
  s.bind(1, after).bind(2, after).bind(3, limit);
  std::vector<FileRecord> out;
  while (s.step()) out.push_back(read_file(s));
  return out;
}

int64_t Store::stored_bytes() {
  std::lock_guard lock(mu_);
  Statement s(db_, "SELECT coalesce(sum(bytes), 0) FROM files");
  return s.step() ? s.number(0) : 0;
}

std::pair<int64_t, int64_t> Store::delete_expired(int64_t now, int64_t batch_ttl_s) {
  std::vector<std::string> gone;
  {
    std::lock_guard lock(mu_);
    Statement s(db_, "SELECT id FROM files WHERE expires_at > 0 AND expires_at <= ?");
    s.bind(1, now);
    while (s.step()) gone.push_back(s.text(0));
  }
  int64_t files = 0;
  for (const std::string& id : gone) files += delete_file(id) ? 1 : 0;
  std::lock_guard lock(mu_);
  Statement s(db_,
              "DELETE FROM batches WHERE status IN ('completed', 'failed', 'expired', "
              "'cancelled') AND created_at <= ? AND output_file_id NOT IN (SELECT id FROM files) "
              "AND error_file_id NOT IN (SELECT id FROM files) AND input_file_id NOT IN (SELECT id "
              "FROM files)");
  s.bind(1, now - batch_ttl_s).step();
  return {files, s.ok() ? int64_t(sqlite3_changes(db_)) : 0};
}

bool Store::delete_file(std::string_view id) {
  std::lock_guard lock(mu_);
  Statement s(db_, "DELETE FROM files WHERE id = ?");
  s.bind(1, id).step();
  const bool deleted = s.ok() && sqlite3_changes(db_) > 0;
  if (deleted) {
    if (auto path = file_path(id)) {
      std::error_code ec;
      fs::remove(*path, ec);
    }
  }
  return deleted;
}

Status Store::add_batch(const BatchRecord& b) {
  std::lock_guard lock(mu_);
  std::string sql = std::string("INSERT INTO batches (") + kBatchColumns + ") VALUES (?";
  for (size_t i = 1; i < kBatchTexts + kBatchNumbers.size(); ++i) sql += ",?";
  Statement s(db_, sql + ")");
  s.bind(1, b.id).bind(2, b.endpoint).bind(3, b.model).bind(4, b.input_file_id);
  s.bind(5, b.output_file_id).bind(6, b.error_file_id).bind(7, batch_status_name(b.status));
  s.bind(8, b.errors_json).bind(9, b.metadata_json);
  for (size_t i = 0; i < kBatchNumbers.size(); ++i)
    s.bind(kBatchTexts + 1 + int(i), b.*kBatchNumbers[i]);
  s.step();
  if (!s.ok())
    return {StatusCode::kInternal, "jobs database " + database_path(dir_) + ": " + s.error()};
  return Status();
}

std::optional<BatchRecord> Store::batch(std::string_view id) {
  std::lock_guard lock(mu_);
  Statement s(db_, std::string("SELECT ") + kBatchColumns + " FROM batches WHERE id = ?");
  if (!s.bind(1, id).step()) return std::nullopt;
  return read_batch(s);
}

std::vector<BatchRecord> Store::batches(std::string_view after, int64_t limit) {
  std::lock_guard lock(mu_);
  Statement s(db_, std::string("SELECT ") + kBatchColumns +
                       " FROM batches WHERE rowid < coalesce((SELECT rowid FROM batches WHERE id = "
                       "?), CASE WHEN ? = '' THEN 9223372036854775807 ELSE 0 END) ORDER BY rowid "
                       "DESC LIMIT ?");
  s.bind(1, after).bind(2, after).bind(3, limit);
  std::vector<BatchRecord> out;
  while (s.step()) out.push_back(read_batch(s));
  return out;
}

std::vector<std::pair<std::string, int64_t>> Store::count_by_status() {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, int64_t>> out;
  for (const char* name : kStatusNames) out.emplace_back(name, 0);
  Statement s(db_, "SELECT status, count(*) FROM batches GROUP BY status");
  while (s.step()) {
    for (auto& [name, count] : out)
      if (name == s.text(0)) count = s.number(1);
  }
  return out;
}

std::vector<BatchRecord> Store::unfinished() {
  std::lock_guard lock(mu_);
  Statement s(db_, std::string("SELECT ") + kBatchColumns +
                       " FROM batches WHERE status IN ('validating', 'in_progress', 'finalizing', "
                       "'cancelling') ORDER BY rowid");
  std::vector<BatchRecord> out;
  while (s.step()) out.push_back(read_batch(s));
  return out;
}

Status Store::commit_progress(std::string_view id, const Progress& p) {
  std::lock_guard lock(mu_);
  // One statement is one transaction: the lines done and both files' lengths move together.
  Statement s(db_,
              "UPDATE batches SET next_line = ?, completed = ?, failed = ?, prompt_tokens = ?, "
              "total_tokens = ?, output_bytes = ?, error_bytes = ? WHERE id = ?");
  s.bind(1, p.next_line).bind(2, p.completed).bind(3, p.failed).bind(4, p.prompt_tokens);
  s.bind(5, p.total_tokens).bind(6, p.output_bytes).bind(7, p.error_bytes).bind(8, id).step();
  if (!s.ok())
    return {StatusCode::kInternal, "jobs database " + database_path(dir_) + ": " + s.error()};
  if (sqlite3_changes(db_) == 0)
    return {StatusCode::kNotFound, "no batch '" + std::string(id) + "'"};
  return Status();
}

Status Store::set_status(std::string_view id, BatchStatus status, int64_t at,
                         std::optional<std::string> errors_json) {
  std::lock_guard lock(mu_);
  const std::string stamp = std::string(batch_status_name(status)) + "_at";
  std::string sql = "UPDATE batches SET status = ?";
  if (status != BatchStatus::kValidating) sql += ", " + stamp + " = ?";
  if (errors_json) sql += ", errors_json = ?";
  Statement s(db_, sql + " WHERE id = ?");
  int i = 1;
  s.bind(i++, batch_status_name(status));
  if (status != BatchStatus::kValidating) s.bind(i++, at);
  if (errors_json) s.bind(i++, *errors_json);
  s.bind(i, id).step();
  if (!s.ok())
    return {StatusCode::kInternal, "jobs database " + database_path(dir_) + ": " + s.error()};
  if (sqlite3_changes(db_) == 0)
    return {StatusCode::kNotFound, "no batch '" + std::string(id) + "'"};
  return Status();
}

Status Store::request_cancel(std::string_view id, int64_t at) {
  std::lock_guard lock(mu_);
  Statement s(db_,
              "UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ? AND status "
              "IN ('validating', 'in_progress')");
  s.bind(1, at).bind(2, id).step();
  if (!s.ok())
    return {StatusCode::kInternal, "jobs database " + database_path(dir_) + ": " + s.error()};
  if (sqlite3_changes(db_) > 0) return Status();
  Statement now(db_, "SELECT status FROM batches WHERE id = ?");
  if (!now.bind(1, id).step()) return {StatusCode::kNotFound, "no batch '" + std::string(id) + "'"};
  return {StatusCode::kFailedPrecondition, "batch '" + std::string(id) + "' is " + now.text(0) +
                                               ": only a validating or in_progress batch can be "
                                               "cancelled"};
}

Status Store::start_batch(std::string_view id, int64_t total, const std::string& output_file_id,
                          const std::string& error_file_id, int64_t at) {
  std::lock_guard lock(mu_);
  Statement s(db_,
              "UPDATE batches SET total = ?, output_file_id = ?, error_file_id = ?, status = CASE "
              "status WHEN 'cancelling' THEN status ELSE 'in_progress' END, in_progress_at = ? "
              "WHERE id = ?");
  s.bind(1, total).bind(2, output_file_id).bind(3, error_file_id).bind(4, at).bind(5, id).step();
  if (!s.ok())
    return {StatusCode::kInternal, "jobs database " + database_path(dir_) + ": " + s.error()};
  return Status();
}

Status Store::recover_files(const BatchRecord& batch) {
  const std::pair<const std::string*, int64_t> files[] = {
      {&batch.output_file_id, batch.output_bytes}, {&batch.error_file_id, batch.error_bytes}};
  for (const auto& [id, committed] : files) {
    if (id->empty()) continue;
    const auto path = file_path(*id);
    if (!path) return {StatusCode::kInternal, "batch " + batch.id + ": bad file id '" + *id + "'"};
    const int fd = ::open(path->c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      const std::string err = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return {StatusCode::kInternal, "batch " + batch.id + ": " + path->string() + ": " + err};
    }
    std::string problem;
    if (st.st_size < committed) {
      problem = "holds " + std::to_string(st.st_size) + " bytes, fewer than the " +
                std::to_string(committed) + " committed: the disk lost data";
    } else if (st.st_size > committed && (::ftruncate(fd, committed) != 0 || ::fsync(fd) != 0)) {
      problem = std::string("cannot cut it back to its committed length: ") + std::strerror(errno);
    }
    ::close(fd);
    if (!problem.empty())
      return {StatusCode::kInternal, "batch " + batch.id + ": " + path->string() + " " + problem};
  }
  return Status();
}

}  // namespace fastformer::jobs
