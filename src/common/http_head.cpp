#include "sluice/common/http_head.hpp"

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

HeadWriter& HeadWriter::request_line(std::string_view method, std::string_view target) {
  out_.append(method);
  out_ += ' ';
  out_.append(target);
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

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool is_hop_by_hop_header(std::string_view name) {
  static constexpr std::string_view kHopByHop[] = {"connection",
                                                   "keep-alive",
                                                   "proxy-connection",
                                                   "proxy-authenticate",
                                                   "proxy-authorization",
                                                   "te",
                                                   "trailer",
                                                   "transfer-encoding",
                                                   "upgrade",
                                                   "content-length",
                                                   "host"};
  for (auto hop : kHopByHop) {
    if (iequals(name, hop)) return true;
  }
  return false;
}

}  // namespace sluice
