#include "client/cmd/connection_flags.h"

#include <cctype>
#include <fstream>
#include <iostream>
#include <iterator>

namespace fastformer::cli {

void add_connection_flags(CLI::App& app, ConnectionFlags& flags) {
  app.add_option("--target", flags.target, "server address host:port")
      ->envname("FASTFORMER_TARGET")
      ->capture_default_str();
  app.add_option("--deadline-ms", flags.deadline_ms, "deadline of each call in ms, 0 = none")
      ->envname("FASTFORMER_DEADLINE_MS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--tls", flags.tls, "TLS with the system's root certificates")
      ->envname("FASTFORMER_TLS");
  app.add_option("--tls-ca", flags.tls_ca,
                 "PEM file of the root certificates to trust (implies TLS)")
      ->envname("FASTFORMER_TLS_CA")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", flags.tls_cert,
                 "PEM client certificate, for mutual TLS (implies TLS)")
      ->envname("FASTFORMER_CLIENT_TLS_CERT")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", flags.tls_key, "PEM key of --tls-cert")
      ->envname("FASTFORMER_CLIENT_TLS_KEY")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-server-name", flags.tls_server_name,
                 "name to check the server certificate against, if not the target's host")
      ->envname("FASTFORMER_TLS_SERVER_NAME");
  auto* token = app.add_option("--token", flags.token,
                               "bearer token, sent as `authorization: Bearer <token>`")
                    ->envname("FASTFORMER_TOKEN");
  app.add_option("--token-file", flags.token_file, "file holding the bearer token")
      ->envname("FASTFORMER_TOKEN_FILE")
      ->check(CLI::ExistingFile)
      ->excludes(token);
}

bool make_client_options(const ConnectionFlags& flags, ClientOptions* out, std::string* error) {
  out->target = flags.target;
  out->deadline = Milliseconds(flags.deadline_ms);
  out->tls.enabled = flags.tls;
  out->tls.root_certs_file = flags.tls_ca;
  out->tls.cert_chain_file = flags.tls_cert;
  out->tls.private_key_file = flags.tls_key;
  out->tls.server_name_override = flags.tls_server_name;
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    *error = "--tls-cert and --tls-key go together";
    return false;
  }
  out->bearer_token = flags.token;
  if (!flags.token_file.empty()) {
    std::ifstream in(flags.token_file, std::ios::binary);
    std::string token{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.good() && !in.eof()) {
      *error = "--token-file " + flags.token_file + ": cannot read";
      return false;
    }
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
      token.pop_back();
    if (token.empty()) {
      *error = "--token-file " + flags.token_file + ": empty";
      return false;
    }
    out->bearer_token = token;
  }
  return true;
}

std::unique_ptr<Client> make_client(const ConnectionFlags& flags, const std::string& program) {
  ClientOptions options;
  std::string error;
  if (!make_client_options(flags, &options, &error)) {
    print_error(program, error);
    return nullptr;
  }
  try {
    return std::make_unique<Client>(options);
  } catch (const std::exception& e) {
    print_error(program, e.what());
    return nullptr;
  }
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints --help, or the error with a hint
    return code == 0 ? 0 : kExitUsage;
  }
  return std::nullopt;
}

void print_error(const std::string& program, const std::string& message) {
  std::cerr << program << ": " << message << std::endl;
}

std::string describe(const grpc::Status& status) {
  return status_code_name(status.error_code()) + ": " + status.error_message();
}

}  // namespace fastformer::cli
