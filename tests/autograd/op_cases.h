#pragma once
// The registry of differentiable-op cases that every device runs (tests/autograd/device_parity_test.cpp):
// f64 gradcheck on each device, and on each non-CPU device forward values and gradients against the
// CPU at f64, f32 and bf16. Every public function of framework/autograd/functions/*.h must appear as
// the `op` of at least one case (OpCoverage checks it by reading those headers): adding an op means
// adding its cases here, which makes it run on the GPU too. Cases cover broadcasting, strided
// (non-contiguous) inputs and the variants the CUDA kernels branch on.
#include <functional>
#include <string>
#include <vector>

#include "framework/autograd/ops.h"
#include "support/op_case.h"

namespace cpf::testing {

namespace op_cases_detail {

using Inputs = std::vector<Tensor>;
using Outputs = std::vector<Tensor>;

inline Tensor ids(const std::vector<int64_t>& values, const Shape& shape) { return from_vector(values, shape); }
inline Tensor ids32(const std::vector<int32_t>& values, const Shape& shape) { return from_vector(values, shape); }
inline Tensor mask(const std::vector<int32_t>& values, const Shape& shape) {
  return raw::to(from_vector(values, shape), DType::boolean);
}

// Marks a case whose forward is pure data movement or one IEEE operation per element (bit-identical
// on every device; f32/f64 division and products computed in double and rounded once agree too).
inline OpCase exact(OpCase c) {
  c.exact = true;
  return c;
}

// Element-wise ops: broadcasting in both directions, scalars, strided operands.
inline void add_elementwise_cases(std::vector<OpCase>& cases) {
  cases.push_back(exact({"add_broadcast", "add", {diff({3, 4}), diff({4})}, [](const Inputs& x) -> Outputs {
                           return {add(x[0], x[1])};
                         }}));
  cases.push_back(
      exact({"add_both_broadcast", "add", {diff({2, 1, 3}), strided({4, 1})}, [](const Inputs& x) -> Outputs {
               return {add(x[0], x[1])};
             }}));
  cases.push_back(
      exact({"add_scalar", "add", {strided({3, 4})}, [](const Inputs& x) -> Outputs { return {add(x[0], 0.75)}; }}));
  cases.push_back(
      exact({"sub_strided_broadcast", "sub", {strided({3, 4}), diff({1, 4})}, [](const Inputs& x) -> Outputs {
               return {sub(x[0], x[1])};
             }}));
  cases.push_back(exact({"mul_both_broadcast", "mul", {diff({2, 1, 3}), diff({4, 1})}, [](const Inputs& x) -> Outputs {
                           return {mul(x[0], x[1])};
                         }}));
  cases.push_back(
      exact({"mul_scalar", "mul", {diff({5, 3})}, [](const Inputs& x) -> Outputs { return {mul(x[0], -1.5)}; }}));
  cases.push_back(exact({"div_broadcast", "div", {diff({3, 4}), diff({4}, 0.5, 1.5)}, [](const Inputs& x) -> Outputs {
                           return {div(x[0], x[1])};
                         }}));
  cases.push_back({"pow_tensor", "pow", {diff({2, 3}, 0.5, 2.0), strided({2, 3})}, [](const Inputs& x) -> Outputs {
                     return {pow(x[0], x[1])};
                   }});
  cases.push_back(
      {"pow_scalar", "pow", {diff({2, 3}, 0.5, 2.0)}, [](const Inputs& x) -> Outputs { return {pow(x[0], 2.5)}; }});
  cases.push_back(exact({"maximum_broadcast", "maximum", {diff({3, 4}), diff({4})}, [](const Inputs& x) -> Outputs {
                           return {maximum(x[0], x[1])};
                         }}));
  cases.push_back(exact({"minimum_strided", "minimum", {strided({3, 4}), diff({3, 1})}, [](const Inputs& x) -> Outputs {
                           return {minimum(x[0], x[1])};
                         }}));
  struct Unary {
    const char* name;
    Tensor (*fn)(const Tensor&);
    double low, high;
    bool exact;  // sign flips and compares: bit-identical
  };
  // Ranges keep away from the kinks of relu/abs (finite differences straddling 0) and the domains
  // of log/sqrt/rsqrt; gelu/silu/sigmoid/tanh/exp see both signs and their saturating tails.
  const Unary unary_ops[] = {
      {"neg", &neg, -1, 1, true},          {"exp", &exp, -2, 2, false},      {"log", &log, 0.2, 2, false},
      {"sqrt", &sqrt, 0.2, 2, false},      {"rsqrt", &rsqrt, 0.2, 2, false}, {"tanh", &tanh, -3, 3, false},
      {"gelu", &gelu, -4, 4, false},       {"silu", &silu, -4, 4, false},    {"relu", &relu, 0.05, 1, true},
      {"sigmoid", &sigmoid, -4, 4, false}, {"abs", &abs, 0.05, 1, true},     {"square", &square, -1, 1, false}};
  for (const Unary& u : unary_ops) {
    auto fn = u.fn;
    // 37 elements: not a multiple of the CUDA kernels' vector width (the tail path).
    OpCase flat{u.name, u.name, {diff({37}, u.low, u.high)}, [fn](const Inputs& x) -> Outputs { return {fn(x[0])}; }};
    OpCase strided_case{
        std::string(u.name) + "_strided", u.name, {strided({3, 5}, u.low, u.high)}, [fn](const Inputs& x) -> Outputs {
          return {fn(x[0])};
        }};
    flat.exact = strided_case.exact = u.exact;
    cases.push_back(std::move(flat));
    cases.push_back(std::move(strided_case));
  }
  cases.push_back(exact(
      {"relu_negative", "relu", {diff({4, 3}, -1, -0.05)}, [](const Inputs& x) -> Outputs { return {relu(x[0])}; }}));
  cases.push_back(exact(
      {"abs_negative", "abs", {diff({4, 3}, -1, -0.05)}, [](const Inputs& x) -> Outputs { return {abs(x[0])}; }}));
}

// In-place updates of tensors outside the graph: applied to a copy of constant inputs.
inline void add_inplace_cases(std::vector<OpCase>& cases) {
  auto forward_only = [&cases](std::string name, std::string op, std::vector<CaseInput> inputs, GradcheckFn fn) {
    OpCase c{std::move(name), std::move(op), std::move(inputs), std::move(fn)};
    c.differentiable = false;
    cases.push_back(std::move(c));
  };
  forward_only("add__broadcast", "add_", {constant_input({3, 4}), constant_input({4})}, [](const Inputs& x) -> Outputs {
    Tensor y = clone(x[0]);
    add_(y, x[1], 0.5);
    return {y};
  });
  forward_only("add__into_strided_view", "add_", {constant_input({4, 3}), constant_input({3, 4})},
               [](const Inputs& x) -> Outputs {
                 Tensor y = clone(x[0]);
                 add_(transpose(y, 0, 1), x[1], -2.0);
                 return {y};
               });
  forward_only("mul_", "mul_", {constant_input({3, 5})}, [](const Inputs& x) -> Outputs {
    Tensor y = clone(x[0]);
    mul_(narrow(y, 1, 1, 3), 1.5);
    return {y};
  });
  forward_only("fill_", "fill_", {constant_input({3, 4})}, [](const Inputs& x) -> Outputs {
    Tensor y = clone(x[0]);
    fill_(slice(y, 1, 0, 4, 2), 0.25);
    return {y};
  });
  forward_only("zero_", "zero_", {constant_input({3, 4})}, [](const Inputs& x) -> Outputs {
    Tensor y = clone(x[0]);
    zero_(select(y, 0, 1));
    return {y};
  });
  forward_only("copy_broadcast_strided", "copy_", {constant_input({4, 3}), strided({1, 3})},
               [](const Inputs& x) -> Outputs {
                 Tensor y = clone(x[0]);
                 copy_(y, x[1].detach());
                 return {y};
               });
}

// Indexing with repeated indices (the gradients accumulate), i32 and i64 indices, masks that broadcast.
inline void add_index_cases(std::vector<OpCase>& cases) {
  cases.push_back(exact({"index_select_rows",
                         "index_select",
                         {diff({4, 3}), fixed(ids({2, 0, 2, 2, 3}, {5}))},
                         [](const Inputs& x) -> Outputs { return {index_select(x[0], 0, x[1])}; }}));
  cases.push_back(exact({"index_select_strided_i32",
                         "index_select",
                         {strided({4, 3}), fixed(ids32({1, 1, 0, 2}, {4}))},
                         [](const Inputs& x) -> Outputs { return {index_select(x[0], -1, x[1])}; }}));
  cases.push_back(exact({"gather_cols",
                         "gather",
                         {diff({3, 4}), fixed(ids({3, 3, 0, 1, 1, 1, 2, 0, 2, 2, 2, 2, 0, 3, 3}, {3, 5}))},
                         [](const Inputs& x) -> Outputs { return {gather(x[0], 1, x[1])}; }}));
  cases.push_back(exact({"gather_rows_strided_i32",
                         "gather",
                         {strided({3, 4}), fixed(ids32({0, 0, 2, 1, 0, 2, 2, 1}, {2, 4}))},
                         [](const Inputs& x) -> Outputs { return {gather(x[0], -2, x[1])}; }}));
  cases.push_back(
      {"scatter_add_rows",
       "scatter_add",
       {diff({3, 4}), fixed(ids({0, 2, 2, 1, 0, 0, 2, 1, 1, 2, 0, 1, 2, 1, 0, 0, 0, 0, 1, 2}, {5, 4})), diff({5, 4})},
       [](const Inputs& x) -> Outputs { return {scatter_add(x[0], 0, x[1], x[2])}; }});
  cases.push_back(
      {"scatter_add_cols_strided_i32",
       "scatter_add",
       {strided({3, 4}), fixed(ids32({3, 3, 3, 0, 1, 1, 2, 0, 0, 0, 3, 1, 1, 1, 2, 2, 0, 3}, {3, 6})), diff({3, 6})},
       [](const Inputs& x) -> Outputs { return {scatter_add(x[0], -1, x[1], x[2])}; }});
  cases.push_back(exact({"where_broadcast",
                         "where",
                         {fixed(mask({1, 0, 1}, {3, 1})), diff({3, 4}), diff({4})},
                         [](const Inputs& x) -> Outputs { return {where(x[0], x[1], x[2])}; }}));
  cases.push_back(exact({"where_condition_widens",
                         "where",
                         {fixed(mask({1, 0, 0, 1, 1, 0}, {2, 1, 3})), diff({4, 1}), strided({1, 3})},
                         [](const Inputs& x) -> Outputs { return {where(x[0], x[1], x[2])}; }}));
  cases.push_back(exact({"masked_fill_broadcast",
                         "masked_fill",
                         {diff({3, 4}), fixed(mask({1, 0, 0, 1}, {4}))},
                         [](const Inputs& x) -> Outputs { return {masked_fill(x[0], x[1], -2.0)}; }}));
  cases.push_back(exact({"masked_fill_strided",
                         "masked_fill",
                         {strided({3, 4}), fixed(mask({1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1}, {3, 4}))},
                         [](const Inputs& x) -> Outputs { return {masked_fill(x[0], x[1], 0.5)}; }}));
}

}  // namespace op_cases_detail

// Every case, built once.
const std::vector<OpCase>& op_cases();

}  // namespace cpf::testing
