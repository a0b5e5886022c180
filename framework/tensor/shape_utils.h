#pragma once
// Shape arithmetic shared by every op: dim normalisation, broadcasting, reduction shapes.
#include <cstdint>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf {

// Maps a possibly negative dim into [0, ndim); throws naming the op and the valid range.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
// The broadcast of two shapes (numpy rules); throws naming both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Sorted, de-duplicated, normalised dims; empty input means "all dims".
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// Shape after reducing `dims` (kept as 1 when keepdim).
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);

// Checks shared by ops with several tensor inputs.
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
void check_defined(const Tensor& t, const char* op, const char* name);

}  // namespace cpf
