// Bearer-token authentication of gRPC calls (--auth-token-file, --auth-health).
//
// A call is let in when one of its `authorization` metadata values is `Bearer <token>` with a
// token of the token file; else it gets UNAUTHENTICATED before any handler sees it. Health and
// reflection are let in without a token unless --auth-health. The check runs in gRPC's server
// auth filter (server_credentials.h installs it); this file holds the decision, which knows
// nothing of gRPC's plumbing, so it is unit-tested on its own.
//
// Tokens never leave this file: not in a log line, not in a status message, not in a metric.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fastformer::serving {

// The tokens of a token file: one per line, surrounding whitespace trimmed; blank lines and
// lines starting with '#' are ignored.
std::vector<std::string> parse_token_file(std::string_view contents);

// Reads and parses the token file at `path`. Throws std::runtime_error, naming the file but
// never its contents, when it cannot be read, is over 1 MiB, or holds no token.
std::vector<std::string> read_token_file(const std::string& path);

// a == b, in a time that depends on the lengths only, never on where the strings differ.
bool constant_time_equals(std::string_view a, std::string_view b);

// The token of an `authorization` value "Bearer <token>" (the scheme in any case, RFC 7235);
// empty when the value is not a bearer credential.
std::string_view bearer_token(std::string_view authorization);

// grpc.health.v1.Health and grpc.reflection.*.ServerReflection calls, by their :path.
bool is_health_or_reflection(std::string_view path);

// fastformer_auth_failures_total{reason="missing"|"invalid"}: registered at start-up whether
// or not tokens are required, so the series exist before the first failure.
struct AuthMetrics {
  explicit AuthMetrics(prometheus::Registry& registry);
  prometheus::Family<prometheus::Counter>& family;  // declared first: the counters live in it
  prometheus::Counter& missing_token;
  prometheus::Counter& invalid_token;
};

class TokenAuthenticator {
 public:
  // `tokens` must not be empty. protect_health: health and reflection need a token too.
  TokenAuthenticator(std::vector<std::string> tokens, bool protect_health, AuthMetrics& metrics);

  // The decision for one call, from its :path and its `authorization` values: OK, or
  // UNAUTHENTICATED with a message that names neither the presented nor a stored token.
  // Every stored token is compared, so the time does not say which one (if any) matched.
  // Thread-safe; called on gRPC's threads.
  Status check(std::string_view path, std::span<const std::string_view> authorization) const {
    return check(path, is_health_or_reflection(path), authorization);
  }
  // The same for any transport: `open` says the path is a health check (let in without a
  // token unless protect_health). HTTP's health routes pass true.
  Status check(std::string_view path, bool open,
               std::span<const std::string_view> authorization) const;

  // Re-reads the token file (SIGHUP). On success the new tokens replace the old ones at once;
  // when the file cannot be read or holds no token, the old tokens stay. Logs the outcome
  // and the number of tokens, never a token. Returns whether the tokens were replaced.
  bool reload(const std::string& path);

  size_t token_count() const;
  bool protects_health() const { return protect_health_; }

 private:
  std::shared_ptr<const std::vector<std::string>> tokens() const;

  mutable std::mutex mutex_;  // guards tokens_ (the pointer; the vector is immutable)
  std::shared_ptr<const std::vector<std::string>> tokens_;
  const bool protect_health_;
  AuthMetrics& metrics_;
};

}  // namespace fastformer::serving
