#pragma once

#include <boost/system/error_code.hpp>
#include <string>
#include <string_view>

namespace sluice {

using error_code = boost::system::error_code;

// The one list of network errors that are part of normal life (a peer went
// away, we cancelled an operation): logged at debug, never as failures.
bool is_benign_network_error(const error_code& ec);

}  // namespace sluice
