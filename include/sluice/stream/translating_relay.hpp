#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <string>
#include <string_view>

#include "sluice/http/socket_deadline.hpp"
#include "sluice/stream/answer_translator.hpp"
#include "sluice/stream/relay.hpp"
#include "sluice/stream/sse_events.hpp"
#include "sluice/upstream/client.hpp"

namespace sluice::stream {

// Relays an answer that a protocol adapter translates. An event stream is
// still relayed event by event: each upstream event is translated and
// written the moment it is whole, so translation costs no first-token time
// beyond its own. A body that is no stream is read whole (up to
// kLargestTranslatedBody), translated and sent with its length.
//
// The client gets the translator's status and content type with sluice's
// `head_fields`; the upstream's other header fields belong to its own
// protocol and are not passed on. RelayOptions' capture and
// on_upstream_complete see the translated answer (what the client's
// protocol would cache); its usage is read from the translated answer too.
class TranslatingRelay {
 public:
  static constexpr std::size_t kLargestTranslatedBody = std::size_t{16} * 1024 * 1024;

  TranslatingRelay(boost::asio::ip::tcp::socket& client, SocketDeadline& client_deadline,
                   Relay::Buffers& buffers, std::chrono::milliseconds write_timeout)
      : client_(client),
        client_deadline_(client_deadline),
        buffers_(buffers),
        write_timeout_(write_timeout) {}

  boost::asio::awaitable<RelayOutcome> run(upstream::Exchange& exchange,
                                           AnswerTranslator& translator,
                                           std::string_view head_fields, bool keep_alive,
                                           const RelayOptions& options);

 private:
  boost::asio::awaitable<RelayOutcome> relay_events(upstream::Exchange& exchange,
                                                    AnswerTranslator& translator,
                                                    std::string_view head_fields, bool keep_alive,
                                                    const RelayOptions& options);
  boost::asio::awaitable<RelayOutcome> relay_body(upstream::Exchange& exchange,
                                                  AnswerTranslator& translator,
                                                  std::string_view head_fields, bool keep_alive,
                                                  const RelayOptions& options);
  // Writes `head` (if not empty) and `payload`, as an HTTP chunk when
  // `chunked`; `last` adds the chunked body's end. Returns whether all of it
  // was written.
  boost::asio::awaitable<bool> write(std::string_view head, std::string_view payload, bool chunked,
                                     bool last, RelayOutcome& outcome);

  boost::asio::ip::tcp::socket& client_;
  SocketDeadline& client_deadline_;
  Relay::Buffers& buffers_;
  std::chrono::milliseconds write_timeout_;
};

}  // namespace sluice::stream
