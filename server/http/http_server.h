// The HTTP/1.1 listener (--http-listen), on Boost.Beast over asio: keep-alive, TLS through
// OpenSSL with the gRPC port's certificate files, and the limits a public listener needs
// against slow and greedy clients: a request-body limit (413), a header-size limit (431), a
// time limit for a request's headers (--http-header-timeout-s, against a header that never
// ends), an idle limit for a kept-alive connection and for a body in flight
// (--http-idle-timeout-s), and a connection limit (one more is answered 503 and closed).
//
// This file is transport only: it reads whole requests and writes whole responses, one at a
// time per connection. What a request means is the Handler's (api.h), which may answer at once
// or later from any thread (a queued inference answers from the batcher's thread). Two routes
// stream instead (issue 50, the Files API): an upload's body goes to its route's BodySink as it
// arrives, under the route's own limit, and a stored file is answered from disk (send_file),
// neither held in memory whole.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/serving/security_options.h"

namespace fastformer::http {

namespace bhttp = boost::beast::http;
using Request = bhttp::request<bhttp::string_body>;
using Response = bhttp::response<bhttp::string_body>;

// Where one request's answer goes. send() must be called exactly once, from any thread; the
// connection writes it on its own strand. post() runs work on that strand (an I/O thread), so
// that a slow conversion (JSON of big float arrays) runs off the batcher's thread.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(Response response) = 0;
  // The same, its body the file at `path` read from disk as it is written out (`head` gives the
  // status and headers; its body is ignored). A file that cannot be opened is answered 500.
  virtual void send_file(Response head, std::string path) = 0;
  virtual void post(std::function<void()> work) = 0;
};

// Where a streamed request's body goes (an upload), in order, as it arrives.
class BodySink {
 public:
  virtual ~BodySink() = default;
  // The next bytes of the body; an answer here (a refusal) ends the request, and the
  // connection is closed after it (the rest of the body is not read).
  virtual std::optional<Response> feed(std::string_view bytes) = 0;
  // The body ended: the answer.
  virtual Response finish() = 0;
  // The transport could not read the whole body (the client went away, a timeout, the limit):
  // whatever was kept is dropped.
  virtual void abandon() = 0;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // One complete request, on an I/O thread.
  virtual void handle(Request& request, std::shared_ptr<Responder> responder) = 0;
  // A request whose header names a streamed route: its sink and, in `limit`, its body limit
  // (which replaces max_body_bytes); or an answer at once (a refusal: the body is not read);
  // or neither (null, nothing): the body is read whole and handle() gets it.
  struct Stream {
    std::shared_ptr<BodySink> sink;
    uint64_t limit = 0;
    std::optional<Response> answer;
  };
  virtual Stream stream(const Request& header) {
    (void)header;
    return {};
  }
  // The answer to a request the transport refused before handling it (413 body over the
  // limit, 431 header too large, 400 malformed HTTP, 503 too many connections), in the error
  // shape of the route `target` names (it may be empty when not even the start line parsed).
  virtual Response refuse(std::string_view target, bhttp::status status,
                          const std::string& message) = 0;
};

struct HttpOptions {
  std::string listen;  ///< host:port; port 0 picks a free one
  int threads = 2;     ///< I/O threads (JSON parsing and printing run on them)
  int64_t max_body_bytes = int64_t(64) << 20;
  int64_t max_header_bytes = 64 << 10;
  int64_t max_connections = 1024;
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds header_timeout{10000};
  serving::SecurityOptions tls;  ///< tls_cert/tls_key/tls_client_ca: HTTPS, as the gRPC port
};

class HttpServer {
 public:
  // Binds and starts the I/O threads. Throws std::runtime_error naming the address or the
  // file when the port cannot be bound or a TLS file cannot be used.
  HttpServer(HttpOptions options, Handler& handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  bool tls() const;
  // Stops accepting, waits (up to `grace`) for responses already handed to send() to be
  // written, then closes every connection and joins the I/O threads.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastformer::http
