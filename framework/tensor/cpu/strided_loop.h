#pragma once
// The CPU element-wise engine: walk N operands that share one iteration shape, each with its own
// element strides (0 along broadcast dimensions). Dimensions that are contiguous for every operand
// are merged first, so a contiguous tensor of any rank becomes a single row and the inner loop is a
// plain indexed loop the compiler vectorises. Rows are split across OpenMP threads when the work is
// large enough to pay for it.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::cpu {

// Below this many elements, loops stay on one thread (thread start-up costs more than it saves).
inline constexpr int64_t kParallelGrain = 1 << 15;

int max_threads();

// Columns per task when `cols` columns are split between the threads (all of them in one task when not
// `parallel`): whole 16-wide SIMD groups, at least 64, at least 1. A task that owns its columns sums
// down them in row order, so each sum's order does not depend on the thread count.
inline int64_t column_group(int64_t cols, bool parallel) {
  const int64_t threads = parallel ? max_threads() : 1;
  const int64_t group = (cols + threads - 1) / threads;
  return std::max<int64_t>(1, std::min(cols, std::max<int64_t>(64, (group + 15) / 16 * 16)));
}

template <size_t N>
struct StridedIteration {
  Shape shape;                                  // coalesced iteration shape (at least rank 1)
  std::array<std::vector<int64_t>, N> strides;  // per operand, elements, same rank as shape
  int64_t numel = 0;
};

// Broadcast strides of `t` for iterating over `shape` (t.shape must broadcast to shape).
std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& shape);

template <size_t N>
StridedIteration<N> make_iteration(const Shape& shape, std::array<std::vector<int64_t>, N> strides) {
  StridedIteration<N> it;
  it.numel = shape_numel(shape);
  // Drop size-1 dims, then merge dim d into d-1 when stride[d-1] == stride[d] * size[d] for all.
  Shape dims;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) mergeable &= st[k].back() == strides[k][d] * shape[d];
      if (mergeable) {
        dims.back() *= shape[d];
        for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
        continue;
      }
    }
    dims.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < N; ++k) st[k].push_back(0);
  }
  it.shape = std::move(dims);
  it.strides = std::move(st);
  return it;
}

// Calls row(ptrs, n, inner_strides) for every row (the innermost coalesced dim) with typed base
// pointers advanced to the row start. Ptrs are byte pointers; element sizes convert strides.
// split_rows: whether one row may be cut into pieces run by different threads. Pass false when the
// row function accumulates across a row's elements into shared outputs (scatter), which relies on
// a row running in order on one thread.
template <size_t N, class RowFn>
void for_each_row(const StridedIteration<N>& it, std::array<char*, N> base, std::array<int64_t, N> elem_size,
                  RowFn&& row, bool split_rows = true) {
  const int64_t ndim = static_cast<int64_t>(it.shape.size());
  const int64_t inner = it.shape.back();
  if (it.numel == 0) return;
  const int64_t rows = it.numel / inner;
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = it.strides[k].back();

  auto run_rows = [&](int64_t first, int64_t last) {
    // Multi-index of row `first` over dims [0, ndim-1).
    std::vector<int64_t> index(static_cast<size_t>(ndim > 1 ? ndim - 1 : 0), 0);
    int64_t rest = first;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      index[d] = rest % it.shape[d];
      rest /= it.shape[d];
    }
    std::array<char*, N> ptr;
    for (size_t k = 0; k < N; ++k) {
      int64_t off = 0;
      for (int64_t d = 0; d < ndim - 1; ++d) off += index[d] * it.strides[k][d];
      ptr[k] = base[k] + off * elem_size[k];
    }
    for (int64_t r = first; r < last; ++r) {
      row(ptr, inner, inner_stride);
      // Advance the multi-index like an odometer, updating pointers incrementally.
      for (int64_t d = ndim - 2; d >= 0; --d) {
        if (++index[d] < it.shape[d]) {
          for (size_t k = 0; k < N; ++k) ptr[k] += it.strides[k][d] * elem_size[k];
          break;
        }
        index[d] = 0;
        for (size_t k = 0; k < N; ++k) ptr[k] -= it.strides[k][d] * (it.shape[d] - 1) * elem_size[k];
      }
    }
  };

#if defined(CPF_WITH_OPENMP)
  const int threads = max_threads();
  if (split_rows && threads > 1 && it.numel >= kParallelGrain && rows < threads) {
    // Few long rows (a contiguous tensor is a single row): cut every row into pieces, aligned to
    // 64 elements so each piece keeps full-width vector loads.
    const int64_t pieces = (threads + rows - 1) / rows;
    auto row_start = [&](int64_t r) {
      std::array<char*, N> ptr = base;
      for (int64_t d = ndim - 2, rest = r; d >= 0; --d) {
        const int64_t i = rest % it.shape[d];
        rest /= it.shape[d];
        for (size_t k = 0; k < N; ++k) ptr[k] += i * it.strides[k][d] * elem_size[k];
      }
      return ptr;
    };
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < rows * pieces; ++p) {
      const int64_t r = p / pieces, piece = p % pieces;
      const int64_t first = std::min(inner, (inner * piece / pieces) / 64 * 64);
      const int64_t last = piece + 1 == pieces ? inner : std::min(inner, (inner * (piece + 1) / pieces) / 64 * 64);
      if (last <= first) continue;
      std::array<char*, N> ptr = row_start(r);
      for (size_t k = 0; k < N; ++k) ptr[k] += first * inner_stride[k] * elem_size[k];
      row(ptr, last - first, inner_stride);
    }
    return;
  }
  if (threads > 1 && it.numel >= kParallelGrain && rows > 1) {
    const int64_t chunks = std::min<int64_t>(rows, threads);
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      run_rows(rows * c / chunks, rows * (c + 1) / chunks);
    }
    return;
  }
#endif
  run_rows(0, rows);
}

// out[i] = f(in_k[i]...) over the broadcast iteration of `out`'s shape. Types: Out, In... are the
// element types of the operands (already checked by the caller). f is called as f(In...) -> Out.
template <class Out, class... In, class F>
void map_elements(const Tensor& out, F&& f, const std::conditional_t<true, Tensor, In>&... inputs) {
  constexpr size_t N = 1 + sizeof...(In);
  const Shape& shape = out.shape();
  std::array<std::vector<int64_t>, N> strides{out.strides(), broadcast_strides(inputs, shape)...};
  const auto it = make_iteration<N>(shape, std::move(strides));
  std::array<char*, N> base{static_cast<char*>(out.raw_data()), static_cast<char*>(inputs.raw_data())...};
  std::array<int64_t, N> sizes{static_cast<int64_t>(sizeof(Out)), static_cast<int64_t>(sizeof(In))...};
  for_each_row<N>(it, base, sizes, [&](const std::array<char*, N>& p, int64_t n, const std::array<int64_t, N>& s) {
    bool unit = true;
    for (size_t k = 0; k < N; ++k) unit &= s[k] == 1;
    Out* o = reinterpret_cast<Out*>(p[0]);
    if (unit) {
      [&]<size_t... I>(std::index_sequence<I...>) {
        auto ins = std::make_tuple(reinterpret_cast<const In*>(p[I + 1])...);
        (void)ins;
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(std::get<I>(ins)[i]...));
      }
      (std::index_sequence_for<In...>{});
    } else {
      [&]<size_t... I>(std::index_sequence<I...>) {
        auto ins = std::make_tuple(reinterpret_cast<const In*>(p[I + 1])...);
        (void)ins;
        for (int64_t i = 0; i < n; ++i) o[i * s[0]] = static_cast<Out>(f(std::get<I>(ins)[i * s[I + 1]]...));
      }
      (std::index_sequence_for<In...>{});
    }
  });
}

}  // namespace cpf::cpu
