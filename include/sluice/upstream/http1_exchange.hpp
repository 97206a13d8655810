#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "sluice/common/recycling_allocator.hpp"
#include "sluice/upstream/connection.hpp"
#include "sluice/upstream/exchange.hpp"
#include "sluice/upstream/pool.hpp"
#include "sluice/upstream/response_parser.hpp"

namespace sluice::upstream {

// An HTTP/1.1 exchange over one connection of the pool (Http1Client). When it
// is destroyed the connection goes back to the pool only if the response was
// read to its end and the upstream keeps it alive; otherwise it is closed.
class Http1Exchange final : public Exchange, public PerThreadRecycled {
 public:
  Http1Exchange(Pool& pool, Limits limits, AbortHandle& abort_handle);
  ~Http1Exchange() override;

  unsigned status() const override { return parser_->status(); }
  std::string_view forwarded_fields() const override { return parser_->forwarded_fields(); }
  std::string_view content_type() const override { return parser_->content_type(); }
  bool is_event_stream() const override { return parser_->is_event_stream(); }
  std::optional<std::chrono::milliseconds> retry_after() const override {
    return parser_->retry_after();
  }
  std::optional<std::uint64_t> content_length() const override {
    auto length = parser_->content_length();
    return length ? std::optional<std::uint64_t>(*length) : std::nullopt;
  }
  bool finished() const override { return parser_->is_done(); }
  const Timing& timing() const override { return timing_; }
  // The connection's idle time in the pool counts from `when`.
  void note_finished(TimePoint when) override { finished_at_ = when; }
  bool reusable() const override;

  // First from what the connection has buffered already: most bodies come
  // with their head, and most events whole.
  std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(
      char* data, std::size_t capacity) override;
  // Views of the connection's read buffer: they stay valid until the socket
  // is read again (begin_plain_body_read) or the exchange ends. Only for a
  // plain connection: a TLS connection's reads go through Beast's, which may
  // move buffered bytes while it reads.
  std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(
      std::vector<std::string_view>& views) override;
  bool reads_in_place() const override { return connection_->plain_socket() != nullptr; }
  boost::asio::awaitable<Result<std::size_t, UpstreamError>> read_body(
      char* data, std::size_t capacity) override;

  // nullopt for a TLS connection: read_body reads those.
  std::optional<PlainBodyRead> begin_plain_body_read() override;
  std::optional<Result<std::size_t, UpstreamError>> finish_plain_body_read(
      error_code ec, std::size_t bytes, char* data, std::size_t capacity) override;
  std::optional<Result<std::size_t, UpstreamError>> finish_plain_body_read(
      error_code ec, std::size_t bytes, std::vector<std::string_view>& views) override;

  // Closes the connection now; it will not be reused.
  void abort() override;

 private:
  // Http1Client::start runs the exchange's rounds up to its final head
  // through the members below.
  friend class Http1Client;

  // What a head just read turned out to be.
  enum class Head {
    final,
    interim,     // dropped: the final head follows on the connection
    unreadable,  // a switch of protocols, nothing this client could read or relay
  };

  // Starts a round of Http1Client::start on `connection`: a fresh parser,
  // abort_handle closing this connection, and the head's deadline armed.
  void begin_round(std::unique_ptr<Connection> connection);
  Connection& connection() { return *connection_; }
  ResponseParser& parser() { return *parser_; }
  // The request's write has ended with `ec`: the error it is, or nullopt
  // once the request is out (abort_handle is told).
  std::optional<UpstreamError> settle_send(error_code ec);
  Head take_head();
  // The head's read has ended with `ec`: the error it is, or nullopt for a
  // final head.
  std::optional<UpstreamError> settle_head(error_code ec);
  // Drops the connection and says so when `error` shows a pooled connection
  // the upstream had closed while it lay idle: the request did not reach
  // the upstream, and a fresh connection may carry it.
  bool drop_dead_pooled_connection(const UpstreamError& error, bool request_written);

  UpstreamError classify(const error_code& ec, bool expecting_head) const;
  // When the next body read gives up: timeouts.idle from now, or the total
  // deadline if that comes first.
  TimePoint body_read_deadline() const;
  // read_buffered_body into the buffer or views set on the parser.
  std::optional<Result<std::size_t, UpstreamError>> take_buffered_body();
  // A plain socket read's outcome, settled into the read buffer.
  error_code settle_plain_body_read(error_code ec, std::size_t bytes);
  void reset_parser();

  Pool& pool_;
  Limits limits_;
  AbortHandle& abort_handle_;
  std::unique_ptr<Connection> connection_;
  std::optional<ResponseParser> parser_;  // fresh for every round of Http1Client::start
  Timing timing_;
  TimePoint finished_at_{};
  bool failed_ = false;
  // An interim head (1xx) came on this round: the upstream has the request,
  // and a close now is no sign of a connection that was dead already.
  bool got_interim_ = false;
};

}  // namespace sluice::upstream
