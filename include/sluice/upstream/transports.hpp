#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "sluice/upstream/transport.hpp"

namespace sluice::upstream {

// The transports a deployment may name, in the table of transports.cpp: a
// new transport is its own files and one line there.
struct RegisteredTransport {
  std::string_view name;
  std::unique_ptr<Transport> (*make)(const TransportDeps& deps);
};

// What a deployment that names none is carried by.
inline constexpr std::string_view kDefaultTransport = "http1";

std::span<const RegisteredTransport> registered_transports();

// A registered transport's place in registered_transports(), which is also
// its place in every worker's Transports: nullopt for a name not
// registered. A deployment's is looked up once per config, not per request.
std::optional<std::size_t> find_transport(std::string_view name);
// kDefaultTransport's place.
std::size_t default_transport();
// The place of what carries requests to `origin`: HTTP/2 where it may be
// spoken (Origin::may_speak_http2), the default otherwise.
std::size_t transport_for(const Origin& origin);

// One instance of every registered transport, for one worker thread.
class Transports {
 public:
  explicit Transports(const TransportDeps& deps);

  Transport& operator[](std::size_t place) { return *instances_[place]; }
  // Null for a name not registered.
  Transport* find(std::string_view name);
  // Transport::shut_down of every instance.
  void shut_down() {
    for (auto& instance : instances_) instance->shut_down();
  }

 private:
  std::vector<std::unique_ptr<Transport>> instances_;
};

}  // namespace sluice::upstream
