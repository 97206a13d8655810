#pragma once

#include <boost/beast/http/field.hpp>
#include <cstddef>
#include <string>
#include <string_view>

namespace sluice {

// Writes an HTTP/1.1 head straight into a reusable string: cheaper than
// building a Beast fields container for heads we only ever serialise.
class HeadWriter {
 public:
  // Room for a typical head at once: appending field by field to an empty
  // string would reallocate it several times per request.
  static constexpr std::size_t kTypicalHeadBytes = 512;

  explicit HeadWriter(std::string& out) : out_(out) {
    out_.clear();
    out_.reserve(kTypicalHeadBytes);
  }

  HeadWriter& status_line(unsigned status);
  HeadWriter& request_line(std::string_view method, std::string_view target);
  HeadWriter& field(std::string_view name, std::string_view value);
  HeadWriter& field(std::string_view name, std::size_t value);
  // Copies preformatted "Name: value\r\n" lines.
  HeadWriter& raw_fields(std::string_view lines);
  std::string& finish();

 private:
  std::string& out_;
};

// Hop-by-hop headers (RFC 9110 §7.6.1) and the framing headers a proxy
// always sets itself.
bool is_hop_by_hop_header(std::string_view name);
// The same set for a name the parser has looked up already: Beast knows
// every hop-by-hop name, so an unknown one is end-to-end.
bool is_hop_by_hop_field(boost::beast::http::field name);

// ASCII case-insensitive equality, as header names compare.
inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    char y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace sluice
