#include "sluice/upstream/response_parser.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "sluice/common/http_head.hpp"

namespace sluice::upstream {

namespace http = boost::beast::http;
using boost::beast::error_code;

namespace {

// Room for a typical response's forwarded lines at once.
constexpr std::size_t kTypicalLinesBytes = 256;

// Takes as much of `body` as fits in [data, data + space), as Beast's
// buffer_body does: what does not fit waits for the next buffer.
std::size_t fill(char*& data, std::size_t& space, std::string_view body, error_code& ec) {
  if (data == nullptr) {
    ec = http::error::need_buffer;
    return 0;
  }
  const std::size_t taken = std::min(space, body.size());
  if (taken > 0) std::memcpy(data, body.data(), taken);
  data += taken;
  space -= taken;
  if (taken < body.size()) ec = http::error::need_buffer;
  return taken;
}

}  // namespace

bool ResponseParser::is_event_stream() const {
  auto type = content_type();
  return type.size() >= 17 && iequals(type.substr(0, 17), "text/event-stream");
}

void ResponseParser::on_request_impl(http::verb, boost::beast::string_view,
                                     boost::beast::string_view, int, error_code& ec) {
  ec = http::error::bad_method;  // a response parser never sees a request line
}

void ResponseParser::on_response_impl(int code, boost::beast::string_view, int, error_code&) {
  status_ = static_cast<unsigned>(code);
  lines_.reserve(kTypicalLinesBytes);
}

void ResponseParser::on_field_impl(http::field name, boost::beast::string_view name_text,
                                   boost::beast::string_view value, error_code&) {
  // Beast knows every hop-by-hop name, so an unknown one is end-to-end.
  if (is_hop_by_hop_field(name)) return;
  if (name == http::field::retry_after) {
    unsigned seconds = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
    if (ec == std::errc() && end == value.data() + value.size()) {
      retry_after_ = std::chrono::seconds(seconds);
    }
  }
  if (name == http::field::content_type) {
    content_type_at_ = lines_.size() + name_text.size() + 2;
    content_type_size_ = value.size();
  }
  // Most lines are written "Name: value" and lie whole in the buffer: they
  // are copied as they came. Any other spacing, or a value Beast unfolded
  // into a buffer of its own, is written out piece by piece.
  const char* const name_end = name_text.data() + name_text.size();
  const char* const value_end = value.data() + value.size();
  if (value.data() == name_end + 2 && std::memcmp(name_end, ": ", 2) == 0 &&
      std::memcmp(value_end, "\r\n", 2) == 0) {
    lines_.append(name_text.data(), static_cast<std::size_t>(value_end + 2 - name_text.data()));
    return;
  }
  lines_.append(name_text.data(), name_text.size()).append(": ", 2);
  lines_.append(value.data(), value.size()).append("\r\n", 2);
}

void ResponseParser::on_header_impl(error_code&) {}

void ResponseParser::on_body_init_impl(const boost::optional<std::uint64_t>&, error_code&) {}

std::size_t ResponseParser::on_body_impl(boost::beast::string_view body, error_code& ec) {
  return fill(body_data_, body_space_, {body.data(), body.size()}, ec);
}

void ResponseParser::on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) {}

std::size_t ResponseParser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                               error_code& ec) {
  return fill(body_data_, body_space_, {body.data(), body.size()}, ec);
}

void ResponseParser::on_finish_impl(error_code&) {}

}  // namespace sluice::upstream
