#include "mock/mock_server.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <variant>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <nghttp2/nghttp2.h>

#include "mock/anthropic.hpp"
#include "mock/event_clock.hpp"

namespace sluice::mock {

namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using asio::awaitable;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using Request = http::request<http::string_body>;

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

constexpr std::size_t kRecordedLimit = 64;
constexpr std::size_t kMaxBodyBytes = 64 * 1024 * 1024;
constexpr std::size_t kMaxHeaderBytes = 64 * 1024;
constexpr unsigned kMaxDims = 65536;
constexpr std::uint64_t kContextLimitTokens = 8192;
// How often a request waiting for a slot (Behaviour::slots) looks again.
constexpr auto kSlotPoll = std::chrono::milliseconds(1);

// A slot of Behaviour::slots, given back when the answer is done.
class SlotHold {
 public:
  explicit SlotHold(std::atomic<unsigned>& busy) : busy_(busy) {}
  ~SlotHold() {
    if (held_) busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
  SlotHold(const SlotHold&) = delete;
  SlotHold& operator=(const SlotHold&) = delete;
  bool try_take(unsigned slots) {
    unsigned busy = busy_.load(std::memory_order_acquire);
    while (busy < slots) {
      if (busy_.compare_exchange_weak(busy, busy + 1, std::memory_order_acq_rel)) {
        held_ = true;
        return true;
      }
    }
    return false;
  }

 private:
  std::atomic<unsigned>& busy_;
  bool held_ = false;
};

// Events a truncated stream sends before it is cut off.
constexpr std::size_t kTruncateAfterEvents = 3;
// Content deltas an "error-mid" stream sends before its error event.
constexpr std::size_t kErrorMidAfterDeltas = 3;
// Streamed tool-call arguments come in pieces this many bytes long, split
// mid-token as OpenAI splits them.
constexpr std::size_t kToolArgumentPieceBytes = 5;
// An endless stream with no interval would flood the peer; this floor keeps it
// a stream rather than a firehose.
constexpr auto kEndlessMinInterval = std::chrono::milliseconds(1);
constexpr std::string_view kDefaultModel = "mock-model";
// The largest duration accepted from a header or /mock/behaviour: a day in
// milliseconds. Anything longer is a typo, and the cap keeps arithmetic on
// durations far from overflow.
constexpr std::uint64_t kMaxHeaderDuration = 86'400'000;

// ---------------------------------------------------------------------------
// Small text helpers

std::string_view to_std(beast::string_view text) { return {text.data(), text.size()}; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

void append_uint(std::string& out, std::uint64_t value) {
  char digits[24];
  auto result = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, result.ptr);
}

void append_int(std::string& out, std::int64_t value) {
  char digits[24];
  auto result = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, result.ptr);
}

void append_float(std::string& out, float value) {
  char digits[32];
  auto result = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, result.ptr);
}

// Appends `text` as a quoted JSON string.
void append_json_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out += kHex[byte >> 4];
          out += kHex[byte & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_base64(std::string& out, const unsigned char* data, std::size_t size) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::size_t i = 0;
  for (; i + 3 <= size; i += 3) {
    std::uint32_t triple = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
    out += kAlphabet[(triple >> 18) & 63];
    out += kAlphabet[(triple >> 12) & 63];
    out += kAlphabet[(triple >> 6) & 63];
    out += kAlphabet[triple & 63];
  }
  if (std::size_t rest = size - i; rest > 0) {
    std::uint32_t triple = data[i] << 16;
    if (rest == 2) triple |= data[i + 1] << 8;
    out += kAlphabet[(triple >> 18) & 63];
    out += kAlphabet[(triple >> 12) & 63];
    out += rest == 2 ? kAlphabet[(triple >> 6) & 63] : '=';
    out += '=';
  }
}

template <class Unsigned>
std::optional<Unsigned> parse_unsigned(std::string_view text) {
  Unsigned value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> parse_rate(std::string_view text) {
  double value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  if (!(value >= 0.0 && value <= 1.0)) return std::nullopt;
  return value;
}

// Token i of every completion; a fixed shape lets tests predict the content.
void append_token(std::string& out, std::size_t index) {
  out += "tok";
  append_uint(out, index);
  out += ' ';
}

// ---------------------------------------------------------------------------
// Failure modes

enum class FailMode {
  none,
  bad_request,
  unauthorized,
  server_error,
  unavailable,
  rate_limited,
  context_length,
  stall,
  stall_mid,
  reset,
  reset_mid,
  garbage,
  truncate,
  cut_short,  // a clean end (last chunk, Content-Length met) before the answer's own
  endless,
  drip,
  overloaded,  // 529
  error_mid,   // an error event in the middle of a stream
};

std::optional<FailMode> parse_fail_mode(std::string_view mode) {
  static constexpr std::pair<std::string_view, FailMode> kModes[] = {
      {"", FailMode::none},
      {"400", FailMode::bad_request},
      {"401", FailMode::unauthorized},
      {"500", FailMode::server_error},
      {"503", FailMode::unavailable},
      {"429", FailMode::rate_limited},
      {"context", FailMode::context_length},
      {"stall", FailMode::stall},
      {"stall-mid", FailMode::stall_mid},
      {"reset", FailMode::reset},
      {"reset-mid", FailMode::reset_mid},
      {"garbage", FailMode::garbage},
      {"truncate", FailMode::truncate},
      {"cut-short", FailMode::cut_short},
      {"endless", FailMode::endless},
      {"drip", FailMode::drip},
      {"overloaded", FailMode::overloaded},
      {"error-mid", FailMode::error_mid},
  };
  for (const auto& [name, value] : kModes) {
    if (name == mode) return value;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Endpoints

enum class Endpoint {
  chat,
  completions,
  embeddings,
  responses,
  moderations,
  images,          // generations, edits and variations
  speech,          // /audio/speech: audio bytes back
  transcriptions,  // /audio/transcriptions and /audio/translations
  models,
  messages,               // Anthropic's /v1/messages
  messages_count_tokens,  // Anthropic's /v1/messages/count_tokens
  mock_stats,
  mock_behaviour,
  unknown,
};

// Matching on the suffix accepts any base path ("/v1", "/openai/v1", ...).
Endpoint classify(std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  if (path.ends_with("/mock/stats")) return Endpoint::mock_stats;
  if (path.ends_with("/mock/behaviour")) return Endpoint::mock_behaviour;
  if (path.ends_with("/chat/completions")) return Endpoint::chat;
  if (path.ends_with("/completions")) return Endpoint::completions;
  if (path.ends_with("/embeddings")) return Endpoint::embeddings;
  if (path.ends_with("/responses")) return Endpoint::responses;
  if (path.ends_with("/moderations")) return Endpoint::moderations;
  if (path.ends_with("/images/generations") || path.ends_with("/images/edits") ||
      path.ends_with("/images/variations")) {
    return Endpoint::images;
  }
  if (path.ends_with("/audio/speech")) return Endpoint::speech;
  if (path.ends_with("/audio/transcriptions") || path.ends_with("/audio/translations")) {
    return Endpoint::transcriptions;
  }
  if (path.ends_with("/models")) return Endpoint::models;
  if (path.ends_with("/messages")) return Endpoint::messages;
  if (path.ends_with("/messages/count_tokens")) return Endpoint::messages_count_tokens;
  return Endpoint::unknown;
}

bool is_anthropic(Endpoint endpoint) {
  return endpoint == Endpoint::messages || endpoint == Endpoint::messages_count_tokens;
}

// Azure OpenAI names the deployment in the path and the API version in the
// query: /openai/deployments/{deployment}/chat/completions?api-version=...
bool is_azure_deployment_path(std::string_view target) {
  return target.starts_with("/openai/deployments/");
}

bool has_query_parameter(std::string_view target, std::string_view name) {
  const auto query_start = target.find('?');
  if (query_start == std::string_view::npos) return false;
  std::string_view query = target.substr(query_start + 1);
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const std::string_view key = pair.substr(0, pair.find('='));
    if (key == name && pair.size() > key.size() + 1) return true;
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return false;
}

bool is_control(Endpoint endpoint) {
  return endpoint == Endpoint::mock_stats || endpoint == Endpoint::mock_behaviour;
}

// ---------------------------------------------------------------------------
// OpenAI payloads

std::string error_body(std::string_view message, std::string_view type, std::string_view param,
                       std::string_view code) {
  std::string out;
  out.reserve(128 + message.size());
  out += R"({"error":{"message":)";
  append_json_string(out, message);
  out += R"(,"type":)";
  append_json_string(out, type);
  out += R"(,"param":)";
  if (param.empty()) {
    out += "null";
  } else {
    append_json_string(out, param);
  }
  out += R"(,"code":)";
  if (code.empty()) {
    out += "null";
  } else {
    append_json_string(out, code);
  }
  out += "}}";
  return out;
}

// A response decided before any streaming starts: an error or a control reply.
struct Reply {
  unsigned status = 200;
  std::string body;
  unsigned retry_after_s = 0;  // 0: no Retry-After header
  std::string_view content_type = "application/json";
  unsigned retry_after_ms = 0;  // 0: no retry-after-ms header
};

Reply invalid_request(std::string_view message, std::string_view param = {},
                      std::string_view code = {}) {
  return {400, error_body(message, "invalid_request_error", param, code)};
}

std::size_t text_chars(const Json& value) {
  if (value.is_string()) return value.get_ref<const std::string&>().size();
  std::size_t chars = 0;
  if (value.is_array()) {
    for (const auto& part : value) chars += text_chars(part);
  } else if (value.is_object()) {
    // Content parts ({"type":"text","text":...}) and Responses input items
    // ({"role":...,"content":...}).
    if (auto text = value.find("text"); text != value.end()) chars += text_chars(*text);
    if (auto content = value.find("content"); content != value.end()) chars += text_chars(*content);
  } else if (value.is_number()) {
    chars += 4;  // a token id
  }
  return chars;
}

// The estimate real providers roughly follow: four characters per token.
std::uint64_t estimate_prompt_tokens(Endpoint endpoint, const Json& body) {
  std::size_t chars = 0;
  switch (endpoint) {
    case Endpoint::chat:
      if (auto messages = body.find("messages"); messages != body.end() && messages->is_array()) {
        for (const auto& message : *messages) {
          if (message.is_object()) {
            if (auto content = message.find("content"); content != message.end()) {
              chars += text_chars(*content);
            }
          }
        }
      }
      break;
    case Endpoint::completions:
      if (auto prompt = body.find("prompt"); prompt != body.end()) chars += text_chars(*prompt);
      break;
    case Endpoint::embeddings:
      if (auto input = body.find("input"); input != body.end()) chars += text_chars(*input);
      break;
    case Endpoint::moderations:
    case Endpoint::speech:
      if (auto input = body.find("input"); input != body.end()) chars += text_chars(*input);
      break;
    case Endpoint::responses:
      if (auto input = body.find("input"); input != body.end()) chars += text_chars(*input);
      if (auto instructions = body.find("instructions"); instructions != body.end()) {
        chars += text_chars(*instructions);
      }
      break;
    case Endpoint::messages:
    case Endpoint::messages_count_tokens:
      if (auto messages = body.find("messages"); messages != body.end()) {
        chars += text_chars(*messages);
      }
      if (auto system = body.find("system"); system != body.end()) chars += text_chars(*system);
      break;
    default:
      break;
  }
  return std::max<std::uint64_t>(1, chars / 4);
}

// Bag-of-words embedding: every word (lowercased run of alphanumerics; bytes
// above 0x7f count as letters so UTF-8 text works) adds 1 to the bucket its
// FNV-1a hash selects. Texts sharing most words get a high cosine similarity.
std::vector<float> embed(std::string_view text, unsigned dims) {
  constexpr std::uint32_t kFnvOffset = 2166136261u;
  constexpr std::uint32_t kFnvPrime = 16777619u;
  std::vector<float> vector(dims, 0.0f);
  std::uint32_t hash = kFnvOffset;
  bool in_word = false;
  auto end_word = [&] {
    if (in_word) vector[hash % dims] += 1.0f;
    hash = kFnvOffset;
    in_word = false;
  };
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) || byte >= 0x80) {
      hash = (hash ^ static_cast<unsigned char>(std::tolower(byte))) * kFnvPrime;
      in_word = true;
    } else {
      end_word();
    }
  }
  end_word();
  double norm_squared = 0;
  for (float component : vector) norm_squared += double(component) * component;
  if (norm_squared == 0) {
    vector[0] = 1.0f;  // still a unit vector for empty input
  } else {
    const auto scale = static_cast<float>(1.0 / std::sqrt(norm_squared));
    for (float& component : vector) component *= scale;
  }
  return vector;
}

std::string embedding_input_text(const Json& input) {
  if (input.is_string()) return input.get<std::string>();
  std::string text;
  if (input.is_array()) {  // token ids: each id becomes a word
    for (const auto& item : input) {
      if (!text.empty()) text += ' ';
      text += item.is_string() ? item.get<std::string>() : item.dump();
    }
  } else {
    text = input.dump();
  }
  return text;
}

// Everything needed to answer one model request, fixed before the first byte.
struct Plan {
  Endpoint endpoint = Endpoint::unknown;
  Behaviour behaviour;
  FailMode fail = FailMode::none;
  bool stream = false;
  bool include_usage = false;
  bool embeddings_base64 = false;
  std::string model_json;     // the request's model, already a quoted JSON string
  std::string presented_key;  // from Authorization: Bearer, quoted back by a 401
  std::uint64_t prompt_tokens = 1;
  std::uint64_t serial = 0;
  std::int64_t created = 0;
  Clock::duration ttft{};
  std::vector<std::string> embedding_inputs;
  unsigned dims = 16;
  anthropic::Answer anthropic_answer;  // for Endpoint::messages
  // For Endpoint::chat: when not empty, the answer is a call of this tool
  // (x-mock-openai: tools and a request that offers tools).
  std::string tool_name;
};

// The arguments of a chat completion's tool call: the same object as the
// Anthropic answers' tool_use input, so a test can compare what reaches a
// client through either protocol.
std::string tool_arguments() { return anthropic::tool_input_json({}); }

std::uint64_t completion_tokens(const Plan& plan) {
  if (plan.tool_name.empty()) return plan.behaviour.tokens;
  return std::max<std::uint64_t>(1, tool_arguments().size() / 4);
}

// The tool call's id, type and name, up to the arguments (left open); a
// streamed call starts with its index.
void append_tool_call_opening(std::string& out, const Plan& plan, bool streamed) {
  out += streamed ? R"({"index":0,"id":"call_mock_)" : R"({"id":"call_mock_)";
  append_uint(out, plan.serial);
  out += R"(","type":"function","function":{"name":)";
  append_json_string(out, plan.tool_name);
  out += R"(,"arguments":)";
}

void append_usage(std::string& out, const Plan& plan) {
  const std::uint64_t completion = completion_tokens(plan);
  if (plan.endpoint == Endpoint::responses || plan.endpoint == Endpoint::transcriptions) {
    out += plan.endpoint == Endpoint::transcriptions ? R"({"type":"tokens","input_tokens":)"
                                                     : R"({"input_tokens":)";
    append_uint(out, plan.prompt_tokens);
    out += R"(,"output_tokens":)";
    append_uint(out, completion);
  } else {
    out += R"({"prompt_tokens":)";
    append_uint(out, plan.prompt_tokens);
    out += R"(,"completion_tokens":)";
    append_uint(out, completion);
  }
  out += R"(,"total_tokens":)";
  append_uint(out, plan.prompt_tokens + completion);
  out += '}';
}

void append_all_tokens(std::string& out, const Plan& plan) {
  for (unsigned i = 0; i < plan.behaviour.tokens; ++i) append_token(out, i);
}

void append_response_object(std::string& out, const Plan& plan) {
  out += R"({"id":"resp_mock_)";
  append_uint(out, plan.serial);
  out += R"(","object":"response","created_at":)";
  append_int(out, plan.created);
  out += R"(,"status":"completed","model":)";
  out += plan.model_json;
  out += R"(,"output":[{"type":"message","id":"msg_mock_)";
  append_uint(out, plan.serial);
  out += R"(","status":"completed","role":"assistant","content":[{"type":"output_text","text":")";
  append_all_tokens(out, plan);
  out += R"(","annotations":[]}]}],"usage":)";
  append_usage(out, plan);
  out += '}';
}

// Binary content for the audio and image answers: every byte value, CR and
// LF among them, so a relay that treats the body as text shows.
std::string audio_bytes(const Plan& plan) {
  std::string bytes = "ID3";
  const std::size_t size = std::size_t{64} * std::max(1u, plan.behaviour.tokens);
  for (std::size_t i = 0; bytes.size() < size; ++i) {
    bytes.push_back(static_cast<char>((i * 37 + plan.serial) & 0xff));
  }
  return bytes;
}

std::string_view content_type_of(Endpoint endpoint) {
  return endpoint == Endpoint::speech ? "audio/mpeg" : "application/json";
}

std::string complete_body(const Plan& plan) {
  std::string out;
  out.reserve(320 + plan.behaviour.tokens * 8);
  switch (plan.endpoint) {
    case Endpoint::chat:
      out += R"({"id":"chatcmpl-mock-)";
      append_uint(out, plan.serial);
      out += R"(","object":"chat.completion","created":)";
      append_int(out, plan.created);
      out += R"(,"model":)";
      out += plan.model_json;
      if (!plan.tool_name.empty()) {
        // As OpenAI answers a tool call: no content, the call, its finish reason.
        out += R"(,"choices":[{"index":0,"message":{"role":"assistant","content":null,)";
        out += R"("tool_calls":[)";
        append_tool_call_opening(out, plan, false);
        append_json_string(out, tool_arguments());
        out += R"(}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":)";
        append_usage(out, plan);
        out += '}';
        break;
      }
      out += R"(,"choices":[{"index":0,"message":{"role":"assistant","content":")";
      append_all_tokens(out, plan);
      out += R"("},"logprobs":null,"finish_reason":"stop"}],"usage":)";
      append_usage(out, plan);
      out += '}';
      break;
    case Endpoint::completions:
      out += R"({"id":"cmpl-mock-)";
      append_uint(out, plan.serial);
      out += R"(","object":"text_completion","created":)";
      append_int(out, plan.created);
      out += R"(,"model":)";
      out += plan.model_json;
      out += R"(,"choices":[{"index":0,"text":")";
      append_all_tokens(out, plan);
      out += R"(","logprobs":null,"finish_reason":"stop"}],"usage":)";
      append_usage(out, plan);
      out += '}';
      break;
    case Endpoint::responses:
      append_response_object(out, plan);
      break;
    case Endpoint::embeddings: {
      out.reserve(128 + plan.embedding_inputs.size() * plan.dims * 12);
      out += R"({"object":"list","data":[)";
      for (std::size_t i = 0; i < plan.embedding_inputs.size(); ++i) {
        if (i > 0) out += ',';
        out += R"({"object":"embedding","index":)";
        append_uint(out, i);
        out += R"(,"embedding":)";
        const auto vector = embed(plan.embedding_inputs[i], plan.dims);
        if (plan.embeddings_base64) {
          // Little-endian float32, as the OpenAI SDKs decode it.
          std::string raw(vector.size() * sizeof(float), '\0');
          std::memcpy(raw.data(), vector.data(), raw.size());
          out += '"';
          append_base64(out, reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
          out += '"';
        } else {
          out += '[';
          for (std::size_t d = 0; d < vector.size(); ++d) {
            if (d > 0) out += ',';
            append_float(out, vector[d]);
          }
          out += ']';
        }
        out += '}';
      }
      out += R"(],"model":)";
      out += plan.model_json;
      out += R"(,"usage":{"prompt_tokens":)";
      append_uint(out, plan.prompt_tokens);
      out += R"(,"total_tokens":)";
      append_uint(out, plan.prompt_tokens);
      out += "}}";
      break;
    }
    case Endpoint::models:
      out +=
          R"({"object":"list","data":[{"id":"mock-model","object":"model","created":0,"owned_by":"sluice-mock"}]})";
      break;
    case Endpoint::moderations:
      out += R"({"id":"modr-mock-)";
      append_uint(out, plan.serial);
      out += R"(","model":)";
      out += plan.model_json;
      out += R"(,"results":[{"flagged":false,"categories":{"harassment":false,"hate":false,)"
             R"("self-harm":false,"sexual":false,"violence":false},"category_scores":{)"
             R"("harassment":0.0001,"hate":0.0001,"self-harm":0.0001,"sexual":0.0001,)"
             R"("violence":0.0001}}]})";
      break;
    case Endpoint::images: {
      out += R"({"created":)";
      append_int(out, plan.created);
      out += R"(,"data":[{"b64_json":")";
      const auto image = audio_bytes(plan);
      append_base64(out, reinterpret_cast<const unsigned char*>(image.data()), image.size());
      out += R"("}]})";
      break;
    }
    case Endpoint::speech:
      out = audio_bytes(plan);
      break;
    case Endpoint::transcriptions:
      out += R"({"text":")";
      append_all_tokens(out, plan);
      out += R"("})";
      break;
    case Endpoint::messages:
      out = anthropic::message_body(plan.anthropic_answer);
      break;
    case Endpoint::messages_count_tokens:
      out = anthropic::count_tokens_body(plan.prompt_tokens);
      break;
    default:
      break;
  }
  return out;
}

// The events of one stream, formatted on demand so a long or endless stream
// costs no memory up front.
class EventScript {
 public:
  explicit EventScript(const Plan& plan) : plan_(plan) {
    const std::size_t tokens = plan.behaviour.tokens;
    if (plan.endpoint == Endpoint::messages) {
      script_anthropic();
      return;
    }
    if (plan.endpoint == Endpoint::responses || plan.endpoint == Endpoint::transcriptions) {
      count_ = tokens + 1;  // deltas, then response.completed or transcript.text.done
      if (plan.fail == FailMode::error_mid) script_openai_error_mid();
      return;
    }
    count_ = tokens + 1 + (plan.include_usage ? 1 : 0) + 1;  // + finish, usage, [DONE]
    prefix_.reserve(160 + plan.model_json.size());
    prefix_ += R"(data: {"id":")";
    prefix_ += plan.endpoint == Endpoint::chat ? "chatcmpl-mock-" : "cmpl-mock-";
    append_uint(prefix_, plan.serial);
    prefix_ += plan.endpoint == Endpoint::chat ? R"(","object":"chat.completion.chunk","created":)"
                                               : R"(","object":"text_completion","created":)";
    append_int(prefix_, plan.created);
    prefix_ += R"(,"model":)";
    prefix_ += plan.model_json;
    prefix_ += R"(,"choices":)";
    if (!plan.tool_name.empty()) script_openai_tool_call();
    if (plan.fail == FailMode::error_mid) script_openai_error_mid();
  }

  std::size_t size() const { return count_; }

  // Appends event `index` with its SSE framing.
  void append_event(std::size_t index, std::string& out) const {
    if (!scripted_.empty()) {
      out += scripted_[index];
      return;
    }
    if (plan_.endpoint == Endpoint::messages) {  // a text answer, or an endless stream
      if (plan_.fail == FailMode::endless) {
        anthropic::append_endless_event(plan_.anthropic_answer, index, out);
      } else {
        anthropic::append_text_answer_event(plan_.anthropic_answer, index, out);
      }
      return;
    }
    const std::size_t tokens = plan_.behaviour.tokens;
    if (index < tokens) {
      append_token_event(index, out);
    } else if (plan_.endpoint == Endpoint::transcriptions) {
      out += R"(data: {"type":"transcript.text.done","text":")";
      append_all_tokens(out, plan_);
      out += R"(","usage":)";
      append_usage(out, plan_);
      out += "}\n\n";
    } else if (plan_.endpoint == Endpoint::responses) {
      out +=
          "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":";
      append_uint(out, index);
      out += R"(,"response":)";
      append_response_object(out, plan_);
      out += "}\n\n";
    } else if (index == tokens) {
      out += prefix_;
      if (plan_.endpoint == Endpoint::chat) {
        out += tokens == 0 ? R"([{"index":0,"delta":{"role":"assistant"},"finish_reason":"stop"}])"
                           : R"([{"index":0,"delta":{},"finish_reason":"stop"}])";
      } else {
        out += R"([{"index":0,"text":"","logprobs":null,"finish_reason":"stop"}])";
      }
      end_chunk(out);
    } else if (plan_.include_usage && index == tokens + 1) {
      out += prefix_;
      out += R"([],"usage":)";
      append_usage(out, plan_);
      out += "}\n\n";
    } else {
      out += "data: [DONE]\n\n";
    }
  }

  // Appends the content event for token `index`; endless streams call this
  // past the scripted token count.
  void append_token_event(std::size_t index, std::string& out) const {
    if (plan_.endpoint == Endpoint::messages) {
      anthropic::append_endless_event(plan_.anthropic_answer, index, out);
      return;
    }
    if (plan_.endpoint == Endpoint::transcriptions) {
      out += R"(data: {"type":"transcript.text.delta","delta":")";
      append_token(out, index);
      out += "\"}\n\n";
      return;
    }
    if (plan_.endpoint == Endpoint::responses) {
      out += "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",";
      out += R"("item_id":"msg_mock_)";
      append_uint(out, plan_.serial);
      out += R"(","output_index":0,"content_index":0,"sequence_number":)";
      append_uint(out, index);
      out += R"(,"delta":")";
      append_token(out, index);
      out += "\"}\n\n";
      return;
    }
    out += prefix_;
    if (plan_.endpoint == Endpoint::chat) {
      out += index == 0 ? R"([{"index":0,"delta":{"role":"assistant","content":")"
                        : R"([{"index":0,"delta":{"content":")";
      append_token(out, index);
      out += R"("},"logprobs":null,"finish_reason":null}])";
    } else {
      out += R"([{"index":0,"text":")";
      append_token(out, index);
      out += R"(","logprobs":null,"finish_reason":null}])";
    }
    end_chunk(out);
  }

  // As OpenAI does: when the request asked for usage, every chunk before
  // the usage chunk carries "usage":null.
  void end_chunk(std::string& out) const {
    out += plan_.include_usage ? ",\"usage\":null}\n\n" : "}\n\n";
  }

 private:
  // A tool call: its id, type and name in the first chunk, then its
  // arguments a few characters a chunk, then the finish reason, the usage
  // when asked for, and [DONE].
  void script_openai_tool_call() {
    const std::string arguments = tool_arguments();
    std::string& opening = scripted_.emplace_back(prefix_);
    opening += R"([{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[)";
    append_tool_call_opening(opening, plan_, true);
    opening += R"(""}}]},"logprobs":null,"finish_reason":null}])";
    end_chunk(opening);
    for (std::size_t at = 0; at < arguments.size(); at += kToolArgumentPieceBytes) {
      std::string& piece = scripted_.emplace_back(prefix_);
      piece += R"([{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":)";
      append_json_string(piece, std::string_view(arguments).substr(at, kToolArgumentPieceBytes));
      piece += R"(}}]},"logprobs":null,"finish_reason":null}])";
      end_chunk(piece);
    }
    std::string& finish = scripted_.emplace_back(prefix_);
    finish += R"([{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}])";
    end_chunk(finish);
    if (plan_.include_usage) {
      std::string& usage = scripted_.emplace_back(prefix_);
      usage += R"([],"usage":)";
      append_usage(usage, plan_);
      usage += "}\n\n";
    }
    scripted_.emplace_back("data: [DONE]\n\n");
    count_ = scripted_.size();
  }

  // A few tokens (or pieces of a tool call's arguments), then the error
  // OpenAI sends when a stream fails midway.
  void script_openai_error_mid() {
    if (!scripted_.empty()) {  // a tool call: its opening chunk and a few pieces
      scripted_.resize(std::min(scripted_.size(), 1 + kErrorMidAfterDeltas));
    } else {
      const std::size_t tokens = plan_.behaviour.tokens;
      for (std::size_t index = 0; index < std::min(tokens, kErrorMidAfterDeltas); ++index) {
        append_token_event(index, scripted_.emplace_back());
      }
    }
    scripted_.push_back("data: " +
                        error_body("The server had an error while processing your request. "
                                   "Sorry about that!",
                                   "server_error", {}, {}) +
                        "\n\n");
    count_ = scripted_.size();
  }

  // A text answer is formatted as it goes, as the OpenAI streams are, and
  // so is an endless one; one with thinking or tool use, or cut by an error,
  // has too many kinds of event for that and is formatted up front.
  void script_anthropic() {
    if (plan_.fail == FailMode::endless) {
      count_ = anthropic::kEventsBeforeFirstDelta + plan_.behaviour.tokens;
      return;
    }
    const auto& content = plan_.anthropic_answer.content;
    if (!content.thinking && !content.tool_use && plan_.fail != FailMode::error_mid) {
      count_ = anthropic::text_answer_event_count(plan_.anthropic_answer);
      return;
    }
    scripted_ = anthropic::stream_events(plan_.anthropic_answer);
    if (plan_.fail == FailMode::error_mid) {
      // Cut after a few content deltas (one short of all of them in a short
      // answer, so the error always comes before the answer is complete),
      // then the error event Anthropic sends when it fails midway, most often
      // an overload.
      const auto total_deltas = static_cast<std::size_t>(
          std::count_if(scripted_.begin(), scripted_.end(),
                        [](const std::string& event) { return anthropic::is_delta_event(event); }));
      const std::size_t kept_deltas =
          std::min(kErrorMidAfterDeltas, total_deltas > 0 ? total_deltas - 1 : 0);
      std::size_t deltas = 0;
      auto cut = std::find_if(scripted_.begin(), scripted_.end(), [&](const std::string& event) {
        return (anthropic::is_delta_event(event) && ++deltas > kept_deltas) ||
               anthropic::is_message_delta_event(event);
      });
      scripted_.erase(cut, scripted_.end());
      scripted_.push_back(anthropic::error_event("overloaded_error", "Overloaded"));
    }
    count_ = scripted_.size();
  }

  const Plan& plan_;
  std::string prefix_;  // everything of a chunk up to the choices array
  // Events formatted up front: an Anthropic stream, or any "error-mid" one.
  std::vector<std::string> scripted_;
  std::size_t count_ = 0;
};

// Opens the event's JSON object with "sent_ns": the steady clock now, read
// as late as possible: just before the event is framed and written. Events
// without a JSON object ([DONE]) stay as they are.
void stamp_event(std::string& event) {
  constexpr std::string_view kDataObject = "data: {";
  const auto at = event.find(kDataObject);
  if (at == std::string::npos) return;
  const auto sent_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  constexpr std::string_view kKey = R"("sent_ns":)";
  char stamp[48];
  std::memcpy(stamp, kKey.data(), kKey.size());
  auto [end, error] = std::to_chars(stamp + kKey.size(), stamp + sizeof stamp - 1, sent_ns);
  if (error != std::errc{}) return;
  *end++ = ',';
  event.insert(at + kDataObject.size(), stamp, static_cast<std::size_t>(end - stamp));
}

// ---------------------------------------------------------------------------
// Behaviour overrides

// The Anthropic headers concern only the Anthropic endpoints and
// x-mock-openai only chat completions; other paths skip looking them up.
std::optional<std::string> apply_header_overrides(const http::fields& fields, Endpoint endpoint,
                                                  Behaviour& behaviour) {
  auto header = [&](std::string_view name) -> std::optional<std::string_view> {
    auto found = fields.find(beast::string_view(name.data(), name.size()));
    if (found == fields.end()) return std::nullopt;
    return to_std(found->value());
  };
  auto invalid = [](std::string_view name) {
    return "invalid value for header " + std::string(name);
  };
  auto read_count = [&](std::string_view name, auto& target) -> bool {
    auto value = header(name);
    if (!value) return true;
    auto parsed = parse_unsigned<std::uint64_t>(*value);
    if (!parsed || *parsed > std::numeric_limits<unsigned>::max()) return false;
    target = static_cast<std::remove_reference_t<decltype(target)>>(*parsed);
    return true;
  };
  auto read_duration = [&](std::string_view name, auto& target) -> bool {
    auto value = header(name);
    if (!value) return true;
    auto parsed = parse_unsigned<std::uint64_t>(*value);
    if (!parsed || *parsed > kMaxHeaderDuration) return false;
    target = std::remove_reference_t<decltype(target)>(*parsed);
    return true;
  };

  // "0" or "1".
  auto read_flag = [&](std::string_view name, bool& target) -> bool {
    auto value = header(name);
    if (!value) return true;
    if (*value != "0" && *value != "1") return false;
    target = *value == "1";
    return true;
  };

  if (!read_duration("x-mock-ttft-ms", behaviour.ttft)) return invalid("x-mock-ttft-ms");
  if (!read_duration("x-mock-ttft-per-token-us", behaviour.ttft_per_prompt_token)) {
    return invalid("x-mock-ttft-per-token-us");
  }
  if (!read_duration("x-mock-interval-ms", behaviour.interval)) {
    return invalid("x-mock-interval-ms");
  }
  if (!read_count("x-mock-tokens", behaviour.tokens)) return invalid("x-mock-tokens");
  if (!read_count("x-mock-slots", behaviour.slots)) return invalid("x-mock-slots");
  if (!read_duration("x-mock-stall-ms", behaviour.stall)) return invalid("x-mock-stall-ms");
  if (!read_count("x-mock-retry-after", behaviour.retry_after_s)) {
    return invalid("x-mock-retry-after");
  }
  if (!read_count("x-mock-retry-after-ms", behaviour.retry_after_ms)) {
    return invalid("x-mock-retry-after-ms");
  }
  if (endpoint == Endpoint::chat) {
    if (auto value = header("x-mock-openai")) {
      if (!is_valid_openai_content(*value)) return invalid("x-mock-openai");
      behaviour.openai_content.assign(value->data(), value->size());
    }
  }
  if (is_anthropic(endpoint)) {
    if (!read_count("x-mock-cache-read-tokens", behaviour.cache_read_tokens)) {
      return invalid("x-mock-cache-read-tokens");
    }
    if (!read_count("x-mock-cache-creation-tokens", behaviour.cache_creation_tokens)) {
      return invalid("x-mock-cache-creation-tokens");
    }
    if (auto value = header("x-mock-anthropic")) {
      if (!anthropic::parse_content_choice(*value)) return invalid("x-mock-anthropic");
      behaviour.anthropic_content.assign(value->data(), value->size());
    }
  }
  if (header("x-mock-dims")) {
    if (!read_count("x-mock-dims", behaviour.dims) || behaviour.dims == 0 ||
        behaviour.dims > kMaxDims) {
      return invalid("x-mock-dims");
    }
  }
  if (auto value = header("x-mock-fail")) {
    if (!parse_fail_mode(*value)) return invalid("x-mock-fail");
    behaviour.fail.assign(value->data(), value->size());
  }
  if (!read_flag("x-mock-stamp", behaviour.stamp)) return invalid("x-mock-stamp");
  if (!read_flag("x-mock-skip-body", behaviour.skip_body)) return invalid("x-mock-skip-body");
  if (auto value = header("x-mock-fail-rate")) {
    auto rate = parse_rate(*value);
    if (!rate) return invalid("x-mock-fail-rate");
    behaviour.fail_rate = *rate;
  }
  return std::nullopt;
}

// Applies a POST /mock/behaviour document; omitted fields keep their value.
std::optional<std::string> apply_behaviour_json(const Json& document, Behaviour& behaviour) {
  if (!document.is_object()) return "the body must be a JSON object";
  for (const auto& [key, value] : document.items()) {
    auto count = [&]() -> std::optional<unsigned> {
      if (!value.is_number_unsigned()) return std::nullopt;
      auto number = value.get<std::uint64_t>();
      if (number > std::numeric_limits<unsigned>::max()) return std::nullopt;
      return static_cast<unsigned>(number);
    };
    auto milliseconds = [&]() -> std::optional<std::chrono::milliseconds> {
      if (!value.is_number_unsigned() || value.get<std::uint64_t>() > kMaxHeaderDuration) {
        return std::nullopt;
      }
      return std::chrono::milliseconds(value.get<std::uint64_t>());
    };
    bool ok = true;
    if (key == "ttft_ms") {
      auto v = milliseconds();
      ok = v.has_value();
      if (ok) behaviour.ttft = *v;
    } else if (key == "ttft_per_token_us") {
      ok = value.is_number_unsigned() && value.get<std::uint64_t>() <= kMaxHeaderDuration;
      if (ok)
        behaviour.ttft_per_prompt_token = std::chrono::microseconds(value.get<std::uint64_t>());
    } else if (key == "accept_delay_ms") {
      auto v = milliseconds();
      ok = v.has_value();
      if (ok) behaviour.accept_delay = *v;
    } else if (key == "interval_ms") {
      auto v = milliseconds();
      ok = v.has_value();
      if (ok) behaviour.interval = *v;
    } else if (key == "stall_ms") {
      auto v = milliseconds();
      ok = v.has_value();
      if (ok) behaviour.stall = *v;
    } else if (key == "tokens") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.tokens = *v;
    } else if (key == "slots") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.slots = *v;
    } else if (key == "retry_after") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.retry_after_s = *v;
    } else if (key == "retry_after_ms") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.retry_after_ms = *v;
    } else if (key == "cache_read_tokens") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.cache_read_tokens = *v;
    } else if (key == "cache_creation_tokens") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.cache_creation_tokens = *v;
    } else if (key == "anthropic") {
      ok = value.is_string() &&
           anthropic::parse_content_choice(value.get_ref<const std::string&>()).has_value();
      if (ok) behaviour.anthropic_content = value.get<std::string>();
    } else if (key == "openai") {
      ok = value.is_string() && is_valid_openai_content(value.get_ref<const std::string&>());
      if (ok) behaviour.openai_content = value.get<std::string>();
    } else if (key == "dims") {
      auto v = count();
      ok = v.has_value() && *v > 0 && *v <= kMaxDims;
      if (ok) behaviour.dims = *v;
    } else if (key == "fail") {
      ok = value.is_string() && parse_fail_mode(value.get_ref<const std::string&>()).has_value();
      if (ok) behaviour.fail = value.get<std::string>();
    } else if (key == "fail_rate") {
      ok = value.is_number() && value.get<double>() >= 0.0 && value.get<double>() <= 1.0;
      if (ok) behaviour.fail_rate = value.get<double>();
    } else if (key == "h2_max_streams") {
      auto v = count();
      ok = v.has_value() && *v > 0;
      if (ok) behaviour.h2_max_streams = *v;
    } else if (key == "h2_goaway_after") {
      auto v = count();
      ok = v.has_value();
      if (ok) behaviour.h2_goaway_after = *v;
    } else if (key == "h2_ping_ack") {
      ok = value.is_boolean();
      if (ok) behaviour.h2_ping_ack = value.get<bool>();
    } else if (key == "stamp") {
      ok = value.is_boolean();
      if (ok) behaviour.stamp = value.get<bool>();
    } else {
      return "unknown behaviour field '" + key + "'";
    }
    if (!ok) return "invalid value for behaviour field '" + key + "'";
  }
  return std::nullopt;
}

Json behaviour_json(const Behaviour& behaviour) {
  return {
      {"ttft_ms", behaviour.ttft.count()},
      {"ttft_per_token_us", behaviour.ttft_per_prompt_token.count()},
      {"accept_delay_ms", behaviour.accept_delay.count()},
      {"interval_ms", behaviour.interval.count()},
      {"tokens", behaviour.tokens},
      {"slots", behaviour.slots},
      {"fail", behaviour.fail},
      {"stall_ms", behaviour.stall.count()},
      {"fail_rate", behaviour.fail_rate},
      {"retry_after", behaviour.retry_after_s},
      {"retry_after_ms", behaviour.retry_after_ms},
      {"dims", behaviour.dims},
      {"stamp", behaviour.stamp},
      {"anthropic", behaviour.anthropic_content},
      {"openai", behaviour.openai_content},
      {"cache_read_tokens", behaviour.cache_read_tokens},
      {"cache_creation_tokens", behaviour.cache_creation_tokens},
      {"h2_max_streams", behaviour.h2_max_streams},
      {"h2_goaway_after", behaviour.h2_goaway_after},
      {"h2_ping_ack", behaviour.h2_ping_ack},
  };
}

// ---------------------------------------------------------------------------
// HTTP framing

void append_head(std::string& out, unsigned status, std::string_view content_type,
                 std::size_t content_length, bool keep_alive, unsigned retry_after_s = 0,
                 unsigned retry_after_ms = 0) {
  out += "HTTP/1.1 ";
  append_uint(out, status);
  out += ' ';
  // 529 is Anthropic's own status, unknown to Beast.
  out += status == 529 ? std::string_view("Overloaded")
                       : to_std(http::obsolete_reason(http::int_to_status(status)));
  out += "\r\nServer: sluice-mock\r\n";
  if (status != 204) {
    if (!content_type.empty()) {
      out += "Content-Type: ";
      out += content_type;
      out += "\r\n";
    }
    out += "Content-Length: ";
    append_uint(out, content_length);
    out += "\r\n";
  }
  if (retry_after_s > 0) {
    out += "Retry-After: ";
    append_uint(out, retry_after_s);
    out += "\r\n";
  }
  if (retry_after_ms > 0) {
    out += "retry-after-ms: ";
    append_uint(out, retry_after_ms);
    out += "\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
}

void append_stream_head(std::string& out, bool keep_alive) {
  out +=
      "HTTP/1.1 200 OK\r\nServer: sluice-mock\r\nContent-Type: text/event-stream\r\n"
      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
}

void append_chunk(std::string& out, std::string_view payload) {
  char size[16];
  auto result = std::to_chars(size, size + sizeof size, payload.size(), 16);
  out.append(size, result.ptr);
  out += "\r\n";
  out += payload;
  out += "\r\n";
}

constexpr std::string_view kLastChunk = "0\r\n\r\n";

// ---------------------------------------------------------------------------
// Server-wide state shared by every connection

struct SharedState {
  std::atomic<std::uint64_t> connections_accepted{0};
  std::atomic<std::uint64_t> open_connections{0};
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> streams_completed{0};
  std::atomic<std::uint64_t> streams_cancelled{0};
  std::atomic<std::uint64_t> h2_connections{0};
  std::atomic<std::uint64_t> h2_resets_received{0};
  std::atomic<std::uint64_t> h2_pings_received{0};
  std::atomic<std::uint64_t> next_serial{1};
  bool http2 = false;  // Options::http2, fixed at start
  // Requests being served now, for Behaviour::slots.
  std::atomic<unsigned> busy_slots{0};

  mutable std::mutex behaviour_mutex;
  Behaviour behaviour;
  // One seeded sequence for the whole server, so a run with a given order of
  // requests fails the same ones again.
  std::mt19937_64 failure_rng{0x5eed5eedULL};

  mutable std::mutex recorded_mutex;
  std::deque<RecordedRequest> recorded;

  Behaviour behaviour_snapshot() const {
    std::lock_guard lock(behaviour_mutex);
    return behaviour;
  }

  bool roll_failure(double rate) {
    if (rate >= 1.0) return true;
    if (rate <= 0.0) return false;
    std::lock_guard lock(behaviour_mutex);
    return std::uniform_real_distribution<double>(0.0, 1.0)(failure_rng) < rate;
  }

  void record(const Request& request) {
    RecordedRequest entry;
    entry.method = to_std(request.method_string());
    entry.target = to_std(request.target());
    entry.headers.reserve(16);
    for (const auto& field : request) {
      entry.headers.emplace_back(to_std(field.name_string()), to_std(field.value()));
    }
    entry.body = request.body();
    std::lock_guard lock(recorded_mutex);
    if (recorded.size() == kRecordedLimit) recorded.pop_front();
    recorded.push_back(std::move(entry));
  }

  Stats stats() const {
    Stats snapshot;
    snapshot.connections_accepted = connections_accepted.load(std::memory_order_relaxed);
    snapshot.open_connections = open_connections.load(std::memory_order_relaxed);
    snapshot.requests = requests.load(std::memory_order_relaxed);
    snapshot.streams_completed = streams_completed.load(std::memory_order_relaxed);
    snapshot.streams_cancelled = streams_cancelled.load(std::memory_order_relaxed);
    snapshot.h2_connections = h2_connections.load(std::memory_order_relaxed);
    snapshot.h2_resets_received = h2_resets_received.load(std::memory_order_relaxed);
    snapshot.h2_pings_received = h2_pings_received.load(std::memory_order_relaxed);
    return snapshot;
  }

  std::string stats_json() const {
    const Stats snapshot = stats();
    return Json{
        {"connections_accepted", snapshot.connections_accepted},
        {"open_connections", snapshot.open_connections},
        {"requests", snapshot.requests},
        {"streams_completed", snapshot.streams_completed},
        {"streams_cancelled", snapshot.streams_cancelled},
        {"h2_connections", snapshot.h2_connections},
        {"h2_resets_received", snapshot.h2_resets_received},
        {"h2_pings_received", snapshot.h2_pings_received},
    }
        .dump();
  }
};

bool is_form_data(std::string_view content_type) {
  constexpr std::string_view kFormData = "multipart/form-data";
  return content_type.size() >= kFormData.size() &&
         iequals(content_type.substr(0, kFormData.size()), kFormData);
}

// Reads a multipart/form-data body: its text fields into `fields` as
// strings, the names of its files into `files`. False when it is not framed
// as the Content-Type says.
bool read_form(std::string_view body, std::string_view content_type, Json& fields,
               std::vector<std::string>& files) {
  constexpr std::string_view kBoundary = "boundary=";
  const auto at = content_type.find(kBoundary);
  if (at == std::string_view::npos) return false;
  std::string_view boundary = content_type.substr(at + kBoundary.size());
  boundary = boundary.substr(0, boundary.find(';'));
  if (boundary.size() >= 2 && boundary.front() == '"' && boundary.back() == '"') {
    boundary = boundary.substr(1, boundary.size() - 2);
  }
  if (boundary.empty()) return false;
  const std::string delimiter = "\r\n--" + std::string(boundary);
  std::size_t pos = body.starts_with(std::string_view(delimiter).substr(2)) ? delimiter.size() - 2
                                                                            : body.find(delimiter);
  if (pos == std::string_view::npos) return false;
  if (pos != delimiter.size() - 2) pos += delimiter.size();
  while (!body.substr(pos).starts_with("--")) {
    const auto head_end = body.find("\r\n\r\n", pos);
    const auto next =
        head_end == std::string_view::npos ? head_end : body.find(delimiter, head_end);
    if (next == std::string_view::npos) return false;
    const std::string_view head = body.substr(pos, head_end - pos);
    const std::string_view content = body.substr(head_end + 4, next - head_end - 4);
    constexpr std::string_view kName = "name=\"";
    auto name_at = head.find(kName);
    // "filename=\"" holds "name=\"" too: the field's name is the one after a
    // separator.
    while (name_at != std::string_view::npos && name_at > 0 && head[name_at - 1] != ' ' &&
           head[name_at - 1] != ';') {
      name_at = head.find(kName, name_at + 1);
    }
    if (name_at == std::string_view::npos) return false;
    const auto name_begin = name_at + kName.size();
    const auto name = std::string(head.substr(name_begin, head.find('"', name_begin) - name_begin));
    if (head.find("filename=") != std::string_view::npos) {
      files.push_back(name);
    } else {
      fields[name] = std::string(content);
    }
    pos = next + delimiter.size();
  }
  return true;
}

// Builds the plan for a model request, or the error reply that replaces it.
std::variant<Plan, Reply> make_plan(Endpoint endpoint, const Request& request, SharedState& state) {
  Plan plan;
  plan.endpoint = endpoint;
  plan.behaviour = state.behaviour_snapshot();
  if (auto error = apply_header_overrides(request.base(), endpoint, plan.behaviour)) {
    return invalid_request(*error, {}, "invalid_mock_header");
  }
  if (is_azure_deployment_path(to_std(request.target())) &&
      !has_query_parameter(to_std(request.target()), "api-version")) {
    return invalid_request("Missing required query parameter 'api-version'.", "api-version",
                           "BadRequest");
  }
  if (is_anthropic(endpoint) && request.base().find("anthropic-version") == request.base().end()) {
    return invalid_request("anthropic-version: header is required");
  }
  const bool skip_body =
      plan.behaviour.skip_body && (endpoint == Endpoint::chat || endpoint == Endpoint::completions);
  Json body = Json::object();
  std::vector<std::string> files;
  const auto content_type = to_std(request.base()[http::field::content_type]);
  if (endpoint != Endpoint::models && !skip_body && is_form_data(content_type)) {
    if (!read_form(request.body(), content_type, body, files)) {
      return invalid_request("We could not parse the multipart/form-data body of your request.");
    }
  } else if (endpoint != Endpoint::models && !skip_body) {
    body = Json::parse(request.body(), nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      return invalid_request(
          "We could not parse the JSON body of your request. The body must be a JSON object.");
    }
  }
  auto fail = parse_fail_mode(plan.behaviour.fail);
  if (!fail) return invalid_request("unknown failure mode '" + plan.behaviour.fail + "'");
  if (*fail != FailMode::none && state.roll_failure(plan.behaviour.fail_rate)) plan.fail = *fail;
  if (plan.fail == FailMode::unauthorized) {
    auto authorization = to_std(request.base()[http::field::authorization]);
    constexpr std::string_view kBearer = "Bearer ";
    if (authorization.starts_with(kBearer)) authorization.remove_prefix(kBearer.size());
    plan.presented_key = std::string(authorization);
  }

  auto required = [&](const char* field) { return skip_body || body.contains(field); };
  switch (endpoint) {
    case Endpoint::chat:
      if (!required("messages") || (!skip_body && !body["messages"].is_array())) {
        return invalid_request("'messages' is a required array", "messages");
      }
      break;
    case Endpoint::completions:
      if (!required("prompt")) return invalid_request("'prompt' is required", "prompt");
      break;
    case Endpoint::embeddings:
    case Endpoint::responses:
    case Endpoint::moderations:
    case Endpoint::speech:
      if (!required("input")) return invalid_request("'input' is required", "input");
      break;
    case Endpoint::transcriptions:
      if (std::find(files.begin(), files.end(), "file") == files.end()) {
        return invalid_request("'file' is a required file", "file");
      }
      break;
    case Endpoint::messages:
      if (!body.contains("max_tokens")) return invalid_request("max_tokens: Field required");
      [[fallthrough]];
    case Endpoint::messages_count_tokens:
      if (!body.contains("messages") || !body["messages"].is_array()) {
        return invalid_request("messages: Field required");
      }
      break;
    default:
      break;
  }

  plan.model_json.reserve(32);
  if (auto model = body.find("model"); model != body.end() && model->is_string()) {
    append_json_string(plan.model_json, model->get_ref<const std::string&>());
  } else {
    append_json_string(plan.model_json, kDefaultModel);
  }
  if (endpoint == Endpoint::chat || endpoint == Endpoint::completions ||
      endpoint == Endpoint::responses || endpoint == Endpoint::transcriptions ||
      endpoint == Endpoint::messages) {
    // A form's fields are text: "true" streams.
    if (auto stream = body.find("stream"); stream != body.end() && stream->is_string()) {
      plan.stream = stream->get_ref<const std::string&>() == "true";
    }
    if (auto stream = body.find("stream"); stream != body.end() && stream->is_boolean()) {
      plan.stream = stream->get<bool>();
    }
    if (auto options = body.find("stream_options"); options != body.end() && options->is_object()) {
      if (auto usage = options->find("include_usage");
          usage != options->end() && usage->is_boolean()) {
        plan.include_usage = usage->get<bool>();
      }
    }
  }
  if (endpoint == Endpoint::embeddings) {
    const Json& input = body["input"];
    if (input.is_array() && !input.empty() && !input.front().is_number()) {
      for (const auto& item : input) plan.embedding_inputs.push_back(embedding_input_text(item));
    } else {
      plan.embedding_inputs.push_back(embedding_input_text(input));
    }
    plan.dims = std::clamp(plan.behaviour.dims, 1u, kMaxDims);
    if (auto dims = body.find("dimensions"); dims != body.end() && dims->is_number_unsigned()) {
      auto requested = dims->get<std::uint64_t>();
      if (requested == 0 || requested > kMaxDims) {
        return invalid_request("'dimensions' is out of range", "dimensions");
      }
      plan.dims = static_cast<unsigned>(requested);
    }
    if (auto format = body.find("encoding_format"); format != body.end() && format->is_string()) {
      plan.embeddings_base64 = format->get_ref<const std::string&>() == "base64";
    }
  }

  plan.prompt_tokens =
      skip_body ? request.body().size() / 4 : estimate_prompt_tokens(endpoint, body);
  plan.serial = state.next_serial.fetch_add(1, std::memory_order_relaxed);
  plan.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  plan.ttft = plan.behaviour.ttft +
              plan.behaviour.ttft_per_prompt_token * static_cast<std::int64_t>(plan.prompt_tokens);
  // An endless stream has no end for a tool call's arguments: it sends text.
  if (endpoint == Endpoint::chat && plan.behaviour.openai_content == "tools" && !skip_body &&
      plan.fail != FailMode::endless) {
    // The tool the model "calls" is the first one the request offers; a
    // request that offers none is answered with text.
    if (auto tools = body.find("tools");
        tools != body.end() && tools->is_array() && !tools->empty()) {
      plan.tool_name = "get_weather";
      const Json& tool = tools->front();
      if (auto function = tool.find("function");
          tool.is_object() && function != tool.end() && function->is_object()) {
        if (auto name = function->find("name"); name != function->end() && name->is_string()) {
          plan.tool_name = name->get<std::string>();
        }
      }
    }
  }
  if (endpoint == Endpoint::messages) {
    auto content = anthropic::parse_content_choice(plan.behaviour.anthropic_content);
    if (!content) {
      return invalid_request("unknown Anthropic content '" + plan.behaviour.anthropic_content +
                             "'");
    }
    anthropic::Answer& answer = plan.anthropic_answer;
    answer.serial = plan.serial;
    const auto model = body.find("model");
    answer.model = model != body.end() && model->is_string() ? model->get<std::string>()
                                                             : std::string(kDefaultModel);
    answer.text_tokens = plan.behaviour.tokens;
    answer.content = *content;
    // The tool the model "calls" is the first one the request offers.
    if (auto tools = body.find("tools");
        tools != body.end() && tools->is_array() && !tools->empty() && tools->front().is_object()) {
      if (auto name = tools->front().find("name");
          name != tools->front().end() && name->is_string()) {
        answer.tool_name = name->get<std::string>();
      }
    }
    answer.input_tokens = plan.prompt_tokens;
    answer.cache_read_input_tokens = plan.behaviour.cache_read_tokens;
    answer.cache_creation_input_tokens = plan.behaviour.cache_creation_tokens;
  }
  return plan;
}

std::optional<Reply> failure_reply(const Plan& plan) {
  switch (plan.fail) {
    case FailMode::bad_request:
      return invalid_request("Mock failure: the request was rejected (x-mock-fail: 400).");
    case FailMode::unauthorized:
      // As OpenAI does, the message quotes the key it was given: an upstream
      // error body can carry a secret.
      return Reply{401, error_body("Incorrect API key provided: " + plan.presented_key +
                                       ". You can find your API key at "
                                       "https://platform.openai.com/account/api-keys.",
                                   "invalid_request_error", {}, "invalid_api_key")};
    case FailMode::server_error:
      return Reply{500, error_body("The server had an error while processing your request. "
                                   "Sorry about that!",
                                   "server_error", {}, {})};
    case FailMode::unavailable:
      return Reply{
          503, error_body("The server is overloaded or not ready yet.", "server_error", {}, {})};
    case FailMode::rate_limited: {
      std::string message = "Rate limit reached for requests. Please try again in ";
      append_uint(message, plan.behaviour.retry_after_s);
      message += "s.";
      return Reply{429, error_body(message, "requests", {}, "rate_limit_exceeded"),
                   plan.behaviour.retry_after_s, "application/json", plan.behaviour.retry_after_ms};
    }
    case FailMode::overloaded:
      // Anthropic's status for an overloaded API; OpenAI endpoints send it too,
      // in their own shape, so one mode drives a gateway's handling of it.
      return Reply{
          529, error_body("The server is overloaded or not ready yet.", "server_error", {}, {})};
    case FailMode::context_length: {
      if (is_anthropic(plan.endpoint)) {
        std::string message = "prompt is too long: ";
        append_uint(message, std::max(plan.prompt_tokens, kContextLimitTokens + 1));
        message += " tokens > 8192 maximum";
        return invalid_request(message);
      }
      std::string message = "This model's maximum context length is 8192 tokens. However, your ";
      message += "messages resulted in ";
      append_uint(message, std::max(plan.prompt_tokens, kContextLimitTokens + 1));
      message += " tokens. Please reduce the length of the messages.";
      return invalid_request(message, "messages", "context_length_exceeded");
    }
    default:
      return std::nullopt;
  }
}

// Anthropic's clients read errors in Anthropic's shape, so on its paths an
// error reply keeps its status and headers and gets that body instead.
Reply in_anthropic_shape(Reply reply) {
  if (reply.status < 400) return reply;
  std::string message;
  if (reply.status == 401) {
    message = "invalid x-api-key";
  } else if (reply.status == 529) {
    message = "Overloaded";
  } else {
    const Json openai = Json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    const Json* text = openai.is_object() && openai.contains("error") &&
                               openai["error"].is_object() && openai["error"].contains("message")
                           ? &openai["error"]["message"]
                           : nullptr;
    message = text && text->is_string() ? text->get<std::string>() : "Error";
  }
  reply.body = anthropic::error_body(anthropic::error_type_for_status(reply.status), message);
  return reply;
}

// Control endpoints, unknown URLs and wrong methods; nullopt for a model
// request. The same for either framing.
Reply update_behaviour(const std::string& body, SharedState& state) {
  Json document = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return invalid_request("The behaviour body is not valid JSON.");
  std::lock_guard lock(state.behaviour_mutex);
  Behaviour updated = state.behaviour;
  if (auto error = apply_behaviour_json(document, updated)) return invalid_request(*error);
  state.behaviour = std::move(updated);
  return Reply{204, {}};
}

std::optional<Reply> reply_without_model(const Request& request, Endpoint endpoint,
                                         SharedState& state) {
  const auto method = request.method();
  switch (endpoint) {
    case Endpoint::mock_stats:
      if (method == http::verb::get) return Reply{200, state.stats_json()};
      break;
    case Endpoint::mock_behaviour:
      if (method == http::verb::get) {
        return Reply{200, behaviour_json(state.behaviour_snapshot()).dump()};
      }
      if (method == http::verb::post) return update_behaviour(request.body(), state);
      break;
    case Endpoint::unknown: {
      std::string message = "Unknown request URL: ";
      message += to_std(request.method_string());
      message += ' ';
      message += to_std(request.target());
      message += '.';
      return Reply{404, error_body(message, "invalid_request_error", {}, "unknown_url")};
    }
    case Endpoint::models:
      if (method == http::verb::get) return std::nullopt;
      break;
    default:
      if (method == http::verb::post) return std::nullopt;
      break;
  }
  std::string message = "Method ";
  message += to_std(request.method_string());
  message += " is not allowed for ";
  message += to_std(request.target());
  message += '.';
  return Reply{405, error_body(message, "invalid_request_error", {}, "method_not_allowed")};
}

// ---------------------------------------------------------------------------
// Connections

class ConnectionHandle {
 public:
  virtual ~ConnectionHandle() = default;
  // Closes the connection from any thread.
  virtual void close_for_shutdown() = 0;
};

// Live connections, so stop() can close them all.
class Registry {
 public:
  // False once the server is stopping: the caller must drop the connection.
  bool add(std::uint64_t id, std::weak_ptr<ConnectionHandle> connection) {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    live_.emplace(id, std::move(connection));
    return true;
  }

  void remove(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    live_.erase(id);
  }

  std::vector<std::shared_ptr<ConnectionHandle>> close_registry() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    std::vector<std::shared_ptr<ConnectionHandle>> connections;
    connections.reserve(live_.size());
    for (auto& [id, weak] : live_) {
      if (auto connection = weak.lock()) connections.push_back(std::move(connection));
    }
    return connections;
  }

 private:
  std::mutex mutex_;
  bool closed_ = false;
  std::unordered_map<std::uint64_t, std::weak_ptr<ConnectionHandle>> live_;
};

enum class CloseStyle { graceful, reset };

// One HTTP/2 connection: nghttp2 does the framing, HPACK and flow control;
// the answers are those of the HTTP/1.1 connection below, only framed as
// DATA frames of their stream. A reader feeds the session what arrives, a
// writer sends what the session has to send, and every stream's answer is a
// coroutine of its own; all of them share the connection's strand.
template <class Stream>
class H2Connection final : public ConnectionHandle,
                           public std::enable_shared_from_this<H2Connection<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

 public:
  H2Connection(SharedState& state, Registry& registry, std::uint64_t id, Stream stream)
      : state_(state),
        registry_(registry),
        id_(id),
        stream_(std::move(stream)),
        sleep_timer_(stream_.get_executor()),
        write_wanted_(stream_.get_executor()) {
    state_.h2_connections.fetch_add(1, std::memory_order_relaxed);
    read_buffer_.resize(16 * 1024);
  }

  ~H2Connection() override {
    if (session_) nghttp2_session_del(session_);
    if (!closed_) state_.open_connections.fetch_sub(1, std::memory_order_relaxed);
    registry_.remove(id_);
  }

  // `accept_delay`: a fresh h2c connection waits as Behaviour::accept_delay
  // says; one handed over after its TLS handshake has waited already.
  static void launch(std::shared_ptr<H2Connection> self, bool accept_delay) {
    auto executor = self->stream_.get_executor();
    asio::co_spawn(executor, run(self, accept_delay),
                   asio::bind_executor(executor, [self](std::exception_ptr failure) {
                     if (failure) self->close(CloseStyle::reset);
                   }));
  }

  void close_for_shutdown() override {
    asio::post(stream_.get_executor(),
               [self = this->shared_from_this()] { self->close(CloseStyle::graceful); });
  }

  void close_unstarted() { close(CloseStyle::reset); }

 private:
  struct H2Stream {
    explicit H2Stream(const asio::any_io_executor& executor) : timer(executor) {}
    std::int32_t id = 0;
    Request request;
    std::string out;  // answer bytes not yet taken by the session
    std::size_t taken = 0;
    bool body_done = false;
    bool deferred = false;  // the session waits for resume_data
    bool closed = false;
    bool refused = false;  // above the GOAWAY's last stream: never answered
    bool in_stream = false;
    asio::steady_timer timer;
  };

  static awaitable<void> run(std::shared_ptr<H2Connection> self, bool accept_delay) {
    const Behaviour behaviour = self->state_.behaviour_snapshot();
    if (accept_delay && behaviour.accept_delay.count() > 0) {
      self->sleep_timer_.expires_after(behaviour.accept_delay);
      co_await self->sleep_timer_.async_wait(use_tuple);
      if (self->closed_) co_return;
    }
    if (!self->start_session(behaviour)) {
      self->close(CloseStyle::reset);
      co_return;
    }
    auto executor = self->stream_.get_executor();
    asio::co_spawn(executor, write_loop(self), asio::detached);
    co_await self->read_loop();
  }

  bool start_session(const Behaviour& behaviour) {
    goaway_after_ = behaviour.h2_goaway_after;
    nghttp2_session_callbacks* callbacks = nullptr;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, &on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, &on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &on_stream_close);
    nghttp2_option* option = nullptr;
    nghttp2_option_new(&option);
    if (!behaviour.h2_ping_ack) nghttp2_option_set_no_auto_ping_ack(option, 1);
    const int rv = nghttp2_session_server_new2(&session_, callbacks, this, option);
    nghttp2_option_del(option);
    nghttp2_session_callbacks_del(callbacks);
    if (rv != 0) return false;
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, behaviour.h2_max_streams},
    };
    return nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, 1) == 0;
  }

  awaitable<void> read_loop() {
    while (!closed_) {
      auto [error, bytes] = co_await stream_.async_read_some(asio::buffer(read_buffer_), use_tuple);
      if (closed_) co_return;
      if (error) {
        peer_gone();
        co_return;
      }
      const auto used = nghttp2_session_mem_recv(
          session_, reinterpret_cast<const std::uint8_t*>(read_buffer_.data()), bytes);
      if (used < 0) {
        close(CloseStyle::reset);
        co_return;
      }
      wake_writer();
    }
  }

  static awaitable<void> write_loop(std::shared_ptr<H2Connection> self) {
    auto& me = *self;
    while (!me.closed_) {
      me.out_.clear();
      for (;;) {
        const std::uint8_t* data = nullptr;
        const auto size = nghttp2_session_mem_send(me.session_, &data);
        if (size < 0) {
          me.close(CloseStyle::reset);
          co_return;
        }
        if (size == 0) break;
        me.out_.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(size));
        if (me.out_.size() >= 64 * 1024) break;
      }
      if (me.out_.empty()) {
        if (!nghttp2_session_want_read(me.session_) && !nghttp2_session_want_write(me.session_)) {
          me.close(CloseStyle::graceful);
          co_return;
        }
        me.write_wanted_.expires_at(Clock::time_point::max());
        co_await me.write_wanted_.async_wait(use_tuple);
        continue;
      }
      auto [error, written] =
          co_await asio::async_write(me.stream_, asio::buffer(me.out_), use_tuple);
      if (error) {
        me.peer_gone();
        co_return;
      }
    }
  }

  void wake_writer() { write_wanted_.cancel(); }

  static H2Connection& self_of(void* user_data) { return *static_cast<H2Connection*>(user_data); }

  H2Stream* find(std::int32_t stream_id) {
    auto it = streams_.find(stream_id);
    return it == streams_.end() ? nullptr : it->second.get();
  }

  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user_data) {
    auto& me = self_of(user_data);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    auto stream = std::make_shared<H2Stream>(me.stream_.get_executor());
    stream->id = frame->hd.stream_id;
    if (me.goaway_after_ > 0 && me.started_ >= me.goaway_after_) {
      stream->refused = true;
      if (!me.goaway_sent_) {
        me.goaway_sent_ = true;
        nghttp2_submit_goaway(me.session_, NGHTTP2_FLAG_NONE, me.last_started_, NGHTTP2_NO_ERROR,
                              nullptr, 0);
      }
    } else {
      ++me.started_;
      me.last_started_ = stream->id;
    }
    me.streams_.emplace(stream->id, std::move(stream));
    return 0;
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
                       std::size_t name_size, const std::uint8_t* value, std::size_t value_size,
                       std::uint8_t, void* user_data) {
    auto* stream = self_of(user_data).find(frame->hd.stream_id);
    if (stream == nullptr) return 0;
    const std::string_view key(reinterpret_cast<const char*>(name), name_size);
    const std::string_view text(reinterpret_cast<const char*>(value), value_size);
    auto& request = stream->request;
    if (key == ":method") {
      request.method_string(text);
    } else if (key == ":path") {
      request.target(text);
    } else if (key == ":authority") {
      request.set(http::field::host, text);
    } else if (!key.starts_with(':')) {
      request.insert(key, text);
    }
    return 0;
  }

  static int on_data_chunk(nghttp2_session*, std::uint8_t, std::int32_t stream_id,
                           const std::uint8_t* data, std::size_t size, void* user_data) {
    auto* stream = self_of(user_data).find(stream_id);
    if (stream != nullptr && stream->request.body().size() + size <= kMaxBodyBytes) {
      stream->request.body().append(reinterpret_cast<const char*>(data), size);
    }
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user_data) {
    auto& me = self_of(user_data);
    if (frame->hd.type == NGHTTP2_RST_STREAM) {
      me.state_.h2_resets_received.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) {
      me.state_.h2_pings_received.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    const bool request_ends =
        (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (!request_ends) return 0;
    auto it = me.streams_.find(frame->hd.stream_id);
    if (it == me.streams_.end()) return 0;
    if (it->second->refused) {
      nghttp2_submit_rst_stream(me.session_, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                NGHTTP2_REFUSED_STREAM);
      return 0;
    }
    asio::co_spawn(me.stream_.get_executor(), answer(me.shared_from_this(), it->second),
                   asio::detached);
    return 0;
  }

  static int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code,
                             void* user_data) {
    auto& me = self_of(user_data);
    auto it = me.streams_.find(stream_id);
    if (it == me.streams_.end()) return 0;
    auto& stream = *it->second;
    stream.closed = true;
    stream.timer.cancel();
    if (stream.in_stream) {
      stream.in_stream = false;
      const bool completed = error_code == NGHTTP2_NO_ERROR && stream.body_done;
      (completed ? me.state_.streams_completed : me.state_.streams_cancelled)
          .fetch_add(1, std::memory_order_relaxed);
    }
    me.streams_.erase(it);
    return 0;
  }

  static ssize_t read_answer(nghttp2_session*, std::int32_t, std::uint8_t* buffer,
                             std::size_t length, std::uint32_t* flags, nghttp2_data_source* source,
                             void*) {
    auto& stream = *static_cast<H2Stream*>(source->ptr);
    const std::size_t available = stream.out.size() - stream.taken;
    if (available == 0) {
      if (stream.body_done) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        return 0;
      }
      stream.deferred = true;
      return NGHTTP2_ERR_DEFERRED;
    }
    const std::size_t size = std::min(available, length);
    std::memcpy(buffer, stream.out.data() + stream.taken, size);
    stream.taken += size;
    if (stream.taken == stream.out.size()) {
      stream.out.clear();
      stream.taken = 0;
      if (stream.body_done) *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return static_cast<ssize_t>(size);
  }

  // Hands the session more of a stream's answer.
  void push(H2Stream& stream, std::string_view bytes, bool last) {
    if (stream.closed || closed_) return;
    stream.out += bytes;
    if (last) stream.body_done = true;
    if (stream.deferred) {
      stream.deferred = false;
      nghttp2_session_resume_data(session_, stream.id);
    }
    wake_writer();
  }

  void submit_head(H2Stream& stream, unsigned status, std::string_view content_type,
                   unsigned retry_after_s, unsigned retry_after_ms, bool with_body) {
    std::string status_text = std::to_string(status);
    std::string retry_after = std::to_string(retry_after_s);
    std::string retry_after_ms_text = std::to_string(retry_after_ms);
    auto pair = [](std::string_view name, std::string_view value) {
      return nghttp2_nv{reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
                        reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())),
                        name.size(), value.size(), NGHTTP2_NV_FLAG_NONE};
    };
    std::vector<nghttp2_nv> fields{pair(":status", status_text), pair("server", "sluice-mock")};
    if (!content_type.empty() && status != 204)
      fields.push_back(pair("content-type", content_type));
    if (content_type == "text/event-stream") fields.push_back(pair("cache-control", "no-cache"));
    if (retry_after_s > 0) fields.push_back(pair("retry-after", retry_after));
    if (retry_after_ms > 0) fields.push_back(pair("retry-after-ms", retry_after_ms_text));
    nghttp2_data_provider provider{};
    provider.source.ptr = &stream;
    provider.read_callback = &read_answer;
    nghttp2_submit_response(session_, stream.id, fields.data(), fields.size(),
                            with_body ? &provider : nullptr);
    wake_writer();
  }

  void send_reply(H2Stream& stream, const Reply& reply) {
    if (stream.closed || closed_) return;
    stream.out = reply.body;
    stream.body_done = true;
    submit_head(stream, reply.status, reply.content_type, reply.retry_after_s, reply.retry_after_ms,
                reply.status != 204);
  }

  void reset(H2Stream& stream, std::uint32_t code) {
    if (stream.closed || closed_) return;
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, stream.id, code);
    wake_writer();
  }

  // Sleeps unless the stream or the connection ends first. False once
  // either is gone.
  awaitable<bool> pause(H2Stream& stream, Clock::duration duration) {
    return pause_until(stream, Clock::now() + duration);
  }

  // Sleeps until `due` (not at all once it has passed) unless the stream or
  // the connection ends first. False once either is gone.
  awaitable<bool> pause_until(H2Stream& stream, Clock::time_point due) {
    if (stream.closed || closed_) co_return false;
    if (due > Clock::now()) {
      stream.timer.expires_at(due);
      co_await stream.timer.async_wait(use_tuple);
    }
    co_return !stream.closed && !closed_;
  }

  static awaitable<void> answer(std::shared_ptr<H2Connection> self,
                                std::shared_ptr<H2Stream> held) {
    auto& me = *self;
    auto& stream = *held;
    const Request& request = stream.request;
    const Endpoint endpoint = classify(to_std(request.target()));
    if (!is_control(endpoint)) {
      me.state_.requests.fetch_add(1, std::memory_order_relaxed);
      me.state_.record(request);
    }
    std::optional<Reply> reply = reply_without_model(request, endpoint, me.state_);
    if (reply) {
      if (is_anthropic(endpoint)) reply = in_anthropic_shape(std::move(*reply));
      me.send_reply(stream, *reply);
      co_return;
    }
    std::variant<Plan, Reply> planned;
    try {
      planned = make_plan(endpoint, request, me.state_);
    } catch (const std::exception& error) {
      planned = invalid_request(std::string("Invalid request body: ") + error.what());
    }
    if (std::holds_alternative<Reply>(planned)) {
      Reply& early = std::get<Reply>(planned);
      if (is_anthropic(endpoint)) early = in_anthropic_shape(std::move(early));
      me.send_reply(stream, early);
      co_return;
    }
    const Plan& plan = std::get<Plan>(planned);
    std::optional<Reply> failure = failure_reply(plan);
    if (failure) {
      if (is_anthropic(plan.endpoint)) failure = in_anthropic_shape(std::move(*failure));
      me.send_reply(stream, *failure);
      co_return;
    }
    if (plan.fail == FailMode::reset || plan.fail == FailMode::garbage) {
      me.reset(stream, NGHTTP2_INTERNAL_ERROR);
      co_return;
    }
    if (plan.fail == FailMode::stall) {
      if (plan.stream) stream.in_stream = true;
      const bool open = co_await me.pause(stream, plan.behaviour.stall);
      if (!open) co_return;
    }
    SlotHold slot(me.state_.busy_slots);
    if (plan.behaviour.slots > 0) {
      while (!slot.try_take(plan.behaviour.slots)) {
        const bool open = co_await me.pause(stream, kSlotPoll);
        if (!open) co_return;
      }
    }
    if (plan.stream) {
      co_await me.answer_stream(stream, plan);
    } else {
      co_await me.answer_whole(stream, plan);
    }
  }

  awaitable<void> answer_whole(H2Stream& stream, const Plan& plan) {
    bool open = co_await pause(stream, plan.ttft);
    if (!open) co_return;
    std::string body = complete_body(plan);
    if (plan.fail == FailMode::cut_short) body.resize(body.size() / 2);
    const std::string_view whole = body;
    const std::string_view half = whole.substr(0, whole.size() / 2);
    switch (plan.fail) {
      case FailMode::reset_mid:
      case FailMode::truncate:
        submit_head(stream, 200, content_type_of(plan.endpoint), 0, 0, true);
        push(stream, half, false);
        open = co_await pause(stream, std::chrono::milliseconds(1));
        if (open) reset(stream, NGHTTP2_INTERNAL_ERROR);
        co_return;
      case FailMode::stall_mid:
        submit_head(stream, 200, content_type_of(plan.endpoint), 0, 0, true);
        open = co_await pause(stream, plan.behaviour.stall);
        if (open) push(stream, whole, true);
        co_return;
      case FailMode::endless:
        submit_head(stream, 200, content_type_of(plan.endpoint), 0, 0, true);
        co_return;
      case FailMode::drip:
        submit_head(stream, 200, content_type_of(plan.endpoint), 0, 0, true);
        for (std::size_t i = 0; i < whole.size(); ++i) {
          if (i > 0) {
            open = co_await pause(stream, plan.behaviour.interval);
            if (!open) co_return;
          }
          push(stream, whole.substr(i, 1), i + 1 == whole.size());
        }
        co_return;
      default:
        send_reply(stream, Reply{200, std::move(body), 0, content_type_of(plan.endpoint)});
        co_return;
    }
  }

  awaitable<void> answer_stream(H2Stream& stream, const Plan& plan) {
    stream.in_stream = true;
    const EventScript script(plan);
    const FailMode fail = plan.fail;
    const bool endless = fail == FailMode::endless;
    const bool dripping = fail == FailMode::drip;
    const Clock::duration interval =
        endless ? std::max<Clock::duration>(plan.behaviour.interval, kEndlessMinInterval)
                : Clock::duration(plan.behaviour.interval);
    const std::size_t total = script.size();
    std::size_t events_to_send = total;
    if (fail == FailMode::reset_mid) events_to_send = std::max<std::size_t>(1, total / 2);
    const bool cut_short = fail == FailMode::cut_short;
    if (fail == FailMode::truncate || cut_short) {
      events_to_send = std::max<std::size_t>(1, std::min(kTruncateAfterEvents, total - 1));
    }
    const bool finishes = !endless && (events_to_send == total || cut_short);

    bool open = co_await pause(stream, plan.ttft);
    if (!open) co_return;
    submit_head(stream, 200, "text/event-stream", 0, 0, true);
    std::string event;
    EventClock event_clock(Clock::now());
    for (std::size_t index = 0; endless || index < events_to_send; ++index) {
      if (index > 0) {
        open = co_await pause_until(stream, event_clock.next(interval, Clock::now()));
        if (!open) co_return;
      }
      event.clear();
      if (endless && index > 0) {
        script.append_token_event(index, event);
      } else {
        script.append_event(index, event);
      }
      if (plan.behaviour.stamp) stamp_event(event);
      const bool last = finishes && index + 1 == events_to_send;
      if (dripping) {
        for (std::size_t i = 0; i < event.size(); ++i) {
          if (i > 0) {
            open = co_await pause(stream, interval);
            if (!open) co_return;
          }
          push(stream, std::string_view(event).substr(i, 1), last && i + 1 == event.size());
        }
      } else {
        push(stream, event, last);
      }
      if (index == 0 && fail == FailMode::stall_mid) {
        open = co_await pause(stream, plan.behaviour.stall);
        if (!open) co_return;
        event_clock.restart(Clock::now());
      }
    }
    if (!finishes) {
      // Ends the stream without its end: what a reset or a cut connection
      // leaves an HTTP/2 client with.
      open = co_await pause(stream, std::chrono::milliseconds(1));
      if (open) reset(stream, NGHTTP2_INTERNAL_ERROR);
    }
  }

  void peer_gone() {
    if (closed_) return;
    for (auto& [id, stream] : streams_) {
      stream->closed = true;
      stream->timer.cancel();
      if (stream->in_stream) {
        stream->in_stream = false;
        state_.streams_cancelled.fetch_add(1, std::memory_order_relaxed);
      }
    }
    close(CloseStyle::graceful);
  }

  void close(CloseStyle style) {
    if (closed_) return;
    closed_ = true;
    state_.open_connections.fetch_sub(1, std::memory_order_relaxed);
    sleep_timer_.cancel();
    write_wanted_.cancel();
    for (auto& [id, stream] : streams_) {
      stream->closed = true;
      stream->timer.cancel();
    }
    boost::system::error_code ignored;
    tcp::socket& raw = [&]() -> tcp::socket& {
      if constexpr (kTls) {
        return stream_.next_layer();
      } else {
        return stream_;
      }
    }();
    if (style == CloseStyle::reset) {
      raw.set_option(asio::socket_base::linger(true, 0), ignored);
    } else {
      raw.shutdown(tcp::socket::shutdown_send, ignored);
    }
    raw.close(ignored);
  }

  SharedState& state_;
  Registry& registry_;
  const std::uint64_t id_;
  Stream stream_;
  asio::steady_timer sleep_timer_;
  // Wakes the writer when the session has something to send; never expires.
  asio::steady_timer write_wanted_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<H2Stream>> streams_;
  std::string read_buffer_;
  std::string out_;
  unsigned goaway_after_ = 0;
  unsigned started_ = 0;
  std::int32_t last_started_ = 0;
  bool goaway_sent_ = false;
  bool closed_ = false;
};

// Whether a TLS connection's handshake chose h2.
bool alpn_chose_h2(SSL* ssl) {
  const unsigned char* chosen = nullptr;
  unsigned int size = 0;
  SSL_get0_alpn_selected(ssl, &chosen, &size);
  return size == 2 && std::memcmp(chosen, "h2", 2) == 0;
}

// The server's ALPN choice: h2 when offered, else http/1.1, else none.
int select_alpn(SSL*, const unsigned char** out, unsigned char* out_size, const unsigned char* in,
                unsigned int in_size, void*) {
  for (std::string_view wanted : {std::string_view("h2"), std::string_view("http/1.1")}) {
    for (unsigned int i = 0; i < in_size;) {
      const unsigned size = in[i];
      if (i + 1 + size > in_size) break;
      if (std::string_view(reinterpret_cast<const char*>(in + i + 1), size) == wanted) {
        *out = in + i + 1;
        *out_size = static_cast<unsigned char>(size);
        return SSL_TLSEXT_ERR_OK;
      }
      i += 1 + size;
    }
  }
  return SSL_TLSEXT_ERR_NOACK;
}

// One client connection. Two coroutines share its strand: the reader always
// has a read pending (so a peer that goes away is noticed immediately, even
// while a response is sleeping between events) and queues requests; the
// responder answers them in order.
//
// Every co_await here is a statement of its own (`x = co_await f(...);`),
// never part of an if condition or a ?: operand: GCC 12 miscompiles a
// co_await inside a condition when its operand involves a temporary, and the
// awaited coroutine is then resumed at a wrong frame address.
template <class Stream>
class Connection final : public ConnectionHandle,
                         public std::enable_shared_from_this<Connection<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

 public:
  Connection(SharedState& state, Registry& registry, std::uint64_t id, Stream stream)
      : state_(state),
        registry_(registry),
        id_(id),
        stream_(std::move(stream)),
        sleep_timer_(stream_.get_executor()),
        request_ready_(stream_.get_executor()) {
    read_buffer_.reserve(16 * 1024);
    out_.reserve(4096);
    event_.reserve(1024);
  }

  ~Connection() override {
    if (handed_over_) return;
    // Reached without close() only if a coroutine ended by an exception.
    if (!closed_) state_.open_connections.fetch_sub(1, std::memory_order_relaxed);
    registry_.remove(id_);
  }

  static void launch(std::shared_ptr<Connection> self) {
    auto executor = self->stream_.get_executor();
    asio::co_spawn(executor, run(self), close_on_exception(self));
  }

  void close_for_shutdown() override {
    asio::post(stream_.get_executor(),
               [self = this->shared_from_this()] { self->close(CloseStyle::graceful); });
  }

  // Not on the strand: only before the connection's coroutines start.
  void close_unstarted() { close(CloseStyle::reset); }

 private:
  struct Pending {
    Request request;
    Endpoint endpoint;
  };
  enum class Next { keep_alive, close };

  // Completion handler for the connection's coroutines: a coroutine that
  // ends by an exception takes the connection down with it rather than
  // leaving its partner waiting forever.
  static auto close_on_exception(const std::shared_ptr<Connection>& self) {
    return asio::bind_executor(self->stream_.get_executor(), [self](std::exception_ptr failure) {
      if (failure) self->close(CloseStyle::reset);
    });
  }

  tcp::socket& socket() {
    if constexpr (kTls) {
      return stream_.next_layer();
    } else {
      return stream_;
    }
  }

  static awaitable<void> run(std::shared_ptr<Connection> self) {
    const auto accept_delay = self->state_.behaviour_snapshot().accept_delay;
    if (accept_delay.count() > 0) {
      self->sleep_timer_.expires_after(accept_delay);
      co_await self->sleep_timer_.async_wait(use_tuple);
      if (self->closed_) co_return;
    }
    if constexpr (kTls) {
      auto [error] = co_await self->stream_.async_handshake(ssl::stream_base::server, use_tuple);
      if (error) {
        self->close(CloseStyle::graceful);
        co_return;
      }
      if (self->state_.http2 && alpn_chose_h2(self->stream_.native_handle())) {
        self->hand_over_to_h2();
        co_return;
      }
    }
    if (self->closed_) co_return;
    asio::co_spawn(self->stream_.get_executor(), read_requests(self), close_on_exception(self));
    co_await self->respond_loop();
  }

  // The handshake chose h2: the connection, its id and its count go on as
  // an H2Connection, and this one ends without closing anything.
  void hand_over_to_h2() {
    handed_over_ = true;
    closed_ = true;
    registry_.remove(id_);
    auto h2 = std::make_shared<H2Connection<Stream>>(state_, registry_, id_, std::move(stream_));
    if (!registry_.add(id_, h2)) {
      h2->close_unstarted();
      return;
    }
    H2Connection<Stream>::launch(std::move(h2), false);
  }

  static awaitable<void> read_requests(std::shared_ptr<Connection> self) {
    co_await self->read_loop();
  }

  awaitable<void> read_loop() {
    while (!closed_) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      parser.body_limit(kMaxBodyBytes);
      const boost::system::error_code error = co_await read_request(parser);
      if (closed_) co_return;
      if (error) {
        const bool malformed =
            error.category() == http::make_error_code(http::error::bad_target).category() &&
            error != http::error::end_of_stream && error != http::error::partial_message;
        if (malformed) {
          malformed_request_ = true;
          request_ready_.cancel();
        } else {
          peer_gone();
        }
        co_return;
      }
      Pending pending{parser.release(), Endpoint::unknown};
      pending.endpoint = classify(to_std(pending.request.target()));
      if (!is_control(pending.endpoint)) {
        state_.requests.fetch_add(1, std::memory_order_relaxed);
        state_.record(pending.request);
      }
      pending_.push_back(std::move(pending));
      request_ready_.cancel();
    }
  }

  awaitable<boost::system::error_code> read_request(
      http::request_parser<http::string_body>& parser) {
    auto [head_error, head_bytes] =
        co_await http::async_read_header(stream_, read_buffer_, parser, use_tuple);
    if (head_error || parser.is_done()) co_return head_error;
    // Clients such as curl hold a large body back until they see 100 Continue.
    // Only an idle responder with nothing queued lets the reader write, so
    // writes never overlap.
    const auto expect = parser.get()[http::field::expect];
    if (!responding_ && pending_.empty() && beast::iequals(expect, "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      auto [write_error, written] =
          co_await asio::async_write(stream_, asio::buffer(kContinue), use_tuple);
      if (write_error) co_return write_error;
    }
    auto [body_error, body_bytes] =
        co_await http::async_read(stream_, read_buffer_, parser, use_tuple);
    co_return body_error;
  }

  awaitable<void> respond_loop() {
    for (;;) {
      while (pending_.empty() && !malformed_request_ && !closed_) {
        request_ready_.expires_at(Clock::time_point::max());
        co_await request_ready_.async_wait(use_tuple);
      }
      if (closed_) co_return;
      if (pending_.empty()) {  // the reader hit a malformed request
        const Reply reply = invalid_request("The request is not valid HTTP/1.1.");
        co_await send_reply(reply, false);
        close(CloseStyle::graceful);
        co_return;
      }
      Pending pending = std::move(pending_.front());
      pending_.pop_front();
      responding_ = true;
      const Next next = co_await respond(pending);
      responding_ = false;
      if (closed_) co_return;
      if (next == Next::close) {
        close(CloseStyle::graceful);
        co_return;
      }
    }
  }

  awaitable<Next> respond(Pending& pending) {
    const bool keep_alive = pending.request.keep_alive();
    std::optional<Reply> reply = reply_without_model(pending.request, pending.endpoint, state_);
    if (reply) {
      if (is_anthropic(pending.endpoint)) reply = in_anthropic_shape(std::move(*reply));
      const Next next = co_await send_reply(*reply, keep_alive);
      co_return next;
    }
    const Next next = co_await respond_model_request(pending, keep_alive);
    co_return next;
  }

  awaitable<Next> respond_model_request(Pending& pending, bool keep_alive) {
    std::variant<Plan, Reply> planned;
    try {
      planned = make_plan(pending.endpoint, pending.request, state_);
    } catch (const std::exception& error) {  // a body of unexpected shape
      planned = invalid_request(std::string("Invalid request body: ") + error.what());
    }
    if (std::holds_alternative<Reply>(planned)) {
      Reply& reply = std::get<Reply>(planned);
      if (is_anthropic(pending.endpoint)) reply = in_anthropic_shape(std::move(reply));
      const Next next = co_await send_reply(reply, keep_alive);
      co_return next;
    }
    const Plan& plan = std::get<Plan>(planned);

    std::optional<Reply> failure = failure_reply(plan);
    if (failure) {
      if (is_anthropic(plan.endpoint)) failure = in_anthropic_shape(std::move(*failure));
      const Next next = co_await send_reply(*failure, keep_alive);
      co_return next;
    }
    if (plan.fail == FailMode::reset) {
      close(CloseStyle::reset);
      co_return Next::close;
    }
    if (plan.fail == FailMode::garbage) {
      out_.assign("this is not http\r\n\r\n");
      co_await send(out_);
      co_return Next::close;
    }
    if (plan.fail == FailMode::stall) {
      if (plan.stream) in_stream_ = true;  // a close while stalling cancels the stream
      const bool still_open = co_await pause(plan.behaviour.stall);
      if (!still_open) co_return Next::close;
    }
    // Queueing: the request waits for a free slot, and holds it until its
    // answer is sent (or its connection is gone).
    SlotHold slot(state_.busy_slots);
    if (plan.behaviour.slots > 0) {
      while (!slot.try_take(plan.behaviour.slots)) {
        if (!co_await pause(kSlotPoll)) co_return Next::close;
      }
    }
    if (plan.stream) {
      const Next next = co_await respond_stream(plan, keep_alive);
      co_return next;
    }
    const Next next = co_await respond_whole(plan, keep_alive);
    co_return next;
  }

  awaitable<Next> respond_whole(const Plan& plan, bool keep_alive) {
    const Next done = keep_alive ? Next::keep_alive : Next::close;
    bool open = co_await pause(plan.ttft);
    if (!open) co_return Next::close;

    std::string body = complete_body(plan);
    // Half the answer, framed as if it were all of it.
    if (plan.fail == FailMode::cut_short) body.resize(body.size() / 2);
    out_.clear();
    append_head(out_, 200, content_type_of(plan.endpoint), body.size(), keep_alive);
    const std::size_t head_size = out_.size();
    out_ += body;
    const std::string_view whole = out_;
    const std::string_view head = whole.substr(0, head_size);
    const std::string_view half = whole.substr(0, head_size + body.size() / 2);

    switch (plan.fail) {
      case FailMode::reset_mid:
        open = co_await send(half);
        if (open) close(CloseStyle::reset);
        co_return Next::close;
      case FailMode::truncate:
        co_await send(half);
        co_return Next::close;
      case FailMode::stall_mid:
        open = co_await send(head);
        if (open) open = co_await pause(plan.behaviour.stall);
        if (open) open = co_await send(whole.substr(head_size));
        co_return open ? done : Next::close;
      case FailMode::endless:
        // A body that never arrives: the head, then nothing until the peer leaves.
        open = co_await send(head);
        if (open) co_await wait_until_closed();
        co_return Next::close;
      case FailMode::drip:
        open = co_await drip(whole, plan.behaviour.interval);
        co_return open ? done : Next::close;
      default:
        open = co_await send(whole);
        co_return open ? done : Next::close;
    }
  }

  awaitable<Next> respond_stream(const Plan& plan, bool keep_alive) {
    in_stream_ = true;
    const EventScript script(plan);
    const FailMode fail = plan.fail;
    const bool endless = fail == FailMode::endless;
    const bool dripping = fail == FailMode::drip;
    const Clock::duration interval =
        endless ? std::max<Clock::duration>(plan.behaviour.interval, kEndlessMinInterval)
                : Clock::duration(plan.behaviour.interval);
    const Clock::duration byte_gap = dripping ? interval : Clock::duration::zero();
    const std::size_t total = script.size();
    std::size_t events_to_send = total;
    if (fail == FailMode::reset_mid) events_to_send = std::max<std::size_t>(1, total / 2);
    const bool cut_short = fail == FailMode::cut_short;
    if (fail == FailMode::truncate || cut_short) {
      events_to_send = std::max<std::size_t>(1, std::min(kTruncateAfterEvents, total - 1));
    }
    // A stream cut short ends cleanly, only too soon: no finish_reason, no
    // usage, no [DONE].
    const bool finishes = !endless && (events_to_send == total || cut_short);

    bool open = co_await pause(plan.ttft);
    if (!open) co_return Next::close;

    // The head goes out with the first event, as one write.
    out_.clear();
    append_stream_head(out_, keep_alive);
    event_.clear();
    script.append_event(0, event_);
    if (plan.behaviour.stamp) stamp_event(event_);
    append_chunk(out_, event_);
    const bool first_is_last = finishes && events_to_send == 1;
    if (first_is_last) out_ += kLastChunk;
    EventClock event_clock(Clock::now());
    open = co_await send_stream_bytes(first_is_last, byte_gap, dripping);
    if (open && fail == FailMode::stall_mid) {
      open = co_await pause(plan.behaviour.stall);
      event_clock.restart(Clock::now());
    }
    if (!open) co_return Next::close;

    for (std::size_t index = 1; endless || index < events_to_send; ++index) {
      // Dripped bytes are already spaced by the interval.
      if (!dripping) {
        open = co_await pause_until(event_clock.next(interval, Clock::now()));
        if (!open) co_return Next::close;
      }
      event_.clear();
      if (endless) {
        script.append_token_event(index, event_);
      } else {
        script.append_event(index, event_);
      }
      if (plan.behaviour.stamp) stamp_event(event_);
      out_.clear();
      append_chunk(out_, event_);
      const bool last = finishes && index + 1 == events_to_send;
      if (last) out_ += kLastChunk;
      open = co_await send_stream_bytes(last, byte_gap, dripping);
      if (!open) co_return Next::close;
    }

    in_stream_ = false;
    if (fail == FailMode::reset_mid) {
      close(CloseStyle::reset);
      co_return Next::close;
    }
    if (fail == FailMode::truncate) co_return Next::close;
    co_return keep_alive ? Next::keep_alive : Next::close;
  }

  // Sends out_ as part of a stream; `last` marks the write that carries the
  // terminating chunk. A peer may have received all of that write and closed
  // before its completion runs here, so that write's own outcome, not the
  // close, decides whether the stream counts as completed or cancelled.
  awaitable<bool> send_stream_bytes(bool last, Clock::duration byte_gap, bool dripping) {
    final_write_in_flight_ = last;
    const bool open = co_await send_event(out_, byte_gap, dripping);
    if (!last) co_return open;
    final_write_in_flight_ = false;
    if (in_stream_) {
      in_stream_ = false;
      auto& counter = last_write_ok_ ? state_.streams_completed : state_.streams_cancelled;
      counter.fetch_add(1, std::memory_order_relaxed);
    }
    co_return open;
  }

  awaitable<Next> send_reply(const Reply& reply, bool keep_alive) {
    out_.clear();
    append_head(out_, reply.status, reply.content_type, reply.body.size(), keep_alive,
                reply.retry_after_s, reply.retry_after_ms);
    out_ += reply.body;
    const bool open = co_await send(out_);
    co_return (open && keep_alive) ? Next::keep_alive : Next::close;
  }

  // Writes `bytes`. False once the connection is gone.
  awaitable<bool> send(std::string_view bytes) {
    last_write_ok_ = false;
    if (closed_) co_return false;
    auto [error, written] = co_await asio::async_write(stream_, asio::buffer(bytes), use_tuple);
    last_write_ok_ = !error;
    if (error && !closed_) peer_gone();
    co_return !closed_;
  }

  // Writes `bytes` one byte per write, `gap` apart: the worst case for a
  // client's parser. False once the connection is gone.
  awaitable<bool> drip(std::string_view bytes, Clock::duration gap) {
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      if (i > 0) {
        const bool open = co_await pause(gap);
        if (!open) co_return false;
      }
      const bool open = co_await send(bytes.substr(i, 1));
      if (!open) co_return false;
    }
    co_return !closed_;
  }

  awaitable<bool> send_event(std::string_view bytes, Clock::duration byte_gap, bool dripping) {
    if (dripping) {
      const bool open = co_await drip(bytes, byte_gap);
      co_return open;
    }
    const bool open = co_await send(bytes);
    co_return open;
  }

  // Sleeps unless the connection closes first. False once it is gone.
  awaitable<bool> pause(Clock::duration duration) { return pause_until(Clock::now() + duration); }

  // Sleeps until `due` (not at all once it has passed) unless the
  // connection closes first. False once it is gone.
  awaitable<bool> pause_until(Clock::time_point due) {
    if (closed_) co_return false;
    if (due <= Clock::now()) co_return true;
    sleep_timer_.expires_at(due);
    co_await sleep_timer_.async_wait(use_tuple);
    co_return !closed_;
  }

  awaitable<void> wait_until_closed() {
    while (!closed_) {
      sleep_timer_.expires_at(Clock::time_point::max());
      co_await sleep_timer_.async_wait(use_tuple);
    }
  }

  void peer_gone() {
    if (closed_) return;
    if (in_stream_ && !final_write_in_flight_) {
      in_stream_ = false;
      state_.streams_cancelled.fetch_add(1, std::memory_order_relaxed);
    }
    close(CloseStyle::graceful);
  }

  void close(CloseStyle style) {
    if (closed_) return;
    closed_ = true;
    state_.open_connections.fetch_sub(1, std::memory_order_relaxed);
    sleep_timer_.cancel();
    request_ready_.cancel();
    boost::system::error_code ignored;
    auto& raw = socket();
    if (style == CloseStyle::reset) {
      // Zero linger turns close() into an RST, which is what "reset" promises.
      raw.set_option(asio::socket_base::linger(true, 0), ignored);
    } else {
      raw.shutdown(tcp::socket::shutdown_send, ignored);
    }
    raw.close(ignored);
  }

  SharedState& state_;
  Registry& registry_;
  const std::uint64_t id_;
  Stream stream_;
  asio::steady_timer sleep_timer_;
  // Wakes the responder when the reader queues a request; never expires.
  asio::steady_timer request_ready_;
  beast::flat_buffer read_buffer_;
  std::deque<Pending> pending_;
  std::string out_;    // bytes of the write in progress
  std::string event_;  // the SSE event being framed
  bool closed_ = false;
  bool in_stream_ = false;
  bool malformed_request_ = false;
  bool responding_ = false;  // the responder owns the write side
  bool final_write_in_flight_ = false;
  bool last_write_ok_ = false;
  bool handed_over_ = false;
};

std::string bracket_if_ipv6(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace

bool is_valid_fail_mode(std::string_view mode) { return parse_fail_mode(mode).has_value(); }

bool is_valid_anthropic_content(std::string_view content) {
  return anthropic::parse_content_choice(content).has_value();
}

bool is_valid_openai_content(std::string_view content) {
  return content.empty() || content == "tools";
}

std::optional<std::string> RecordedRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (iequals(key, name)) return value;
  }
  return std::nullopt;
}

// Members are declared so that the io_context is destroyed before what the
// connections it may still own refer to (state, registry, TLS context).
struct MockServer::Impl {
  explicit Impl(Options opts) : options(std::move(opts)), io(std::max(1u, options.threads)) {
    state.behaviour = options.behaviour;
    state.http2 = options.http2;
  }

  // Connections already queued are taken together, up to this many per
  // wake-up, so that the listen queue empties as fast as connects arrive.
  static constexpr int kAcceptsPerWakeup = 1024;

  awaitable<void> accept_loop() {
    boost::system::error_code ignored;
    acceptor->non_blocking(true, ignored);
    for (;;) {
      auto [error] = co_await acceptor->async_wait(tcp::acceptor::wait_read, use_tuple);
      for (int taken = 0; !error && taken < kAcceptsPerWakeup; ++taken) {
        tcp::socket socket(asio::make_strand(io));
        acceptor->accept(socket, error);
        if (error == asio::error::would_block || error == asio::error::try_again) {
          error = {};
          break;
        }
        if (error == asio::error::connection_aborted) {
          error = {};
          continue;
        }
        if (!error) serve(std::move(socket));
      }
      if (error) {
        if (!acceptor->is_open() || error == asio::error::operation_aborted) co_return;
        // Out of descriptors and similar: back off instead of spinning.
        asio::steady_timer backoff(acceptor->get_executor(), std::chrono::milliseconds(10));
        co_await backoff.async_wait(use_tuple);
      }
    }
  }

  void serve(tcp::socket socket) {
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    state.connections_accepted.fetch_add(1, std::memory_order_relaxed);
    state.open_connections.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t id = next_connection_id++;
    if (tls) {
      using TlsStream = ssl::stream<tcp::socket>;
      start_connection(id, std::make_shared<Connection<TlsStream>>(
                               state, registry, id, TlsStream(std::move(socket), *tls)));
    } else if (state.http2) {
      auto connection =
          std::make_shared<H2Connection<tcp::socket>>(state, registry, id, std::move(socket));
      if (!registry.add(id, connection)) {
        connection->close_unstarted();
        return;
      }
      H2Connection<tcp::socket>::launch(std::move(connection), true);
    } else {
      start_connection(
          id, std::make_shared<Connection<tcp::socket>>(state, registry, id, std::move(socket)));
    }
  }

  template <class ConnectionType>
  void start_connection(std::uint64_t id, std::shared_ptr<ConnectionType> connection) {
    if (!registry.add(id, connection)) {
      connection->close_unstarted();
      return;
    }
    ConnectionType::launch(std::move(connection));
  }

  Options options;
  SharedState state;
  Registry registry;
  std::optional<ssl::context> tls;
  asio::io_context io;
  // Accepting has a thread of its own. On the serving threads, a burst of
  // thousands of connects filled the listen queue while each accept waited
  // its turn behind the handlers of the streams being served, and the
  // kernel dropped the connects that met a full queue (the client sends its
  // SYN again a second later): the upstream a benchmark measures proxies
  // against must not be the one that makes them wait.
  asio::io_context accept_io{1};
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::thread accept_thread;
  std::uint64_t next_connection_id = 1;
  std::uint16_t bound_port = 0;
  std::mutex lifecycle_mutex;
  bool started = false;
  bool stopped = false;
};

MockServer::MockServer(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {
  if (!is_valid_fail_mode(impl_->options.behaviour.fail)) {
    throw std::invalid_argument("unknown failure mode '" + impl_->options.behaviour.fail + "'");
  }
  if (!is_valid_anthropic_content(impl_->options.behaviour.anthropic_content)) {
    throw std::invalid_argument("unknown Anthropic content '" +
                                impl_->options.behaviour.anthropic_content + "'");
  }
  if (!is_valid_openai_content(impl_->options.behaviour.openai_content)) {
    throw std::invalid_argument("unknown OpenAI content '" +
                                impl_->options.behaviour.openai_content + "'");
  }
}

MockServer::~MockServer() { stop(); }

void MockServer::start() {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.lifecycle_mutex);
  if (impl.started) throw std::logic_error("MockServer::start called twice");

  if (!impl.options.tls_cert_pem.empty() && !impl.options.tls_key_pem.empty()) {
    impl.tls.emplace(ssl::context::tls_server);
    impl.tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                          ssl::context::no_sslv3 | ssl::context::single_dh_use);
    impl.tls->use_certificate_chain(
        asio::buffer(impl.options.tls_cert_pem.data(), impl.options.tls_cert_pem.size()));
    impl.tls->use_private_key(
        asio::buffer(impl.options.tls_key_pem.data(), impl.options.tls_key_pem.size()),
        ssl::context::pem);
    if (impl.options.http2) {
      SSL_CTX_set_alpn_select_cb(impl.tls->native_handle(), &select_alpn, nullptr);
    }
  }

  tcp::resolver resolver(impl.io);
  const auto endpoints = resolver.resolve(impl.options.host, std::to_string(impl.options.port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service);
  if (endpoints.empty()) throw std::runtime_error("cannot resolve " + impl.options.host);
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();

  impl.acceptor.emplace(impl.accept_io);
  impl.acceptor->open(endpoint.protocol());
  impl.acceptor->set_option(asio::socket_base::reuse_address(true));
  impl.acceptor->bind(endpoint);
  impl.acceptor->listen(asio::socket_base::max_listen_connections);
  impl.bound_port = impl.acceptor->local_endpoint().port();

  impl.started = true;
  // The serving threads' reactor is made now rather than with the first
  // accepted socket, so that a started server already holds every
  // descriptor it keeps (the leak checks count them from there).
  { tcp::socket reactor_made_now(impl.io); }
  asio::co_spawn(impl.accept_io, impl.accept_loop(), asio::detached);
  impl.work.emplace(impl.io.get_executor());
  // A handler that throws must not take the whole mock down.
  const auto run_until_stopped = [](asio::io_context& context) {
    for (;;) {
      try {
        context.run();
        return;
      } catch (const std::exception&) {
      }
    }
  };
  const unsigned thread_count = std::max(1u, impl.options.threads);
  impl.threads.reserve(thread_count);
  for (unsigned i = 0; i < thread_count; ++i) {
    impl.threads.emplace_back([&impl, run_until_stopped] { run_until_stopped(impl.io); });
  }
  impl.accept_thread =
      std::thread([&impl, run_until_stopped] { run_until_stopped(impl.accept_io); });
}

void MockServer::stop() {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.lifecycle_mutex);
  if (!impl.started || impl.stopped) return;
  impl.stopped = true;
  asio::post(impl.acceptor->get_executor(), [&impl] {
    boost::system::error_code ignored;
    impl.acceptor->close(ignored);
  });
  // The accept loop ends with the acceptor, and its thread with it: no
  // connection is added after the registry is closed below.
  impl.accept_thread.join();
  for (auto& connection : impl.registry.close_registry()) connection->close_for_shutdown();
  // Every pending operation is now being cancelled; the threads return once
  // the coroutines have unwound.
  impl.work.reset();
  for (auto& thread : impl.threads) thread.join();
  impl.threads.clear();
}

std::uint16_t MockServer::port() const { return impl_->bound_port; }

std::string MockServer::base_url() const {
  std::string host = impl_->options.host;
  // A wildcard address is not something a client can connect to.
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "::") host = "::1";
  return std::string(impl_->tls ? "https://" : "http://") + bracket_if_ipv6(host) + ":" +
         std::to_string(port()) + "/v1";
}

Stats MockServer::stats() const { return impl_->state.stats(); }

void MockServer::set_behaviour(Behaviour behaviour) {
  if (!is_valid_fail_mode(behaviour.fail)) {
    throw std::invalid_argument("unknown failure mode '" + behaviour.fail + "'");
  }
  if (!is_valid_anthropic_content(behaviour.anthropic_content)) {
    throw std::invalid_argument("unknown Anthropic content '" + behaviour.anthropic_content + "'");
  }
  if (!is_valid_openai_content(behaviour.openai_content)) {
    throw std::invalid_argument("unknown OpenAI content '" + behaviour.openai_content + "'");
  }
  std::lock_guard lock(impl_->state.behaviour_mutex);
  impl_->state.behaviour = std::move(behaviour);
}

Behaviour MockServer::behaviour() const { return impl_->state.behaviour_snapshot(); }

std::vector<RecordedRequest> MockServer::recent_requests() const {
  std::lock_guard lock(impl_->state.recorded_mutex);
  return {impl_->state.recorded.begin(), impl_->state.recorded.end()};
}

void MockServer::clear_recorded() {
  std::lock_guard lock(impl_->state.recorded_mutex);
  impl_->state.recorded.clear();
}

}  // namespace sluice::mock
