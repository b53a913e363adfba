#include "server/http/http_server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace fastformer::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;

struct HttpServer::Impl {
  Impl(HttpOptions o, Handler& h) : options(std::move(o)), handler(h), acceptor(ioc), retry(ioc) {}

  void accept();

  const HttpOptions options;
  Handler& handler;
  // Declared before the io_context: sessions (destroyed with it) still count down these and
  // may still hold the TLS context.
  std::atomic<int64_t> connections{0};
  std::atomic<int64_t> pending_writes{0};
  std::unique_ptr<ssl::context> tls;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::steady_timer retry;  // accept again after a failed accept (EMFILE)
  std::vector<std::thread> threads;
  bool stopped = false;
};

namespace {

template <class Stream>
constexpr bool kIsTls = !std::is_same_v<Stream, beast::tcp_stream>;

// Errors that mean the peer went away or stayed silent too long: the connection closes
// without an answer (there is no one to read it, or the time to send one is over).
bool is_disconnect(const beast::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == net::error::eof ||
         ec == beast::error::timeout || ec == net::error::connection_reset ||
         ec == net::error::operation_aborted || ec == net::error::broken_pipe ||
         ec == ssl::error::stream_truncated || ec == bhttp::error::partial_message;
}

template <class Stream>
class Session final : public Responder, public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <class... Args>
  Session(HttpServer::Impl& server, bool over_limit, Args&&... args)
      : server_(server), over_limit_(over_limit), stream_(std::forward<Args>(args)...) {}
  ~Session() override { server_.connections.fetch_sub(1); }

  void start() {
    if constexpr (kIsTls<Stream>) {
      lowest().expires_after(server_.options.header_timeout);
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) return self->close_now();
                                self->wait_request();
                              });
    } else {
      wait_request();
    }
  }

  void send(Response response) override {
    server_.pending_writes.fetch_add(1);
    net::post(stream_.get_executor(),
              [self = this->shared_from_this(), r = std::move(response)]() mutable {
                self->write(std::move(r));
              });
  }

  void send_file(Response head, std::string path) override {
    server_.pending_writes.fetch_add(1);
    net::post(stream_.get_executor(),
              [self = this->shared_from_this(), h = std::move(head),
               p = std::move(path)]() mutable { self->write_file(std::move(h), p); });
  }

  void post(std::function<void()> work) override {
    net::post(stream_.get_executor(), std::move(work));
  }

 private:
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  // Keep-alive: wait up to the idle timeout for the next request's first byte.
  void wait_request() {
    if (buffer_.size() > 0) return read_header();
    lowest().expires_after(server_.options.idle_timeout);
    stream_.async_read_some(buffer_.prepare(8192),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              self->buffer_.commit(n);
                              if (ec) return self->close_now();
                              self->read_header();
                            });
  }

  // The header within --http-header-timeout-s of its first byte (a slow client is cut off).
  void read_header() {
    parser_.emplace();
    parser_->header_limit(
        uint32_t(std::min<int64_t>(server_.options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(uint64_t(server_.options.max_body_bytes));
    lowest().expires_after(server_.options.header_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               if (ec) return self->read_failed(ec);
                               self->on_header();
                             });
  }

  void on_header() {
    const Request& header = parser_->get();
    version_ = header.version();
    target_ = std::string(header.target());
    Handler::Stream streamed = over_limit_ ? Handler::Stream{} : server_.handler.stream(header);
    if (streamed.answer) {  // refused before its body: the body is not read
      keep_alive_ = false;
      parser_.reset();
      server_.pending_writes.fetch_add(1);
      return write(std::move(*streamed.answer));
    }
    sink_ = std::move(streamed.sink);
    sink_limit_ = streamed.limit;
    if (beast::iequals(header[bhttp::field::expect], "100-continue")) {
      auto go_on = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_,
                                                                        header.version());
      lowest().expires_after(server_.options.idle_timeout);
      bhttp::async_write(stream_, *go_on,
                         [self = this->shared_from_this(), go_on](beast::error_code ec, size_t) {
                           if (ec) return self->close_now();
                           self->sink_ ? self->read_streamed() : self->read_body();
                         });
      return;
    }
    sink_ ? read_streamed() : read_body();
  }

  // A streamed body: the header's parser, now with a buffer body under the route's limit,
  // reads it a chunk at a time into the route's sink.
  void read_streamed() {
    streamed_.emplace(std::move(*parser_));
    parser_.reset();
    streamed_->body_limit(sink_limit_);
    chunk_.resize(64 << 10);
    read_chunk();
  }

  void read_chunk() {
    auto& body = streamed_->get().body();
    body.data = chunk_.data();
    body.size = chunk_.size();
    lowest().expires_after(server_.options.idle_timeout);
    bhttp::async_read(
        stream_, buffer_, *streamed_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_chunk(ec); });
  }

  void on_chunk(beast::error_code ec) {
    if (ec == bhttp::error::need_buffer) ec = {};
    const size_t got = chunk_.size() - streamed_->get().body().size;
    if (!ec && got > 0) {
      if (std::optional<Response> refusal = sink_->feed(std::string_view(chunk_.data(), got))) {
        sink_->abandon();
        return end_streamed(std::move(*refusal), false);
      }
    }
    if (ec) {
      sink_->abandon();
      if (is_disconnect(ec)) return close_now();
      const bool over = ec == bhttp::error::body_limit;
      return end_streamed(
          server_.handler.refuse(
              target_, over ? bhttp::status::payload_too_large : bhttp::status::bad_request,
              over ? "the upload is over the limit of " + std::to_string(sink_limit_) + " bytes"
                   : "malformed HTTP request: " + ec.message()),
          false);
    }
    if (!streamed_->is_done()) return read_chunk();
    keep_alive_ = streamed_->get().keep_alive();
    lowest().expires_never();
    Response answer = sink_->finish();
    end_streamed(std::move(answer), keep_alive_);
  }

  void end_streamed(Response answer, bool keep_alive) {
    keep_alive_ = keep_alive;
    sink_.reset();
    streamed_.reset();
    chunk_ = {};
    server_.pending_writes.fetch_add(1);
    write(std::move(answer));
  }

  // The body, with no more than the idle timeout between its bytes' arrivals... and in all.
  void read_body() {
    lowest().expires_after(server_.options.idle_timeout);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->read_failed(ec);
                        self->on_request();
                      });
  }

  void read_failed(const beast::error_code& ec) {
    if (is_disconnect(ec)) {
      if (ec == beast::error::timeout) spdlog::debug("HTTP: a client was too slow; closing");
      return close_now();
    }
    keep_alive_ = false;
    version_ = parser_ && parser_->is_header_done() ? parser_->get().version() : 11;
    const std::string target =
        parser_ && parser_->is_header_done() ? std::string(parser_->get().target()) : "";
    if (ec == bhttp::error::body_limit) {
      send(server_.handler.refuse(target, bhttp::status::payload_too_large,
                                  "the request body is over the limit of " +
                                      std::to_string(server_.options.max_body_bytes) +
                                      " bytes (--http-max-body-bytes)"));
    } else if (ec == bhttp::error::header_limit) {
      send(server_.handler.refuse(target, bhttp::status::request_header_fields_too_large,
                                  "the request's headers are over the limit of " +
                                      std::to_string(server_.options.max_header_bytes) + " bytes"));
    } else {
      send(server_.handler.refuse(target, bhttp::status::bad_request,
                                  "malformed HTTP request: " + ec.message()));
    }
  }

  void on_request() {
    request_ = parser_->release();
    parser_.reset();
    keep_alive_ = request_.keep_alive();
    version_ = request_.version();
    lowest().expires_never();  // the handler's time is the request's (its deadline), not ours
    if (over_limit_) {
      keep_alive_ = false;
      send(server_.handler.refuse(request_.target(), bhttp::status::service_unavailable,
                                  "too many connections: --http-max-connections " +
                                      std::to_string(server_.options.max_connections) +
                                      " are open; retry later"));
      return;
    }
    try {
      server_.handler.handle(request_, this->shared_from_this());
    } catch (const std::exception& e) {
      // A handler's bug must not take the I/O thread with it.
      spdlog::error("HTTP {} {}: {}", std::string(request_.method_string()),
                    std::string(request_.target()), e.what());
      keep_alive_ = false;
      send(server_.handler.refuse(request_.target(), bhttp::status::internal_server_error,
                                  std::string("internal error: ") + e.what()));
    }
  }

  // A response whose body is a file read from disk as it is written (send_file). The write may
  // take the idle timeout plus a second for each MiB (a slow reader of a big file is cut off).
  void write_file(Response head, const std::string& path) {
    bhttp::response<bhttp::file_body> res{head.result(), version_};
    beast::error_code ec;
    res.body().open(path.c_str(), beast::file_mode::scan, ec);
    if (ec) {
      spdlog::error("HTTP: cannot read {}: {}", path, ec.message());
      return write(server_.handler.refuse(target_, bhttp::status::internal_server_error,
                                          "the file cannot be read: " + ec.message()));
    }
    for (const auto& field : head) res.set(field.name_string(), field.value());
    res.keep_alive(keep_alive_ && head.keep_alive());
    res.set(bhttp::field::server, "fastformer-server");
    res.prepare_payload();
    const auto seconds = std::chrono::seconds(int64_t(res.body().size() >> 20));
    file_response_.emplace(std::move(res));
    request_ = {};
    lowest().expires_after(server_.options.idle_timeout + seconds);
    bhttp::async_write(stream_, *file_response_,
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
                         self->server_.pending_writes.fetch_sub(1);
                         if (ec) return self->close_now();
                         const bool keep = self->file_response_->keep_alive();
                         self->file_response_.reset();
                         if (!keep) return self->close_gracefully();
                         self->wait_request();
                       });
  }

  void write(Response response) {
    response.version(version_);
    response.keep_alive(keep_alive_ && response.keep_alive());
    response.set(bhttp::field::server, "fastformer-server");
    response.prepare_payload();
    response_.emplace(std::move(response));
    request_ = {};
    lowest().expires_after(server_.options.idle_timeout);
    bhttp::async_write(stream_, *response_,
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
                         self->server_.pending_writes.fetch_sub(1);
                         if (ec) return self->close_now();
                         const bool keep = self->response_->keep_alive();
                         self->response_.reset();
                         if (!keep) return self->close_gracefully();
                         self->wait_request();
                       });
  }

  // After a last answer: stop sending, and read (and drop) what the client still sends for a
  // moment, so that closing does not reset the connection before it has read the answer.
  void close_gracefully() {
    if constexpr (kIsTls<Stream>) {
      lowest().expires_after(std::chrono::seconds(1));
      stream_.async_shutdown(
          [self = this->shared_from_this()](beast::error_code) { self->close_now(); });
    } else {
      beast::error_code ec;
      lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
      lowest().expires_after(std::chrono::seconds(1));
      drain();
    }
  }

  void drain() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(8192),
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close_now();
                              self->drain();
                            });
  }

  void close_now() {
    beast::error_code ec;
    lowest().socket().close(ec);
  }

  HttpServer::Impl& server_;
  const bool over_limit_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Request request_;
  std::optional<Response> response_;
  // A streamed request (Handler::stream): its sink, limit, parser and read buffer; and a file
  // response (send_file).
  std::shared_ptr<BodySink> sink_;
  uint64_t sink_limit_ = 0;
  std::optional<bhttp::request_parser<bhttp::buffer_body>> streamed_;
  std::vector<char> chunk_;
  std::optional<bhttp::response<bhttp::file_body>> file_response_;
  std::string target_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
};

std::unique_ptr<ssl::context> make_tls(const serving::SecurityOptions& o) {
  if (o.tls_cert.empty()) return nullptr;
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  auto use = [](const char* flag, const std::string& file, auto&& load) {
    try {
      load();
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(flag) + " " + file +
                               ": cannot be used for the HTTP listener: " + e.what());
    }
  };
  use("--tls-cert", o.tls_cert, [&] { ctx->use_certificate_chain_file(o.tls_cert); });
  use("--tls-key", o.tls_key, [&] { ctx->use_private_key_file(o.tls_key, ssl::context::pem); });
  if (!o.tls_client_ca.empty()) {
    use("--tls-client-ca", o.tls_client_ca, [&] { ctx->load_verify_file(o.tls_client_ca); });
    ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  return ctx;
}

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors, most likely: wait a moment rather than spin.
      spdlog::warn("HTTP: accept failed: {}; retrying in 100 ms", ec.message());
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    const bool over_limit =
        connections.fetch_add(1) >= options.max_connections && options.max_connections > 0;
    if (tls) {
      std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(*this, over_limit,
                                                                      std::move(socket), *tls)
          ->start();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(*this, over_limit, std::move(socket))->start();
    }
    accept();
  });
}

HttpServer::HttpServer(HttpOptions options, Handler& handler)
    : impl_(std::make_unique<Impl>(std::move(options), handler)) {
  Impl& s = *impl_;
  s.tls = make_tls(s.options.tls);
  const std::string& listen = s.options.listen;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    throw std::runtime_error("--http-listen " + listen + ": expected host:port");
  }
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  try {
    tcp::resolver resolver(s.ioc);
    const auto endpoints = resolver.resolve(host, port, tcp::resolver::passive);
    if (endpoints.empty()) throw std::runtime_error("no address");
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    s.acceptor.open(endpoint.protocol());
    s.acceptor.set_option(net::socket_base::reuse_address(true));
    s.acceptor.bind(endpoint);
    s.acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot listen on " + listen + " (--http-listen): " + e.what());
  }
  s.accept();
  for (int i = 0; i < std::max(1, s.options.threads); ++i) {
    s.threads.emplace_back([&s] { s.ioc.run(); });
  }
}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }
bool HttpServer::tls() const { return impl_->tls != nullptr; }

void HttpServer::stop(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  if (s.stopped) return;
  s.stopped = true;
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
    s.retry.cancel();
  });
  const auto give_up = std::chrono::steady_clock::now() + grace;
  while (s.pending_writes.load() > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  s.ioc.stop();
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
}

}  // namespace fastformer::http
