// all_gather, reduce_scatter and all_to_all of NcclProcessGroup: the collectives along a dim.
//
// NCCL moves flat buffers: rank pieces lie one after another. Along dim d of a tensor whose dims
// before d hold more than one element ("outer" > 1), a piece is not one flat run, so pieces are
// staged: packed into per-rank contiguous segments before sending, or unpacked from them after
// receiving, with one strided copy per rank on the GPU.
#include <numeric>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_process_group.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::dist::nccl {
namespace {

int64_t outer_size(const Shape& shape, int64_t dim) {
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[static_cast<size_t>(d)];
  return outer;
}

Shape with_dim(Shape shape, int64_t dim, int64_t size) {
  shape[static_cast<size_t>(dim)] = size;
  return shape;
}

// A contiguous `shape` view of `flat` (contiguous) starting `offset` elements in.
Tensor segment(const Tensor& flat, int64_t offset, const Shape& shape) {
  return raw::as_strided(flat, shape, contiguous_strides(shape), flat.offset() + offset);
}

std::vector<int64_t> prefix(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  return offsets;
}

bool all_equal(const std::vector<int64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
}

}  // namespace

WorkPtr NcclProcessGroup::do_all_gather(const Tensor& input, int64_t dim, const Tensor& out) {
  const std::string context = op_context("all_gather");
  check_device(input, context, "the input");
  check_device(out, context, "out");
  const int n = size();
  const int64_t mine = input.size(dim);
  // Sizes along dim: with `out` sized n * mine every piece has that size (each rank's out holds the
  // same total, so the ranks agree); otherwise they are exchanged (a small collective the host waits for).
  std::vector<int64_t> sizes;
  if (out.defined() && out.size(dim) == n * mine) {
    sizes.assign(static_cast<size_t>(n), mine);
  } else {
    sizes = exchange_sizes(mine, context);
  }
  const std::vector<int64_t> offsets = prefix(sizes);
  const Shape total = with_dim(input.shape(), dim, offsets.back());
  CPF_CHECK(!out.defined() || out.shape() == total, context, ": out has shape ", out.shape(),
            " but the gathered result has shape ", total, " (sizes along dim ", dim, ": ", sizes, ")");
  const bool flat = outer_size(input.shape(), dim) == 1;  // pieces are consecutive runs of the result
  const Tensor src = raw::contiguous(input);
  const Tensor dst = out.defined() && out.is_contiguous() ? out : empty_on(total, input.dtype(), device());
  const Tensor result = out.defined() ? out : dst;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < total.size(); ++d) inner *= total[d];
  return issue(context, {result}, {src, dst}, [&](const Issue& is, std::vector<Tensor>& staging) {
    if (dst.numel() == 0) return;
    const ncclDataType_t type = nccl_dtype(input.dtype());
    const int64_t outer = outer_size(input.shape(), dim);
    // Pieces land in dst directly and out needs no copy-out: nothing follows the NCCL calls, so their
    // launch is deferred.
    const bool last = flat && dst.is_same(result);
    // Where rank j's piece lands: directly in dst when pieces are runs, else in a staging segment.
    Tensor landing = dst;
    if (!flat) {
      landing = empty_on({dst.numel()}, input.dtype(), device());
      staging.push_back(landing);
    }
    auto* base = static_cast<char*>(landing.raw_data());
    const size_t bytes = dtype_size(input.dtype());
    if (all_equal(sizes)) {
      run_body_nccl(is, last, "ncclAllGather", [&] {
        return ncclAllGather(src.raw_data(), base, static_cast<size_t>(src.numel()), type, is.comm, is.stream);
      });
    } else {
      run_body_nccl(is, last, "grouped ncclSend/ncclRecv", [&] {
        return in_group([&] {
          for (int j = 0; j < n; ++j) {
            const size_t count_in = static_cast<size_t>(src.numel());
            const int64_t count_j = outer * sizes[static_cast<size_t>(j)] * inner;
            if (count_in > 0) {
              const ncclResult_t sent = ncclSend(src.raw_data(), count_in, type, j, is.comm, is.stream);
              if (nccl_failed(sent)) return sent;
            }
            if (count_j > 0) {
              void* at = base + static_cast<size_t>(outer * offsets[static_cast<size_t>(j)] * inner) * bytes;
              const ncclResult_t received = ncclRecv(at, static_cast<size_t>(count_j), type, j, is.comm, is.stream);
              if (nccl_failed(received)) return received;
            }
          }
          return ncclSuccess;
        });
      });
    }
    if (!flat) {
      // Rank j's segment (outer, size_j, inner...) at outer * offset_j * inner goes to its slice of dst.
      for (int j = 0; j < n; ++j) {
        const int64_t len = sizes[static_cast<size_t>(j)];
        if (len == 0) continue;
        const Tensor piece =
            segment(landing, outer * offsets[static_cast<size_t>(j)] * inner, with_dim(input.shape(), dim, len));
        raw::copy_(raw::narrow(dst, dim, offsets[static_cast<size_t>(j)], len), piece);
      }
    }
    if (!dst.is_same(result)) raw::copy_(result, dst);
  });
}

WorkPtr NcclProcessGroup::do_reduce_scatter(const Tensor& input, int64_t dim, ReduceOp op, const Tensor& out,
                                            int64_t out_size, const std::vector<int64_t>& splits) {
  const std::string context = op_context("reduce_scatter");
  check_device(input, context, "the input");
  check_device(out, context, "out");
  const int n = size();
  const int64_t total = input.size(dim);
  // Piece sizes: splits, or every rank's out (exchanged), or the even split every rank computes alike.
  std::vector<int64_t> pieces;
  if (!splits.empty()) {
    pieces = splits;
  } else if (out.defined()) {
    pieces = exchange_sizes(out_size, context);
    const int64_t sum = std::accumulate(pieces.begin(), pieces.end(), int64_t{0});
    CPF_CHECK(sum == total, context, ": the ranks' out sizes along dim ", dim, " are ", pieces, " and add up to ", sum,
              " but the input has ", total, " there");
  } else {
    pieces = even_splits(total, n);
  }
  const std::vector<int64_t> offsets = prefix(pieces);
  const int64_t outer = outer_size(input.shape(), dim);
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < input.shape().size(); ++d) inner *= input.shape()[d];
  // The input with piece j as one contiguous run at outer * offset_j * inner (packed on the caller's stream).
  Tensor packed = raw::contiguous(input);
  if (outer != 1) {
    const Tensor flat_buffer = empty_on({input.numel()}, input.dtype(), device());
    for (int j = 0; j < n; ++j) {
      const int64_t len = pieces[static_cast<size_t>(j)];
      if (len == 0) continue;
      raw::copy_(
          segment(flat_buffer, outer * offsets[static_cast<size_t>(j)] * inner, with_dim(input.shape(), dim, len)),
          raw::narrow(input, dim, offsets[static_cast<size_t>(j)], len));
    }
    packed = flat_buffer;
  }
  const Shape piece_shape = with_dim(input.shape(), dim, pieces[static_cast<size_t>(rank_)]);
  const Tensor dst = out.defined() && out.is_contiguous() ? out : empty_on(piece_shape, input.dtype(), device());
  const Tensor result = out.defined() ? out : dst;
  return issue(context, {result}, {packed, dst}, [&](const Issue& is, std::vector<Tensor>&) {
    const ncclDataType_t type = nccl_dtype(input.dtype());
    const bool last = dst.is_same(result);  // no copy-out after the NCCL calls: their launch is deferred
    const ncclRedOp_t red = nccl_reduce_op(op);
    const auto* base = static_cast<const char*>(packed.raw_data());
    const size_t bytes = dtype_size(input.dtype());
    if (all_equal(pieces)) {
      if (dst.numel() > 0) {
        run_body_nccl(is, last, "ncclReduceScatter", [&] {
          return ncclReduceScatter(base, dst.raw_data(), static_cast<size_t>(dst.numel()), type, red, is.comm,
                                   is.stream);
        });
      }
    } else {
      // Uneven pieces: one reduce per piece to its owner, posted together.
      run_body_nccl(is, last, "grouped ncclReduce", [&] {
        return in_group([&] {
          for (int j = 0; j < n; ++j) {
            const int64_t count = outer * pieces[static_cast<size_t>(j)] * inner;
            if (count == 0) continue;
            const void* from = base + static_cast<size_t>(outer * offsets[static_cast<size_t>(j)] * inner) * bytes;
            // recvbuff is only written on the root (j == rank_).
            const ncclResult_t status =
                ncclReduce(from, dst.raw_data(), static_cast<size_t>(count), type, red, j, is.comm, is.stream);
            if (nccl_failed(status)) return status;
          }
          return ncclSuccess;
        });
      });
    }
    if (!dst.is_same(result)) raw::copy_(result, dst);
  });
}

WorkPtr NcclProcessGroup::do_all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim, const Tensor& out) {
  const std::string context = op_context("all_to_all");
  check_device(input, context, "the input");
  check_device(out, context, "out");
  const int n = size();
  const int64_t k = input.size(split_dim) / n;
  const Shape piece = with_dim(input.shape(), split_dim, k);  // what travels to one rank
  const int64_t piece_numel = shape_numel(piece);
  Shape result_shape = piece;
  result_shape[static_cast<size_t>(concat_dim)] *= n;
  // Send buffer: piece j as the j-th contiguous run (packed on the caller's stream unless it already is).
  Tensor send = raw::contiguous(input);
  if (outer_size(input.shape(), split_dim) != 1) {
    send = empty_on({input.numel()}, input.dtype(), device());
    for (int j = 0; j < n; ++j)
      raw::copy_(segment(send, j * piece_numel, piece), raw::narrow(input, split_dim, j * k, k));
  }
  const Tensor dst = out.defined() && out.is_contiguous() ? out : empty_on(result_shape, input.dtype(), device());
  const Tensor result = out.defined() ? out : dst;
  const bool direct = outer_size(result_shape, concat_dim) == 1;  // received pieces are runs of dst
  return issue(context, {result}, {send, dst}, [&](const Issue& is, std::vector<Tensor>& staging) {
    if (piece_numel == 0) return;
    const bool last = direct && dst.is_same(result);  // no unpacking or copy-out after: deferred launch
    const ncclDataType_t type = nccl_dtype(input.dtype());
    Tensor landing = dst;
    if (!direct) {
      landing = empty_on({dst.numel()}, input.dtype(), device());
      staging.push_back(landing);
    }
    const size_t bytes = dtype_size(input.dtype()) * static_cast<size_t>(piece_numel);
    const auto* from = static_cast<const char*>(send.raw_data());
    auto* to = static_cast<char*>(landing.raw_data());
    const size_t count = static_cast<size_t>(piece_numel);
    run_body_nccl(is, last, "grouped ncclSend/ncclRecv", [&] {
      return in_group([&] {
        for (int j = 0; j < n; ++j) {
          const size_t at = bytes * static_cast<size_t>(j);
          const ncclResult_t sent = ncclSend(from + at, count, type, j, is.comm, is.stream);
          if (nccl_failed(sent)) return sent;
          const ncclResult_t received = ncclRecv(to + at, count, type, j, is.comm, is.stream);
          if (nccl_failed(received)) return received;
        }
        return ncclSuccess;
      });
    });
    if (!direct) {
      const int64_t c = piece[static_cast<size_t>(concat_dim)];
      for (int j = 0; j < n; ++j)
        raw::copy_(raw::narrow(dst, concat_dim, j * c, c), segment(landing, j * piece_numel, piece));
    }
    if (!dst.is_same(result)) raw::copy_(result, dst);
  });
}

}  // namespace cpf::dist::nccl
