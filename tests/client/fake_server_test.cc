// fastformer::Client against an in-process Encoder whose answers a test scripts: retries
// (which codes, how many attempts, the deadline over all of them, asynchronous ones), the
// bearer token, cancellation when the Client goes, TLS and mutual TLS. Also the backoff rule
// and the retry timer on their own.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "client/src/retry.h"
#include "fastformer/client.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

using namespace std::chrono_literals;
using Code = grpc::StatusCode;

// Answers call n with script[n] (OK past its end): one Encoding per sequence when OK.
class FakeEncoder final : public v1::Encoder::CallbackService {
 public:
  std::vector<Code> script;
  bool hold = false;  ///< leave calls unanswered until release()
  std::atomic<int> calls{0};

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override {
    const size_t n = size_t(calls++);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::lock_guard lock(mu_);
    const auto& metadata = context->client_metadata();
    const auto it = metadata.find("authorization");
    authorization_.emplace_back(
        it == metadata.end() ? "" : std::string(it->second.data(), it->second.size()));
    if (hold) {
      held_.push_back(reactor);
      return reactor;
    }
    const Code code = n < script.size() ? script[n] : Code::OK;
    if (code == Code::OK) {
      response->set_request_id(request->request_id());
      for (const auto& seq : request->sequences()) {
        response->add_encodings()->set_num_tokens(uint32_t(seq.token_ids_size()));
      }
    }
    reactor->Finish(grpc::Status(code, "scripted answer " + std::to_string(n)));
    return reactor;
  }

  void release() {
    std::lock_guard lock(mu_);
    for (auto* reactor : held_) reactor->Finish(grpc::Status(Code::UNAVAILABLE, "released"));
    held_.clear();
  }

  std::vector<std::string> authorization() {
    std::lock_guard lock(mu_);
    return authorization_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> authorization_;
  std::vector<grpc::ServerUnaryReactor*> held_;
};

class FakeServer {
 public:
  explicit FakeServer(
      std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials()) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port_);
    builder.RegisterService(&service);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() {
    service.release();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

  FakeEncoder service;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

ClientOptions options_for(const FakeServer& server) {
  ClientOptions o;
  o.target = server.target();
  o.deadline = 10s;
  o.retry.initial_backoff = 1ms;
  o.retry.max_backoff = 5ms;
  return o;
}

// EncodeAsync, waited for (at most 10 s: DEADLINE_EXCEEDED "no callback" after that).
grpc::Status encode_async(Client& client, v1::EncodeRequest request) {
  auto done = std::make_shared<std::promise<grpc::Status>>();
  auto future = done->get_future();
  client.EncodeAsync(std::move(request),
                     [done](grpc::Status s, v1::EncodeResponse) { done->set_value(std::move(s)); });
  if (future.wait_for(10s) != std::future_status::ready)
    return {Code::DEADLINE_EXCEEDED, "no callback"};
  return future.get();
}

TEST(ClientRetry, OffByDefault) {
  FakeServer server;
  server.service.script = {Code::UNAVAILABLE};
  Client client(options_for(server));
  v1::EncodeResponse response;
  EXPECT_EQ(client.Encode({{1, 2}}, &response).error_code(), Code::UNAVAILABLE);
  EXPECT_EQ(server.service.calls.load(), 1);
}

TEST(ClientRetry, RetriesUnavailableAndResourceExhaustedUntilSuccess) {
  FakeServer server;
  server.service.script = {Code::UNAVAILABLE, Code::RESOURCE_EXHAUSTED};
  ClientOptions o = options_for(server);
  o.retry.max_attempts = 5;
  std::vector<RetryEvent> events;
  o.on_retry = [&](const RetryEvent& e) { events.push_back(e); };
  Client client(o);
  v1::EncodeResponse response;
  const grpc::Status status = client.Encode({{1, 2, 3}}, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.encodings(0).num_tokens(), 3u);
  EXPECT_EQ(server.service.calls.load(), 3);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].attempt, 1);
  EXPECT_EQ(events[0].status.error_code(), Code::UNAVAILABLE);
  EXPECT_EQ(events[1].attempt, 2);
  EXPECT_EQ(events[1].status.error_code(), Code::RESOURCE_EXHAUSTED);
}

TEST(ClientRetry, OtherCodesAreFinal) {
  for (Code code : {Code::INVALID_ARGUMENT, Code::INTERNAL, Code::DEADLINE_EXCEEDED}) {
    FakeServer server;
    server.service.script = {code};
    ClientOptions o = options_for(server);
    o.retry.max_attempts = 5;
    Client client(o);
    v1::EncodeResponse response;
    EXPECT_EQ(client.Encode({{1}}, &response).error_code(), code);
    EXPECT_EQ(server.service.calls.load(), 1) << status_code_name(code);
  }
}

TEST(ClientRetry, GivesUpAfterMaxAttempts) {
  FakeServer server;
  server.service.script = std::vector<Code>(10, Code::RESOURCE_EXHAUSTED);
  ClientOptions o = options_for(server);
  o.retry.max_attempts = 3;
  Client client(o);
  v1::EncodeResponse response;
  const grpc::Status status = client.Encode({{1}}, &response);
  EXPECT_EQ(status.error_code(), Code::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "scripted answer 2");
  EXPECT_EQ(server.service.calls.load(), 3);
}

TEST(ClientRetry, TheDeadlineCoversEveryAttemptAndWait) {
  FakeServer server;
  server.service.script = std::vector<Code>(100, Code::UNAVAILABLE);
  ClientOptions o = options_for(server);
  o.retry.max_attempts = 100;
  o.retry.initial_backoff = 40ms;
  o.retry.max_backoff = 40ms;
  o.retry.jitter = 0;
  Client client(o);
  v1::EncodeResponse response;
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = client.Encode({{1}}, &response, {}, 150ms);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  // Waits of 40 ms fit three times in 150 ms; the client stops before one would end past it.
  EXPECT_EQ(status.error_code(), Code::UNAVAILABLE);
  EXPECT_GE(server.service.calls.load(), 2);
  EXPECT_LE(server.service.calls.load(), 4);
  EXPECT_LT(elapsed, 150ms);
}

TEST(ClientRetry, AsyncCallsRetryToo) {
  FakeServer server;
  server.service.script = {Code::UNAVAILABLE, Code::UNAVAILABLE};
  ClientOptions o = options_for(server);
  o.retry.max_attempts = 3;
  Client client(o);
  const grpc::Status status = encode_async(client, Client::MakeRequest({{4, 5}}));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(server.service.calls.load(), 3);
}

TEST(ClientRetry, AsyncCallsGiveUpWithTheLastStatus) {
  FakeServer server;
  server.service.script = std::vector<Code>(5, Code::RESOURCE_EXHAUSTED);
  ClientOptions o = options_for(server);
  o.retry.max_attempts = 2;
  Client client(o);
  const grpc::Status status = encode_async(client, Client::MakeRequest({{4, 5}}));
  EXPECT_EQ(status.error_code(), Code::RESOURCE_EXHAUSTED);
  EXPECT_EQ(server.service.calls.load(), 2);
}

TEST(ClientMetadata, BearerTokenGoesInTheAuthorizationHeader) {
  FakeServer server;
  ClientOptions o = options_for(server);
  o.bearer_token = "s3cr3t";
  Client client(o);
  v1::EncodeResponse response;
  ASSERT_TRUE(client.Encode({{1}}, &response).ok());
  ASSERT_TRUE(encode_async(client, Client::MakeRequest({{1}})).ok());
  EXPECT_EQ(server.service.authorization(),
            (std::vector<std::string>{"Bearer s3cr3t", "Bearer s3cr3t"}));

  Client anonymous(options_for(server));
  ASSERT_TRUE(anonymous.Encode({{1}}, &response).ok());
  EXPECT_EQ(server.service.authorization().back(), "");
}

TEST(ClientLifetime, DestroyingTheClientCancelsCallsInFlight) {
  FakeServer server;
  server.service.hold = true;
  std::promise<grpc::Status> done;
  {
    Client client(options_for(server));
    client.EncodeAsync(Client::MakeRequest({{1}}),
                       [&](grpc::Status s, v1::EncodeResponse) { done.set_value(std::move(s)); });
    while (server.service.calls.load() == 0) std::this_thread::sleep_for(1ms);  // the call is held
  }  // returns only after the callback ran
  auto future = done.get_future();
  ASSERT_EQ(future.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(future.get().error_code(), Code::CANCELLED);
}

TEST(ClientLifetime, DestroyingTheClientEndsRetryWaits) {
  FakeServer server;
  server.service.script = std::vector<Code>(5, Code::UNAVAILABLE);
  std::promise<grpc::Status> done;
  ClientOptions o = options_for(server);
  o.retry.max_attempts = 5;
  o.deadline = Milliseconds(0);   // none: the wait must fit before it
  o.retry.initial_backoff = 10s;  // the test would take that long if the wait ran its course
  o.retry.max_backoff = 10s;
  o.retry.jitter = 0;
  std::atomic<bool> waiting{false};
  o.on_retry = [&](const RetryEvent&) { waiting = true; };
  const auto start = std::chrono::steady_clock::now();
  {
    Client client(o);
    client.EncodeAsync(Client::MakeRequest({{1}}),
                       [&](grpc::Status s, v1::EncodeResponse) { done.set_value(std::move(s)); });
    while (!waiting && std::chrono::steady_clock::now() - start < 5s)
      std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(waiting) << "no retry was scheduled";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(done.get_future().get().error_code(), Code::UNAVAILABLE);  // the last attempt's
  EXPECT_EQ(server.service.calls.load(), 1);
}

// ---- TLS ---------------------------------------------------------------------------------

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A self-signed EC certificate for `name` (DNS name localhost); false without openssl.
bool make_certificate(const std::filesystem::path& dir, const std::string& name) {
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost -keyout " +
      (dir / (name + ".key")).string() + " -out " + (dir / (name + ".crt")).string() +
      " >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

TEST(ClientTls, MutualTlsWithFilesAndOverriddenServerName) {
  test::TempDir dir;
  if (!make_certificate(dir.path(), "server") || !make_certificate(dir.path(), "client")) {
    GTEST_SKIP() << "openssl cannot make test certificates here";
  }
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = read_file(dir / "client.crt");
  ssl.pem_key_cert_pairs.push_back({read_file(dir / "server.key"), read_file(dir / "server.crt")});
  FakeServer server(grpc::SslServerCredentials(ssl));

  ClientOptions o = options_for(server);
  o.deadline = 5s;
  o.tls.root_certs_file = (dir / "server.crt").string();
  o.tls.cert_chain_file = (dir / "client.crt").string();
  o.tls.private_key_file = (dir / "client.key").string();
  o.tls.server_name_override = "localhost";
  Client client(o);
  v1::EncodeResponse response;
  const grpc::Status status = client.Encode({{1, 2}}, &response);
  EXPECT_TRUE(status.ok()) << status_code_name(status.error_code()) << ": "
                           << status.error_message();

  ClientOptions no_client_cert = o;  // PEM contents instead of files, but no client certificate
  no_client_cert.tls = {};
  no_client_cert.tls.root_certs_pem = read_file(dir / "server.crt");
  no_client_cert.tls.server_name_override = "localhost";
  Client refused(no_client_cert);
  EXPECT_EQ(refused.Encode({{1}}, &response).error_code(), Code::UNAVAILABLE);

  ClientOptions plaintext = options_for(server);
  plaintext.deadline = 5s;
  Client plain(plaintext);
  EXPECT_EQ(plain.Encode({{1}}, &response).error_code(), Code::UNAVAILABLE);
  EXPECT_EQ(server.service.calls.load(), 1);
}

TEST(ClientTls, UnreadableFilesAreReportedAtConstruction) {
  ClientOptions o;
  o.tls.root_certs_file = "/nonexistent/ca.pem";
  EXPECT_THROW(Client client(o), std::runtime_error);
  ClientOptions half;
  half.tls.cert_chain_pem = "-----BEGIN CERTIFICATE-----";
  EXPECT_THROW(Client client(half), std::runtime_error);  // a certificate without its key
}

// ---- the backoff rule and the retry timer ------------------------------------------------

TEST(Backoff, GrowsByTheMultiplierUpToTheCap) {
  RetryPolicy policy;
  policy.initial_backoff = 100ms;
  policy.multiplier = 2;
  policy.max_backoff = 1000ms;
  policy.jitter = 0;
  const Milliseconds want[] = {100ms, 200ms, 400ms, 800ms, 1000ms, 1000ms};
  for (int attempt = 1; attempt <= 6; ++attempt) {
    EXPECT_EQ(internal::backoff_delay(policy, attempt), want[attempt - 1]) << attempt;
  }
}

TEST(Backoff, JitterStaysWithinItsFraction) {
  RetryPolicy policy;
  policy.initial_backoff = 1000ms;
  policy.jitter = 0.25;
  Milliseconds lo = 10s, hi = 0ms;
  for (int i = 0; i < 2000; ++i) {
    const Milliseconds d = internal::backoff_delay(policy, 1);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_GE(lo, 750ms);
  EXPECT_LE(hi, 1250ms);
  EXPECT_LT(lo, 800ms) << "jitter should spread the waits";
  EXPECT_GT(hi, 1200ms) << "jitter should spread the waits";
}

TEST(Backoff, OnlyRetryableCodesWithAttemptsAndTimeLeft) {
  RetryPolicy policy;
  policy.max_attempts = 3;
  const grpc::Status unavailable(Code::UNAVAILABLE, "");
  EXPECT_TRUE(internal::should_retry(policy, 1, unavailable, 10ms, std::nullopt));
  EXPECT_TRUE(
      internal::should_retry(policy, 2, {Code::RESOURCE_EXHAUSTED, ""}, 10ms, std::nullopt));
  EXPECT_FALSE(internal::should_retry(policy, 3, unavailable, 10ms, std::nullopt));
  EXPECT_FALSE(internal::should_retry(policy, 1, {Code::INVALID_ARGUMENT, ""}, 10ms, std::nullopt));
  EXPECT_FALSE(internal::should_retry(policy, 1, grpc::Status::OK, 10ms, std::nullopt));
  const auto soon = std::chrono::system_clock::now() + 50ms;
  EXPECT_TRUE(internal::should_retry(policy, 1, unavailable, 10ms, soon));
  EXPECT_FALSE(internal::should_retry(policy, 1, unavailable, 100ms, soon));
}

TEST(DelayQueue, RunsTasksInTimeOrderAndTheRestAtStop) {
  internal::DelayQueue queue;
  std::mutex mu;
  std::vector<std::pair<int, bool>> ran;
  const auto now = std::chrono::steady_clock::now();
  const auto task = [&](int id) {
    return [&, id](bool on_time) {
      std::lock_guard lock(mu);
      ran.emplace_back(id, on_time);
    };
  };
  queue.post(now + 30ms, task(2));
  queue.post(now + 10ms, task(1));
  queue.post(now + 60s, task(3));
  std::this_thread::sleep_for(100ms);
  queue.stop();
  queue.post(now, task(4));  // after stop: at once, on this thread, not on time
  EXPECT_EQ(ran, (std::vector<std::pair<int, bool>>{{1, true}, {2, true}, {3, false}, {4, false}}));
}

TEST(StatusNames, AreTheCodeNames) {
  EXPECT_EQ(status_code_name(Code::OK), "OK");
  EXPECT_EQ(status_code_name(Code::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(status_code_name(Code::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  EXPECT_STREQ(health_status_name(HealthStatus::kNotServing), "NOT_SERVING");
  EXPECT_TRUE(is_retryable(Code::UNAVAILABLE));
  EXPECT_FALSE(is_retryable(Code::INTERNAL));
}

}  // namespace
}  // namespace fastformer
