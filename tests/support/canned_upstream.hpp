#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <string>
#include <thread>
#include <vector>

namespace sluice::testing {

// An upstream that answers every request with the same response, sent in
// one write so that it arrives whole, or in parts some time apart so that
// each arrives in a read of its own. For the answers sluice-mock never
// gives: exact bytes, fields and framing of a test's choosing.
class CannedUpstream {
 public:
  explicit CannedUpstream(std::string response)
      : CannedUpstream(std::vector{std::move(response)}) {}
  explicit CannedUpstream(std::vector<std::string> parts);
  ~CannedUpstream();

  std::string base_url() const;

 private:
  boost::asio::awaitable<void> accept_connections();
  boost::asio::awaitable<void> answer(boost::asio::ip::tcp::socket connection);

  std::vector<std::string> parts_;
  boost::asio::io_context context_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
};

// `data` as one chunk of a chunked body.
std::string chunk(const std::string& data);

}  // namespace sluice::testing
