#pragma once
// Philox 4x32-10 counter-based generator (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11). A random number is a pure function of (seed, offset), so the CPU and CUDA backends
// produce identical streams and any element can be generated independently of the others.
//
// Addressing used by cpformer: element e of a draw that starts at generator offset `o` uses the
// Philox block with counter (o + e) and key (seed). Uniform and normal variates are derived from
// that one block, see uniform_from_block / normal_from_block.
#include <array>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define CPF_HOST_DEVICE __host__ __device__
#else
#define CPF_HOST_DEVICE
#endif

namespace cpf {

using PhiloxBlock = std::array<uint32_t, 4>;

CPF_HOST_DEVICE inline uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// Ten rounds of Philox-4x32 on counter `ctr` with key `key`.
CPF_HOST_DEVICE inline PhiloxBlock philox4x32_10(PhiloxBlock ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(kMul0, ctr[0], &hi0);
    const uint32_t lo1 = philox_mulhilo(kMul1, ctr[2], &hi1);
    ctr = {hi1 ^ ctr[1] ^ key0, lo1, hi0 ^ ctr[3] ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

// The block for element `index` of the stream (seed, ·).
CPF_HOST_DEVICE inline PhiloxBlock philox_block(uint64_t seed, uint64_t index) {
  return philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform in [0, 1): 24 random bits for float, 53 for double.
CPF_HOST_DEVICE inline float uniform_float(const PhiloxBlock& b) {
  return static_cast<float>(b[0] >> 8) * (1.0f / 16777216.0f);
}
CPF_HOST_DEVICE inline double uniform_double(const PhiloxBlock& b) {
  const uint64_t bits = (static_cast<uint64_t>(b[0]) << 21) ^ (b[1] >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller from the four words of one block (cosine branch only, so every
// element stays independent of its neighbours).
CPF_HOST_DEVICE inline double normal_double(const PhiloxBlock& b) {
  const uint64_t bits1 = ((static_cast<uint64_t>(b[0]) << 21) ^ (b[1] >> 11)) & ((1ull << 53) - 1);
  const uint64_t bits2 = ((static_cast<uint64_t>(b[2]) << 21) ^ (b[3] >> 11)) & ((1ull << 53) - 1);
  // u1 in (0, 1] so log(u1) is finite.
  const double u1 = (static_cast<double>(bits1) + 1.0) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(bits2) * (1.0 / 9007199254740992.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
}

}  // namespace cpf
