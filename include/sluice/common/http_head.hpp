#pragma once

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

bool iequals(std::string_view a, std::string_view b);

}  // namespace sluice
