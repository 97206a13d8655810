#include "sluice/server/respond.hpp"

#include <array>
#include <boost/asio/buffer.hpp>

#include "sluice/http/eager_write.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/metrics/server_timing.hpp"
#include "sluice/server/model_list.hpp"
#include "sluice/server/phases.hpp"

namespace sluice::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using namespace std::string_view_literals;

void append_request_fields(std::string& fields, const RequestContext& context) {
  fields.append("x-request-id: "sv).append(context.request_id).append("\r\n"sv);
  if (!context.deployment_id.empty()) {
    fields.append("x-sluice-deployment: "sv).append(context.deployment_id).append("\r\n"sv);
  }
  if (context.attempts > 0) {
    fields.append("x-sluice-attempts: "sv)
        .append(std::to_string(context.attempts))
        .append("\r\n"sv);
  }
}

namespace {

net::awaitable<bool> write_response(RequestContext& context, unsigned status,
                                    std::string_view content_type, std::string_view body,
                                    std::string_view extra_fields) {
  std::string head;
  HeadWriter writer(head);
  writer.status_line(status)
      .field("Content-Type", content_type)
      .field("Content-Length", body.size())
      .raw_fields(extra_fields);
  if (!context.timing_sent) {
    // An answer of the gateway's own: all of its time is sluice's.
    context.gateway_time += Clock::now() - context.body_read;
    std::string timing;
    metrics::render_server_timing(
        timing, {context.gateway_time, context.upstream_connect, context.upstream_ttfb});
    writer.raw_fields(timing);
    context.timing_sent = true;
  }
  context.record.status = status;
  context.record.bytes_out = body.size();
  if (!context.keep_alive) writer.field("Connection", "close");
  writer.finish();
  bool head_only = context.request.method() == http::verb::head;
  std::array<net::const_buffer, 2> wire = {net::buffer(head),
                                           net::buffer(head_only ? std::string_view() : body)};
  auto [ec, n] = co_await write_eagerly(context.client, context.client_deadline,
                                        context.snapshot->config->server.write_timeout, wire);
  co_return !ec && context.keep_alive;
}

// The models a key may use; the full list, rendered once per config, when it
// may use them all.
std::string models_for(const RequestContext& context, const auth::KeyPolicy* key) {
  if (!key || key->models.empty()) return context.snapshot->models_json;
  return render_model_list(*context.snapshot->config, key);
}

}  // namespace

net::awaitable<bool> respond_body(RequestContext& context, unsigned status,
                                  std::string_view content_type, std::string_view body,
                                  std::string_view extra_fields) {
  std::string fields;
  fields.reserve(160 + context.response_fields.size() + extra_fields.size());
  append_request_fields(fields, context);
  fields.append(context.response_fields).append(extra_fields);
  co_return co_await write_response(context, status, content_type, body, fields);
}

net::awaitable<bool> respond_json(RequestContext& context, unsigned status, std::string_view body,
                                  std::string_view extra_fields) {
  co_return co_await respond_body(context, status, "application/json", body, extra_fields);
}

net::awaitable<bool> respond_error(RequestContext& context, const ApiError& error,
                                   std::string_view extra_fields) {
  const auto body = protocol::error_json(context.dialect, error);
  co_return co_await respond_json(context, error.status, body, extra_fields);
}

net::awaitable<bool> respond_here(RequestContext& context, RequestJob& job) {
  const auto& answer = *job.local_answer;
  switch (answer.kind) {
    case LocalAnswer::Kind::refusal:
      co_return co_await respond_error(context, answer.refusal->error, answer.refusal->fields);
    case LocalAnswer::Kind::health:
      co_return co_await respond_json(context, 200, R"({"status":"ok"})");
    case LocalAnswer::Kind::model_list: {
      // Held in a local: GCC 12 mishandles temporaries in an awaited call's
      // arguments.
      const auto models = models_for(context, job.admission.key);
      co_return co_await respond_json(context, 200, models);
    }
    case LocalAnswer::Kind::one_model: {
      const auto model = render_model(answer.model_id);
      co_return co_await respond_json(context, 200, model);
    }
  }
  co_return false;
}

}  // namespace sluice::server
