#pragma once
// Device op cases, continued (see op_cases.h): joins, matmul, nn ops, reductions, views and conversions.
#include <functional>
#include <string>
#include <vector>

#include "autograd/op_cases.h"
#include "framework/autograd/functions/linear_cat.h"

namespace cpf::testing::op_cases_detail {

inline void add_join_cases(std::vector<OpCase>& cases) {
  cases.push_back(exact({"cat_rows", "cat", {diff({2, 3}), diff({4, 3}), diff({1, 3})}, [](const Inputs& x) -> Outputs {
                           return {cat(x, 0)};
                         }}));
  // A constant, a strided input and an empty piece along the last dim.
  cases.push_back(exact({"cat_last_dim_mixed",
                         "cat",
                         {constant_input({3, 2}), strided({3, 4}), diff({3, 0})},
                         [](const Inputs& x) -> Outputs {
                           return {cat({x[0], x[1], x[2], x[1]}, -1)};
                         }}));
  cases.push_back(exact({"stack_first", "stack", {diff({2, 3}), strided({2, 3})}, [](const Inputs& x) -> Outputs {
                           return {stack(x, 0)};
                         }}));
  cases.push_back(exact({"stack_last", "stack", {diff({2, 3}), diff({2, 3})}, [](const Inputs& x) -> Outputs {
                           return {stack({x[0], x[1], x[0]}, -1)};
                         }}));
  cases.push_back(exact({"split_sizes", "split", {diff({3, 7})}, [](const Inputs& x) -> Outputs {
                           return split(x[0], std::vector<int64_t>{2, 0, 4, 1}, 1);
                         }}));
  // One piece unused: its gradient counts as zero.
  cases.push_back({"split_chunks_strided", "split", {strided({5, 3})}, [](const Inputs& x) -> Outputs {
                     const auto pieces = split(x[0], 2, 0);
                     return {mul(pieces[0], exp(pieces[1]))};
                   }});
}

// cuBLASLt's GELU and DGELU epilogues evaluate tanh with their own approximation: in f32 their results
// differ from the CPU's tanh-GELU by ~3e-6 absolute (2.5e-5 relative; measured on an H200: output
// -0.13779425 vs -0.13779083, gradient -0.15916231 vs -0.15915945), which propagates through the
// following GEMMs (K = 8 here). f32 runs of the fused cases: 1e-4 relative, 2e-5 absolute, far below
// times below an O(1) error; f64 (the unfused path) and bf16 keep the default bounds.
inline Tolerance cublaslt_gelu_tolerance(DType run, DType result, double scale) {
  if (run == DType::f32 && result == DType::f32) return {1e-4, 2e-5, INFINITY};
  return tolerance_for(result, false, scale);
}

inline void add_matmul_cases(std::vector<OpCase>& cases) {
  // linear: x (..., K) @ W^T + b in one node (a GEMM epilogue adds b on a device).
  cases.push_back(
      {"linear_bias_3d", "linear", {diff({2, 3, 4}), diff({5, 4}), diff({5})}, [](const Inputs& x) -> Outputs {
         return {linear(x[0], x[1], x[2])};
       }});
  cases.push_back({"linear_no_bias_strided", "linear", {strided({6, 3}), diff({7, 3})}, [](const Inputs& x) -> Outputs {
                     return {linear(x[0], x[1])};
                   }});
  cases.push_back(
      {"linear_transposed_weight", "linear", {diff({4, 6}), diff({6, 8}), diff({8})}, [](const Inputs& x) -> Outputs {
         return {linear(x[0], transpose(x[1], 0, 1), x[2])};
       }});
  // linear_gelu / gelu_mlp: N % 8 == 0 runs cuBLASLt's GELU / DGELU epilogues at f32 and bf16 on a
  // device; other N (and f64) the unfused fallback.
  OpCase linear_gelu_fused{
      "linear_gelu_bias_3d", "linear_gelu", {diff({2, 3, 4}), diff({8, 4}), diff({8})}, [](const Inputs& x) -> Outputs {
        return {linear_gelu(x[0], x[1], x[2])};
      }};
  linear_gelu_fused.tolerance = cublaslt_gelu_tolerance;
  cases.push_back(std::move(linear_gelu_fused));
  cases.push_back(
      {"linear_gelu_no_bias_odd_n", "linear_gelu", {strided({5, 3}), diff({6, 3})}, [](const Inputs& x) -> Outputs {
         return {linear_gelu(x[0], x[1])};
       }});
  OpCase gelu_mlp_fused{"gelu_mlp_bias_3d",
                        "gelu_mlp",
                        {diff({2, 3, 4}), diff({8, 4}), diff({8}), diff({4, 8}), diff({4})},
                        [](const Inputs& x) -> Outputs {
                          return {gelu_mlp(x[0], {x[1], x[2]}, {x[3], x[4]})};
                        }};
  gelu_mlp_fused.tolerance = cublaslt_gelu_tolerance;
  cases.push_back(std::move(gelu_mlp_fused));
  cases.push_back(
      {"gelu_mlp_no_bias_odd", "gelu_mlp", {diff({6, 4}), diff({6, 4}), diff({5, 6})}, [](const Inputs& x) -> Outputs {
         return {gelu_mlp(x[0], {x[1]}, {x[2]})};
       }});
  // linear_cat, fused (min_fused_rows 0): q/k/v-like parts without bias (3-D x), and two parts with
  // biases on a strided x; and the separate linears it runs below min_fused_rows.
  cases.push_back({"linear_cat_three_parts",
                   "linear_cat",
                   {diff({2, 3, 4}), diff({8, 4}), diff({4, 4}), diff({4, 4})},
                   [](const Inputs& x) -> Outputs {
                     return {linear_cat(x[0], {{x[1]}, {x[2]}, {x[3]}}, 0)};
                   }});
  cases.push_back({"linear_cat_bias_strided",
                   "linear_cat",
                   {strided({6, 3}), diff({5, 3}), diff({5}), diff({3, 3}), diff({3})},
                   [](const Inputs& x) -> Outputs {
                     return {linear_cat(x[0], {{x[1], x[2]}, {x[3], x[4]}}, 0)};
                   }});
  cases.push_back({"linear_cat_separate_below_min_rows",
                   "linear_cat",
                   {diff({3, 4}), diff({8, 4}), diff({8}), diff({4, 4}), diff({4})},
                   [](const Inputs& x) -> Outputs {
                     return {linear_cat(x[0], {{x[1], x[2]}, {x[3], x[4]}})};
                   }});
  cases.push_back(
      {"matmul_batched_broadcast", "matmul", {diff({2, 3, 4}), diff({4, 5})}, [](const Inputs& x) -> Outputs {
         return {matmul(x[0], x[1])};
       }});
  cases.push_back(
      {"matmul_transposed_views", "matmul", {diff({2, 3, 4}), diff({4, 5})}, [](const Inputs& x) -> Outputs {
         return {matmul(transpose(x[1], 0, 1), transpose(x[0], 1, 2))};
       }});
  cases.push_back(
      {"matmul_strided_operands", "matmul", {strided({6, 3}), strided({3, 7})}, [](const Inputs& x) -> Outputs {
         return {matmul(x[0], x[1])};
       }});
  cases.push_back(
      {"matmul_both_batched", "matmul", {diff({2, 1, 3, 4}), diff({3, 4, 2})}, [](const Inputs& x) -> Outputs {
         return {matmul(x[0], x[1])};
       }});
  cases.push_back({"matmul_matrix_vector", "matmul", {diff({2, 3, 4}), diff({4})}, [](const Inputs& x) -> Outputs {
                     return {matmul(x[0], x[1])};
                   }});
  cases.push_back({"matmul_vector_matrix", "matmul", {diff({4}), diff({4, 5})}, [](const Inputs& x) -> Outputs {
                     return {matmul(x[0], x[1])};
                   }});
  cases.push_back({"matmul_dot", "matmul", {diff({6}), diff({6})}, [](const Inputs& x) -> Outputs {
                     return {matmul(x[0], x[1])};
                   }});
}

inline void add_nn_cases(std::vector<OpCase>& cases) {
  for (int64_t dim : {-1, 0, 1}) {
    const std::string suffix = dim == -1 ? "last" : dim == 0 ? "first" : "middle";
    cases.push_back({"softmax_" + suffix, "softmax", {diff({3, 4, 5}, -2, 2)}, [dim](const Inputs& x) -> Outputs {
                       return {softmax(x[0], dim)};
                     }});
    cases.push_back(
        {"log_softmax_" + suffix, "log_softmax", {diff({3, 4, 5}, -2, 2)}, [dim](const Inputs& x) -> Outputs {
           return {log_softmax(x[0], dim)};
         }});
  }
  cases.push_back({"softmax_strided", "softmax", {strided({4, 6}, -2, 2)}, [](const Inputs& x) -> Outputs {
                     return {softmax(x[0], -1)};
                   }});
  cases.push_back({"log_softmax_strided", "log_softmax", {strided({4, 6}, -2, 2)}, [](const Inputs& x) -> Outputs {
                     return {log_softmax(x[0], -1)};
                   }});
  cases.push_back({"layer_norm_affine",
                   "layer_norm",
                   {diff({4, 6}, -2, 2), diff({6}, 0.5, 1.5), diff({6})},
                   [](const Inputs& x) -> Outputs { return {layer_norm(x[0], x[1], x[2], 1e-5)}; }});
  cases.push_back({"layer_norm_weight_only_strided",
                   "layer_norm",
                   {strided({3, 5}, -2, 2), diff({5}, 0.5, 1.5)},
                   [](const Inputs& x) -> Outputs { return {layer_norm(x[0], x[1], Tensor(), 1e-5)}; }});
  cases.push_back({"layer_norm_plain_3d", "layer_norm", {diff({2, 3, 8}, -2, 2)}, [](const Inputs& x) -> Outputs {
                     return {layer_norm(x[0], Tensor(), Tensor(), 1e-5)};
                   }});
  cases.push_back(
      {"rms_norm_weight", "rms_norm", {diff({2, 3, 8}, -2, 2), diff({8}, 0.5, 1.5)}, [](const Inputs& x) -> Outputs {
         return {rms_norm(x[0], x[1], 1e-6)};
       }});
  cases.push_back({"rms_norm_plain_strided", "rms_norm", {strided({4, 6}, -2, 2)}, [](const Inputs& x) -> Outputs {
                     return {rms_norm(x[0], Tensor(), 1e-6)};
                   }});
  cases.push_back(exact({"embedding_i64",
                         "embedding",
                         {diff({7, 4}), fixed(ids({1, 5, 1, 0, 6, 1}, {2, 3}))},
                         [](const Inputs& x) -> Outputs { return {embedding(x[0], x[1])}; }}));
  cases.push_back(exact({"embedding_i32_strided",
                         "embedding",
                         {strided({5, 3}), fixed(ids32({3, 3, 3, 4}, {4}))},
                         [](const Inputs& x) -> Outputs { return {embedding(x[0], x[1])}; }}));
  cases.push_back({"cross_entropy_ignore",
                   "cross_entropy",
                   {diff({5, 4}, -3, 3), fixed(ids({0, 3, -100, 1, 1}, {5}))},
                   [](const Inputs& x) -> Outputs { return {cross_entropy(x[0], x[1])}; }});
  cases.push_back({"cross_entropy_i32_strided",
                   "cross_entropy",
                   {strided({5, 4}, -3, 3), fixed(ids32({2, 2, 0, 3, 2}, {5}))},
                   [](const Inputs& x) -> Outputs { return {cross_entropy(x[0], x[1], 2)}; }});
  cases.push_back(
      {"rope_bthd", "rope", {diff({2, 3, 2, 6}), fixed(ids({0, 4, 9}, {3}))}, [](const Inputs& x) -> Outputs {
         return {rope(x[0], x[1])};
       }});
  cases.push_back({"rope_per_batch_partial",
                   "rope",
                   {diff({2, 3, 2, 6}), fixed(ids32({1, 2, 3, 7, 8, 9}, {2, 3}))},
                   [](const Inputs& x) -> Outputs { return {rope(x[0], x[1], 100.0, 4)}; }});
  cases.push_back(
      {"rope_inverse_thd", "rope", {diff({3, 2, 4}), fixed(ids({0, 4, 9}, {3}))}, [](const Inputs& x) -> Outputs {
         return {rope(x[0], x[1], 10000.0, -1, true)};
       }});
  cases.push_back(
      {"rope_strided_heads", "rope", {diff({1, 3, 6, 2}), fixed(ids({2, 5, 11}, {3}))}, [](const Inputs& x) -> Outputs {
         return {rope(transpose(x[0], 2, 3), x[1])};
       }});
  // SwiGLU's gate: plain, and gate | up as the two column halves of one fused projection (row strides).
  cases.push_back({"swiglu", "swiglu", {diff({3, 4}, -4, 4), diff({3, 4})}, [](const Inputs& x) -> Outputs {
                     return {swiglu(x[0], x[1])};
                   }});
  cases.push_back({"swiglu_fused_halves", "swiglu", {diff({2, 3, 8}, -4, 4)}, [](const Inputs& x) -> Outputs {
                     return {swiglu(narrow(x[0], -1, 0, 4), narrow(x[0], -1, 4, 4))};
                   }});
  cases.push_back({"swiglu_packed", "swiglu_packed", {diff({2, 3, 16}, -4, 4)}, [](const Inputs& x) -> Outputs {
                     return {swiglu_packed(x[0])};
                   }});
}

inline void add_reduce_cases(std::vector<OpCase>& cases) {
  cases.push_back(
      {"sum_middle", "sum", {diff({2, 3, 4})}, [](const Inputs& x) -> Outputs { return {sum(x[0], {1})}; }});
  cases.push_back(
      {"sum_all_strided", "sum", {strided({5, 3})}, [](const Inputs& x) -> Outputs { return {sum(x[0])}; }});
  cases.push_back({"mean_keepdim", "mean", {diff({2, 3, 4})}, [](const Inputs& x) -> Outputs {
                     return {mean(x[0], {0, 2}, true)};
                   }});
  cases.push_back(
      {"amax_middle", "amax", {diff({2, 3, 4})}, [](const Inputs& x) -> Outputs { return {amax(x[0], {1})}; }});
  cases.push_back({"amax_strided_all", "amax", {strided({4, 5})}, [](const Inputs& x) -> Outputs {
                     return {amax(x[0], {}, true)};
                   }});
  cases.push_back({"logsumexp_last", "logsumexp", {diff({2, 3, 4}, -2, 2)}, [](const Inputs& x) -> Outputs {
                     return {logsumexp(x[0], {-1})};
                   }});
  cases.push_back({"logsumexp_strided", "logsumexp", {strided({4, 5}, -2, 2)}, [](const Inputs& x) -> Outputs {
                     return {logsumexp(x[0], {0}, true)};
                   }});
  OpCase arg{"argmax_strided", "argmax", {constant_input({3, 5})}, [](const Inputs& x) -> Outputs {
               return {argmax(x[0], 1), argmax(transpose(x[0], 0, 1), 1, true)};
             }};
  arg.differentiable = false;
  cases.push_back(std::move(arg));
}

// Views map gradients back through the inverse view; each is checked on contiguous and strided inputs.
inline void add_shape_cases(std::vector<OpCase>& cases) {
  auto view_case = [&cases](std::string name, std::string op, CaseInput input, std::function<Tensor(const Tensor&)> f) {
    cases.push_back(exact(
        {std::move(name), std::move(op), {std::move(input)}, [f](const Inputs& x) -> Outputs { return {f(x[0])}; }}));
  };
  view_case("view", "view", diff({2, 3, 4}), [](const Tensor& t) { return view(t, {6, 4}); });
  view_case("view_strided", "view", strided({4, 3}), [](const Tensor& t) { return view(t, {2, 2, 3}); });
  view_case("reshape", "reshape", diff({2, 3, 4}), [](const Tensor& t) { return reshape(t, {4, -1, 2}); });
  view_case("reshape_copies_strided", "reshape", strided({4, 3}), [](const Tensor& t) { return reshape(t, {2, 6}); });
  view_case("flatten", "flatten", diff({2, 3, 4}), [](const Tensor& t) { return flatten(t, 1); });
  view_case("flatten_strided", "flatten", strided({4, 3}), [](const Tensor& t) { return flatten(t); });
  view_case("permute", "permute", diff({2, 3, 4}), [](const Tensor& t) { return permute(t, {2, 0, 1}); });
  view_case("transpose", "transpose", strided({2, 3, 4}), [](const Tensor& t) { return transpose(t, 0, -1); });
  view_case("narrow", "narrow", diff({4, 6}), [](const Tensor& t) { return narrow(t, 1, 2, 3); });
  view_case("slice_step", "slice", strided({4, 6}), [](const Tensor& t) { return slice(t, 1, 1, 6, 2); });
  view_case("select", "select", diff({4, 6}), [](const Tensor& t) { return select(t, 1, -1); });
  view_case("expand", "expand", diff({3, 1}), [](const Tensor& t) { return expand(t, {2, 3, 4}); });
  view_case("squeeze", "squeeze", diff({3, 1, 2}), [](const Tensor& t) { return squeeze(t, 1); });
  view_case("unsqueeze_strided", "unsqueeze", strided({4, 3}), [](const Tensor& t) { return unsqueeze(t, -1); });
  view_case("contiguous_strided", "contiguous", strided({4, 3}), [](const Tensor& t) { return contiguous(t); });
  view_case("clone_strided", "clone", strided({4, 3}), [](const Tensor& t) { return clone(t); });
  // Overlapping views of one input accumulate their gradients.
  cases.push_back({"narrow_overlapping", "narrow", {diff({4, 6})}, [](const Inputs& x) -> Outputs {
                     return {mul(narrow(x[0], 1, 0, 4), tanh(narrow(x[0], 1, 2, 4)))};
                   }});
  // Through f64 and back to the input's dtype: real conversions (and their backward) at f32/bf16.
  view_case("to_dtype_round_trip", "to", strided({4, 3}),
            [](const Tensor& t) { return to(mul(to(t, DType::f64), 2.0), t.dtype()); });
  // Through the host and back: on a device both directions are transfers.
  view_case("to_device_round_trip", "to", diff({2, 3}),
            [](const Tensor& t) { return mul(to(to(t, Device::cpu()), t.device()), 3.0); });
}

}  // namespace cpf::testing::op_cases_detail
