#pragma once
// What the CPU paths of the row ops (norm, softmax, cross-entropy, embedding) compute in: bf16 is
// widened to f32 (f32 and f64 stay), and a row or a group of columns is an Eigen array over it, so
// the loops vectorise (SIMD exp, fused multiply-adds) without copies.
#include <Eigen/Core>

#include "framework/tensor/dtype.h"

namespace cpf::raw {

inline DType compute_dtype(DType dtype) { return dtype == DType::bf16 ? DType::f32 : dtype; }

template <class T>
using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;  // (n,) values
template <class T>
using Map = Eigen::Map<Vec<T>>;  // a writable view of n contiguous values
template <class T>
using CMap = Eigen::Map<const Vec<T>>;  // a read-only one

}  // namespace cpf::raw
