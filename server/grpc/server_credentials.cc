#include "server/grpc/server_credentials.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace fastformer::rpc {
namespace {

// The contents of a PEM file given to `flag`, checked to hold a `marker` block, so that a
// swapped or wrong file fails start-up naming the flag rather than deep inside gRPC.
std::string read_pem(const char* flag, const std::string& path, const char* marker,
                     const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(std::string("cannot read ") + flag + " " + path + ": " +
                             std::strerror(errno));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  std::string pem = contents.str();
  if (pem.find(marker) == std::string::npos) {
    throw std::runtime_error(std::string(flag) + " " + path + " holds no " + what + " (no '" +
                             marker + "' line)");
  }
  return pem;
}

std::string_view view(const grpc_slice& slice) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)), GRPC_SLICE_LENGTH(slice)};
}

// grpc_auth_metadata_processor: called by the server auth filter with each call's metadata
// (":path" included); answers at once, on gRPC's thread. On success the `authorization`
// values are consumed, so handlers never see a token.
void process_auth_metadata(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                           grpc_process_auth_metadata_done_cb done, void* user_data) {
  const auto& authenticator = *static_cast<std::shared_ptr<TokenAuthenticator>*>(state);
  std::string_view path;
  std::vector<std::string_view> authorization;
  std::vector<grpc_metadata> consumed;
  for (size_t i = 0; i < num_md; ++i) {
    const std::string_view key = view(md[i].key);
    if (key == ":path") path = view(md[i].value);
    if (key == "authorization") {
      authorization.push_back(view(md[i].value));
      consumed.push_back(md[i]);
    }
  }
  const Status status = authenticator->check(path, authorization);  // serving/auth.h
  if (status.ok()) {
    done(user_data, consumed.data(), consumed.size(), nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(status.code()),
         status.message().c_str());
  }
}

void destroy_auth_state(void* state) {
  delete static_cast<std::shared_ptr<TokenAuthenticator>*>(state);
}

// Core credentials (insecure, or SSL with the certificate, key and optional client CA) with
// the token processor when there is an authenticator.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  CoreServerCredentials(std::string cert_pem, std::string key_pem, std::string client_ca_pem,
                        std::shared_ptr<TokenAuthenticator> authenticator)
      : cert_pem_(std::move(cert_pem)),
        key_pem_(std::move(key_pem)),
        client_ca_pem_(std::move(client_ca_pem)),
        authenticator_(std::move(authenticator)) {}

  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    throw std::logic_error("CoreServerCredentials installs its own auth metadata processor");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* credentials = nullptr;
    if (cert_pem_.empty()) {
      credentials = grpc_insecure_server_credentials_create();
    } else {
      grpc_ssl_pem_key_cert_pair pair{key_pem_.c_str(), cert_pem_.c_str()};
      credentials = grpc_ssl_server_credentials_create_ex(
          client_ca_pem_.empty() ? nullptr : client_ca_pem_.c_str(), &pair, 1,
          client_ca_pem_.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
          nullptr);
    }
    if (authenticator_) {
      grpc_server_credentials_set_auth_metadata_processor(
          credentials, {process_auth_metadata, destroy_auth_state,
                        new std::shared_ptr<TokenAuthenticator>(authenticator_)});
    }
    const int port = grpc_server_add_http2_port(server, addr.c_str(), credentials);
    grpc_server_credentials_release(credentials);
    return port;
  }

  std::string cert_pem_, key_pem_, client_ca_pem_;
  std::shared_ptr<TokenAuthenticator> authenticator_;
};

}  // namespace

ServerSecurity::ServerSecurity(const SecurityOptions& options, AuthMetrics& metrics)
    : options_(options) {
  std::string cert, key, client_ca;
  if (!options.tls_cert.empty()) {
    cert = read_pem("--tls-cert", options.tls_cert, "-----BEGIN CERTIFICATE-----", "certificate");
    key = read_pem("--tls-key", options.tls_key, "PRIVATE KEY-----", "private key");
  }
  if (!options.tls_client_ca.empty()) {
    client_ca = read_pem("--tls-client-ca", options.tls_client_ca, "-----BEGIN CERTIFICATE-----",
                         "certificate");
  }
  if (!options.auth_token_file.empty()) {
    try {
      authenticator_ = std::make_shared<TokenAuthenticator>(
          serving::read_token_file(options.auth_token_file), options.auth_health, metrics);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--auth-token-file: ") + e.what());
    }
  }
  credentials_ = std::make_shared<CoreServerCredentials>(std::move(cert), std::move(key),
                                                         std::move(client_ca), authenticator_);
}

void ServerSecurity::reload_tokens() {
  if (authenticator_) {
    authenticator_->reload(options_.auth_token_file);
  } else {
    spdlog::info("SIGHUP: no --auth-token-file, nothing to reload");
  }
}

std::string ServerSecurity::describe() const {
  std::string out = options_.tls_cert.empty() ? "plaintext (no TLS)"
                    : options_.tls_client_ca.empty()
                        ? "TLS"
                        : "mutual TLS (client certificates required, verified against " +
                              options_.tls_client_ca + ")";
  if (!authenticator_) return out + ", no bearer token required";
  return out + ", bearer token required (" + std::to_string(authenticator_->token_count()) +
         " loaded from " + options_.auth_token_file +
         (authenticator_->protects_health() ? "; health and reflection too)"
                                            : "; health and reflection open)");
}

}  // namespace fastformer::rpc
