#pragma once

#include <cstdint>

#include "sluice/server/resolve.hpp"

namespace sluice::server {

// The tokens a proxied request reserves against its key's `tpm`: its
// estimate when it would go upstream, nothing when it would be refused
// after admission (an unknown model, no rule that matches), which spends
// nothing upstream.
std::uint64_t tokens_to_reserve(const Resolution& resolution);

}  // namespace sluice::server
