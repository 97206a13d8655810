#include "sluice/server/client_request.hpp"

#include <cstring>

#include "sluice/common/http_head.hpp"

namespace sluice::server {

namespace http = boost::beast::http;
using boost::beast::error_code;

namespace {

// Room for a typical SDK request's forwarded lines at once, within the
// largest block the thread's block cache recycles (the string adds a byte
// for its terminator).
constexpr std::size_t kTypicalForwardedBytes = BlockCache::kLargestBlock - 1;
constexpr std::size_t kTypicalWithheldBytes = 192;

}  // namespace

bool is_withheld_from_upstream(std::string_view name) {
  if (is_hop_by_hop_header(name)) return true;
  switch (name.size()) {
    case 6:
      return iequals(name, "expect");
    case 7:
      return iequals(name, "api-key");
    case 9:
      return iequals(name, "x-api-key");
    case 11:
      return iequals(name, "traceparent");
    case 12:
      return iequals(name, "x-request-id");
    case 13:
      return iequals(name, "authorization");
    case 15:
      return iequals(name, "accept-encoding");
    default:
      return false;
  }
}

std::string_view ClientRequest::name_of(const FieldEntry& entry) const {
  const Text& lines = entry.withheld ? withheld_ : forwarded_;
  return {lines.data() + entry.at, entry.name_size};
}

std::string_view ClientRequest::value_of(const FieldEntry& entry) const {
  const Text& lines = entry.withheld ? withheld_ : forwarded_;
  return {lines.data() + entry.at + entry.name_size + 2, entry.value_size};
}

std::string_view ClientRequest::operator[](std::string_view name) const {
  for (const auto& entry : fields_) {
    if (entry.name_size == name.size() && iequals(name_of(entry), name)) return value_of(entry);
  }
  return {};
}

std::string_view ClientRequest::operator[](http::field name) const {
  for (const auto& entry : fields_) {
    if (entry.name == name) return value_of(entry);
  }
  return {};
}

void ClientRequest::on_request_impl(http::verb method, boost::beast::string_view method_text,
                                    boost::beast::string_view target, int version, error_code&) {
  method_ = method;
  method_size_ = method_text.size();
  version_ = static_cast<unsigned>(version);
  start_line_.reserve(method_text.size() + target.size());
  start_line_.append(method_text.data(), method_text.size());
  start_line_.append(target.data(), target.size());
  forwarded_.reserve(kTypicalForwardedBytes);
  withheld_.reserve(kTypicalWithheldBytes);
}

void ClientRequest::on_response_impl(int, boost::beast::string_view, int, error_code& ec) {
  ec = http::error::bad_version;  // a request parser never sees a status line
}

bool is_withheld_from_upstream(http::field name, std::string_view name_text) {
  switch (name) {
    case http::field::unknown:
      // Names Beast does not know, among them the gateway's own.
      return is_withheld_from_upstream(name_text);
    case http::field::expect:
    case http::field::authorization:
    case http::field::accept_encoding:
      return true;
    default:
      return is_hop_by_hop_field(name);
  }
}

void ClientRequest::on_field_impl(http::field name, boost::beast::string_view name_text,
                                  boost::beast::string_view value, error_code&) {
  const std::string_view name_view(name_text.data(), name_text.size());
  const bool withheld = is_withheld_from_upstream(name, name_view);
  Text& lines = withheld ? withheld_ : forwarded_;
  const std::size_t at = lines.size();
  fields_.push_back(FieldEntry{name, withheld, static_cast<std::uint32_t>(name_view.size()),
                               static_cast<std::uint32_t>(at),
                               static_cast<std::uint32_t>(value.size())});
  // One resize and two copies: appending the four pieces cost twice as much.
  lines.resize(at + name_view.size() + value.size() + 4);
  char* out = lines.data() + at;
  std::memcpy(out, name_view.data(), name_view.size());
  out += name_view.size();
  *out++ = ':';
  *out++ = ' ';
  std::memcpy(out, value.data(), value.size());
  out += value.size();
  *out++ = '\r';
  *out = '\n';
}

void ClientRequest::on_header_impl(error_code&) {}

void ClientRequest::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                      error_code&) {
  // The parser has checked the length against the body limit already.
  if (content_length) body_.reserve(static_cast<std::size_t>(*content_length));
}

std::size_t ClientRequest::on_body_impl(boost::beast::string_view body, error_code&) {
  body_.append(body.data(), body.size());
  return body.size();
}

void ClientRequest::on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) {}

std::size_t ClientRequest::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                              error_code&) {
  body_.append(body.data(), body.size());
  return body.size();
}

void ClientRequest::on_finish_impl(error_code&) {}

}  // namespace sluice::server
