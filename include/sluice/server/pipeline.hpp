#pragma once

#include <boost/asio/awaitable.hpp>

#include "sluice/server/request_context.hpp"

namespace sluice::server {

// The only place that knows the order of the phases a request goes through:
//   resolve → authorize → shape → cache lookup → forward → respond → account
// Each phase is a file of its own in this folder.
class Pipeline {
 public:
  // Returns whether the client connection may serve another request.
  static boost::asio::awaitable<bool> handle(RequestContext& context);

 private:
  // The bookkeeping around every request: trace, metrics, access log.
  static void begin(RequestContext& context);
};

}  // namespace sluice::server
