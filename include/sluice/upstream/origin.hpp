#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "sluice/config/config.hpp"

namespace sluice::upstream {

// Where a connection goes and how it is secured: connections are pooled and
// reused per origin only.
struct Origin {
  std::string host;
  std::uint16_t port = 0;
  bool tls = false;
  bool tls_verify = true;
  std::string ca_file;
  // The endpoint itself when the host is an IP address.
  std::optional<boost::asio::ip::tcp::endpoint> address;
  // Whether and how HTTP/2 is spoken (config::Http2Mode), and the health
  // checks of an HTTP/2 connection (upstream.http2_ping_*).
  config::Http2Mode http2 = config::Http2Mode::off;
  std::chrono::milliseconds http2_ping_after{30000};
  std::chrono::milliseconds http2_ping_timeout{5000};

  // Carried by the http2 transport: h2c by prior knowledge, or https where
  // ALPN may choose h2. auto on http:// stays with HTTP/1.1.
  bool may_speak_http2() const {
    return http2 == config::Http2Mode::prior_knowledge ||
           (http2 == config::Http2Mode::automatic && tls);
  }

  // "https://host:port" plus the trust settings, unique per pool.
  const std::string& key() const { return key_; }
  // The Host header value: the port is left out when it is the scheme's default.
  const std::string& host_header() const { return host_header_; }

  // Both derived strings are made here, once: the gateway keeps one Origin
  // per deployment in its snapshot instead of rebuilding them per request.
  static Origin from(const config::Deployment& deployment, const config::Upstream& upstream = {});

 private:
  std::string key_;
  std::string host_header_;
};

// The deployment's own header lines ("Name: value\r\n"): its configured
// headers, then its key as a bearer token when it has one.
std::string deployment_fields(const config::Deployment& deployment);

}  // namespace sluice::upstream
