#pragma once
// RoPE's rotation frequencies (framework/tensor/ops/rope.h): pair i of R rotated dims turns at
// base^(-2i / R) radians a position, or, with a factor other than 1, at that frequency rescaled as Llama 3
// does for long contexts (Hugging Face transformers' rope_type "llama3", the Llama 3.1 / 3.2 checkpoints):
//
//   wavelength w = 2 pi / f, with L = original_context:
//   w < L / high_freq_factor   (high frequencies)  f             unchanged
//   w > L / low_freq_factor    (low frequencies)   f / factor
//   otherwise                                      (1 - s) f / factor + s f,  s = (L / w - low) / (high - low)
//
// Computed in double, on the CPU and inside the CUDA kernel alike (the same function).
#include <cmath>
#include <cstdint>

#if !defined(CPF_HOST_DEVICE)
#if defined(__CUDACC__)
#define CPF_HOST_DEVICE __host__ __device__
#else
#define CPF_HOST_DEVICE
#endif
#endif

namespace cpf {

// Llama 3's scaling of RoPE frequencies (transformers' rope_scaling with rope_type "llama3"); factor 1 = none.
struct RopeScaling {
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;  // transformers' original_max_position_embeddings

  bool active() const { return factor != 1.0; }
  bool operator==(const RopeScaling&) const = default;
};

struct RopeFrequencies {
  double base = 10000.0;
  RopeScaling scaling{};

  // The frequency of pair `pair` of `rot` rotated dims, in radians a position.
  CPF_HOST_DEVICE double of_pair(int64_t pair, int64_t rot) const {
    const double f = ::pow(base, -2.0 * static_cast<double>(pair) / static_cast<double>(rot));
    const RopeScaling& s = scaling;
    if (s.factor == 1.0) return f;
    const double wavelength = 2.0 * 3.14159265358979323846 / f;
    if (wavelength < s.original_context / s.high_freq_factor) return f;
    if (wavelength > s.original_context / s.low_freq_factor) return f / s.factor;
    const double smooth =
        (s.original_context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    return (1.0 - smooth) * f / s.factor + smooth * f;
  }
};

// Throws, naming `op` and the field, unless base is finite and > 0, the factor finite and >= 1 and, when
// scaled, 0 < low_freq_factor < high_freq_factor and original_context > 0, all finite.
void check_rope_frequencies(const RopeFrequencies& f, const char* op);

}  // namespace cpf
