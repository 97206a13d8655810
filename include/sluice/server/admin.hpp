#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <string>

namespace sluice::server {

class Gateway;

// The admin listener, apart from client traffic: GET /metrics (Prometheus
// text), GET /admin/routes (live router state as JSON), POST /admin/reload.
// With server.admin_key set, every request needs `Authorization: Bearer KEY`.
boost::asio::awaitable<void> serve_admin(Gateway& gateway,
                                         boost::asio::ip::tcp::acceptor& acceptor);

// The router view: per deployment its window percentiles, samples, in-flight
// count, recent error rate and cooldown.
std::string render_routes(Gateway& gateway);
// GET /admin/diagnosis: what `sluice doctor --from` reads (first-byte times
// overall, by requests in flight and by prompt class; new connections'
// connect and TLS times), from the windows the router keeps.
std::string render_diagnosis(Gateway& gateway);

}  // namespace sluice::server
