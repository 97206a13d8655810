#include "sluice/upstream/transports.hpp"

#include <array>

#include "sluice/upstream/client.hpp"
#include "sluice/upstream/http2_client.hpp"

namespace sluice::upstream {

namespace {

template <class Implementation>
std::unique_ptr<Transport> make(const TransportDeps& deps) {
  return std::make_unique<Implementation>(deps);
}

constexpr std::array kRegistered{
    RegisteredTransport{"http1", &make<Http1Client>},
    RegisteredTransport{"http2", &make<Http2Client>},
};

}  // namespace

std::span<const RegisteredTransport> registered_transports() { return kRegistered; }

std::optional<std::size_t> find_transport(std::string_view name) {
  for (std::size_t place = 0; place < kRegistered.size(); ++place) {
    if (kRegistered[place].name == name) return place;
  }
  return std::nullopt;
}

std::size_t default_transport() {
  // A table without the default is a mistake no deployment should meet at
  // run time.
  static_assert(
      [] {
        for (const auto& entry : kRegistered) {
          if (entry.name == kDefaultTransport) return true;
        }
        return false;
      }(),
      "the default transport is not registered");
  return *find_transport(kDefaultTransport);
}

std::size_t transport_for(const Origin& origin) {
  static const std::size_t http2 = *find_transport("http2");
  return origin.may_speak_http2() ? http2 : default_transport();
}

Transports::Transports(const TransportDeps& deps) {
  instances_.reserve(kRegistered.size());
  for (const auto& entry : kRegistered) instances_.push_back(entry.make(deps));
}

Transport* Transports::find(std::string_view name) {
  auto place = find_transport(name);
  return place ? instances_[*place].get() : nullptr;
}

}  // namespace sluice::upstream
