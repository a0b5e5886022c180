#include "framework/tensor/rope_frequencies.h"

#include <cmath>

#include "framework/core/error.h"

namespace cpf {

void check_rope_frequencies(const RopeFrequencies& f, const char* op) {
  CPF_CHECK(std::isfinite(f.base) && f.base > 0, op, ": base must be finite and > 0, got ", f.base);
  const RopeScaling& s = f.scaling;
  CPF_CHECK(std::isfinite(s.factor) && s.factor >= 1, op,
            ": the RoPE scaling factor must be finite and >= 1 (1: none), got ", s.factor);
  if (!s.active()) return;
  CPF_CHECK(std::isfinite(s.low_freq_factor) && std::isfinite(s.high_freq_factor) && s.low_freq_factor > 0 &&
                s.low_freq_factor < s.high_freq_factor,
            op, ": Llama 3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor, " and ",
            s.high_freq_factor);
  CPF_CHECK(std::isfinite(s.original_context) && s.original_context > 0, op,
            ": Llama 3 RoPE scaling needs original_max_position_embeddings > 0, got ", s.original_context);
}

}  // namespace cpf
