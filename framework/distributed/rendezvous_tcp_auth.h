#pragma once
// Authentication of the rendezvous handshake: both ends prove they hold the job's secret
// (CPF_RENDEZVOUS_TOKEN) without sending it, by an HMAC-SHA256 over fresh nonces of both ends, the
// rank, the world size and (rank 0's answer) the payload. A recorded handshake replays nowhere (the
// nonces differ), and an answer cannot be moved to another rank or carry another payload. With a token,
// rank 0's errors are proven the same way ("ERR <proof> <text>"): a rank aborts its join only on an
// error that proves the token, so whoever else answers on the port cannot stop a job.
#include <string>
#include <string_view>

namespace cpf::dist::rdzv {

constexpr size_t kNonceHexDigits = 32;  // 128 random bits
constexpr size_t kMacHexDigits = 64;    // HMAC-SHA256
constexpr size_t kMinTokenLength = 16;

// `bytes` bytes from OpenSSL's CSPRNG as lowercase hex; throws if it has no entropy.
std::string random_hex(size_t bytes);

// What a rank sends with its hello: proves the token to rank 0.
std::string hello_mac(const std::string& token, std::string_view server_nonce, std::string_view client_nonce, int rank,
                      int world_size);
// What rank 0 sends with the payload: proves the token, and binds the payload to this handshake.
std::string answer_mac(const std::string& token, std::string_view server_nonce, std::string_view client_nonce, int rank,
                       int world_size, std::string_view payload);

// What rank 0 sends with an error on a connection whose challenge carried `server_nonce`: `client_nonce`
// is the rank's hello's, or "-" when the rank had not said hello yet.
std::string error_mac(const std::string& token, std::string_view server_nonce, std::string_view client_nonce,
                      std::string_view text);

// HMAC-SHA256 (RFC 2104) of `message` under `key`, as 64 lowercase hex digits (OpenSSL's).
std::string hmac_sha256_hex(std::string_view key, std::string_view message);

// Equal in time independent of where they differ (no timing oracle for the MAC).
bool macs_equal(std::string_view a, std::string_view b);

}  // namespace cpf::dist::rdzv
