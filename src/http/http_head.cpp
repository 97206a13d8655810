#include "sluice/http/http_head.hpp"

#include <boost/beast/http/status.hpp>
#include <charconv>

namespace sluice {

HeadWriter& HeadWriter::status_line(unsigned status) {
  out_ += "HTTP/1.1 ";
  out_ += std::to_string(status);
  out_ += ' ';
  auto reason =
      boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(status));
  out_.append(reason.data(), reason.size());
  out_ += "\r\n";
  return *this;
}

HeadWriter& HeadWriter::request_line(std::string_view method,
                                     std::span<const std::string_view> target) {
  out_.append(method);
  out_ += ' ';
  for (auto piece : target) out_.append(piece);
  out_ += " HTTP/1.1\r\n";
  return *this;
}

HeadWriter& HeadWriter::field(std::string_view name, std::string_view value) {
  out_.append(name);
  out_ += ": ";
  out_.append(value);
  out_ += "\r\n";
  return *this;
}

HeadWriter& HeadWriter::field(std::string_view name, std::size_t value) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  return field(name, std::string_view(digits, static_cast<std::size_t>(end - digits)));
}

HeadWriter& HeadWriter::raw_fields(std::string_view lines) {
  out_.append(lines);
  return *this;
}

std::string& HeadWriter::finish() {
  out_ += "\r\n";
  return out_;
}

bool token_list_has(std::string_view list, std::string_view token) {
  const auto is_whitespace = [](char c) { return c == ' ' || c == '\t'; };
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view element = list.substr(0, comma);
    while (!element.empty() && is_whitespace(element.front())) element.remove_prefix(1);
    while (!element.empty() && is_whitespace(element.back())) element.remove_suffix(1);
    if (iequals(element, token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

bool is_hop_by_hop_header(std::string_view name) {
  // By length first: most names a request carries are none of these, and
  // the length alone rules them out.
  switch (name.size()) {
    case 2:
      return field_name_is(name, "te");
    case 4:
      return field_name_is(name, "host");
    case 7:
      return field_name_is(name, "trailer") || field_name_is(name, "upgrade");
    case 10:
      return field_name_is(name, "connection") || field_name_is(name, "keep-alive");
    case 14:
      return field_name_is(name, "content-length");
    case 16:
      return field_name_is(name, "proxy-connection");
    case 17:
      return field_name_is(name, "transfer-encoding");
    case 18:
      return field_name_is(name, "proxy-authenticate");
    case 19:
      return field_name_is(name, "proxy-authorization");
    default:
      return false;
  }
}

bool is_hop_by_hop_field(boost::beast::http::field name) {
  using enum boost::beast::http::field;
  switch (name) {
    case te:
    case host:
    case trailer:
    case upgrade:
    case connection:
    case keep_alive:
    case content_length:
    case proxy_connection:
    case transfer_encoding:
    case proxy_authenticate:
    case proxy_authorization:
      return true;
    default:
      return false;
  }
}

}  // namespace sluice
