// The gRPC port's security, from the flags: plaintext or TLS (--tls-cert, --tls-key), mutual
// TLS (--tls-client-ca: the client must present a certificate that CA signed), and the
// bearer-token check of auth.h (--auth-token-file, --auth-health) on either.
//
// gRPC 1.51's C++ InsecureServerCredentials cannot carry an auth metadata processor, so the
// credentials are built from gRPC's C API: the core credentials (insecure or SSL) with a
// grpc_auth_metadata_processor that asks the TokenAuthenticator. It runs in the server auth
// filter, before the call reaches any service (health and reflection included), so a refused
// call costs no handler, no request parsing and no queue slot.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "server/serving/auth.h"
#include "server/serving/security_options.h"

namespace fastformer::rpc {

using serving::AuthMetrics;
using serving::SecurityOptions;
using serving::TokenAuthenticator;

class ServerSecurity {
 public:
  // Reads the files. Throws std::runtime_error naming the flag and the file when one cannot be
  // read or does not hold what it should (the start-up error).
  ServerSecurity(const SecurityOptions& options, AuthMetrics& metrics);

  // For ServerBuilder::AddListeningPort.
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }

  // SIGHUP: re-reads the token file (see TokenAuthenticator::reload); nothing to do without one.
  void reload_tokens();

  // For the start-up log: "TLS, mutual (client certificates verified), 2 bearer tokens
  // required (health and reflection open)".
  std::string describe() const;

  // The bearer-token check (null without --auth-token-file), for the HTTP listener.
  const TokenAuthenticator* authenticator() const { return authenticator_.get(); }
  const SecurityOptions& options() const { return options_; }

 private:
  SecurityOptions options_;
  std::shared_ptr<TokenAuthenticator> authenticator_;  // null without --auth-token-file
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

}  // namespace fastformer::rpc
