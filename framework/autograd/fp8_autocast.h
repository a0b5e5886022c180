#pragma once
// FP8 autocast: while an Fp8Autocast is alive on a thread, the linear ops of that thread (linear,
// linear_cat, linear_gelu, gelu_mlp; framework/autograd/functions/linear*.h) run their GEMMs through
// fp8_linear (current scaling, framework/autograd/functions/fp8_linear.h) when their input is bf16 and
// their shapes fit the FP8 GEMM (rows, in and out features multiples of 16). Everything else is
// untouched: embeddings, the LM head and loss, norms, attention and any linear whose shape does not fit
// (a decoding step's single row) keep their bf16 GEMMs. This is how `run.precision: fp8` trains.
//
//   { Fp8Autocast fp8({.margin = 0}); loss = model.forward_loss(batch); }  // the forward in FP8
//   backward(loss);  // the FP8 nodes' backward run in FP8 whatever the scope
#include <cstdint>
#include <optional>

#include "framework/autograd/functions/fp8_linear.h"
#include "framework/tensor/tensor.h"

namespace cpf {

class Fp8Autocast {
 public:
  // enabled false: a scope that changes nothing (so callers need no branch).
  explicit Fp8Autocast(bool enabled = true, Fp8LinearOptions options = {});
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  std::optional<Fp8LinearOptions> previous_;
  bool enabled_;
};

// The options of the innermost live Fp8Autocast of this thread, or nullopt when none is.
std::optional<Fp8LinearOptions> fp8_autocast_options();

// Whether a linear with input x (..., K) and `out_features` outputs runs in FP8 now: autocast on, x
// bf16, and rows, K and out_features multiples of 16.
bool use_fp8_linear(const Tensor& x, int64_t out_features);

}  // namespace cpf
