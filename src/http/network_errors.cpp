#include "sluice/http/network_errors.hpp"

#include <boost/asio/error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>

namespace sluice {

bool is_benign_network_error(const error_code& ec) {
  namespace net = boost::asio;
  return ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::connection_aborted || ec == net::error::operation_aborted ||
         ec == net::error::broken_pipe || ec == net::error::not_connected ||
         ec == net::error::bad_descriptor || ec == net::ssl::error::stream_truncated ||
         ec == boost::beast::http::error::end_of_stream ||
         ec == boost::beast::http::error::partial_message;
}

}  // namespace sluice
