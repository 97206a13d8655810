#pragma once

#include <string>

namespace sluice::testing {

struct Certificate {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed certificate made at test time (EC P-256) for the names in
// `subject_alt_names`; it is its own CA.
Certificate make_self_signed_certificate(
    const std::string& subject_alt_names = "DNS:localhost,IP:127.0.0.1");

}  // namespace sluice::testing
