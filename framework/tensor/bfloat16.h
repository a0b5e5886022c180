#pragma once
// bfloat16 storage type: the top 16 bits of an IEEE float. Conversion from float rounds to nearest
// even and keeps NaN a NaN; arithmetic happens in float.
#include <cstdint>
#include <cstring>

namespace cpf {

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  bfloat16(float value) : bits(round_from_float(value)) {}  // NOLINT: implicit like a float type
  operator float() const {                                  // NOLINT
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float out;
    std::memcpy(&out, &wide, sizeof(out));
    return out;
  }

  static uint16_t round_from_float(float value) {
    uint32_t wide;
    std::memcpy(&wide, &value, sizeof(wide));
    if ((wide & 0x7f800000u) == 0x7f800000u && (wide & 0x007fffffu) != 0) {
      return static_cast<uint16_t>((wide >> 16) | 0x0040u);  // quiet NaN
    }
    const uint32_t rounding_bias = 0x7fffu + ((wide >> 16) & 1u);
    return static_cast<uint16_t>((wide + rounding_bias) >> 16);
  }
  static bfloat16 from_bits(uint16_t raw) {
    bfloat16 out;
    out.bits = raw;
    return out;
  }
};

}  // namespace cpf
