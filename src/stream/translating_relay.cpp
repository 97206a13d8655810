#include "sluice/stream/translating_relay.hpp"

#include <array>
#include <boost/asio/buffer.hpp>

#include "sluice/http/eager_write.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/stream/finish_reason.hpp"

namespace sluice::stream {

namespace net = boost::asio;

namespace {

void capture(const RelayOptions& options, std::string_view bytes, RelayOutcome& outcome) {
  if (!options.capture || outcome.capture_overflowed) return;
  if (options.capture->size() + bytes.size() > options.capture_limit) {
    outcome.capture_overflowed = true;
    options.capture->clear();
    return;
  }
  options.capture->append(bytes);
}

std::string response_head(unsigned status, std::string_view content_type,
                          std::string_view head_fields, bool keep_alive,
                          std::optional<std::size_t> length, bool chunked) {
  std::string head;
  HeadWriter writer(head);
  writer.status_line(status).field("Content-Type", content_type);
  if (length) {
    writer.field("Content-Length", *length);
  } else if (chunked) {
    writer.field("Transfer-Encoding", "chunked");
  }
  writer.raw_fields(head_fields);
  if (!keep_alive || (!length && !chunked)) writer.field("Connection", "close");
  writer.finish();
  return head;
}

}  // namespace

net::awaitable<bool> TranslatingRelay::write(std::string_view head, std::string_view payload,
                                             bool chunked, bool last, RelayOutcome& outcome) {
  std::array<char, 20> size_line{};
  std::size_t size_line_length = 0;
  if (chunked && !payload.empty()) {
    const int written =
        std::snprintf(size_line.data(), size_line.size(), "%zx\r\n", payload.size());
    size_line_length = static_cast<std::size_t>(written);
  }
  const std::string_view chunk_end = chunked && !payload.empty() ? "\r\n" : "";
  const std::string_view body_end = chunked && last ? "0\r\n\r\n" : "";
  const std::array<net::const_buffer, 5> wire = {
      net::buffer(head), net::buffer(size_line.data(), size_line_length), net::buffer(payload),
      net::buffer(chunk_end), net::buffer(body_end)};
  if (net::buffer_size(wire) == 0) co_return true;
  auto [ec, n] = co_await write_eagerly(client_, client_deadline_, write_timeout_, wire);
  if (outcome.nothing_sent) outcome.first_write = Clock::now();
  outcome.nothing_sent = false;
  outcome.bytes_out += payload.size();
  if (ec) outcome.client_failed = true;
  co_return !ec;
}

net::awaitable<RelayOutcome> TranslatingRelay::run(upstream::Exchange& exchange,
                                                   AnswerTranslator& translator,
                                                   std::string_view head_fields, bool keep_alive,
                                                   const RelayOptions& options) {
  if (exchange.is_event_stream()) {
    co_return co_await relay_events(exchange, translator, head_fields, keep_alive, options);
  }
  co_return co_await relay_body(exchange, translator, head_fields, keep_alive, options);
}

net::awaitable<RelayOutcome> TranslatingRelay::relay_body(upstream::Exchange& exchange,
                                                          AnswerTranslator& translator,
                                                          std::string_view head_fields,
                                                          bool keep_alive,
                                                          const RelayOptions& options) {
  RelayOutcome outcome;
  auto& buffer = buffers_.copy_buffer();
  std::string upstream_body;
  for (;;) {
    auto read = exchange.read_buffered_body(buffer.data(), buffer.size());
    if (!read) read = co_await exchange.read_body(buffer.data(), buffer.size());
    if (!read->ok()) {
      outcome.upstream_error = read->error();
      co_return outcome;
    }
    if (read->value() == 0) break;
    if (upstream_body.size() + read->value() > kLargestTranslatedBody) {
      exchange.abort();
      outcome.upstream_error = upstream::UpstreamError{upstream::Failure::bad_response, {}};
      co_return outcome;
    }
    upstream_body.append(buffer.data(), read->value());
  }
  std::string body;
  translator.body(upstream_body, body);
  outcome.usage = usage_from_json_tail(body);
  if (options.inspect_end) {
    // What the client gets is the translator's whole JSON: judged as one.
    FinishReasonWatch finish_reason;
    finish_reason.feed(body);
    outcome.saw_finish_reason = finish_reason.saw_reason();
    outcome.finish_length = finish_reason.saw_length();
  }
  capture(options, body, outcome);
  if (options.on_upstream_complete) options.on_upstream_complete(outcome);
  const auto head = response_head(translator.status(exchange.status()),
                                  translator.content_type(exchange.content_type()), head_fields,
                                  keep_alive, body.size(), false);
  outcome.complete = co_await write(head, body, false, false, outcome);
  co_return outcome;
}

net::awaitable<RelayOutcome> TranslatingRelay::relay_events(upstream::Exchange& exchange,
                                                            AnswerTranslator& translator,
                                                            std::string_view head_fields,
                                                            bool keep_alive,
                                                            const RelayOptions& options) {
  RelayOutcome outcome;
  const bool chunked = options.client_reads_chunks;
  outcome.close_delimited = !chunked;
  std::string head = response_head(translator.status(exchange.status()),
                                   translator.content_type(exchange.content_type()), head_fields,
                                   keep_alive, std::nullopt, chunked);
  SseScanner scanner;  // reads the usage of the translated events
  scanner.set_strip_usage_only_chunks(options.strip_usage_only_chunks);
  std::vector<std::string_view> spans;  // what the client gets of `out`
  std::string kept;                     // those spans, when one was stripped
  auto& buffer = buffers_.copy_buffer();
  std::string pending;  // upstream bytes of an event not yet whole
  std::string out;
  // RelayOptions::inspect_end: the translated events' finish_reason.
  FinishReasonWatch finish_reason;
  for (;;) {
    auto read = exchange.read_buffered_body(buffer.data(), buffer.size());
    if (!read) read = co_await exchange.read_body(buffer.data(), buffer.size());
    if (!read->ok()) {
      outcome.upstream_error = read->error();
      outcome.usage = scanner.usage();
      outcome.events = scanner.events();
      const bool aborted = read->error().failure == upstream::Failure::aborted;
      if (outcome.nothing_sent || aborted) co_return outcome;
      // After the first byte the client's stream ends with an error event,
      // never a clean end.
      const auto event = options.error_event(
          "The upstream stream was interrupted: " + read->error().describe(),
          read->error().is_timeout() ? "upstream_timeout" : "stream_interrupted");
      co_await write({}, event, chunked, true, outcome);
      co_return outcome;
    }
    const std::size_t n = read->value();
    const bool ended = n == 0 || exchange.finished();
    pending.append(buffer.data(), n);
    out.clear();
    std::size_t consumed = 0;
    for (;;) {
      std::size_t event_end = 0;
      const auto end = next_event_end(std::string_view(pending).substr(consumed), event_end);
      if (end == std::string_view::npos) break;
      translator.event(std::string_view(pending).substr(consumed, event_end), out);
      consumed += end;
    }
    pending.erase(0, consumed);
    if (ended) {
      // An event left incomplete is dropped, as SSE clients drop it.
      translator.end_of_events(out);
      outcome.complete = true;
    }
    std::string_view payload = out;
    if (!out.empty()) {
      if (options.inspect_end) finish_reason.feed(out);
      scanner.feed(out, spans);
      if (ended) scanner.finish(spans);
      capture(options, out, outcome);
      if (options.strip_usage_only_chunks) {
        kept.clear();
        for (const auto span : spans) kept.append(span);
        payload = kept;
      }
      spans.clear();
    }
    if (ended) {
      outcome.usage = scanner.usage();
      outcome.events = scanner.events();
      outcome.saw_done = scanner.saw_done();
      outcome.saw_finish_reason = finish_reason.saw_reason();
      outcome.finish_length = finish_reason.saw_length();
      if (options.on_upstream_complete) options.on_upstream_complete(outcome);
    }
    if (!payload.empty() || ended) {
      const bool written = co_await write(head, payload, chunked, ended, outcome);
      head.clear();
      if (!written) {
        outcome.complete = false;
        exchange.abort();
        co_return outcome;
      }
    }
    if (ended) co_return outcome;
  }
}

}  // namespace sluice::stream
