#include "framework/distributed/rendezvous_tcp_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <vector>

#include "framework/core/error.h"

namespace cpf::dist::rdzv {
namespace {

std::string to_hex(const unsigned char* bytes, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return out;
}

}  // namespace

// The fields are joined with '\n', which none of them contains (nonces are hex, numbers decimal; the
// payload or text comes last), so no two field lists share a message.
std::string hmac_sha256_hex(std::string_view key, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const unsigned char* result =
      ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  CPF_CHECK(result != nullptr && length == 32, "rendezvous: HMAC-SHA256 failed in OpenSSL");
  return to_hex(mac, length);
}

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> buffer(bytes);
  CPF_CHECK(::RAND_bytes(buffer.data(), static_cast<int>(bytes)) == 1,
            "rendezvous: OpenSSL's random generator failed (no entropy source?)");
  return to_hex(buffer.data(), bytes);
}

std::string hello_mac(const std::string& token, std::string_view server_nonce, std::string_view client_nonce, int rank,
                      int world_size) {
  return hmac_sha256_hex(
      token, str_cat("cpformer-rendezvous-hello-v1\n", server_nonce, "\n", client_nonce, "\n", rank, "\n", world_size));
}

std::string answer_mac(const std::string& token, std::string_view server_nonce, std::string_view client_nonce, int rank,
                       int world_size, std::string_view payload) {
  return hmac_sha256_hex(token, str_cat("cpformer-rendezvous-answer-v1\n", server_nonce, "\n", client_nonce, "\n", rank,
                                        "\n", world_size, "\n", payload));
}

std::string error_mac(const std::string& token, std::string_view server_nonce, std::string_view client_nonce,
                      std::string_view text) {
  return hmac_sha256_hex(token,
                         str_cat("cpformer-rendezvous-error-v1\n", server_nonce, "\n", client_nonce, "\n", text));
}

bool macs_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && ::CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace cpf::dist::rdzv
