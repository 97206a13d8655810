#pragma once

#include <array>
#include <string_view>

namespace sluice {

using Sha256 = std::array<unsigned char, 32>;

// SHA-256 without touching the heap (OpenSSL 3's one-shot SHA256() goes
// through EVP and allocates a context on every call).
Sha256 sha256(std::string_view data);

}  // namespace sluice
