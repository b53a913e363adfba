// fastformer::Client against a real fastformer-server on loopback: unary, asynchronous and
// streaming calls, model info, health, deadlines, and retries that succeed once the server's
// queue has room again.
#include "fastformer/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/client/server_process.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

using namespace std::chrono_literals;
using test::ServerProcess;

// Heavy enough that a few thousand queued tokens take visible time on one thread.
test::TinyModelSpec model_spec() {
  test::TinyModelSpec spec;
  spec.hidden = 128;
  spec.heads = 4;
  spec.layers = 4;
  spec.intermediate = 512;
  spec.max_positions = 1024;
  spec.vocab = 1000;
  spec.num_labels = 3;
  spec.seed = 5;
  return spec;
}

// `n` token ids in [1, vocab), a pad (0) in the middle when n >= 3.
std::vector<int32_t> make_ids(int n, int salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = 1 + (i * 37 + salt * 101) % 999;
  if (n >= 3) ids[size_t(n / 2)] = 0;
  return ids;
}

// "s<i>" (appended: GCC 12 warns falsely on "s" + std::string).
std::string stream_id(int i) { return std::string("s").append(std::to_string(i)); }

// Waits for `n` callbacks.
class Countdown {
 public:
  explicit Countdown(int n) : left_(n) {}
  void done() {
    std::lock_guard lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  bool wait(std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

// A WordLevel tokenizer.json, the ids of a text worked out by hand: lower-case, split on
// \w+|[^\w\s]+, map through the vocabulary (unknown: [UNK] 1), wrap in [CLS] 2 ... [SEP] 3.
constexpr const char* kTokenizerJson = R"({
  "added_tokens": [
    {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "Lowercase"},
  "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
    "pair": [], "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                   "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
  "model": {"type": "WordLevel", "unk_token": "[UNK]", "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
    "the": 4, "quick": 5, "brown": 6, "fox": 7, "jumps": 8, "over": 9, "lazy": 10, "dog": 11, ".": 12}}
})";

// One server (and its model) per test suite.
class ServerSuite : public ::testing::Test {
 protected:
  // `tokenizer_json`, if given, is written to the model directory: the model takes text.
  static void start(const std::vector<std::string>& flags, const std::string& tokenizer_json = "") {
    dir_ = new test::TempDir();
    const auto model = test::write_tiny_model(dir_->path(), "model", model_spec());
    if (!tokenizer_json.empty()) std::ofstream(model / "tokenizer.json") << tokenizer_json;
    server_ = new ServerProcess(model, flags, dir_->path() / "server.log");
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::cerr << "server log:\n" << server_->log_tail();
  }
  static ClientOptions options() {
    ClientOptions o;
    o.target = server_->target();
    o.deadline = 30s;
    return o;
  }

  static inline test::TempDir* dir_ = nullptr;
  static inline ServerProcess* server_ = nullptr;
};

class ClientTest : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    start({"--max-batch-tokens", "1024", "--max-request-tokens", "8192"});
  }
};

TEST_F(ClientTest, UnaryEncodeAnswersEverySequenceInOrder) {
  Client client(options());
  EncodeOptions opts;
  opts.return_token_embeddings = true;
  opts.return_logits = true;
  opts.normalize = true;
  opts.request_id = "unary-1";
  v1::EncodeResponse response;
  const grpc::Status status = client.Encode({make_ids(5, 1), make_ids(9, 2)}, &response, opts);
  ASSERT_TRUE(status.ok()) << status_code_name(status.error_code()) << ": "
                           << status.error_message();
  EXPECT_EQ(response.request_id(), "unary-1");
  ASSERT_EQ(response.encodings_size(), 2);
  const int sizes[] = {5, 9};
  for (int i = 0; i < 2; ++i) {
    const v1::Encoding& e = response.encodings(i);
    EXPECT_EQ(e.num_tokens(), uint32_t(sizes[i]));
    ASSERT_EQ(e.embedding_size(), 128);
    EXPECT_EQ(e.token_embeddings_size(), sizes[i] * 128);
    EXPECT_EQ(e.logits_size(), 3);
    double norm = 0;
    for (float v : e.embedding()) norm += double(v) * v;
    EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);
  }
}

TEST_F(ClientTest, InvalidInputIsNotRetried) {
  ClientOptions o = options();
  o.retry.max_attempts = 5;
  int retries = 0;
  o.on_retry = [&](const RetryEvent&) { ++retries; };
  Client client(o);
  v1::EncodeResponse response;
  const grpc::Status status = client.Encode({{1, 5000, 2}}, &response);  // id beyond vocab 1000
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("sequence 0: token_ids"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(retries, 0);
}

TEST_F(ClientTest, GetModelInfoDescribesTheModel) {
  Client client(options());
  v1::ModelInfo info;
  ASSERT_TRUE(client.GetModelInfo(&info).ok());
  EXPECT_EQ(info.hidden_size(), 128u);
  EXPECT_EQ(info.num_hidden_layers(), 4u);
  EXPECT_EQ(info.max_position_embeddings(), 1024u);
  EXPECT_EQ(info.vocab_size(), 1000u);
  EXPECT_EQ(info.num_labels(), 3u);
  EXPECT_EQ(info.max_request_tokens(), 8192u);
  EXPECT_EQ(info.backend(), "cpu");
}

TEST_F(ClientTest, TextNeedsAModelWithATokenizer) {
  Client client(options());
  v1::EncodeResponse response;
  const grpc::Status status = client.EncodeTexts({"the quick fox"}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("sequence 0: text: this model takes no text"),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("tokenizer.json"), std::string::npos)
      << status.error_message();
  v1::ModelInfo info;
  ASSERT_TRUE(client.GetModelInfo(&info).ok());
  EXPECT_FALSE(info.accepts_text());
  EXPECT_EQ(info.tokenizer(), "");
}

TEST_F(ClientTest, HealthIsServing) {
  Client client(options());
  grpc::Status status;
  EXPECT_EQ(client.Health("", &status), HealthStatus::kServing);
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(client.Health("fastformer.v1.Encoder"), HealthStatus::kServing);
  // The standard health service answers NOT_FOUND for a service it does not know.
  EXPECT_EQ(client.Health("no.such.Service", &status), HealthStatus::kUnknown);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ClientTest, AsyncCallsRunConcurrentlyAndMatchBlockingOnes) {
  Client client(options());
  constexpr int kCalls = 16;
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<v1::EncodeResponse> responses(kCalls);
  Countdown countdown(kCalls);
  std::atomic<int> in_callbacks{0};
  for (int i = 0; i < kCalls; ++i) {
    EncodeOptions opts;
    opts.request_id = "async-" + std::to_string(i);
    client.EncodeAsync(Client::MakeRequest({make_ids(8 + i, i)}, opts),
                       [&, i](grpc::Status status, v1::EncodeResponse response) {
                         ++in_callbacks;
                         statuses[size_t(i)] = std::move(status);
                         responses[size_t(i)] = std::move(response);
                         countdown.done();
                       });
  }
  ASSERT_TRUE(countdown.wait(60s)) << "not every callback ran";
  EXPECT_EQ(in_callbacks.load(), kCalls);
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(statuses[size_t(i)].ok()) << i << ": " << statuses[size_t(i)].error_message();
    EXPECT_EQ(responses[size_t(i)].request_id(), "async-" + std::to_string(i));
    v1::EncodeResponse alone;
    ASSERT_TRUE(client.Encode({make_ids(8 + i, i)}, &alone).ok());
    ASSERT_EQ(responses[size_t(i)].encodings(0).embedding_size(),
              alone.encodings(0).embedding_size());
    for (int d = 0; d < alone.encodings(0).embedding_size(); ++d) {
      // Batched with other requests or alone: the same sequence, the same embedding (up to
      // rounding).
      EXPECT_NEAR(responses[size_t(i)].encodings(0).embedding(d), alone.encodings(0).embedding(d),
                  1e-5);
    }
  }
}

TEST_F(ClientTest, EncodeStreamAnswersEveryMessageWithErrorsInBand) {
  Client client(options());
  std::vector<v1::EncodeRequest> requests;
  for (int i = 0; i < 12; ++i) {
    EncodeOptions opts;
    opts.request_id = stream_id(i);
    requests.push_back(Client::MakeRequest({make_ids(4 + i, i)}, opts));
  }
  EncodeOptions bad;
  bad.request_id = "bad";
  requests.push_back(Client::MakeRequest({{1, 5000}}, bad));
  std::map<std::string, v1::EncodeResponse> answers;
  const grpc::Status status = client.EncodeStream(requests, [&](const v1::EncodeResponse& r) {
    answers[r.request_id()] = r;  // never called concurrently
  });
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(answers.size(), requests.size());
  for (int i = 0; i < 12; ++i) {
    const auto& answer = answers.at(stream_id(i));
    EXPECT_FALSE(answer.has_error());
    ASSERT_EQ(answer.encodings_size(), 1);
    EXPECT_EQ(answer.encodings(0).num_tokens(), uint32_t(4 + i));
  }
  EXPECT_EQ(answers.at("bad").error().code(), int(grpc::StatusCode::INVALID_ARGUMENT));
}

TEST_F(ClientTest, OpenStreamTakesWritesFromItsCallback) {
  Client client(options());
  constexpr int kMessages = 6;
  std::atomic<int> answered{0};
  std::unique_ptr<EncodeStreamCall> call;
  std::atomic<bool> ended{false};
  call = client.OpenEncodeStream(
      [&](const v1::EncodeResponse& r) {
        EXPECT_FALSE(r.has_error());
        if (++answered < kMessages) {
          EXPECT_TRUE(call->Write(Client::MakeRequest({make_ids(6, answered)})));
        }
      },
      std::nullopt, [&](const grpc::Status&) { ended = true; });
  ASSERT_TRUE(call->Write(Client::MakeRequest({make_ids(6, 0)})));
  while (answered < kMessages) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(ended.load());
  EXPECT_TRUE(call->Finish().ok());
  EXPECT_TRUE(ended.load());
  EXPECT_FALSE(call->Write(Client::MakeRequest({make_ids(6, 0)})));
}

TEST_F(ClientTest, DeadlineExpiresBehindABigQueuedRequest) {
  Client client(options());
  std::vector<std::vector<int32_t>> big;
  for (int i = 0; i < 8; ++i) big.push_back(make_ids(1024, i));
  Countdown big_done(1);
  grpc::Status big_status;
  client.EncodeAsync(Client::MakeRequest(big), [&](grpc::Status status, v1::EncodeResponse) {
    big_status = std::move(status);
    big_done.done();
  });
  std::this_thread::sleep_for(30ms);  // the big request is queued or computing
  v1::EncodeResponse response;
  const grpc::Status status = client.Encode({make_ids(8, 1)}, &response, {}, 1ms);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  ASSERT_TRUE(big_done.wait(60s));
  EXPECT_TRUE(big_status.ok()) << big_status.error_message();
}

// A small queue: a second big request is refused (RESOURCE_EXHAUSTED) until the first has
// left the queue.
class ClientRetryTest : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    start({"--max-batch-tokens", "256", "--max-queue-tokens", "8192", "--max-request-tokens",
           "8192"});
  }
  // 32 sequences of 256 tokens: the whole queue.
  static v1::EncodeRequest queue_filler(int salt) {
    std::vector<std::vector<int32_t>> seqs;
    for (int i = 0; i < 32; ++i) seqs.push_back(make_ids(256, salt + i));
    return Client::MakeRequest(seqs);
  }
  // Sends a queue filler and waits until the server has it.
  void fill_queue(Client& client) {
    client.EncodeAsync(queue_filler(0), [this](grpc::Status status, v1::EncodeResponse) {
      filler_status_ = std::move(status);
      filler_done_.done();
    });
    std::this_thread::sleep_for(50ms);
  }
  void expect_filler_ok() {
    ASSERT_TRUE(filler_done_.wait(60s));
    EXPECT_TRUE(filler_status_.ok()) << filler_status_.error_message();
  }
  static RetryPolicy patient() {
    RetryPolicy retry;
    retry.max_attempts = 200;
    retry.initial_backoff = 5ms;
    retry.max_backoff = 50ms;
    retry.multiplier = 2.0;
    retry.jitter = 0.2;
    return retry;
  }

  Countdown filler_done_{1};
  grpc::Status filler_status_;
};

TEST_F(ClientRetryTest, BlockingRetrySucceedsOnceCapacityFrees) {
  Client filler(options());
  fill_queue(filler);

  Client no_retry(options());
  v1::EncodeResponse response;
  EXPECT_EQ(no_retry.Encode(queue_filler(100), &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED)
      << "retry is off by default: the first refusal is final";

  ClientOptions o = options();
  o.retry = patient();
  std::vector<RetryEvent> events;
  o.on_retry = [&](const RetryEvent& e) { events.push_back(e); };
  Client client(o);
  const grpc::Status status = client.Encode(queue_filler(200), &response);
  ASSERT_TRUE(status.ok()) << status_code_name(status.error_code()) << ": "
                           << status.error_message();
  EXPECT_EQ(response.encodings_size(), 32);
  ASSERT_GE(events.size(), 1u) << "the request was admitted at once: no retry observed";
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_STREQ(events[i].method, "Encode");
    EXPECT_EQ(events[i].attempt, int(i) + 1);
    EXPECT_EQ(events[i].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_LE(events[i].backoff, 60ms);
  }
  expect_filler_ok();
}

TEST_F(ClientRetryTest, AsyncRetrySucceedsOnceCapacityFrees) {
  Client filler(options());
  fill_queue(filler);
  ClientOptions o = options();
  o.retry = patient();
  std::atomic<int> retries{0};
  o.on_retry = [&](const RetryEvent&) { ++retries; };
  Client client(o);
  Countdown done(1);
  grpc::Status status;
  v1::EncodeResponse response;
  client.EncodeAsync(queue_filler(300), [&](grpc::Status s, v1::EncodeResponse r) {
    status = std::move(s);
    response = std::move(r);
    done.done();
  });
  ASSERT_TRUE(done.wait(60s));
  ASSERT_TRUE(status.ok()) << status_code_name(status.error_code()) << ": "
                           << status.error_message();
  EXPECT_EQ(response.encodings_size(), 32);
  EXPECT_GE(retries.load(), 1) << "the request was admitted at once: no retry observed";
  expect_filler_ok();
}

TEST(ClientRequests, MakeTextRequestHasOneTextSequencePerTextAndTheOptions) {
  EncodeOptions opts;
  opts.request_id = "t";
  opts.normalize = true;
  opts.truncation = v1::TRUNCATION_LEFT;
  const v1::EncodeRequest request = Client::MakeTextRequest({"h\xC3\xA9llo", "two words"}, opts);
  EXPECT_EQ(request.request_id(), "t");
  EXPECT_TRUE(request.normalize());
  EXPECT_EQ(request.truncation(), v1::TRUNCATION_LEFT);
  ASSERT_EQ(request.sequences_size(), 2);
  EXPECT_EQ(request.sequences(0).text(), "h\xC3\xA9llo");
  EXPECT_EQ(request.sequences(1).text(), "two words");
  EXPECT_EQ(request.sequences(1).token_ids_size(), 0);
}

class ClientTextTest : public ServerSuite {
 protected:
  static void SetUpTestSuite() { start({"--max-batch-tokens", "2048"}, kTokenizerJson); }
};

TEST_F(ClientTextTest, TextsGiveWhatTheirIdsGive) {
  Client client(options());
  EncodeOptions opts;
  opts.return_token_embeddings = true;
  opts.return_logits = true;
  v1::EncodeResponse by_text, by_ids;
  const grpc::Status status =
      client.EncodeTexts({"The quick brown fox.", "Lazy dogs jump"}, &by_text, opts);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(client.Encode({{2, 4, 5, 6, 7, 12, 3}, {2, 10, 1, 1, 3}}, &by_ids, opts).ok());
  ASSERT_EQ(by_text.encodings_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::Encoding &t = by_text.encodings(i), &d = by_ids.encodings(i);
    EXPECT_EQ(t.num_tokens(), d.num_tokens());
    ASSERT_EQ(t.embedding_size(), d.embedding_size());
    ASSERT_EQ(t.token_embeddings_size(), d.token_embeddings_size());
    ASSERT_EQ(t.logits_size(), 3);
    for (int k = 0; k < t.embedding_size(); ++k) EXPECT_NEAR(t.embedding(k), d.embedding(k), 1e-6);
    for (int k = 0; k < t.token_embeddings_size(); ++k)
      EXPECT_NEAR(t.token_embeddings(k), d.token_embeddings(k), 1e-6);
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(t.logits(k), d.logits(k), 1e-6);
  }
  EXPECT_EQ(by_text.encodings(0).num_tokens(), 7u);
  EXPECT_EQ(by_text.encodings(1).num_tokens(), 5u);
}

TEST_F(ClientTextTest, TruncationKeepsTheSpecialTokens) {
  Client client(options());
  std::string text;
  std::vector<int32_t> words;
  for (int i = 0; i < 1100; ++i) {  // max_positions is 1024
    text += i % 2 ? " fox" : " dog";
    words.push_back(i % 2 ? 7 : 11);
  }
  EncodeOptions opts;
  opts.truncation = v1::TRUNCATION_LEFT;
  v1::EncodeResponse by_text, by_ids;
  ASSERT_TRUE(client.EncodeTexts({text}, &by_text, opts).ok());
  std::vector<int32_t> kept{2};
  kept.insert(kept.end(), words.end() - 1022, words.end());
  kept.push_back(3);
  ASSERT_TRUE(client.Encode({kept}, &by_ids).ok());
  EXPECT_EQ(by_text.encodings(0).num_tokens(), 1024u);
  for (int k = 0; k < by_ids.encodings(0).embedding_size(); ++k)
    EXPECT_NEAR(by_text.encodings(0).embedding(k), by_ids.encodings(0).embedding(k), 1e-6);
  EXPECT_EQ(client.EncodeTexts({text}, &by_text).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ClientTextTest, ModelInfoSaysTextIsAccepted) {
  Client client(options());
  v1::ModelInfo info;
  ASSERT_TRUE(client.GetModelInfo(&info).ok());
  EXPECT_TRUE(info.accepts_text());
  EXPECT_EQ(info.tokenizer(), "WordLevel (Lowercase, Whitespace, TemplateProcessing)");
}

TEST(ClientUnreachable, CallsFailWithUnavailable) {
  ClientOptions o;
  o.target = "127.0.0.1:" + std::to_string(test::free_port());
  o.deadline = 5s;
  Client client(o);
  grpc::Status status;
  EXPECT_EQ(client.Health("", &status), HealthStatus::kUnknown);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::EncodeResponse response;
  EXPECT_EQ(client.Encode({{1, 2, 3}}, &response).error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::ModelInfo info;
  EXPECT_EQ(client.GetModelInfo(&info).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace fastformer
