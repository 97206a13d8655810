#pragma once

#include <boost/asio/ip/tcp.hpp>

#include "sluice/common/drain_aware_read.hpp"
#include "sluice/common/errors.hpp"

namespace sluice {

// Readies a connected socket of either side of the relay:
// - no Nagle delay: every event goes out as it is written;
// - non-blocking, so that writes are offered to the socket before anything
//   is awaited (write_now in eager_write.hpp);
// - TCP_INQ, so that a read tells when it emptied the socket and the next
//   one waits for readiness without trying first (drain_aware_read.hpp).
//   Reads through TLS ignore it.
inline void prepare_relay_socket(boost::asio::ip::tcp::socket& socket) {
  error_code ignored;
  socket.set_option(boost::asio::ip::tcp::no_delay(true), ignored);
  socket.non_blocking(true, ignored);
  enable_drain_tracking(socket);
}

}  // namespace sluice
