// sluice-mock: runs the mock OpenAI-compatible (and Anthropic Messages) upstream
// until SIGINT/SIGTERM.

#include <pthread.h>
#include <signal.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "mock/mock_server.hpp"

namespace {

using sluice::mock::MockServer;

constexpr int kUsageError = 2;

constexpr std::string_view kUsage =
    R"(usage: sluice-mock [options]

Serves an OpenAI-compatible mock API (chat/completions, completions,
embeddings, responses, moderations, images, audio speech, transcriptions and
translations, models) whose timing and failures are scripted. It also answers
  POST /v1/messages, /v1/messages/count_tokens
                         Anthropic Messages, plain and streamed (needs an
                         anthropic-version header; errors in Anthropic's shape)
  POST /openai/deployments/NAME/{chat/completions,completions,embeddings}
                         Azure OpenAI's paths, answered as OpenAI's (needs the
                         api-version query parameter)

  --listen HOST:PORT     address to listen on (default 127.0.0.1:8000; port 0 picks one)
  --threads N            serving threads (default 1)
  --ttft DUR             delay before the first token (default 0)
  --ttft-per-token DUR   extra first-token delay per prompt token (default 0)
  --accept-delay DUR     hold each new connection this long before reading it
                         (a slow network, seen on fresh connections only; default 0)
  --interval DUR         gap between stream events (default 0)
  --tokens N             tokens per completion (default 8)
  --slots N              queueing: N answers at once, the rest wait (default 0: no queue)
  --fail MODE            400|401|500|503|429|overloaded|context|stall|stall-mid|reset|
                         reset-mid|garbage|truncate|endless|drip|error-mid (default: none)
  --fail-rate X          probability in [0,1] that --fail applies (default 1)
  --stall DUR            how long stall modes sleep (default 60s)
  --retry-after N        Retry-After seconds on 429 (default 1)
  --retry-after-ms N     also send retry-after-ms: N on 429, as Azure does (default: not sent)
  --anthropic BLOCKS     extra /v1/messages blocks: tools|thinking|tools,thinking
                         (per request: x-mock-anthropic)
  --openai CONTENT       tools: a chat completion whose request offers tools
                         calls the first one (tool_calls, finish_reason
                         tool_calls; streamed, the arguments in small pieces)
                         (per request: x-mock-openai)
  --cache-read-tokens N  cache_read_input_tokens in /v1/messages usage (default 0)
  --cache-creation-tokens N
                         cache_creation_input_tokens in /v1/messages usage (default 0)
  --dims N               embedding dimensions (default 16)
  --tls-cert FILE        PEM certificate chain; with --tls-key serves HTTPS
  --tls-key FILE         PEM private key
  --http2                serve HTTP/2 too: by ALPN (h2, http/1.1) with TLS,
                         h2c with prior knowledge without it
  --h2-max-streams N     SETTINGS_MAX_CONCURRENT_STREAMS per connection (default 100)
  --help                 this text

Durations: 0, 250us, 20ms, 2s, 1.5s, 1m (a bare number is milliseconds).
Every default can be overridden per request with x-mock-* headers, and
changed at run time with POST /mock/behaviour; GET /mock/stats shows counters.
)";

// Thrown for anything the user typed wrong; main turns it into exit code 2.
struct UsageError {
  std::string message;
};

std::optional<std::chrono::microseconds> parse_duration(std::string_view text) {
  std::size_t number_end = 0;
  while (number_end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[number_end])) || text[number_end] == '.')) {
    ++number_end;
  }
  double amount = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + number_end, amount);
  if (number_end == 0 || error != std::errc{} || end != text.data() + number_end) {
    return std::nullopt;
  }
  const std::string_view unit = text.substr(number_end);
  double microseconds_per_unit = 0;
  if (unit == "us") {
    microseconds_per_unit = 1;
  } else if (unit == "ms" || unit.empty()) {
    microseconds_per_unit = 1e3;
  } else if (unit == "s") {
    microseconds_per_unit = 1e6;
  } else if (unit == "m") {
    microseconds_per_unit = 60e6;
  } else {
    return std::nullopt;
  }
  const double total = amount * microseconds_per_unit;
  if (!std::isfinite(total) || total > 1e15) return std::nullopt;
  return std::chrono::microseconds(static_cast<std::int64_t>(std::llround(total)));
}

std::chrono::milliseconds duration_option(std::string_view option, std::string_view value) {
  auto duration = parse_duration(value);
  if (!duration) {
    throw UsageError{"invalid duration for " + std::string(option) + ": '" + std::string(value) +
                     "'"};
  }
  return std::chrono::round<std::chrono::milliseconds>(*duration);
}

unsigned count_option(std::string_view option, std::string_view value, unsigned minimum = 0) {
  unsigned count = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
  if (value.empty() || error != std::errc{} || end != value.data() + value.size() ||
      count < minimum) {
    throw UsageError{"invalid number for " + std::string(option) + ": '" + std::string(value) +
                     "'"};
  }
  return count;
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UsageError{"cannot read " + path};
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

void parse_listen(std::string_view value, MockServer::Options& options) {
  const auto colon = value.rfind(':');
  if (colon == std::string_view::npos) throw UsageError{"--listen expects HOST:PORT"};
  std::string_view host = value.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const unsigned port = count_option("--listen", value.substr(colon + 1));
  if (host.empty() || port > 65535) throw UsageError{"--listen expects HOST:PORT"};
  options.host = std::string(host);
  options.port = static_cast<std::uint16_t>(port);
}

struct Arguments {
  MockServer::Options options;
  bool help = false;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments arguments;
  auto& options = arguments.options;
  auto& behaviour = options.behaviour;
  options.port = 8000;
  std::string cert_file;
  std::string key_file;

  for (int i = 1; i < argc; ++i) {
    std::string_view option = argv[i];
    std::optional<std::string_view> inline_value;
    if (auto equals = option.find('='); option.starts_with("--") && equals != option.npos) {
      inline_value = option.substr(equals + 1);
      option = option.substr(0, equals);
    }
    if (option == "--help" || option == "-h") {
      arguments.help = true;
      continue;
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError{std::string(option) + " needs a value"};
      return argv[++i];
    };

    if (option == "--listen") {
      parse_listen(value(), options);
    } else if (option == "--threads") {
      options.threads = count_option(option, value(), 1);
    } else if (option == "--ttft") {
      behaviour.ttft = duration_option(option, value());
    } else if (option == "--ttft-per-token") {
      auto duration = parse_duration(value());
      if (!duration) throw UsageError{"invalid duration for --ttft-per-token"};
      behaviour.ttft_per_prompt_token = *duration;
    } else if (option == "--accept-delay") {
      behaviour.accept_delay = duration_option(option, value());
    } else if (option == "--interval") {
      behaviour.interval = duration_option(option, value());
    } else if (option == "--tokens") {
      behaviour.tokens = count_option(option, value());
    } else if (option == "--slots") {
      behaviour.slots = count_option(option, value());
    } else if (option == "--fail") {
      const std::string_view mode = value();
      if (!sluice::mock::is_valid_fail_mode(mode)) {
        throw UsageError{"unknown failure mode '" + std::string(mode) + "'"};
      }
      behaviour.fail = std::string(mode);
    } else if (option == "--fail-rate") {
      const std::string_view text = value();
      double rate = -1;
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), rate);
      if (error != std::errc{} || end != text.data() + text.size() || !(rate >= 0 && rate <= 1)) {
        throw UsageError{"--fail-rate expects a number in [0, 1]"};
      }
      behaviour.fail_rate = rate;
    } else if (option == "--stall") {
      behaviour.stall = duration_option(option, value());
    } else if (option == "--retry-after") {
      behaviour.retry_after_s = count_option(option, value());
    } else if (option == "--retry-after-ms") {
      behaviour.retry_after_ms = count_option(option, value());
    } else if (option == "--anthropic") {
      const std::string_view blocks = value();
      if (!sluice::mock::is_valid_anthropic_content(blocks)) {
        throw UsageError{"unknown --anthropic blocks '" + std::string(blocks) + "'"};
      }
      behaviour.anthropic_content = std::string(blocks);
    } else if (option == "--openai") {
      const std::string_view content = value();
      if (!sluice::mock::is_valid_openai_content(content)) {
        throw UsageError{"unknown --openai content '" + std::string(content) + "'"};
      }
      behaviour.openai_content = std::string(content);
    } else if (option == "--cache-read-tokens") {
      behaviour.cache_read_tokens = count_option(option, value());
    } else if (option == "--cache-creation-tokens") {
      behaviour.cache_creation_tokens = count_option(option, value());
    } else if (option == "--dims") {
      behaviour.dims = count_option(option, value(), 1);
    } else if (option == "--tls-cert") {
      cert_file = std::string(value());
    } else if (option == "--tls-key") {
      key_file = std::string(value());
    } else if (option == "--http2") {
      options.http2 = true;
    } else if (option == "--h2-max-streams") {
      behaviour.h2_max_streams = count_option(option, value(), 1);
    } else {
      throw UsageError{"unknown option '" + std::string(option) + "'"};
    }
  }

  if (cert_file.empty() != key_file.empty()) {
    throw UsageError{"--tls-cert and --tls-key go together"};
  }
  if (!cert_file.empty()) {
    options.tls_cert_pem = read_file(cert_file);
    options.tls_key_pem = read_file(key_file);
  }
  return arguments;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  try {
    arguments = parse_arguments(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "sluice-mock: " << error.message << "\n(see sluice-mock --help)\n";
    return kUsageError;
  }
  if (arguments.help) {
    std::cout << kUsage;
    return 0;
  }

  // Blocked before the server threads exist, so they inherit the mask and the
  // signals are delivered only to sigwait below.
  sigset_t shutdown_signals;
  sigemptyset(&shutdown_signals);
  sigaddset(&shutdown_signals, SIGINT);
  sigaddset(&shutdown_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &shutdown_signals, nullptr);

  const bool tls = !arguments.options.tls_cert_pem.empty();
  std::string host = arguments.options.host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";

  MockServer server(arguments.options);
  try {
    server.start();
  } catch (const std::exception& error) {
    std::cerr << "sluice-mock: cannot listen on " << host << ":" << arguments.options.port << ": "
              << error.what() << "\n";
    return 1;
  }
  std::cout << "sluice-mock listening on " << (tls ? "https://" : "http://") << host << ":"
            << server.port() << std::endl;

  int received = 0;
  sigwait(&shutdown_signals, &received);
  server.stop();
  return 0;
}
