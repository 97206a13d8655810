#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/http/socket_deadline.hpp"
#include "sluice/metrics/gap_tracker.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/stream/sse_events.hpp"
#include "sluice/stream/sse_scanner.hpp"
#include "sluice/upstream/client.hpp"

namespace sluice::stream {

struct RelayOutcome {
  // True when the upstream body was relayed to its end.
  bool complete = false;
  // True when nothing reached the client yet, so the caller may still fail
  // over or answer with an error of its own.
  bool nothing_sent = true;
  bool client_failed = false;  // a write to the client failed
  std::optional<upstream::UpstreamError> upstream_error;
  std::uint64_t bytes_out = 0;
  TimePoint first_write{};
  // Token usage the upstream reported (the final chunk of a stream, the
  // `usage` object of a JSON body).
  std::optional<Usage> usage;
  std::size_t events = 0;  // SSE events relayed
  bool saw_done = false;   // a stream's `data: [DONE]` went by
  // Read only with RelayOptions::inspect_end: a JSON body's last non-blank
  // byte closes an object; a finish_reason went by, and it was "length".
  bool json_ends_object = true;
  bool saw_finish_reason = false;
  bool finish_length = false;
  // The body outgrew RelayOptions::capture_limit; the capture was dropped.
  bool capture_overflowed = false;
  // The answer's end is the connection's: the client must not be kept.
  bool close_delimited = false;
};

struct RelayOptions {
  StreamErrorEvent error_event = &stream_error_event;
  // The gateway asked the upstream for a usage chunk the client did not ask
  // for: keep it from the client.
  bool strip_usage_only_chunks = false;
  // False for an HTTP/1.0 client, which knows no chunked encoding: a body
  // of unknown length is sent as it is, and the connection's close ends it.
  bool client_reads_chunks = true;
  // Tell whether a JSON body ends its object and whether the answer was
  // stopped by its length (the quality guard's tests).
  bool inspect_end = false;
  // Where gaps between streamed reads go (both optional: a default handle
  // records nothing).
  metrics::GapTracker* gaps = nullptr;
  metrics::HistogramHandle gap_histogram;
  unsigned shard = 0;
  // Set only for a response that may be cached: the upstream body is
  // appended here as read, up to capture_limit bytes.
  std::string* capture = nullptr;
  std::size_t capture_limit = 0;
  // Called once the whole upstream body has been read, before its last bytes
  // are written to the client: whatever it records is in place by the time
  // the client can send its next request.
  std::function<void(const RelayOutcome&)> on_upstream_complete;
};

// Relays an upstream response to the client as it is read: each read is
// written at once, framed as an HTTP chunk around the upstream's bytes (never
// re-serialised, and from a plain upstream never copied: the write points
// into the upstream connection's read buffer). The response head is sent together with the first
// body bytes. If the upstream fails after that, an event-stream gets a final `data: {"error":...}`
// event and a clean end; other bodies are cut off so the client can tell.
class Relay {
 public:
  // The read buffer starts at kFirstReadSize and grows (up to kLargestRead)
  // when reads keep filling it: streams keep a small buffer, bulk bodies get
  // fewer, larger reads.
  static constexpr std::size_t kFirstReadSize = 1024;  // a few events of a stream
  static constexpr std::size_t kLargestRead = 16 * 1024;

  // What a relay works in, kept by the client connection from one request to
  // the next, so that relaying a request allocates none of it.
  struct Buffers {
    // Where a body is copied to when it cannot be relayed from the upstream
    // connection's own buffer (TLS upstreams; error bodies read whole).
    // Allocated on first use: a plain upstream's streams never need it.
    std::vector<char>& copy_buffer() {
      if (read.empty()) read.resize(kFirstReadSize);
      return read;
    }
    // Lets go of what a large body or head grew, keeping what an ordinary
    // request needs, before the buffers serve another connection.
    void release_grown();
    std::vector<char> read;
    std::string head;
    // One read's body: views of the upstream connection's buffer, or of
    // `read`.
    std::vector<std::string_view> pieces;
    std::vector<std::string_view> spans;
    std::vector<boost::asio::const_buffer> wire;
    std::array<char, 20> chunk_size_line{};  // of the chunk being written
    std::string json_tail;                   // the last bytes of a JSON body read so far
  };

  // Writes that the client's socket does not take at once may wait up to
  // `write_timeout` each, under `client_deadline`.
  Relay(boost::asio::ip::tcp::socket& client, SocketDeadline& client_deadline, Buffers& buffers,
        std::chrono::milliseconds write_timeout)
      : client_(client),
        client_deadline_(client_deadline),
        buffers_(buffers),
        write_timeout_(write_timeout) {}

  // `head_fields` are preformatted "Name: value\r\n" lines added to the
  // upstream's own headers. `options` is read where it lies, so it must
  // outlive the relay (as a local of the coroutine that awaits it does): a
  // copy would grow run()'s frame past the largest block Asio's per-thread
  // cache recycles (1,020 bytes), and every request would allocate it anew.
  boost::asio::awaitable<RelayOutcome> run(upstream::Exchange& exchange,
                                           std::string_view head_fields, bool keep_alive,
                                           const RelayOptions& options);

 private:
  boost::asio::ip::tcp::socket& client_;
  SocketDeadline& client_deadline_;
  Buffers& buffers_;
  std::chrono::milliseconds write_timeout_;
  // A member rather than a local of run(): that keeps run()'s frame under
  // the size glibc's per-thread cache serves.
  std::optional<SseScanner> scanner_;
};

// The usage object near the end of a JSON body, from its last bytes only
// (OpenAI puts `usage` after `choices`/`data`), so a large body need not be
// kept whole.
std::optional<Usage> usage_from_json_tail(std::string_view tail);

}  // namespace sluice::stream
