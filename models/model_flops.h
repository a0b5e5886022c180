#pragma once
// Model FLOPs of a training step, for MFU (model FLOPs utilisation): the work the model needs, not
// what the kernels happen to do (recomputation, padding and masked-out tiles do not count).
//
// Convention (PaLM, appendix B; llm.c uses the same): per trained token, forward + backward =
//   6 N                                  every parameter is used in one multiply-add forward (2 FLOPs)
//                                        and two backward (dX, dW): N counts all parameters, the tied
//                                        embedding included (the LM head's GEMM uses it)
// + 6 L H T (d_qk + d_v)                 attention scores (2 T d_qk per head and token forward) and the
//                                        weighted values (2 T d_v), times 3 for the backward; T is the
//                                        sequence length; causal masking is NOT halved (as in PaLM and
//                                        llm.c), so MFU figures compare with theirs
// With d_qk = d_v = Q this is PaLM's 6N + 12 L H Q T.
#include <cstdint>

#include "models/gpt.h"

namespace cpf::models {

// Training FLOPs per token of a GPT with `num_parameters` parameters on rows of `seq_len` tokens.
double training_flops_per_token(const GPTOptions& options, int64_t num_parameters, int64_t seq_len);

}  // namespace cpf::models
