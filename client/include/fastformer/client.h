// fastformer::Client: the C++ client of fastformer.v1.Encoder (docs/clients.md, docs/api.md).
//
//   fastformer::ClientOptions options;
//   options.target = "127.0.0.1:50051";
//   fastformer::Client client(options);
//   fastformer::v1::EncodeResponse response;
//   grpc::Status status = client.Encode({{101, 2023, 102}}, &response);
//   status = client.EncodeTexts({"some text"}, &response);  // ModelInfo.accepts_text models
//
// One Client holds one channel and is thread-safe: share it between threads. Blocking calls
// (Encode, GetModelInfo, Health, EncodeStream) return a grpc::Status; EncodeAsync and
// OpenEncodeStream run on gRPC's callback API and call back on gRPC's threads (keep callbacks
// short; they may start further calls, but must not destroy the Client or the EncodeStreamCall
// they belong to: both wait for their callbacks). Retries (off by default) apply to Encode,
// EncodeAsync and GetModelInfo, on UNAVAILABLE and RESOURCE_EXHAUSTED only; a stream is never
// retried (its failures come back in-band, per message).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastformer/v1/encoder.grpc.pb.h"

namespace fastformer {

using Milliseconds = std::chrono::milliseconds;

// Transport security. TLS is on when `enabled` is set or any certificate is given. Each PEM can
// be given as contents or as a file path (the file is read when the Client is made).
struct TlsOptions {
  bool enabled = false;
  std::string root_certs_pem;  ///< trusted roots; empty (and no file): the system's roots
  std::string root_certs_file;
  std::string cert_chain_pem;  ///< client certificate, for mutual TLS
  std::string cert_chain_file;
  std::string private_key_pem;  ///< the client certificate's key
  std::string private_key_file;
  std::string server_name_override;  ///< name checked against the server certificate, if not the
                                     ///< target's host
};

// Exponential backoff with jitter. Attempt n+1 starts
// min(max_backoff, initial_backoff * multiplier^(n-1)) * uniform(1 - jitter, 1 + jitter)
// after attempt n failed with a retryable code. The call's deadline covers every attempt and
// every wait: when the next wait would end past it, the last failure is returned.
struct RetryPolicy {
  int max_attempts = 1;  ///< attempts in all, the first included; 1 = no retry
  Milliseconds initial_backoff{50};
  Milliseconds max_backoff{2000};
  double multiplier = 2.0;
  double jitter = 0.2;  ///< in [0, 1]
};

// Told to ClientOptions::on_retry before each wait.
struct RetryEvent {
  const char* method = "";  ///< "Encode" or "GetModelInfo"
  int attempt = 0;          ///< the attempt that failed, from 1
  grpc::Status status;      ///< its status (UNAVAILABLE or RESOURCE_EXHAUSTED)
  Milliseconds backoff{0};  ///< the wait before the next attempt
};

struct ClientOptions {
  std::string target = "127.0.0.1:50051";  ///< host:port, or any gRPC target URI
  Milliseconds deadline{0};  ///< default deadline of a call (a whole stream); 0 = none
  TlsOptions tls;
  std::string bearer_token;  ///< sent as `authorization: Bearer <token>`; empty = none
  RetryPolicy retry;
  std::function<void(const RetryEvent&)> on_retry;  ///< observes retries (any thread)
  int max_receive_message_bytes = -1;  ///< -1 = unlimited (token embeddings can be large)
  int max_send_message_bytes = -1;     ///< -1 = unlimited
};

// What to return for each sequence of a request (EncodeRequest's options).
struct EncodeOptions {
  bool return_token_embeddings = false;
  bool return_logits = false;
  bool normalize = false;
  v1::Truncation truncation = v1::TRUNCATION_UNSPECIFIED;
  std::string request_id;
  std::string model_name;     ///< empty: the server's default model
  std::string model_version;  ///< empty: its newest READY version
};

// grpc.health.v1 HealthCheckResponse.ServingStatus.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

class EncodeStreamCall;

class Client {
 public:
  using EncodeCallback = std::function<void(grpc::Status, v1::EncodeResponse)>;
  using ResponseCallback = std::function<void(const v1::EncodeResponse&)>;

  // Opens a channel to options.target. Throws std::runtime_error when a TLS file cannot be read.
  explicit Client(ClientOptions options = {});
  // Uses `channel` as it is (target and TLS options are ignored), e.g. an in-process channel.
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});
  // Cancels the asynchronous calls still in flight (their callbacks run, with CANCELLED or
  // their last status) and waits for their callbacks. Open streams are not affected.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // `deadline`: nullopt = ClientOptions::deadline; Milliseconds{0} = none.
  grpc::Status Encode(const v1::EncodeRequest& request, v1::EncodeResponse* response,
                      std::optional<Milliseconds> deadline = std::nullopt);
  // One Sequence per token-id vector.
  grpc::Status Encode(const std::vector<std::vector<int32_t>>& token_ids,
                      v1::EncodeResponse* response, const EncodeOptions& options = {},
                      std::optional<Milliseconds> deadline = std::nullopt);
  // One Sequence per text (UTF-8), tokenized by the server with the model's tokenizer.json
  // (ModelInfo.accepts_text); num_tokens counts the tokens it became. A name of its own, not an
  // Encode overload: braced lists such as {{1, 2, 3}} would convert to either. To mix kinds
  // in one request, fill the v1::Sequence fields of an EncodeRequest (set_text, ...).
  grpc::Status EncodeTexts(const std::vector<std::string>& texts, v1::EncodeResponse* response,
                           const EncodeOptions& options = {},
                           std::optional<Milliseconds> deadline = std::nullopt);

  // Returns at once; `done` runs exactly once, on a gRPC thread, with the final status and the
  // response (empty unless OK).
  void EncodeAsync(v1::EncodeRequest request, EncodeCallback done,
                   std::optional<Milliseconds> deadline = std::nullopt);

  // Sends every request on one EncodeStream call and returns when all are answered (or the
  // call ended). `on_response` runs once per answer, in arrival order (not request order: match
  // by request_id), never concurrently; failed messages come back in-band with `error` set.
  // The deadline covers the whole stream.
  grpc::Status EncodeStream(const std::vector<v1::EncodeRequest>& requests,
                            ResponseCallback on_response,
                            std::optional<Milliseconds> deadline = std::nullopt);
  // The same call, open: write messages as you go (see EncodeStreamCall). `on_done`, if set,
  // runs once when the call has ended (after the last on_response), with its status: after
  // Finish/WritesDone once every message is answered, or when the server or the deadline ends
  // the call early.
  std::unique_ptr<EncodeStreamCall> OpenEncodeStream(
      ResponseCallback on_response, std::optional<Milliseconds> deadline = std::nullopt,
      std::function<void(const grpc::Status&)> on_done = nullptr);

  // Of `model_name` (empty: the server's default model) at `model_version` (empty: its newest
  // READY version).
  grpc::Status GetModelInfo(v1::ModelInfo* info,
                            std::optional<Milliseconds> deadline = std::nullopt,
                            const std::string& model_name = {},
                            const std::string& model_version = {});

  // grpc.health.v1.Health/Check of `service` ("" = the server as a whole). kUnknown when the
  // check itself failed; `status` (optional) receives the RPC's status.
  HealthStatus Health(const std::string& service = "", grpc::Status* status = nullptr,
                      std::optional<Milliseconds> deadline = std::nullopt);

  // An EncodeRequest with one Sequence per token-id vector.
  static v1::EncodeRequest MakeRequest(const std::vector<std::vector<int32_t>>& token_ids,
                                       const EncodeOptions& options = {});
  // An EncodeRequest with one Sequence per text.
  static v1::EncodeRequest MakeTextRequest(const std::vector<std::string>& texts,
                                           const EncodeOptions& options = {});

  const ClientOptions& options() const;
  std::shared_ptr<grpc::Channel> channel() const;

  struct State;  // shared with the calls in flight

 private:
  std::shared_ptr<State> state_;
};

// One open EncodeStream call. Thread-safe. Destroying it cancels the call if it has not ended
// and waits until it has.
class EncodeStreamCall {
 public:
  ~EncodeStreamCall();
  EncodeStreamCall(const EncodeStreamCall&) = delete;
  EncodeStreamCall& operator=(const EncodeStreamCall&) = delete;

  // Queues one message (sent in order, one at a time). False when the stream can take no more:
  // WritesDone was called, a write failed, or the server has ended the call.
  bool Write(v1::EncodeRequest request);
  // No more messages: the server ends the call once it has answered every message.
  void WritesDone();
  // WritesDone, then waits for the end of the call; returns its status.
  grpc::Status Finish();
  void Cancel();

  class Reactor;

 private:
  friend class Client;
  explicit EncodeStreamCall(std::unique_ptr<Reactor> reactor);
  std::unique_ptr<Reactor> reactor_;
};

// "OK", "INVALID_ARGUMENT", ... (the names of grpc::StatusCode, as the server's metrics use).
// Defined in the repository's common/status_names.cc, which this library carries.
std::string status_code_name(grpc::StatusCode code);
// "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN".
const char* health_status_name(HealthStatus status);
// True for the codes a retry may cure: UNAVAILABLE and RESOURCE_EXHAUSTED.
bool is_retryable(grpc::StatusCode code);

}  // namespace fastformer
