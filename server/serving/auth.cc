#include "server/serving/auth.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fastformer::serving {
namespace {

constexpr size_t kMaxTokenFileBytes = 1 << 20;

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The messages a refused caller reads: what to send, never what was sent.
const Status kMissingToken(
    StatusCode::kUnauthenticated,
    "missing bearer token: send the metadata `authorization: Bearer <token>`");
const Status kInvalidToken(StatusCode::kUnauthenticated,
                           "invalid bearer token: the token is not one the server accepts");

// The :path as it may appear in a log line: printable ASCII only, at most 200 characters
// (it comes from the caller).
std::string loggable_path(std::string_view path) {
  std::string out(path.substr(0, 200));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  if (path.size() > 200) out += "...";
  return out;
}

}  // namespace

std::vector<std::string> parse_token_file(std::string_view contents) {
  std::vector<std::string> tokens;
  while (!contents.empty()) {
    const size_t end = contents.find('\n');
    const std::string_view line = trim(contents.substr(0, end));
    contents.remove_prefix(end == std::string_view::npos ? contents.size() : end + 1);
    if (line.empty() || line.front() == '#') continue;
    tokens.emplace_back(line);
  }
  return tokens;
}

std::vector<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read the token file " + path + ": " + std::strerror(errno));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read the token file " + path + ": read error");
  const std::string text = contents.str();
  if (text.size() > kMaxTokenFileBytes) {
    throw std::runtime_error("the token file " + path + " is over 1 MiB (" +
                             std::to_string(text.size()) + " bytes); is it the right file?");
  }
  std::vector<std::string> tokens = parse_token_file(text);
  if (tokens.empty()) {
    throw std::runtime_error(
        "the token file " + path +
        " holds no token (one per line; blank lines and # comments are ignored)");
  }
  return tokens;
}

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Runs over the longer string whatever the contents, and accumulates the differences
  // instead of returning at the first one.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string_view bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  authorization = trim(authorization);
  if (authorization.size() <= kScheme.size() ||
      !equals_ignoring_case(authorization.substr(0, kScheme.size()), kScheme) ||
      (authorization[kScheme.size()] != ' ' && authorization[kScheme.size()] != '\t')) {
    return {};
  }
  return trim(authorization.substr(kScheme.size()));
}

bool is_health_or_reflection(std::string_view path) {
  for (std::string_view service :
       {"/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
        "/grpc.reflection.v1.ServerReflection/"}) {
    if (path.starts_with(service)) return true;
  }
  return false;
}

AuthMetrics::AuthMetrics(prometheus::Registry& registry)
    : family(prometheus::BuildCounter()
                 .Name("fastformer_auth_failures_total")
                 .Help("Calls refused UNAUTHENTICATED: reason missing (no bearer token) or invalid "
                       "(not accepted)")
                 .Register(registry)),
      missing_token(family.Add({{"reason", "missing"}})),
      invalid_token(family.Add({{"reason", "invalid"}})) {}

TokenAuthenticator::TokenAuthenticator(std::vector<std::string> tokens, bool protect_health,
                                       AuthMetrics& metrics)
    : tokens_(std::make_shared<const std::vector<std::string>>(std::move(tokens))),
      protect_health_(protect_health),
      metrics_(metrics) {
  if (tokens_->empty()) throw std::invalid_argument("TokenAuthenticator needs at least one token");
}

std::shared_ptr<const std::vector<std::string>> TokenAuthenticator::tokens() const {
  std::lock_guard lock(mutex_);
  return tokens_;
}

size_t TokenAuthenticator::token_count() const { return tokens()->size(); }

Status TokenAuthenticator::check(std::string_view path, bool open,
                                 std::span<const std::string_view> authorization) const {
  if (!protect_health_ && open) return Status();
  const auto tokens = this->tokens();
  bool presented = false;
  bool accepted = false;
  for (std::string_view value : authorization) {
    const std::string_view token = bearer_token(value);
    if (token.empty()) continue;
    presented = true;
    for (const std::string& stored : *tokens) accepted |= constant_time_equals(token, stored);
  }
  if (accepted) return Status();
  const Status& refusal = presented ? kInvalidToken : kMissingToken;
  (presented ? metrics_.invalid_token : metrics_.missing_token).Increment();
  spdlog::warn("{} refused: UNAUTHENTICATED: {}", loggable_path(path), refusal.message());
  return refusal;
}

bool TokenAuthenticator::reload(const std::string& path) {
  std::vector<std::string> tokens;
  try {
    tokens = read_token_file(path);
  } catch (const std::exception& e) {
    spdlog::error("SIGHUP: {}; keeping the {} tokens loaded before", e.what(), token_count());
    return false;
  }
  const size_t count = tokens.size();
  {
    std::lock_guard lock(mutex_);
    tokens_ = std::make_shared<const std::vector<std::string>>(std::move(tokens));
  }
  spdlog::info("SIGHUP: {} bearer tokens loaded from {}", count, path);
  return true;
}

}  // namespace fastformer::serving
