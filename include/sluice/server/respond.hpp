#pragma once

#include <boost/asio/awaitable.hpp>
#include <string>
#include <string_view>

#include "sluice/openai/api_error.hpp"
#include "sluice/server/request_context.hpp"

// Writing the answers the gateway makes itself, with the lines sluice adds
// to every answer.
namespace sluice::server {

// Writes a complete response with any body / a JSON body / an error.
boost::asio::awaitable<bool> respond_body(RequestContext& context, unsigned status,
                                          std::string_view content_type, std::string_view body,
                                          std::string_view extra_fields = {});
boost::asio::awaitable<bool> respond_json(RequestContext& context, unsigned status,
                                          std::string_view body,
                                          std::string_view extra_fields = {});
boost::asio::awaitable<bool> respond_error(RequestContext& context, const ApiError& error,
                                           std::string_view extra_fields = {});

// Appends the lines that say which request this was, which deployment
// answered it and after how many attempts.
void append_request_fields(std::string& fields, const RequestContext& context);

// Room for the lines a relayed answer adds, reserved once.
inline constexpr std::size_t kTypicalResponseFieldBytes = 256;

}  // namespace sluice::server
