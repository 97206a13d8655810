#include "sluice/upstream/response_parser.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "sluice/common/hex.hpp"
#include "sluice/http/http_head.hpp"

namespace sluice::upstream {

namespace http = boost::beast::http;
using boost::beast::error_code;

namespace {

// Room for a typical response's forwarded lines at once.
constexpr std::size_t kTypicalLinesBytes = 256;

// A field's value that is a whole number and nothing else.
std::optional<unsigned> whole_number(std::string_view value) {
  unsigned number = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec != std::errc() || end != value.data() + value.size()) return std::nullopt;
  return number;
}

}  // namespace

// x-request-id and x-ratelimit-*: the names the gateway's answer gives its
// own values, which the upstream's are renamed out of the way of.
bool is_renamed_from_upstream(std::string_view name) {
  constexpr std::size_t kNameOrPrefixSize = 12;  // "x-request-id", "x-ratelimit-"
  if (name.size() < kNameOrPrefixSize || (name[0] | 0x20) != 'x') return false;
  if (name.size() == kNameOrPrefixSize && field_name_is(name, "x-request-id")) return true;
  return field_name_is(name.substr(0, kNameOrPrefixSize), "x-ratelimit-");
}

std::size_t ResponseParser::take_body(std::string_view body, error_code& ec) {
  if (body_views_ != nullptr) {
    if (body.empty()) return 0;
    auto& views = *body_views_;
    if (!views.empty() && views.back().data() + views.back().size() == body.data()) {
      views.back() = {views.back().data(), views.back().size() + body.size()};
    } else {
      views.push_back(body);
    }
    body_taken_ += body.size();
    return body.size();
  }
  // As Beast's buffer_body: what does not fit waits for the next buffer.
  if (body_data_ == nullptr) {
    ec = parse_wait::need_buffer;
    return 0;
  }
  const std::size_t taken = std::min(body_space_, body.size());
  if (taken > 0) std::memcpy(body_data_, body.data(), taken);
  body_data_ += taken;
  body_space_ -= taken;
  body_taken_ += taken;
  if (taken < body.size()) ec = parse_wait::need_buffer;
  return taken;
}

bool ResponseParser::is_event_stream() const {
  auto type = content_type();
  return type.size() >= 17 && iequals(type.substr(0, 17), "text/event-stream");
}

void ResponseParser::on_request_impl(http::verb, boost::beast::string_view,
                                     boost::beast::string_view, int, error_code& ec) {
  ec = http::error::bad_method;  // a response parser never sees a request line
}

std::size_t ResponseParser::read_plain_head(std::string_view bytes) {
  const char* p = bytes.data();
  // A head longer than the limit is Beast's to refuse.
  const char* const last = p + plain_head_room(bytes.size());
  constexpr std::size_t kStatusLineStart = 13;  // "HTTP/1.1 200 "
  if (static_cast<std::size_t>(last - p) < kStatusLineStart) return 0;
  unsigned version = 11;
  if (std::memcmp(p, "HTTP/1.1 ", 9) != 0) {
    if (std::memcmp(p, "HTTP/1.0 ", 9) != 0) return 0;
    version = 10;
  }
  const auto digit = [](char c) { return static_cast<unsigned>(c - '0'); };
  if (digit(p[9]) > 9 || digit(p[10]) > 9 || digit(p[11]) > 9 || p[12] != ' ') return 0;
  const unsigned status = digit(p[9]) * 100 + digit(p[10]) * 10 + digit(p[11]);
  // Whether these have a body the status decides, not the fields.
  if (status / 100 == 1 || status == 204 || status == 304) return 0;
  p = skip_text(p + kStatusLineStart, last);
  if (last - p < 2 || p[0] != '\r' || p[1] != '\n') return 0;
  begin_head(status);

  PlainFraming framing;
  // Beast's parser counts chunk sizes against a body limit; the plain
  // reader follows chunks only where there is none (the gateway sets none).
  framing.chunked_allowed = !has_body_limit();
  const char* const body =
      scan_plain_fields(p + 2, last, [&](std::string_view name, std::string_view value) {
        if (is_hop_by_hop_header(name)) return framing.take(name, value);
        keep_field(name, value);
        return true;
      });
  // A body that runs to the end of the connection is Beast's to frame.
  const bool framed =
      framing.chunked || (framing.content_length && within_body_limit(*framing.content_length));
  if (body == nullptr || !framed) {
    lines_.clear();
    content_type_at_ = content_type_size_ = 0;
    retry_after_.reset();
    retry_after_ms_.reset();
    status_ = 0;
    return 0;
  }
  take_plain_head(framing, version);
  return static_cast<std::size_t>(body - bytes.data());
}

std::size_t ResponseParser::take_plain_body(std::string_view bytes, error_code& ec) {
  ec = {};
  if (chunked()) return take_plain_chunks(bytes, ec);
  const auto length =
      static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), body_remaining_));
  const std::size_t taken = take_body(bytes.substr(0, length), ec);
  body_remaining_ -= taken;
  if (body_remaining_ == 0) end_plain_body();
  return taken;
}

std::size_t ResponseParser::take_plain_chunks(std::string_view bytes, error_code& ec) {
  std::size_t used = 0;
  for (;;) {
    if (body_remaining_ > 0) {
      // Inside a chunk's data.
      const auto length =
          static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size() - used, body_remaining_));
      if (length == 0) return used;
      const std::size_t taken = take_body(bytes.substr(used, length), ec);
      used += taken;
      body_remaining_ -= taken;
      if (ec || body_remaining_ > 0) return used;
      // The CRLF after the data is read with the next chunk line, as Beast
      // reads it.
      chunk_data_ended_ = true;
      if (used == bytes.size()) return used;
    }
    // A chunk line: the CRLF that ends the last chunk's data, a size in
    // hexadecimal alone on its line; after a zero size, the blank line.
    const char* p = bytes.data() + used;
    const char* const last = bytes.data() + bytes.size();
    if (chunk_data_ended_) {
      // Beast's parser waits for two bytes past the CRLF before it checks.
      if (last - p < 4) {
        ec = parse_wait::need_more;
        return used;
      }
      // Anything else is Beast's to refuse.
      if (p[0] != '\r' || p[1] != '\n') return hand_over_chunks(bytes, used, ec);
      p += 2;
    }
    const char* const digits = p;
    std::uint64_t size = 0;
    // 15 digits cannot overflow; longer sizes are Beast's to judge.
    for (; p < last && p - digits < 16; ++p) {
      const int value = hex_digit_value(*p);
      if (value < 0) break;
      size = size * 16 + static_cast<std::uint64_t>(value);
    }
    const std::size_t digit_count = static_cast<std::size_t>(p - digits);
    if (p == last && digit_count < 16) {
      ec = parse_wait::need_more;  // the line is not whole yet
      return used;
    }
    // Extensions, trailers, a long or missing size: Beast's to read.
    const bool plain_line = digit_count > 0 && digit_count < 16 && *p == '\r';
    if (plain_line && last - p < 2) {
      ec = parse_wait::need_more;
      return used;
    }
    if (!plain_line || p[1] != '\n') return hand_over_chunks(bytes, used, ec);
    p += 2;
    if (size > 0) {
      used = static_cast<std::size_t>(p - bytes.data());
      body_remaining_ = size;
      chunk_data_ended_ = false;
      continue;
    }
    // The last chunk, and no trailer: the blank line ends the body.
    if (last - p < 2) {
      ec = parse_wait::need_more;
      return used;
    }
    if (p[0] != '\r' || p[1] != '\n') return hand_over_chunks(bytes, used, ec);
    end_plain_body();
    return static_cast<std::size_t>(p + 2 - bytes.data());
  }
}

std::size_t ResponseParser::hand_over_chunks(std::string_view bytes, std::size_t used,
                                             error_code& ec) {
  return used + hand_chunks_to_beast(chunk_data_ended_, bytes.substr(used), ec);
}

void ResponseParser::begin_head(unsigned status) {
  status_ = status;
  lines_.reserve(kTypicalLinesBytes);
}

void ResponseParser::on_response_impl(int code, boost::beast::string_view, int, error_code&) {
  if (priming()) return;  // the head is the plain reader's
  begin_head(static_cast<unsigned>(code));
}

void ResponseParser::on_field_impl(http::field name, boost::beast::string_view name_text,
                                   boost::beast::string_view value, error_code&) {
  // Beast knows every hop-by-hop name, so an unknown one is end-to-end.
  if (is_hop_by_hop_field(name)) {
    const std::string_view options(value.data(), value.size());
    if (name == http::field::connection && !iequals(options, "keep-alive") &&
        !iequals(options, "close")) {
      if (!connection_options_.empty()) connection_options_ += ',';
      connection_options_.append(options);
    }
    return;
  }
  keep_field({name_text.data(), name_text.size()}, {value.data(), value.size()});
}

void ResponseParser::keep_field(std::string_view name, std::string_view value) {
  if (field_name_is(name, "retry-after")) {
    if (auto seconds = whole_number(value)) retry_after_ = std::chrono::seconds(*seconds);
  } else if (field_name_is(name, "retry-after-ms")) {
    if (auto millis = whole_number(value)) retry_after_ms_ = std::chrono::milliseconds(*millis);
  } else if (field_name_is(name, "content-type")) {
    content_type_at_ = lines_.size() + name.size() + 2;
    content_type_size_ = value.size();
  }
  if (is_renamed_from_upstream(name)) lines_.append(kRenamedPrefix);
  // Most lines are written "Name: value" and lie whole in the buffer: they
  // are copied as they came. Any other spacing, or a value Beast unfolded
  // into a buffer of its own, is written out piece by piece.
  const char* const name_end = name.data() + name.size();
  const char* const value_end = value.data() + value.size();
  if (value.data() == name_end + 2 && std::memcmp(name_end, ": ", 2) == 0 &&
      std::memcmp(value_end, "\r\n", 2) == 0) {
    lines_.append(name.data(), static_cast<std::size_t>(value_end + 2 - name.data()));
    return;
  }
  lines_.append(name.data(), name.size()).append(": ", 2);
  lines_.append(value.data(), value.size()).append("\r\n", 2);
}

void ResponseParser::on_header_impl(error_code&) {
  if (!connection_options_.empty()) drop_connection_options();
}

void ResponseParser::drop_connection_options() {
  const auto listed = [this](std::string_view name) {
    if (token_list_has(connection_options_, name)) return true;
    // A renamed field is named by the name the upstream gave it.
    const std::string_view original = name.substr(std::min(name.size(), kRenamedPrefix.size()));
    return original.size() < name.size() &&
           iequals(name.substr(0, kRenamedPrefix.size()), kRenamedPrefix) &&
           is_renamed_from_upstream(original) && token_list_has(connection_options_, original);
  };
  Lines kept;
  if (lines_without(forwarded_fields(), kept, listed).size() == lines_.size()) return;
  lines_.swap(kept);
  content_type_at_ = content_type_size_ = 0;
  for_each_field_line(forwarded_fields(), [&](const FieldLine& field) {
    if (!field_name_is(field.name, "content-type")) return;
    // As keep_field has it: the last one, its value after ": ".
    content_type_at_ =
        static_cast<std::size_t>(field.line.data() - lines_.data()) + field.name.size() + 2;
    content_type_size_ = field.line.size() - field.name.size() - 4;
  });
}

void ResponseParser::on_body_init_impl(const boost::optional<std::uint64_t>&, error_code&) {}

std::size_t ResponseParser::on_body_impl(boost::beast::string_view body, error_code& ec) {
  return take_body({body.data(), body.size()}, ec);
}

void ResponseParser::on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) {}

std::size_t ResponseParser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                               error_code& ec) {
  if (priming()) return body.size();  // not the upstream's
  return take_body({body.data(), body.size()}, ec);
}

void ResponseParser::on_finish_impl(error_code&) {}

}  // namespace sluice::upstream
