// Parsers for the small value languages used inside the config: durations,
// upstream base URLs and listen addresses. They report failure instead of
// throwing so the loader can attach the YAML path and line to the message.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string_view>

#include "sluice/config/config.hpp"

namespace sluice::config {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), is_digit);
}

char to_lower_ascii(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

std::string lower_ascii(std::string_view text) {
  std::string lowered(text);
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), to_lower_ascii);
  return lowered;
}

// A DNS name or IPv4 literal. Deliberately stricter than RFC 3986 reg-name:
// percent-encoded or exotic host names are a sign of a typo in a config file.
bool is_host_name(std::string_view host) {
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  });
}

// The inside of "[...]". Only the character set is checked; the resolver
// rejects anything that is still not an address.
bool is_ipv6_literal(std::string_view host) {
  return host.find(':') != std::string_view::npos &&
         std::all_of(host.begin(), host.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
         });
}

std::optional<std::uint16_t> parse_port_number(std::string_view text) {
  if (!all_digits(text) || text.size() > 5) return std::nullopt;
  unsigned value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  if (value > std::numeric_limits<std::uint16_t>::max()) return std::nullopt;
  return static_cast<std::uint16_t>(value);
}

// Splits "host[:port]" or "[v6][:port]" into a bare host and the text after
// the colon (nullopt when there is no port at all).
struct HostPort {
  std::string host;
  std::optional<std::string_view> port;
};

std::optional<HostPort> split_host_port(std::string_view text, std::string& why) {
  HostPort result;
  std::string_view rest;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) {
      why = "unterminated IPv6 address (missing ']')";
      return std::nullopt;
    }
    auto inside = text.substr(1, close - 1);
    if (!is_ipv6_literal(inside)) {
      why = "invalid IPv6 address '" + std::string(inside) + "'";
      return std::nullopt;
    }
    result.host = lower_ascii(inside);
    rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') {
      why = "unexpected text after IPv6 address";
      return std::nullopt;
    }
  } else {
    auto colon = text.rfind(':');
    auto host = text.substr(0, colon);
    if (host.empty()) {
      why = "empty host";
      return std::nullopt;
    }
    if (host.find(':') != std::string_view::npos) {
      why = "IPv6 addresses must be written in brackets, e.g. [::1]";
      return std::nullopt;
    }
    if (!is_host_name(host)) {
      why = "invalid character in host '" + std::string(host) + "'";
      return std::nullopt;
    }
    result.host = lower_ascii(host);
    rest = colon == std::string_view::npos ? std::string_view{} : text.substr(colon);
  }
  if (!rest.empty()) result.port = rest.substr(1);  // skip the ':'
  return result;
}

}  // namespace

std::optional<Duration> parse_duration(const std::string& text) {
  if (text == "0") return Duration{0};

  std::size_t pos = 0;
  while (pos < text.size() && is_digit(text[pos])) ++pos;
  std::string_view whole(text.data(), pos);
  if (whole.empty()) return std::nullopt;

  std::string_view fraction;
  if (pos < text.size() && text[pos] == '.') {
    std::size_t start = ++pos;
    while (pos < text.size() && is_digit(text[pos])) ++pos;
    fraction = std::string_view(text.data() + start, pos - start);
    if (fraction.empty()) return std::nullopt;  // "5.s"
  }

  std::string_view unit(text.data() + pos, text.size() - pos);
  std::int64_t unit_ms = 0;
  if (unit == "ms") {
    unit_ms = 1;
  } else if (unit == "s") {
    unit_ms = 1000;
  } else if (unit == "m") {
    unit_ms = std::int64_t{60} * 1000;
  } else if (unit == "h") {
    unit_ms = std::int64_t{60} * 60 * 1000;
  } else {
    return std::nullopt;
  }

  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  std::uint64_t whole_value = 0;
  auto [end, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), whole_value);
  if (ec != std::errc{} || whole_value > static_cast<std::uint64_t>(kMax / unit_ms)) {
    return std::nullopt;
  }
  std::int64_t millis = static_cast<std::int64_t>(whole_value) * unit_ms;

  // The fraction must come out as a whole number of milliseconds: "1.5s" is
  // fine, "1.5ms" is not, rather than being silently rounded.
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (!fraction.empty()) {
    if (fraction.size() > 9) return std::nullopt;
    std::int64_t numerator = 0;
    std::from_chars(fraction.data(), fraction.data() + fraction.size(), numerator);
    std::int64_t denominator = 1;
    for (std::size_t i = 0; i < fraction.size(); ++i) denominator *= 10;
    // numerator < 10^9 and unit_ms <= 3.6e6, so the product fits in 64 bits.
    std::int64_t scaled = numerator * unit_ms;
    if (scaled % denominator != 0) return std::nullopt;
    std::int64_t extra = scaled / denominator;
    if (millis > kMax - extra) return std::nullopt;
    millis += extra;
  }
  return Duration{millis};
}

std::optional<Url> parse_url(const std::string& text, std::string& why) {
  if (text.empty()) {
    why = "empty URL";
    return std::nullopt;
  }
  if (std::any_of(text.begin(), text.end(), [](char c) {
        return std::isspace(static_cast<unsigned char>(c)) ||
               std::iscntrl(static_cast<unsigned char>(c));
      })) {
    why = "URL contains whitespace or control characters";
    return std::nullopt;
  }

  auto separator = text.find("://");
  if (separator == std::string::npos || separator == 0) {
    why = "missing scheme (expected http:// or https://)";
    return std::nullopt;
  }
  Url url;
  // Schemes are case-insensitive (RFC 3986 section 3.1); store the canonical
  // lower-case form so the rest of the gateway can compare it directly.
  url.scheme = lower_ascii(std::string_view(text).substr(0, separator));
  if (url.scheme != "http" && url.scheme != "https") {
    why = "unsupported scheme '" + url.scheme + "' (expected http or https)";
    return std::nullopt;
  }

  std::string_view rest = std::string_view(text).substr(separator + 3);
  if (rest.find('#') != std::string_view::npos) {
    why = "a fragment ('#...') is not allowed";
    return std::nullopt;
  }
  if (rest.find('?') != std::string_view::npos) {
    why = "a query string ('?...') is not allowed";
    return std::nullopt;
  }

  auto path_start = rest.find('/');
  std::string_view authority = rest.substr(0, path_start);
  std::string_view path =
      path_start == std::string_view::npos ? std::string_view{} : rest.substr(path_start);

  if (authority.find('@') != std::string_view::npos) {
    why = "credentials in the URL (user@host) are not allowed; use api_key or headers";
    return std::nullopt;
  }
  if (authority.empty()) {
    why = "empty host";
    return std::nullopt;
  }

  auto host_port = split_host_port(authority, why);
  if (!host_port) return std::nullopt;
  url.host = std::move(host_port->host);
  if (host_port->port) {
    auto port = parse_port_number(*host_port->port);
    if (!port || *port == 0) {
      why = "invalid port '" + std::string(*host_port->port) + "' (expected 1-65535)";
      return std::nullopt;
    }
    url.port = *port;
  } else {
    url.port = url.tls() ? 443 : 80;
  }

  // The prefix is joined with request paths such as "/chat/completions", so
  // a trailing slash would produce "//".
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  url.path_prefix = std::string(path);
  return url;
}

namespace {

// Percent-decoding for the credentials of a Redis URL, where a password may
// hold any byte.
bool percent_decode(std::string_view text, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    unsigned value = 0;
    if (i + 2 >= text.size()) return false;
    auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
    if (ec != std::errc{} || end != text.data() + i + 3) return false;
    out += static_cast<char>(value);
    i += 2;
  }
  return true;
}

bool parse_database(std::string_view text, unsigned& database, std::string& why) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), database);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || database > 65535) {
    why = "invalid database number '" + std::string(text) + "' (expected 0, 1, ...)";
    return false;
  }
  return true;
}

}  // namespace

bool parse_redis_url(const std::string& text, RedisState& into, std::string& why) {
  if (std::any_of(text.begin(), text.end(), [](char c) {
        return std::isspace(static_cast<unsigned char>(c)) ||
               std::iscntrl(static_cast<unsigned char>(c));
      })) {
    why = "URL contains whitespace or control characters";
    return false;
  }
  auto separator = text.find("://");
  if (separator == std::string::npos) {
    why = "missing scheme (expected redis://, rediss:// or unix://)";
    return false;
  }
  const std::string scheme = lower_ascii(std::string_view(text).substr(0, separator));
  std::string_view rest = std::string_view(text).substr(separator + 3);
  RedisState parsed;
  parsed.key_prefix = into.key_prefix;
  parsed.timeout = into.timeout;
  if (scheme == "unix") {
    parsed.transport = RedisState::Transport::unix_socket;
    auto query = rest.find('?');
    parsed.socket_path = std::string(rest.substr(0, query));
    if (parsed.socket_path.empty() || parsed.socket_path.front() != '/') {
      why = "expected an absolute socket path, as in unix:///run/redis/redis.sock";
      return false;
    }
    if (query != std::string_view::npos) {
      std::string_view parameter = rest.substr(query + 1);
      if (!parameter.starts_with("db=")) {
        why = "the only query parameter allowed is db=N";
        return false;
      }
      if (!parse_database(parameter.substr(3), parsed.database, why)) return false;
    }
  } else if (scheme == "redis" || scheme == "rediss") {
    parsed.transport = scheme == "rediss" ? RedisState::Transport::tls : RedisState::Transport::tcp;
    if (rest.find_first_of("?#") != std::string_view::npos) {
      why = "a query string or fragment is not allowed";
      return false;
    }
    auto path_start = rest.find('/');
    std::string_view authority = rest.substr(0, path_start);
    auto at = authority.rfind('@');
    if (at != std::string_view::npos) {
      std::string_view credentials = authority.substr(0, at);
      authority = authority.substr(at + 1);
      auto colon = credentials.find(':');
      std::string_view user = credentials.substr(0, colon);
      std::string_view password =
          colon == std::string_view::npos ? std::string_view{} : credentials.substr(colon + 1);
      // "redis://secret@host" is the password alone, as redis-cli reads it.
      if (colon == std::string_view::npos) std::swap(user, password);
      if (!percent_decode(user, parsed.username) || !percent_decode(password, parsed.password)) {
        why = "invalid percent-encoding in the credentials";
        return false;
      }
    }
    if (authority.empty()) {
      why = "empty host";
      return false;
    }
    auto host_port = split_host_port(authority, why);
    if (!host_port) return false;
    parsed.host = std::move(host_port->host);
    if (host_port->port) {
      auto port = parse_port_number(*host_port->port);
      if (!port || *port == 0) {
        why = "invalid port '" + std::string(*host_port->port) + "' (expected 1-65535)";
        return false;
      }
      parsed.port = *port;
    }
    if (path_start != std::string_view::npos) {
      std::string_view database = rest.substr(path_start + 1);
      if (!database.empty() && !parse_database(database, parsed.database, why)) return false;
    }
  } else {
    why = "unsupported scheme '" + scheme + "' (expected redis, rediss or unix)";
    return false;
  }
  // Kept without its credentials: the URL shows up in logs and messages.
  parsed.url =
      scheme + "://" +
      (parsed.transport == RedisState::Transport::unix_socket
           ? parsed.socket_path
           : (parsed.host.find(':') != std::string::npos ? "[" + parsed.host + "]" : parsed.host) +
                 ":" + std::to_string(parsed.port)) +
      (parsed.database != 0 ? "/" + std::to_string(parsed.database) : "");
  into = std::move(parsed);
  return true;
}

std::optional<std::pair<std::string, std::uint16_t>> parse_listen(const std::string& text) {
  std::string why;
  auto host_port = split_host_port(text, why);
  if (!host_port || !host_port->port) return std::nullopt;
  // Port 0 asks the kernel for an ephemeral port, which tests rely on.
  auto port = parse_port_number(*host_port->port);
  if (!port) return std::nullopt;
  return std::make_pair(std::move(host_port->host), *port);
}

}  // namespace sluice::config
