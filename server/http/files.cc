// OpenAI's Files API, the part a batch needs (issue 50), over the jobs store (server/jobs):
//   POST   /v1/files               multipart/form-data: file, purpose=batch, expires_after[...]
//   GET    /v1/files               the list (after, limit, order, purpose)
//   GET    /v1/files/{id}          one file object
//   GET    /v1/files/{id}/content  its bytes, streamed from disk
//   DELETE /v1/files/{id}
// An upload streams to disk under --jobs-max-file-bytes (never held in memory), is checked to be
// JSON lines, fsynced and renamed into place, and only then recorded: a crash leaves no record
// of a partial file. Files are server-wide: whoever holds the token sees them all.
#include <fcntl.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>

#include "server/http/api.h"
#include "server/http/multipart.h"

namespace fastformer::http {
namespace {

namespace fs = std::filesystem;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void write_file_object(json::Writer& w, const jobs::FileRecord& f) {
  w.raw("{\"object\":\"file\",\"id\":").string(f.id);
  w.raw(",\"bytes\":").number(f.bytes).raw(",\"created_at\":").number(f.created_at);
  w.raw(",\"expires_at\":");
  if (f.expires_at > 0) {
    w.number(f.expires_at);
  } else {
    w.raw("null");
  }
  w.raw(",\"filename\":").string(f.filename).raw(",\"purpose\":").string(f.purpose);
  w.raw(",\"status\":").string(f.status).raw(",\"status_details\":null}");
}

// Why the file at `path` is not JSON lines (each line that is not blank a JSON object), or
// nothing.
std::optional<std::string> not_json_lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  simdjson::dom::parser parser;
  std::string line;
  int64_t number = 0, requests = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++requests;
    simdjson::dom::element e;
    if (parser.parse(line).get(e) != simdjson::SUCCESS || !e.is_object()) {
      return "file: line " + std::to_string(number) +
             " is not a JSON object (a batch's input file is JSON lines, one request a line)";
    }
  }
  if (requests == 0) return std::string("file: has no lines (a batch's input file is JSON lines)");
  return std::nullopt;
}

// One upload in flight: the multipart body parsed as it streams, the file part written to
// files/<id>.upload, the small fields kept.
class FileUpload final : public BodySink {
 public:
  FileUpload(jobs::Store& store, const FilesOptions& options, const std::string& boundary)
      : store_(store),
        options_(options),
        id_(jobs::Store::new_id("file-")),
        parser_(boundary, callbacks()) {}
  ~FileUpload() override { abandon(); }

  std::optional<Response> feed(std::string_view bytes) override {
    if (auto error = parser_.feed(bytes)) return refuse(*error);
    return std::nullopt;
  }

  Response finish() override {
    if (auto error = parser_.finish()) return refuse(*error);
    if (!seen_purpose_) return refuse("purpose: is required (send purpose=batch)", "purpose");
    if (purpose_ != "batch") {
      return refuse("purpose: '" + purpose_ +
                        "' is not served here: only 'batch' (the Batch API's input files)",
                    "purpose");
    }
    if (fd_ < 0 && !written_) return refuse("file: is required (the file part)", "file");
    if (::fsync(fd_) != 0) return server_error("cannot sync the upload");
    ::close(fd_);
    fd_ = -1;
    int64_t expires = options_.ttl_seconds;
    if (!anchor_.empty() || !seconds_.empty()) {
      int64_t s = 0;
      const auto [end, ec] = std::from_chars(seconds_.data(), seconds_.data() + seconds_.size(), s);
      if (anchor_ != "created_at")
        return refuse("expires_after[anchor]: expected \"created_at\"", "expires_after");
      if (ec != std::errc() || end != seconds_.data() + seconds_.size() || s < 3600 ||
          s > 2592000) {
        return refuse(
            "expires_after[seconds]: expected 3600 to 2592000 (1 hour to 30 days), got '" +
                seconds_ + "'",
            "expires_after");
      }
      expires = s;
    }
    if (auto why = not_json_lines(temp_path())) return refuse(*why, "file");
    if (store_.stored_bytes() + bytes_ > options_.max_stored_bytes) {
      return refuse_status(bhttp::status::payload_too_large,
                           "the server's files would pass --jobs-max-stored-bytes " +
                               std::to_string(options_.max_stored_bytes) +
                               "; delete files (DELETE /v1/files/{id}) or raise it",
                           "file");
    }
    const fs::path final_path = *store_.file_path(id_);
    std::error_code ec;
    fs::rename(temp_path(), final_path, ec);
    if (ec) return server_error("cannot store the upload: " + ec.message());
    const int dir = ::open(final_path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);  // the rename survives a crash before the record does
      ::close(dir);
    }
    const int64_t now = unix_now();
    const jobs::FileRecord record{id_, filename_, "batch", bytes_, now, now + expires, "processed"};
    if (Status s = store_.add_file(record); !s.ok()) {
      fs::remove(final_path, ec);
      return server_error(s.message());
    }
    done_ = true;
    json::Writer w;
    write_file_object(w, record);
    return json_response(bhttp::status::ok, w.take());
  }

  void abandon() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!done_) {
      std::error_code ec;
      fs::remove(temp_path(), ec);
    }
  }

 private:
  multipart::Parser::Callbacks callbacks() {
    multipart::Parser::Callbacks c;
    c.on_part = [this](const multipart::PartHeaders& h) -> std::optional<std::string> {
      field_ = nullptr;
      in_file_ = false;
      if (h.name == "file") {
        if (written_ || fd_ >= 0) return std::string("file: sent twice");
        fd_ = ::open(temp_path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd_ < 0) return std::string("the upload cannot be stored: ") + std::strerror(errno);
        filename_ = h.filename.value_or("upload.jsonl");
        in_file_ = true;
        written_ = true;
      } else if (h.name == "purpose") {
        field_ = &purpose_;
        seen_purpose_ = true;
      } else if (h.name == "expires_after[anchor]") {
        field_ = &anchor_;
      } else if (h.name == "expires_after[seconds]") {
        field_ = &seconds_;
      }
      return std::nullopt;  // other fields are ignored
    };
    c.on_data = [this](std::string_view bytes) -> std::optional<std::string> {
      if (in_file_) {
        bytes_ += int64_t(bytes.size());
        if (bytes_ > options_.max_file_bytes) {
          too_large_ = true;
          return "file: over the limit of " + std::to_string(options_.max_file_bytes) +
                 " bytes (--jobs-max-file-bytes)";
        }
        while (!bytes.empty()) {
          const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return std::string("the upload cannot be stored: ") + std::strerror(errno);
          bytes.remove_prefix(size_t(n));
        }
      } else if (field_ != nullptr) {
        if (field_->size() + bytes.size() > 256)
          return std::string("a form field is over 256 bytes");
        field_->append(bytes);
      }
      return std::nullopt;
    };
    return c;
  }

  fs::path temp_path() const { return store_.dir() / "files" / (id_ + ".upload"); }

  Response refuse(const std::string& message, const std::string& param = "file") {
    return refuse_status(too_large_ ? bhttp::status::payload_too_large : bhttp::status::bad_request,
                         message, param);
  }
  Response refuse_status(bhttp::status status, const std::string& message,
                         const std::string& param) {
    abandon();
    return error_response(Api::kOpenAI, status, message, param);
  }
  Response server_error(const std::string& message) {
    abandon();
    return error_response(Api::kOpenAI, bhttp::status::internal_server_error, message);
  }

  jobs::Store& store_;
  const FilesOptions& options_;
  const std::string id_;
  multipart::Parser parser_;
  int fd_ = -1;
  bool written_ = false, in_file_ = false, seen_purpose_ = false, done_ = false, too_large_ = false;
  int64_t bytes_ = 0;
  std::string filename_, purpose_, anchor_, seconds_;
  std::string* field_ = nullptr;
};

}  // namespace

std::string query_param(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = std::min(rest.find('&'), rest.size());
    const std::string_view pair = rest.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name)
      return std::string(eq == std::string_view::npos ? "" : pair.substr(eq + 1));
    rest.remove_prefix(std::min(amp + 1, rest.size()));
  }
  return {};
}

Status query_limit(std::string_view target, int64_t fallback, int64_t max, int64_t* limit) {
  const std::string text = query_param(target, "limit");
  *limit = fallback;
  if (text.empty()) return Status();
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *limit);
  if (ec != std::errc() || end != text.data() + text.size() || *limit < 1 || *limit > max)
    return invalid_argument("limit: expected 1 to " + std::to_string(max) + ", got '" + text + "'");
  return Status();
}

Handler::Stream HttpApi::stream(const Request& header) {
  const std::string_view target = header.target();
  const std::string_view path = target.substr(0, target.find('?'));
  if (header.method() != bhttp::verb::post || path != "/v1/files" || options_.jobs == nullptr)
    return {};  // read whole: handle() answers it
  const auto start = batching::Clock::now();
  auto refused = [&](const Status& s, const std::string& param) {
    intake_.record("POST /v1/files", s, start);
    return Stream{nullptr, 0,
                  error_response(Api::kOpenAI, http_status(Api::kOpenAI, s), s.message(), param)};
  };
  if (Status s = authorize(header, path); !s.ok()) return refused(s, "");
  std::string why;
  const auto boundary = multipart::boundary_of(header[bhttp::field::content_type], &why);
  if (!boundary) return refused(invalid_argument("Content-Type: " + why), "file");
  intake_.record("POST /v1/files", Status(), start);
  return Stream{std::make_shared<FileUpload>(*options_.jobs, options_.files, *boundary),
                uint64_t(options_.files.max_file_bytes) + (64 << 10), std::nullopt};
}

bool HttpApi::files_enabled(Call& call) {
  if (options_.jobs != nullptr) return true;
  fail(call, {StatusCode::kUnimplemented,
              "the Files and Batch APIs are off: start the server with --jobs-dir"});
  return false;
}

void HttpApi::files_list(const Request& request, Call call) {
  if (!files_enabled(call)) return;
  const std::string after = query_param(request.target(), "after");
  const std::string order = query_param(request.target(), "order");
  const std::string purpose = query_param(request.target(), "purpose");
  int64_t limit = 0;
  if (Status s = query_limit(request.target(), 10000, 10000, &limit); !s.ok())
    return fail(call, s, "limit");
  if (!order.empty() && order != "asc" && order != "desc")
    return fail(call, invalid_argument("order: expected asc or desc, got '" + order + "'"),
                "order");
  std::vector<jobs::FileRecord> all = options_.jobs->files("", INT64_MAX);
  if (order != "asc") std::reverse(all.begin(), all.end());  // OpenAI's default: newest first
  if (!purpose.empty()) {
    std::erase_if(all, [&](const jobs::FileRecord& f) { return f.purpose != purpose; });
  }
  size_t from = 0;
  if (!after.empty()) {
    const auto it = std::find_if(all.begin(), all.end(),
                                 [&](const jobs::FileRecord& f) { return f.id == after; });
    from = it == all.end() ? all.size() : size_t(it - all.begin()) + 1;
  }
  const size_t to = std::min(all.size(), from + size_t(limit));
  json::Writer w;
  write_list(w, std::span<const jobs::FileRecord>(all).subspan(from, to - from), to < all.size(),
             write_file_object);
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

std::optional<jobs::FileRecord> HttpApi::find_file(Call& call, const std::string& id) {
  if (!files_enabled(call)) return std::nullopt;
  std::optional<jobs::FileRecord> f = options_.jobs->file(id);
  if (!f) fail(call, {StatusCode::kNotFound, "No such File object: " + id}, "id");
  return f;
}

void HttpApi::files_get(Call call, const std::string& id) {
  const auto f = find_file(call, id);
  if (!f) return;
  json::Writer w;
  write_file_object(w, *f);
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::files_content(Call call, const std::string& id) {
  const auto f = find_file(call, id);
  if (!f) return;
  Response head{bhttp::status::ok, 11};
  head.set(bhttp::field::content_type, "application/octet-stream");
  head.set(bhttp::field::content_disposition, "attachment; filename=\"" + f->id + ".jsonl\"");
  intake_.record(call.method, Status(), call.start);
  call.responder->send_file(std::move(head), options_.jobs->file_path(f->id)->string());
}

void HttpApi::files_delete(Call call, const std::string& id) {
  if (!find_file(call, id)) return;
  options_.jobs->delete_file(id);
  json::Writer w;
  w.raw("{\"id\":").string(id).raw(",\"object\":\"file\",\"deleted\":true}");
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

}  // namespace fastformer::http
