#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace sluice::server {

class Worker;

// Serves one client connection: reads requests with limits and timeouts,
// hands each to the pipeline, keeps the connection alive between them.
// `socket` was accepted non-blocking from a listener that
// prepare_relay_listener set (relay_socket.hpp).
boost::asio::awaitable<void> serve_connection(Worker& worker, boost::asio::ip::tcp::socket socket);

// Answers 503 and closes: the gateway is at server.max_connections.
boost::asio::awaitable<void> refuse_connection(boost::asio::ip::tcp::socket socket);

}  // namespace sluice::server
