#pragma once

#include <string>

namespace sluice::testing {

struct Certificate {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed certificate made at test time (EC P-256) for the names in
// `subject_alt_names`; it is its own CA, and can sign others
// (make_signed_certificate).
Certificate make_self_signed_certificate(
    const std::string& subject_alt_names = "DNS:localhost,IP:127.0.0.1",
    const std::string& common_name = "sluice test");

// A certificate (EC P-256, not a CA) with `common_name`, signed by `issuer`,
// one that make_self_signed_certificate made: a client certificate for
// mutual TLS, or a server's that chains to a test CA.
Certificate make_signed_certificate(const Certificate& issuer, const std::string& common_name,
                                    const std::string& subject_alt_names = "DNS:localhost");

}  // namespace sluice::testing
