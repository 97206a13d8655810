#include "support/http_client.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <stdexcept>

namespace sluice::testing {

namespace net = boost::asio;
namespace http = boost::beast::http;
using error_code = boost::system::error_code;

namespace {
bool same_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}
}  // namespace

std::string HttpResponse::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (same_name(key, name)) return value;
  }
  return {};
}

bool HttpResponse::has_header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (same_name(key, name)) return true;
  }
  return false;
}

HttpConnection::HttpConnection(std::uint16_t port, std::chrono::milliseconds timeout,
                               int receive_buffer)
    : socket_(context_), timeout_(timeout), piece_(64 * 1024) {
  net::ip::tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), port);
  if (receive_buffer > 0) {
    socket_.open(endpoint.protocol());
    socket_.set_option(net::socket_base::receive_buffer_size(receive_buffer));
    const int segment = std::max(256, receive_buffer / 8);
    if (setsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_MAXSEG, &segment, sizeof segment) != 0)
      throw std::runtime_error("setsockopt(TCP_MAXSEG) failed");
  }
  auto ec = run([&](auto handler) {
    socket_.async_connect(endpoint, [handler](error_code e) mutable { handler(e, 0); });
  });
  if (ec)
    throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + ": " + ec.message());
  socket_.set_option(net::ip::tcp::no_delay(true));
}

HttpConnection::~HttpConnection() { close(); }

template <class Start>
error_code HttpConnection::run(Start&& start) {
  error_code result = net::error::timed_out;
  bool done = false;
  start([&](error_code ec, std::size_t) {
    result = ec;
    done = true;
  });
  context_.restart();
  context_.run_for(timeout_);
  if (!done) {
    error_code ignored;
    socket_.cancel(ignored);
    context_.restart();
    context_.run();
    return net::error::timed_out;
  }
  return result;
}

void HttpConnection::send(const std::string& method, const std::string& target,
                          const std::string& body, const Headers& headers) {
  std::string wire = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_content_type = false;
  for (const auto& [name, value] : headers) {
    wire += name + ": " + value + "\r\n";
    has_content_type = has_content_type || same_name(name, "content-type");
  }
  if (!body.empty() && !has_content_type) wire += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST")
    wire += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  wire += "\r\n" + body;
  send_raw(wire);
}

void HttpConnection::send_raw(std::string_view bytes) {
  auto ec = run([&](auto handler) { net::async_write(socket_, net::buffer(bytes), handler); });
  if (ec) throw std::runtime_error("send: " + ec.message());
}

HttpResponse HttpConnection::read_head() {
  parser_.emplace();
  parser_->body_limit(boost::none);
  auto ec =
      run([&](auto handler) { http::async_read_header(socket_, buffer_, *parser_, handler); });
  if (ec) throw std::runtime_error("read head: " + ec.message());
  HttpResponse response;
  response.status = parser_->get().result_int();
  for (const auto& field : parser_->get()) {
    response.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  return response;
}

std::optional<std::string> HttpConnection::read_body_piece() {
  if (!parser_) throw std::logic_error("read_head first");
  while (!parser_->is_done()) {
    auto& body = parser_->get().body();
    body.data = piece_.data();
    body.size = piece_.size();
    auto ec =
        run([&](auto handler) { http::async_read_some(socket_, buffer_, *parser_, handler); });
    if (ec == http::error::need_buffer) ec = {};
    if (ec) throw std::runtime_error("read body: " + ec.message());
    std::size_t produced = piece_.size() - body.size;
    if (produced > 0) return std::string(piece_.data(), produced);
  }
  return std::nullopt;
}

std::string HttpConnection::read_rest_of_body() {
  std::string body;
  while (auto piece = read_body_piece()) body += *piece;
  return body;
}

HttpResponse HttpConnection::request(const std::string& method, const std::string& target,
                                     const std::string& body, const Headers& headers) {
  send(method, target, body, headers);
  auto response = read_head();
  response.body = read_rest_of_body();
  return response;
}

std::string HttpConnection::read_until_close() {
  std::string received(static_cast<const char*>(buffer_.data().data()), buffer_.size());
  buffer_.consume(buffer_.size());
  for (;;) {
    std::size_t got = 0;
    auto ec = run([&](auto handler) {
      socket_.async_read_some(net::buffer(piece_),
                              [&, handler](error_code e, std::size_t n) mutable {
                                got = n;
                                handler(e, n);
                              });
    });
    received.append(piece_.data(), got);
    if (ec == net::error::eof || ec == net::error::connection_reset) return received;
    if (ec) throw std::runtime_error("read until close: " + ec.message());
  }
}

bool HttpConnection::closed_by_peer() {
  std::size_t got = 0;
  auto ec = run([&](auto handler) {
    socket_.async_read_some(net::buffer(piece_), [&, handler](error_code e, std::size_t n) mutable {
      got = n;
      handler(e, n);
    });
  });
  return ec == net::error::eof || ec == net::error::connection_reset;
}

void HttpConnection::close() {
  error_code ignored;
  socket_.close(ignored);
}

HttpResponse http_request(std::uint16_t port, const std::string& method, const std::string& target,
                          const std::string& body, const Headers& headers) {
  HttpConnection connection(port);
  return connection.request(method, target, body, headers);
}

Headers bearer(const std::string& key) { return {{"Authorization", "Bearer " + key}}; }

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> events;
  std::size_t pos = 0;
  while (pos < body.size()) {
    auto end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string_view event(body.data() + pos, end - pos);
    std::size_t line_start = 0;
    while (line_start < event.size()) {
      auto line_end = event.find('\n', line_start);
      if (line_end == std::string_view::npos) line_end = event.size();
      auto line = event.substr(line_start, line_end - line_start);
      if (line.starts_with("data: ")) events.emplace_back(line.substr(6));
      line_start = line_end + 1;
    }
    pos = end + 2;
  }
  return events;
}

std::string chat_body(const std::string& model, bool stream, const std::string& extra_json) {
  std::string body = R"({"model":")" + model +
                     R"(","messages":[{"role":"user","content":"Say hello"}],"stream":)" +
                     (stream ? "true" : "false");
  if (!extra_json.empty()) body += "," + extra_json;
  return body + "}";
}

}  // namespace sluice::testing
