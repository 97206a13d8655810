#include "support/certificates.hpp"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sluice::testing {

namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;
using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<std::size_t>(size));
}

BioPtr bio_of(const std::string& pem) {
  return {BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free};
}

// Made with `key` for `common_name`, signed by `issuer_key` as `issuer`
// (null: by itself). A random serial, so that two certificates of one
// test tell apart.
Certificate make_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                             EVP_PKEY* issuer_key,
                             const std::vector<std::pair<const char*, std::string>>& extensions) {
  CertPtr cert(X509_new(), X509_free);
  X509_set_version(cert.get(), 2);
  unsigned char serial_bytes[8];
  RAND_bytes(serial_bytes, sizeof serial_bytes);
  serial_bytes[0] &= 0x7f;
  std::uint64_t serial = 0;
  for (unsigned char byte : serial_bytes) serial = (serial << 8) | byte;
  ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));

  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, signer, cert.get(), nullptr, nullptr, 0);
  for (const auto& [ext_name, ext_value] : extensions) {
    X509_EXTENSION* extension = X509V3_EXT_conf(nullptr, &context, ext_name, ext_value.c_str());
    if (!extension) throw std::runtime_error(std::string("bad extension ") + ext_name);
    X509_add_ext(cert.get(), extension, -1);
    X509_EXTENSION_free(extension);
  }
  if (!X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256())) {
    throw std::runtime_error("sign failed");
  }

  BioPtr cert_bio(BIO_new(BIO_s_mem()), BIO_free);
  BioPtr key_bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(cert_bio.get(), cert.get());
  PEM_write_bio_PrivateKey(key_bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  return {bio_text(cert_bio.get()), bio_text(key_bio.get())};
}

KeyPtr new_key() {
  KeyPtr key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  if (!key) throw std::runtime_error("EC key generation failed");
  return key;
}

}  // namespace

Certificate make_self_signed_certificate(const std::string& subject_alt_names,
                                         const std::string& common_name) {
  auto key = new_key();
  return make_certificate(key.get(), common_name, nullptr, nullptr,
                          {{"subjectAltName", subject_alt_names},
                           {"basicConstraints", "critical,CA:TRUE"},
                           {"keyUsage", "critical,digitalSignature,keyCertSign"}});
}

Certificate make_signed_certificate(const Certificate& issuer, const std::string& common_name,
                                    const std::string& subject_alt_names) {
  auto cert_bio = bio_of(issuer.cert_pem);
  auto key_bio = bio_of(issuer.key_pem);
  CertPtr issuer_cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  KeyPtr issuer_key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr),
                    EVP_PKEY_free);
  if (!issuer_cert || !issuer_key) throw std::runtime_error("unreadable issuer");
  auto key = new_key();
  return make_certificate(key.get(), common_name, issuer_cert.get(), issuer_key.get(),
                          {{"subjectAltName", subject_alt_names},
                           {"basicConstraints", "critical,CA:FALSE"},
                           {"keyUsage", "critical,digitalSignature"},
                           {"extendedKeyUsage", "serverAuth,clientAuth"}});
}

}  // namespace sluice::testing
