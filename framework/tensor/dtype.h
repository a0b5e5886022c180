#pragma once
// Element types and the compile-time dispatch from a runtime DType to a C++ type.
#include <cstddef>
#include <cstdint>
#include <string>

#include "framework/core/error.h"
#include "framework/tensor/bfloat16.h"

namespace cpf {

// f8e4m3 / f8e5m2: FP8 storage (framework/tensor/float8.h) for the FP8 GEMM's operands. They are not
// "floating" for the ops: only copies, views and the FP8 ops of framework/tensor/ops/fp8.h take them.
enum class DType : uint8_t { f32, f64, bf16, i32, i64, boolean, f8e4m3, f8e5m2 };

size_t dtype_size(DType dtype);
std::string dtype_name(DType dtype);  // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);
inline bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16; }
inline bool is_integral(DType dtype) { return dtype == DType::i32 || dtype == DType::i64 || dtype == DType::boolean; }
inline bool is_fp8(DType dtype) { return dtype == DType::f8e4m3 || dtype == DType::f8e5m2; }
std::ostream& operator<<(std::ostream& os, DType dtype);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// Calls fn.template operator()<T>() with T the C++ type of `dtype`:
//   visit_dtype(t.dtype(), [&]<class T>() { ... });
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<bfloat16>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    case DType::boolean: return fn.template operator()<bool>();
    case DType::f8e4m3:
    case DType::f8e5m2:
      CPF_FAIL(dtype_name(dtype), " tensors are FP8 GEMM operands: this op does not take them (raw::quantize_fp8 and ",
               "raw::dequantize_fp8 convert to and from them, framework/tensor/ops/fp8.h)");
  }
  CPF_FAIL("unknown dtype ", static_cast<int>(dtype));
}

// Same, restricted to the types kernels compute in (f32, f64); `op` names the caller in the error.
template <class Fn>
decltype(auto) visit_compute_dtype(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    default: break;
  }
  CPF_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported (expected f32 or f64; bf16 is computed in f32)");
}

}  // namespace cpf
