#pragma once
// FP8 autocast: while an Fp8Autocast is alive on a thread, the linear ops of that thread (linear,
// linear_cat, linear_gelu, gelu_mlp; framework/autograd/functions/linear*.h) run their GEMMs through
// fp8_linear (framework/autograd/functions/fp8_linear.h) when their input is bf16 and their shapes fit
// the FP8 GEMM (rows, in and out features multiples of 16). Everything else is untouched: embeddings, the
// LM head and loss, norms, attention and any linear whose shape does not fit (a decoding step's single
// row) keep their bf16 GEMMs. This is how `run.precision: fp8` trains.
//
// The recipe (fp8_scaling.h): without a state, current scaling; with an Fp8ScalingState, delayed
// scaling, the k-th FP8 linear of the scope (k = 0, 1, ...) taking the slot "<prefix>.fp8_<k>". A scope
// per transformer block (prefix "blocks.3") gives every call site a stable key, also when the block is
// recomputed in the backward (a new scope with the same prefix counts from 0 again).
//
//   { Fp8Autocast fp8(true, options, &state, "blocks.3"); y = block.forward(x); }  // the forward in FP8
//   backward(loss);  // the FP8 nodes' backward run in FP8 whatever the scope
#include <cstdint>
#include <optional>
#include <string>

#include "framework/autograd/fp8_scaling.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/tensor/tensor.h"

namespace cpf {

class Fp8Autocast {
 public:
  // enabled false: a scope that changes nothing (so callers need no branch). state null: current
  // scaling with options.margin; otherwise delayed scaling with the state's slots (its margin).
  explicit Fp8Autocast(bool enabled = true, Fp8LinearOptions options = {}, Fp8ScalingState* state = nullptr,
                       std::string prefix = "");
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

  struct Scope {
    Fp8LinearOptions options;
    Fp8ScalingState* state = nullptr;
    std::string prefix;
    int64_t next = 0;  // the index of the next FP8 linear in this scope
  };

 private:
  std::optional<Scope> previous_;
  bool enabled_;
};

// Whether an Fp8Autocast is alive on this thread.
bool fp8_autocast_active();

// The options of the next FP8 linear of the innermost live scope (its slot taken from the state, which
// counts it), or nullopt when none is alive. Call it once per fp8_linear call.
std::optional<Fp8LinearOptions> next_fp8_linear_options();

// Whether a linear with input x (..., K) and `out_features` outputs runs in FP8 now: autocast on, x
// bf16, and rows, K and out_features multiples of 16.
bool use_fp8_linear(const Tensor& x, int64_t out_features);
// The same for a linear fed by an activation fused into its cast (fp8_linear_after): x holds the
// activation's input, and the linear reads in_features of it a row (SwiGLU's [gate | up] is 2 in_features).
bool use_fp8_linear(const Tensor& x, int64_t in_features, int64_t out_features);

// Whether an Fp8Autocast is alive on this thread and its options fuse the activations' casts
// (Fp8LinearOptions::fuse_activation_casts): the MLPs then call fp8_linear_after.
bool fp8_fuse_activation_casts();

}  // namespace cpf
