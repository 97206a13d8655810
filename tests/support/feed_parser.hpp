#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <string_view>

namespace sluice::testing {

// Feeds `bytes` to a Beast-style parser until it stops taking them; returns
// how many it took. `ec` is the last put's outcome.
template <class Parser>
std::size_t feed_parser(Parser& parser, std::string_view bytes, boost::system::error_code& ec) {
  std::size_t used = 0;
  while (used < bytes.size()) {
    ec = {};
    auto taken = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += taken;
    if (ec || taken == 0) break;
  }
  return used;
}

}  // namespace sluice::testing
