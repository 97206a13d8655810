#include "sluice/server/client_request.hpp"

#include <algorithm>
#include <boost/beast/http/error.hpp>
#include <cstring>

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
      return field_name_is(name, "expect");
    case 7:
      return field_name_is(name, "api-key");
    case 9:
      return field_name_is(name, "x-api-key");
    case 11:
      return field_name_is(name, "traceparent");
    case 12:
      return field_name_is(name, "x-request-id");
    case 13:
      return field_name_is(name, "authorization");
    case 15:
      return field_name_is(name, "accept-encoding");
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
  // Most names asked for are absent (x-request-id, expect, traceparent, the
  // key's other spellings): one bit answers for them instead of a scan.
  if ((name_marks_ & name_mark(name)) == 0) return {};
  for (const auto& entry : fields_) {
    if (entry.name_size == name.size() && iequals(name_of(entry), name)) return value_of(entry);
  }
  return {};
}

std::size_t ClientRequest::read_plain_head(std::string_view bytes) {
  const char* p = bytes.data();
  // A head longer than the limit is Beast's to refuse.
  const char* const last = p + plain_head_room(bytes.size());

  const char* const method_first = p;
  while (p < last && *p >= 'A' && *p <= 'Z') ++p;
  if (p == method_first || p == last || *p != ' ') return 0;
  const std::string_view method(method_first, static_cast<std::size_t>(p - method_first));
  const char* const target_first = ++p;
  p = skip_visible(p, last, 0x21);
  constexpr std::size_t kVersionLine = 10;  // "HTTP/1.1\r\n"
  if (p == target_first || static_cast<std::size_t>(last - p) <= kVersionLine || *p != ' ') {
    return 0;
  }
  const std::string_view target(target_first, static_cast<std::size_t>(p - target_first));
  ++p;
  unsigned version = 11;
  if (std::memcmp(p, "HTTP/1.1\r\n", kVersionLine) != 0) {
    if (std::memcmp(p, "HTTP/1.0\r\n", kVersionLine) != 0) return 0;
    version = 10;
  }
  p += kVersionLine;
  begin_head(http::string_to_verb(method), method, target, version);

  PlainFraming framing;
  const char* const body =
      scan_plain_fields(p, last, [&](std::string_view name, std::string_view value) {
        // Every framing field is hop-by-hop, so withheld.
        const bool withheld = is_withheld_from_upstream(name);
        if (withheld && !framing.take(name, value)) return false;
        add_field(name, value, withheld);
        return true;
      });
  // Beast refuses a length over the limit with its own error.
  if (body == nullptr || (framing.content_length && !within_body_limit(*framing.content_length))) {
    forget_head();
    return 0;
  }
  take_plain_head(framing, version);
  if (body_remaining_ > 0) body_.reserve(static_cast<std::size_t>(body_remaining_));
  return static_cast<std::size_t>(body - bytes.data());
}

void ClientRequest::forget_head() {
  start_line_.clear();
  forwarded_.clear();
  withheld_.clear();
  fields_.clear();
  content_type_field_ = -1;
  name_marks_ = 0;
}

std::size_t ClientRequest::take_plain_body(std::string_view bytes, error_code& ec) {
  ec = {};
  const auto taken =
      static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), body_remaining_));
  append_body(bytes.substr(0, taken));
  body_remaining_ -= taken;
  if (body_remaining_ == 0) end_plain_body();
  return taken;
}

void ClientRequest::commit_body_read(std::size_t bytes) {
  body_.commit(bytes);
  body_remaining_ -= bytes;
  if (body_remaining_ == 0) end_plain_body();
}

void ClientRequest::append_body(std::string_view bytes) {
  if (bytes.empty()) return;
  std::memcpy(body_.prepare(bytes.size()).data(), bytes.data(), bytes.size());
  body_.commit(bytes.size());
}

void ClientRequest::begin_head(http::verb method, std::string_view method_text,
                               std::string_view target, unsigned version) {
  method_ = method;
  method_size_ = method_text.size();
  version_ = version;
  start_line_.reserve(method_text.size() + target.size());
  start_line_.append(method_text);
  start_line_.append(target);
  forwarded_.reserve(kTypicalForwardedBytes);
  withheld_.reserve(kTypicalWithheldBytes);
}

void ClientRequest::on_request_impl(http::verb method, boost::beast::string_view method_text,
                                    boost::beast::string_view target, int version, error_code&) {
  begin_head(method, {method_text.data(), method_text.size()}, {target.data(), target.size()},
             static_cast<unsigned>(version));
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
  saw_connection_ = saw_connection_ || name == http::field::connection;
  saw_transfer_encoding_ = saw_transfer_encoding_ || name == http::field::transfer_encoding;
  add_field(name_view, {value.data(), value.size()}, is_withheld_from_upstream(name, name_view));
}

void ClientRequest::add_field(std::string_view name, std::string_view value, bool withheld) {
  Text& lines = withheld ? withheld_ : forwarded_;
  const std::size_t at = lines.size();
  name_marks_ |= name_mark(name);
  if (content_type_field_ < 0 && field_name_is(name, "content-type")) {
    content_type_field_ = static_cast<int>(fields_.size());
  }
  fields_.push_back(FieldEntry{withheld, static_cast<std::uint32_t>(name.size()),
                               static_cast<std::uint32_t>(at),
                               static_cast<std::uint32_t>(value.size())});
  // One resize and two copies: appending the four pieces cost twice as much.
  lines.resize(at + name.size() + value.size() + 4);
  char* out = lines.data() + at;
  std::memcpy(out, name.data(), name.size());
  out += name.size();
  *out++ = ':';
  *out++ = ' ';
  std::memcpy(out, value.data(), value.size());
  out += value.size();
  *out++ = '\r';
  *out = '\n';
}

void ClientRequest::on_header_impl(error_code& ec) {
  // Beast's parser reads a request whose last transfer coding is not
  // chunked as one without a body, and its body as the next request: such a
  // request has no length the gateway could know (RFC 9112 §6.3).
  if (saw_transfer_encoding_ && !http::basic_parser<true>::chunked()) {
    ec = http::error::bad_transfer_encoding;
    return;
  }
  if (saw_connection_) withhold_connection_options();
}

void ClientRequest::withhold_connection_options() {
  const auto listed = [this](std::string_view name) {
    bool found = false;
    for_each_value("connection",
                   [&](std::string_view value) { found = found || token_list_has(value, name); });
    return found;
  };
  const bool any_listed = std::any_of(fields_.begin(), fields_.end(), [&](const FieldEntry& entry) {
    return !entry.withheld && listed(name_of(entry));
  });
  if (!any_listed) return;
  Text forwarded;
  forwarded.reserve(forwarded_.size());
  for (auto& entry : fields_) {
    if (entry.withheld) continue;
    const std::string_view line(forwarded_.data() + entry.at,
                                entry.name_size + entry.value_size + 4);
    const bool hop_by_hop = listed(name_of(entry));
    Text& lines = hop_by_hop ? withheld_ : forwarded;
    entry.withheld = hop_by_hop;
    entry.at = static_cast<std::uint32_t>(lines.size());
    lines.append(line.data(), line.size());
  }
  forwarded_.swap(forwarded);
}

void ClientRequest::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                      error_code&) {
  // The parser has checked the length against the body limit already.
  if (content_length) body_.reserve(static_cast<std::size_t>(*content_length));
}

std::size_t ClientRequest::on_body_impl(boost::beast::string_view body, error_code&) {
  append_body({body.data(), body.size()});
  return body.size();
}

void ClientRequest::on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) {}

std::size_t ClientRequest::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                              error_code&) {
  append_body({body.data(), body.size()});
  return body.size();
}

void ClientRequest::on_finish_impl(error_code&) {}

}  // namespace sluice::server
