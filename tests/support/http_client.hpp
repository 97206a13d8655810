#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sluice::testing {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  unsigned status = 0;
  Headers headers;
  std::string body;

  // Case-insensitive; "" when absent.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

// A blocking HTTP/1.1 client for tests: one keep-alive connection, every
// operation bounded by `timeout` so a broken server fails the test instead
// of hanging it.
class HttpConnection {
 public:
  // A non-zero `receive_buffer` sets the socket's receive buffer before it
  // connects, which also caps the window the peer may fill, and caps the
  // segment size below it: loopback's segments (about 64 KiB) would not fit
  // a small window, and the peer would then send only when its persist
  // timer probes the window, at intervals that double up to minutes.
  explicit HttpConnection(std::uint16_t port,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10),
                          int receive_buffer = 0);
  ~HttpConnection();

  HttpResponse request(const std::string& method, const std::string& target,
                       const std::string& body = {}, const Headers& headers = {});

  // For streams: send, then read the head, then the body piece by piece.
  void send(const std::string& method, const std::string& target, const std::string& body = {},
            const Headers& headers = {});
  void send_raw(std::string_view bytes);
  HttpResponse read_head();
  // The next piece of body as it arrives; nullopt at the end of the body.
  // Throws on a timeout or a broken connection.
  std::optional<std::string> read_body_piece();
  std::string read_rest_of_body();
  // Everything the server sends until it closes (for raw protocol tests).
  std::string read_until_close();
  // True when the server closed the connection (read returns EOF) within the timeout.
  bool closed_by_peer();

  void close();
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  template <class Start>
  boost::system::error_code run(Start&& start);

  boost::asio::io_context context_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::response_parser<boost::beast::http::buffer_body>> parser_;
  std::chrono::milliseconds timeout_;
  std::vector<char> piece_;
};

// One request on a fresh connection.
HttpResponse http_request(std::uint16_t port, const std::string& method, const std::string& target,
                          const std::string& body = {}, const Headers& headers = {});

// An Authorization header carrying `key` as a bearer token.
Headers bearer(const std::string& key);

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> sse_data(const std::string& body);

// A chat completion request body.
std::string chat_body(const std::string& model, bool stream, const std::string& extra_json = "");

}  // namespace sluice::testing
