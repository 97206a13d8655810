#include "sluice/upstream/tls_contexts.hpp"

namespace sluice::upstream {

boost::asio::ssl::context& TlsContexts::get(bool verify, const std::string& ca_file) {
  namespace ssl = boost::asio::ssl;
  std::lock_guard lock(mutex_);
  auto& slot = contexts_[{verify, ca_file}];
  if (!slot) {
    auto context = std::make_unique<ssl::context>(ssl::context::tls_client);
    context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                         ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                         ssl::context::no_tlsv1_1);
    if (verify) {
      context->set_default_verify_paths();
      if (!ca_file.empty()) context->load_verify_file(ca_file);
      context->set_verify_mode(ssl::verify_peer);
    } else {
      context->set_verify_mode(ssl::verify_none);
    }
    slot = std::move(context);
  }
  return *slot;
}

}  // namespace sluice::upstream
