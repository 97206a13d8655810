#include "sluice/upstream/origin.hpp"

#include <boost/asio/ip/address.hpp>

namespace sluice::upstream {

namespace {

std::string pool_key(const Origin& origin) {
  std::string key = origin.tls ? "https://" : "http://";
  key += origin.host;
  key += ':';
  key += std::to_string(origin.port);
  if (origin.tls && !origin.tls_verify) key += "#noverify";
  if (origin.tls && !origin.ca_file.empty()) key += "#ca=" + origin.ca_file;
  return key;
}

std::string host_header_value(const Origin& origin) {
  bool ipv6 = origin.host.find(':') != std::string::npos;
  std::string value = ipv6 ? "[" + origin.host + "]" : origin.host;
  const std::uint16_t default_port = origin.tls ? 443 : 80;
  if (origin.port != default_port) value += ":" + std::to_string(origin.port);
  return value;
}

}  // namespace

Origin Origin::from(const config::Deployment& deployment, const config::Upstream& upstream) {
  const auto& url = deployment.base_url;
  Origin origin;
  origin.host = url.host;
  origin.port = url.port;
  origin.tls = url.tls();
  origin.tls_verify = deployment.tls_verify;
  origin.ca_file = deployment.ca_file;
  origin.http2 = deployment.http2;
  origin.http2_ping_after = upstream.http2_ping_after;
  origin.http2_ping_timeout = upstream.http2_ping_timeout;
  boost::system::error_code not_an_address;
  auto address = boost::asio::ip::make_address(origin.host, not_an_address);
  if (!not_an_address) origin.address.emplace(address, origin.port);
  origin.key_ = pool_key(origin);
  origin.host_header_ = host_header_value(origin);
  return origin;
}

std::string deployment_fields(const config::Deployment& deployment) {
  std::string fields;
  for (const auto& [name, value] : deployment.headers) {
    fields.append(name).append(": ").append(value).append("\r\n");
  }
  if (!deployment.api_key.empty()) {
    fields.append("Authorization: Bearer ").append(deployment.api_key).append("\r\n");
  }
  return fields;
}

}  // namespace sluice::upstream
