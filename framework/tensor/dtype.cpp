#include "framework/tensor/dtype.h"

#include <ostream>

namespace cpf {

size_t dtype_size(DType dtype) {
  if (is_fp8(dtype)) return 1;
  return visit_dtype(dtype, []<class T>() { return sizeof(T); });
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (DType d :
       {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean, DType::f8e4m3, DType::f8e5m2}) {
    if (dtype_name(d) == name) return d;
  }
  if (name == "float32" || name == "fp32") return DType::f32;
  if (name == "float64" || name == "fp64") return DType::f64;
  if (name == "bfloat16") return DType::bf16;
  CPF_FAIL("unknown dtype '", name, "' (expected one of f32, f64, bf16, i32, i64, bool, f8e4m3, f8e5m2)");
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

}  // namespace cpf
