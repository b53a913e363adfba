// The security flags both front doors share: the certificate files serve the gRPC port and
// the HTTP listener alike (server/grpc/server_credentials.h, server/http/http_server.h), the
// token file feeds the one TokenAuthenticator (auth.h) both consult.
#pragma once

#include <string>

namespace fastformer::serving {

struct SecurityOptions {
  std::string tls_cert;         ///< PEM certificate chain of the server; empty = plaintext
  std::string tls_key;          ///< PEM private key of tls_cert
  std::string tls_client_ca;    ///< PEM CA bundle for client certificates; empty = no mTLS
  std::string auth_token_file;  ///< bearer tokens, one per line; empty = no token needed
  bool auth_health = false;     ///< health and reflection need the token too
};

}  // namespace fastformer::serving
