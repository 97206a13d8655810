#pragma once

#include <boost/asio/ssl/context.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace sluice::upstream {

// One client TLS context per trust setting, shared by every thread (OpenSSL
// contexts are safe to use concurrently once configured). Built on first use;
// the lock is taken only when a new connection is opened.
class TlsContexts {
 public:
  // Throws std::runtime_error if ca_file cannot be loaded.
  boost::asio::ssl::context& get(bool verify, const std::string& ca_file);

 private:
  std::mutex mutex_;
  std::map<std::pair<bool, std::string>, std::unique_ptr<boost::asio::ssl::context>> contexts_;
};

}  // namespace sluice::upstream
