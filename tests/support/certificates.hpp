#pragma once

#include <string>

namespace sluice::testing {

struct Certificate {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed certificate made at test time (EC P-256), valid for
// DNS:localhost and IP:127.0.0.1; it is its own CA.
Certificate make_self_signed_certificate(const std::string& common_name = "localhost");

}  // namespace sluice::testing
