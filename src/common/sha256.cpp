#include "sluice/common/sha256.hpp"

#include <openssl/crypto.h>
#include <openssl/sha.h>

namespace sluice {

// The low-level SHA256_* calls are deprecated in OpenSSL 3 but remain the
// only way to hash without a heap allocation per call (SHA256() and EVP
// allocate a context each time), which matters on the path every request
// takes. They run the same assembly the default provider uses.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
Sha256 sha256(std::string_view data) {
  Sha256 digest;
  SHA256_CTX context;
  SHA256_Init(&context);
  SHA256_Update(&context, data.data(), data.size());
  SHA256_Final(digest.data(), &context);
  // The context holds the tail of the secret.
  OPENSSL_cleanse(&context, sizeof context);
  return digest;
}
#pragma GCC diagnostic pop

}  // namespace sluice
