#pragma once
// Data movement of the thread backend: strided copies and the n-way reduction, on host memory.
//
// These write through raw pointers and never bump a version counter: several ranks' progress
// threads write disjoint parts of one output at once, and the counter is not atomic. The owning
// rank bumps its output's version once, after every rank finished (see collectives.cpp).
#include <cstdint>
#include <vector>

#include "framework/distributed/process_group.h"
#include "framework/tensor/tensor.h"

namespace cpf::dist::thread {

bool shares_storage(const Tensor& a, const Tensor& b);
// Same storage, offset, shape and strides: writing one is writing the other, element for element.
bool same_view(const Tensor& a, const Tensor& b);

// dst = src element-wise; same shape and dtype, any strides, host tensors.
void copy_view(const Tensor& dst, const Tensor& src);

// outputs[k][i] = inputs[0][i] op inputs[1][i] op ... for i < count, over contiguous host buffers of
// `dtype` (pointers to the first element). The inputs are combined in order, bf16 in f32 with one
// rounding at the end, integers with wrap-around; avg divides the sum by the number of inputs.
// An output may alias an input: each block of every input is read before it is written.
void reduce_into(ReduceOp op, DType dtype, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                 int64_t count);

// The tensor as the data movement reads it: itself on the host, else a host copy. Reductions also
// need it contiguous.
Tensor host_view(const Tensor& t);
// After this (progress) thread wrote a device tensor: waits until the write is done, so the rank may
// read it on any stream once the operation's Work completes (this backend has no device events).
void device_written(const Tensor& t);
Tensor host_contiguous(const Tensor& t);

}  // namespace cpf::dist::thread
