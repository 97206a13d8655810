#include "sluice/upstream/origin.hpp"

namespace sluice::upstream {

std::string Origin::key() const {
  std::string key = tls ? "https://" : "http://";
  key += host;
  key += ':';
  key += std::to_string(port);
  if (tls && !tls_verify) key += "#noverify";
  if (tls && !ca_file.empty()) key += "#ca=" + ca_file;
  return key;
}

std::string Origin::host_header() const {
  bool ipv6 = host.find(':') != std::string::npos;
  std::string value = ipv6 ? "[" + host + "]" : host;
  if ((tls && port != 443) || (!tls && port != 80)) value += ":" + std::to_string(port);
  return value;
}

Origin Origin::from(const config::Deployment& deployment) {
  const auto& url = deployment.base_url;
  return Origin{url.host, url.port, url.tls(), deployment.tls_verify, deployment.ca_file};
}

}  // namespace sluice::upstream
