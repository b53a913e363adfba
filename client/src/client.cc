#include "fastformer/client.h"

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <vector>

#include "client/src/async_encode_call.h"
#include "client/src/client_state.h"
#include "client/src/encode_stream_reactor.h"

namespace fastformer {
namespace {

using internal::SystemTime;

// `pem` if given, else the contents of `file` (empty when neither is).
std::string pem_or_file(const std::string& pem, const std::string& file, const char* what) {
  if (!pem.empty() || file.empty()) return pem;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(what) + ": cannot read " + file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::shared_ptr<grpc::Channel> make_channel(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  const TlsOptions& tls = options.tls;
  const bool use_tls = tls.enabled || !tls.root_certs_pem.empty() || !tls.root_certs_file.empty() ||
                       !tls.cert_chain_pem.empty() || !tls.cert_chain_file.empty() ||
                       !tls.private_key_pem.empty() || !tls.private_key_file.empty();
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (use_tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs =
        pem_or_file(tls.root_certs_pem, tls.root_certs_file, "TLS root certificates");
    ssl.pem_cert_chain =
        pem_or_file(tls.cert_chain_pem, tls.cert_chain_file, "TLS client certificate");
    ssl.pem_private_key = pem_or_file(tls.private_key_pem, tls.private_key_file, "TLS client key");
    if (ssl.pem_cert_chain.empty() != ssl.pem_private_key.empty()) {
      throw std::runtime_error("mutual TLS needs both a client certificate and its key");
    }
    if (!tls.server_name_override.empty()) args.SetSslTargetNameOverride(tls.server_name_override);
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(options.target, credentials, args);
}

// Runs `attempt` (given a fresh context) until it succeeds, fails for good or the retry
// policy gives up; waits between attempts on this thread.
template <class Attempt>
grpc::Status with_retries(const Client::State& state, const char* method,
                          std::optional<SystemTime> deadline, Attempt&& attempt) {
  for (int n = 1;; ++n) {
    grpc::ClientContext context;
    state.prepare(&context, deadline);
    grpc::Status status = attempt(&context);
    const Milliseconds backoff = internal::backoff_delay(state.options.retry, n);
    if (!internal::should_retry(state.options.retry, n, status, backoff, deadline)) return status;
    state.report_retry(method, n, status, backoff);
    std::this_thread::sleep_for(backoff);
  }
}

}  // namespace

// ---- State -------------------------------------------------------------------------------

std::optional<SystemTime> Client::State::deadline_for(std::optional<Milliseconds> per_call) const {
  const Milliseconds timeout = per_call.value_or(options.deadline);
  if (timeout.count() <= 0) return std::nullopt;
  return std::chrono::system_clock::now() + timeout;
}

void Client::State::prepare(grpc::ClientContext* context,
                            std::optional<SystemTime> deadline) const {
  if (deadline) context->set_deadline(*deadline);
  if (!options.bearer_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options.bearer_token);
  }
}

void Client::State::report_retry(const char* method, int attempt, const grpc::Status& status,
                                 Milliseconds backoff) const {
  if (options.on_retry) options.on_retry(RetryEvent{method, attempt, status, backoff});
}

// ---- Client ------------------------------------------------------------------------------

Client::Client(ClientOptions options) : Client(make_channel(options), options) {}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : state_(std::make_shared<State>()) {
  state_->options = std::move(options);
  state_->channel = std::move(channel);
  state_->stub = v1::Encoder::NewStub(state_->channel);
  state_->health_stub = grpc::health::v1::Health::NewStub(state_->channel);
}

Client::~Client() {
  std::vector<std::shared_ptr<internal::AsyncEncodeCall>> calls;
  {
    std::lock_guard lock(state_->mu);
    state_->closing = true;
    for (const auto& [ptr, call] : state_->calls) calls.push_back(call);
  }
  for (const auto& call : calls) call->cancel();
  calls.clear();
  state_->retry_timer.stop();       // calls waiting to retry end now, with their last status
  state_->live_calls->wait_none();  // every callback has run and every call object is gone
}

grpc::Status Client::Encode(const v1::EncodeRequest& request, v1::EncodeResponse* response,
                            std::optional<Milliseconds> deadline) {
  return with_retries(*state_, "Encode", state_->deadline_for(deadline),
                      [&](grpc::ClientContext* context) {
                        response->Clear();
                        return state_->stub->Encode(context, request, response);
                      });
}

grpc::Status Client::Encode(const std::vector<std::vector<int32_t>>& token_ids,
                            v1::EncodeResponse* response, const EncodeOptions& options,
                            std::optional<Milliseconds> deadline) {
  return Encode(MakeRequest(token_ids, options), response, deadline);
}

grpc::Status Client::EncodeTexts(const std::vector<std::string>& texts,
                                 v1::EncodeResponse* response, const EncodeOptions& options,
                                 std::optional<Milliseconds> deadline) {
  return Encode(MakeTextRequest(texts, options), response, deadline);
}

void Client::EncodeAsync(v1::EncodeRequest request, EncodeCallback done,
                         std::optional<Milliseconds> deadline) {
  internal::AsyncEncodeCall::start(std::make_shared<internal::AsyncEncodeCall>(
      state_, std::move(request), std::move(done), state_->deadline_for(deadline)));
}

grpc::Status Client::EncodeStream(const std::vector<v1::EncodeRequest>& requests,
                                  ResponseCallback on_response,
                                  std::optional<Milliseconds> deadline) {
  auto call = OpenEncodeStream(std::move(on_response), deadline);
  for (const auto& request : requests) {
    if (!call->Write(request)) break;  // the call has ended: Finish says why
  }
  return call->Finish();
}

std::unique_ptr<EncodeStreamCall> Client::OpenEncodeStream(
    ResponseCallback on_response, std::optional<Milliseconds> deadline,
    std::function<void(const grpc::Status&)> on_done) {
  auto reactor = std::make_unique<EncodeStreamCall::Reactor>(
      state_, std::move(on_response), std::move(on_done), state_->deadline_for(deadline));
  return std::unique_ptr<EncodeStreamCall>(new EncodeStreamCall(std::move(reactor)));
}

grpc::Status Client::GetModelInfo(v1::ModelInfo* info, std::optional<Milliseconds> deadline,
                                  const std::string& model_name, const std::string& model_version) {
  v1::GetModelInfoRequest request;
  request.set_model_name(model_name);
  request.set_model_version(model_version);
  return with_retries(*state_, "GetModelInfo", state_->deadline_for(deadline),
                      [&](grpc::ClientContext* context) {
                        info->Clear();
                        return state_->stub->GetModelInfo(context, request, info);
                      });
}

HealthStatus Client::Health(const std::string& service, grpc::Status* status,
                            std::optional<Milliseconds> deadline) {
  grpc::ClientContext context;
  state_->prepare(&context, state_->deadline_for(deadline));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status rpc_status = state_->health_stub->Check(&context, request, &response);
  if (status != nullptr) *status = rpc_status;
  if (!rpc_status.ok()) return HealthStatus::kUnknown;
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return HealthStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return HealthStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return HealthStatus::kServiceUnknown;
    default:
      return HealthStatus::kUnknown;
  }
}

namespace {

// An EncodeRequest with `options` and no sequences.
v1::EncodeRequest request_with(const EncodeOptions& options) {
  v1::EncodeRequest request;
  request.set_request_id(options.request_id);
  request.set_return_token_embeddings(options.return_token_embeddings);
  request.set_return_logits(options.return_logits);
  request.set_normalize(options.normalize);
  request.set_truncation(options.truncation);
  request.set_model_name(options.model_name);
  request.set_model_version(options.model_version);
  return request;
}

}  // namespace

v1::EncodeRequest Client::MakeRequest(const std::vector<std::vector<int32_t>>& token_ids,
                                      const EncodeOptions& options) {
  v1::EncodeRequest request = request_with(options);
  for (const auto& ids : token_ids) {
    request.add_sequences()->mutable_token_ids()->Assign(ids.begin(), ids.end());
  }
  return request;
}

v1::EncodeRequest Client::MakeTextRequest(const std::vector<std::string>& texts,
                                          const EncodeOptions& options) {
  v1::EncodeRequest request = request_with(options);
  for (const auto& text : texts) request.add_sequences()->set_text(text);
  return request;
}

const ClientOptions& Client::options() const { return state_->options; }

std::shared_ptr<grpc::Channel> Client::channel() const { return state_->channel; }

// ---- names -------------------------------------------------------------------------------

const char* health_status_name(HealthStatus status) {
  switch (status) {
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case HealthStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

bool is_retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

}  // namespace fastformer
