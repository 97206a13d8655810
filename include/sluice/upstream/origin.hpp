#pragma once

#include <cstdint>
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

  // "https://host:port" plus the trust settings, unique per pool.
  std::string key() const;
  // The Host header value: the port is left out when it is the scheme's default.
  std::string host_header() const;

  static Origin from(const config::Deployment& deployment);
};

}  // namespace sluice::upstream
