#pragma once

#include <boost/asio/awaitable.hpp>

#include "sluice/server/request_context.hpp"
#include "sluice/server/request_job.hpp"

namespace sluice::server {

// The only place that knows the order of the phases a request goes through:
//   resolve → authorize → shape → cache lookup → forward → respond → account
// Each phase is a file of its own in this folder.
class Pipeline {
 public:
  // One request from its first phase to its last, counted in
  // sluice_requests_in_flight while it lives. The connection's coroutine
  // holds it and awaits answer(), then calls account(): a request that only
  // needs forwarding is decided in plain code and answered by forward's
  // coroutine, with no coroutine frame of the pipeline's own to allocate.
  class Request {
   public:
    explicit Request(RequestContext& context);
    ~Request();
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

    // resolve → authorize → shape, then the awaitable that answers.
    // Returns whether the client connection may serve another request.
    boost::asio::awaitable<bool> answer();
    // Once the answer is written.
    void account(bool keep);

   private:
    RequestContext& context_;
    RequestJob job_;
  };

 private:
  // The bookkeeping around every request: trace, metrics, access log.
  static void begin(RequestContext& context);
};

}  // namespace sluice::server
