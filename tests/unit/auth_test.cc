// Bearer-token authentication (server/serving/auth.h): token-file parsing, the constant-time
// comparison, the Bearer header, the per-call decision, and reloading.
#include "server/serving/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fastformer::serving {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(TokenFile, OneTokenPerLineTrimmedSkippingBlankAndCommentLines) {
  EXPECT_THAT(parse_token_file("alpha\n\n  # a comment\n\tbeta  \r\n#gamma\n   \ndelta"),
              ElementsAre("alpha", "beta", "delta"));
  EXPECT_THAT(parse_token_file(""), IsEmpty());
  EXPECT_THAT(parse_token_file("\n\n# only comments\n"), IsEmpty());
  EXPECT_THAT(parse_token_file("a#b\n"),
              ElementsAre("a#b"));  // '#' starts a comment only at line start
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents)
      : path_(std::filesystem::temp_directory_path() /
              ("fastformer_auth_test_" + std::to_string(getpid()) + "_" +
               std::to_string(counter_++))) {
    write(contents);
  }
  ~TempFile() { std::filesystem::remove(path_); }
  void write(const std::string& contents) { std::ofstream(path_, std::ios::binary) << contents; }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(TokenFile, ReadErrorsNameTheFileButNeverItsContents) {
  TempFile empty("# no tokens here\n\n");
  try {
    read_token_file(empty.path());
    FAIL() << "a file without tokens was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(empty.path()));
    EXPECT_THAT(e.what(), HasSubstr("holds no token"));
    EXPECT_THAT(e.what(), Not(HasSubstr("no tokens here")));
  }
  EXPECT_THROW(read_token_file("/nonexistent/fastformer/tokens"), std::runtime_error);
  TempFile good("s3cret-token\n");
  EXPECT_THAT(read_token_file(good.path()), ElementsAre("s3cret-token"));
}

TEST(ConstantTimeEquals, EqualsExactlyWhenTheStringsAreEqual) {
  EXPECT_TRUE(constant_time_equals("", ""));
  EXPECT_TRUE(constant_time_equals("token", "token"));
  EXPECT_FALSE(constant_time_equals("token", "tokem"));
  EXPECT_FALSE(constant_time_equals("token", "Token"));
  EXPECT_FALSE(constant_time_equals("token", "token2"));  // a prefix is not a match
  EXPECT_FALSE(constant_time_equals("token2", "token"));
  EXPECT_FALSE(constant_time_equals("", "token"));
  EXPECT_FALSE(constant_time_equals("token", ""));
  // Bytes past the shorter string compare against 0: a NUL tail must still differ by length.
  EXPECT_FALSE(constant_time_equals(std::string_view("ab\0", 3), "ab"));
  const std::string high = "\xff\x80token";
  EXPECT_TRUE(constant_time_equals(high, std::string(high)));
}

TEST(BearerToken, TakesTheTokenAfterTheSchemeInAnyCase) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer abc"), "abc");
  EXPECT_EQ(bearer_token("BEARER   abc  "), "abc");
  EXPECT_EQ(bearer_token("Bearer\tabc"), "abc");
  EXPECT_EQ(bearer_token("Bearer"), "");
  EXPECT_EQ(bearer_token("Bearer "), "");
  EXPECT_EQ(bearer_token("Bearerabc"), "");
  EXPECT_EQ(bearer_token("Basic dXNlcjpwYXNz"), "");
  EXPECT_EQ(bearer_token("abc"), "");
}

TEST(HealthOrReflection, ByServicePath) {
  EXPECT_TRUE(is_health_or_reflection("/grpc.health.v1.Health/Check"));
  EXPECT_TRUE(is_health_or_reflection("/grpc.health.v1.Health/Watch"));
  EXPECT_TRUE(
      is_health_or_reflection("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"));
  EXPECT_TRUE(is_health_or_reflection("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"));
  EXPECT_FALSE(is_health_or_reflection("/fastformer.v1.Encoder/Encode"));
  EXPECT_FALSE(is_health_or_reflection("/grpc.health.v1.HealthX/Check"));
  EXPECT_FALSE(is_health_or_reflection(""));
}

class Authenticator : public ::testing::Test {
 protected:
  Status check(const TokenAuthenticator& auth, std::string_view path,
               std::vector<std::string_view> values) {
    return auth.check(path, values);
  }
  prometheus::Registry registry;
  AuthMetrics metrics{registry};
};

constexpr std::string_view kEncode = "/fastformer.v1.Encoder/Encode";
constexpr std::string_view kHealth = "/grpc.health.v1.Health/Check";

TEST_F(Authenticator, AcceptsAnyOfTheTokensAndRefusesTheRestUnauthenticated) {
  TokenAuthenticator auth({"first-token", "second-token"}, false, metrics);
  EXPECT_TRUE(check(auth, kEncode, {"Bearer first-token"}).ok());
  EXPECT_TRUE(check(auth, kEncode, {"Bearer second-token"}).ok());
  EXPECT_TRUE(check(auth, kEncode, {"Bearer wrong", "Bearer second-token"}).ok());

  const Status missing = check(auth, kEncode, {});
  EXPECT_EQ(missing.code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("missing bearer token"));
  EXPECT_EQ(check(auth, kEncode, {"Basic abc"}).code(), StatusCode::kUnauthenticated);

  const Status wrong = check(auth, kEncode, {"Bearer first-tokem"});
  EXPECT_EQ(wrong.code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), HasSubstr("invalid bearer token"));
  for (const Status& s : {missing, wrong}) {
    EXPECT_THAT(s.message(), Not(HasSubstr("first-tok")));
    EXPECT_THAT(s.message(), Not(HasSubstr("second-tok")));
  }
  EXPECT_EQ(metrics.missing_token.Value(), 2);
  EXPECT_EQ(metrics.invalid_token.Value(), 1);
}

TEST_F(Authenticator, HealthAndReflectionOpenUnlessProtected) {
  TokenAuthenticator open({"t"}, false, metrics);
  EXPECT_TRUE(check(open, kHealth, {}).ok());
  EXPECT_TRUE(
      check(open, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {}).ok());
  EXPECT_FALSE(check(open, "/fastformer.v1.Encoder/GetModelInfo", {}).ok());
  EXPECT_FALSE(check(open, "/unknown.Service/Method", {}).ok());

  TokenAuthenticator closed({"t"}, true, metrics);
  EXPECT_EQ(check(closed, kHealth, {}).code(), StatusCode::kUnauthenticated);
  EXPECT_TRUE(check(closed, kHealth, {"Bearer t"}).ok());
}

TEST_F(Authenticator, ReloadReplacesTheTokensOrKeepsTheOldOnesOnError) {
  TempFile file("old-token\n");
  TokenAuthenticator auth(read_token_file(file.path()), false, metrics);
  file.write("# rotated\nnew-token\nother-token\n");
  EXPECT_TRUE(auth.reload(file.path()));
  EXPECT_EQ(auth.token_count(), 2u);
  EXPECT_FALSE(check(auth, kEncode, {"Bearer old-token"}).ok());
  EXPECT_TRUE(check(auth, kEncode, {"Bearer new-token"}).ok());

  file.write("\n# emptied by mistake\n");
  EXPECT_FALSE(auth.reload(file.path()));
  EXPECT_FALSE(auth.reload("/nonexistent/fastformer/tokens"));
  EXPECT_EQ(auth.token_count(), 2u);
  EXPECT_TRUE(check(auth, kEncode, {"Bearer new-token"}).ok());
}

// gRPC calls check() on its threads while SIGHUP reloads on the main thread (run under TSan
// by make test-tsan): every check sees either the old or the new tokens, whole.
TEST_F(Authenticator, ChecksRaceReloadsSafely) {
  TempFile file("token-a\n");
  TokenAuthenticator auth(read_token_file(file.path()), false, metrics);
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::off);  // thousands of refusals, each a log line
  std::atomic<bool> stop{false};
  std::atomic<int> neither{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      while (!stop.load()) {
        const bool a = check(auth, kEncode, {"Bearer token-a"}).ok();
        const bool b = check(auth, kEncode, {"Bearer token-b"}).ok();
        if (!a && !b && !check(auth, kEncode, {"Bearer token-a", "Bearer token-b"}).ok()) {
          neither.fetch_add(1);
        }
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
    file.write(i % 2 ? "token-a\n" : "token-b\n");
    auth.reload(file.path());
  }
  stop.store(true);
  for (std::thread& t : callers) t.join();
  spdlog::set_level(level);
  EXPECT_EQ(neither.load(), 0) << "a check saw no token at all";
}

}  // namespace
}  // namespace fastformer::serving
