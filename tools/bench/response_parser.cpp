#include "response_parser.hpp"

#include <charconv>
#include <cstring>

namespace sluice::bench {

namespace {

bool iequals(std::string_view a, std::string_view b) {
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

// True when the comma-separated header value lists `token`.
bool has_token(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const auto comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (iequals(item, token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

void ResponseParser::reset() {
  state_ = State::status_line;
  progress_ = Progress::need_more;
  line_size_ = 0;
  status_ = 0;
  http_1_0_ = false;
  keep_alive_ = true;
  chunked_ = false;
  has_content_length_ = false;
  started_ = false;
  content_length_ = 0;
  remaining_ = 0;
  failure_ = {};
}

ResponseParser::Progress ResponseParser::finish_at_eof() {
  if (progress_ == Progress::need_more) {
    if (state_ == State::body_until_close) {
      progress_ = Progress::complete;
    } else {
      fail("connection closed before the response was complete");
    }
  }
  return progress_;
}

void ResponseParser::fail(std::string_view why) {
  failure_ = why;
  progress_ = Progress::failed;
}

std::size_t ResponseParser::consume_line_bytes(const char* data, std::size_t size) {
  const void* newline = std::memchr(data, '\n', size);
  const std::size_t take =
      newline ? static_cast<std::size_t>(static_cast<const char*>(newline) - data) + 1 : size;
  if (line_size_ + take > line_.size()) {
    fail("response line longer than 8 KiB");
    return take;
  }
  std::memcpy(line_.data() + line_size_, data, take);
  line_size_ += take;
  if (newline) {
    std::string_view line(line_.data(), line_size_ - 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    line_size_ = 0;
    handle_line(line);
  }
  return take;
}

void ResponseParser::handle_line(std::string_view line) {
  switch (state_) {
    case State::status_line:
      handle_status_line(line);
      break;
    case State::header_line:
      if (line.empty()) {
        handle_end_of_head();
      } else {
        handle_header_line(line);
      }
      break;
    case State::chunk_size_line:
      handle_chunk_size_line(line);
      break;
    case State::chunk_data_end:
      if (!line.empty()) {
        fail("chunk data longer than its size");
      } else {
        state_ = State::chunk_size_line;
      }
      break;
    case State::trailer_line:
      if (line.empty()) progress_ = Progress::complete;
      break;
    default:
      break;
  }
}

void ResponseParser::handle_status_line(std::string_view line) {
  // "HTTP/1.1 200 OK"
  if (line.size() < 12 || !line.starts_with("HTTP/1.") || line[8] != ' ') {
    fail("malformed status line");
    return;
  }
  http_1_0_ = line[7] == '0';
  keep_alive_ = !http_1_0_;
  unsigned status = 0;
  auto [end, error] = std::from_chars(line.data() + 9, line.data() + 12, status);
  if (error != std::errc{} || end != line.data() + 12 || status < 100) {
    fail("malformed status code");
    return;
  }
  status_ = status;
  state_ = State::header_line;
}

void ResponseParser::handle_header_line(std::string_view line) {
  const auto colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    fail("malformed header line");
    return;
  }
  const std::string_view name = line.substr(0, colon);
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);

  if (iequals(name, "content-length")) {
    std::uint64_t length = 0;
    auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), length);
    if (value.empty() || error != std::errc{} || end != value.data() + value.size()) {
      fail("malformed Content-Length");
      return;
    }
    has_content_length_ = true;
    content_length_ = length;
  } else if (iequals(name, "transfer-encoding")) {
    chunked_ = has_token(value, "chunked");
  } else if (iequals(name, "connection")) {
    if (has_token(value, "close")) keep_alive_ = false;
    if (http_1_0_ && has_token(value, "keep-alive")) keep_alive_ = true;
  }
}

void ResponseParser::handle_end_of_head() {
  if (status_ < 200) {
    // An interim response (100 Continue...): the real one follows.
    const bool started = started_;
    reset();
    started_ = started;
    return;
  }
  if (status_ == 204 || status_ == 304) {
    progress_ = Progress::complete;
  } else if (chunked_) {
    state_ = State::chunk_size_line;
  } else if (has_content_length_) {
    if (content_length_ == 0) {
      progress_ = Progress::complete;
    } else {
      remaining_ = content_length_;
      state_ = State::body_sized;
    }
  } else {
    keep_alive_ = false;
    state_ = State::body_until_close;
  }
}

void ResponseParser::handle_chunk_size_line(std::string_view line) {
  const auto extension = line.find(';');
  std::string_view digits = line.substr(0, extension);
  while (!digits.empty() && (digits.back() == ' ' || digits.back() == '\t'))
    digits.remove_suffix(1);
  std::uint64_t size = 0;
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), size, 16);
  if (digits.empty() || error != std::errc{} || end != digits.data() + digits.size()) {
    fail("malformed chunk size");
    return;
  }
  if (size == 0) {
    state_ = State::trailer_line;
  } else {
    remaining_ = size;
    state_ = State::chunk_data;
  }
}

}  // namespace sluice::bench
