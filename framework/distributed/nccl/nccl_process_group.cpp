#include "framework/distributed/nccl/nccl_process_group.cuh"

#include <chrono>

#include "framework/core/error.h"
#include "framework/distributed/nccl/nccl_check.cuh"
#include "framework/distributed/nccl/nccl_ready.cuh"
#include "framework/distributed/nccl/nccl_work.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/ops/copy.h"

namespace cpf::dist::nccl {

Tensor empty_on(const Shape& shape, DType dtype, Device device) {
  return empty(shape, {.dtype = dtype, .device = device});
}

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<NcclRankState> state, ncclComm_t comm, int rank,
                                   std::vector<int> global_ranks, std::string name, std::string id)
    : state_(std::move(state)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      name_(std::move(name)),
      id_(std::move(id)),
      stream_(cuda::Stream::create(state_->device())) {
  comm_ = state_->add_communicator(comm, name_);
}

NcclProcessGroup::~NcclProcessGroup() {
  // A launch still pending is finished first (its event recorded; a failure aborted the world). Work
  // still queued on the communication stream finishes before the stream goes (an aborted
  // communicator's kernels have returned already). The communicator itself stays with the rank
  // state until the rank ends: destroying it now can deadlock (NcclRankState::add_communicator).
  try {
    state_->finish_launch(*comm_);
  } catch (...) {
  }
  if (!state_->aborted()) (void)cudaStreamSynchronize(comm_stream());
}

void NcclProcessGroup::check_device(const Tensor& t, const std::string& context, const char* what) const {
  if (!t.defined()) return;
  CPF_CHECK(t.device() == device(), context, ": ", what, " is on ", t.device(), " but this NCCL group runs on ",
            device(), "; move it there first (raw::to(t, ", device(), "))");
}

WorkPtr NcclProcessGroup::issue(const std::string& context, const std::vector<Tensor>& results,
                                std::vector<Tensor> keep_alive,
                                FunctionRef<void(const Issue&, std::vector<Tensor>&)> body, bool host_blocking) {
  state_->check_alive(context);
  const int device = state_->device();
  cuda::DeviceGuard guard(device);
  const cudaStream_t caller = cuda::current_cuda_stream(device);
  // A launch still pending on this communicator: nothing may be queued on its stream before it is done.
  state_->finish_launch(*comm_);
  const cudaStream_t comm_stream = this->comm_stream();
  EventPool& events = *state_->events();
  // Event 1: the communication stream starts after what the caller's stream did so far (the inputs'
  // producers, the contiguous copies and output allocations of `prepare`). The wait captures the
  // record, so the event goes back to the pool at once.
  cudaEvent_t ready = events.acquire();
  cudaError_t status = cudaEventRecord(ready, caller);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(comm_stream, ready, 0);
  events.release(ready);
  CPF_CUDA_CHECK(status);
  // Watched from here on: the NCCL calls themselves may block on the host (a peer that never comes).
  auto completion = std::make_shared<CompletionEvent>(state_->events(), context);
  state_->track({completion, std::chrono::steady_clock::now()});
  std::vector<Tensor> staging;
  bool deferred = false;  // run_body_nccl deferred the launch: the event is recorded by the rank state
  try {
    cuda::StreamGuard on_comm(stream_);
    body(Issue{comm_->comm, comm_stream, completion->description(), completion, deferred}, staging);
  } catch (...) {
    try {
      // What was enqueued completes; nothing else to watch (a deferred launch is the body's last call).
      if (!deferred) completion->record(comm_stream);
    } catch (...) {
    }
    throw;
  }
  for (Tensor& t : staging) keep_alive.push_back(std::move(t));
  for (const Tensor& t : results) {
    t.bump_version();
    keep_alive.push_back(t);
  }
  // Event 2: completion, waited for by Work::wait() on the caller's stream.
  return std::make_shared<NcclWork>(state_, comm_, std::move(completion), comm_stream, !deferred, caller, results,
                                    std::move(keep_alive), host_blocking);
}

void NcclProcessGroup::run_body_nccl(const Issue& is, bool last, const char* call, FunctionRef<ncclResult_t()> calls) {
  if (!last) {
    run_nccl(call, calls, is.context);
    return;
  }
  state_->run_deferred(*comm_, call, calls, is.done, is.stream);
  is.deferred = true;
}

std::vector<int64_t> NcclProcessGroup::exchange_sizes(int64_t mine, const std::string& context) {
  state_->check_alive(context);
  const int n = size();
  cuda::DeviceGuard guard(state_->device());
  std::vector<int64_t> sizes(static_cast<size_t>(n), 0);
  state_->finish_launch(*comm_);  // before the copy below is queued on the communication stream
  cudaEvent_t done = nullptr;
  CPF_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  try {
    cuda::StreamGuard on_comm(stream_);
    const Tensor buffer = empty_on({n + 1}, DType::i64, device());  // [mine, gathered...]
    auto* data = static_cast<int64_t*>(buffer.raw_data());
    CPF_CUDA_CHECK(cudaMemcpyAsync(data, &mine, sizeof(int64_t), cudaMemcpyHostToDevice, comm_stream()));
    run_nccl(
        "ncclAllGather", [&] { return ncclAllGather(data, data + 1, 1, ncclInt64, comm_->comm, comm_stream()); },
        context);
    CPF_CUDA_CHECK(cudaMemcpyAsync(sizes.data(), data + 1, sizeof(int64_t) * static_cast<size_t>(n),
                                   cudaMemcpyDeviceToHost, comm_stream()));
    CPF_CUDA_CHECK(cudaEventRecord(done, comm_stream()));
    state_->host_wait(done, context + " (exchanging sizes)");
  } catch (...) {
    (void)cudaEventDestroy(done);
    throw;
  }
  (void)cudaEventDestroy(done);
  return sizes;
}

WorkPtr NcclProcessGroup::do_all_reduce(const Tensor& input, ReduceOp op, const Tensor& out) {
  const std::string context = op_context("all_reduce");
  check_device(input, context, "the input");
  check_device(out, context, "out");
  const Tensor src = raw::contiguous(input);
  const Tensor dst = out.defined() && out.is_contiguous() ? out : empty_on(input.shape(), input.dtype(), device());
  const Tensor result = out.defined() ? out : dst;
  return issue(context, {result}, {src, dst}, [&](const Issue& is, std::vector<Tensor>&) {
    if (input.numel() == 0) return;
    const ncclDataType_t type = nccl_dtype(input.dtype());
    const ncclRedOp_t red = nccl_reduce_op(op);
    // Nothing follows the call on the communication stream unless out needs the copy-out.
    run_body_nccl(is, dst.is_same(result), "ncclAllReduce", [&] {
      return ncclAllReduce(src.raw_data(), dst.raw_data(), static_cast<size_t>(input.numel()), type, red, is.comm,
                           is.stream);
    });
    if (!dst.is_same(result)) raw::copy_(result, dst);
  });
}

WorkPtr NcclProcessGroup::do_broadcast(const Tensor& input, int root, const Tensor& out) {
  const std::string context = op_context("broadcast");
  check_device(input, context, "the input");
  check_device(out, context, "out");
  const Tensor src = rank_ == root ? raw::contiguous(input) : Tensor();
  const Tensor dst = out.defined() && out.is_contiguous() ? out : empty_on(input.shape(), input.dtype(), device());
  const Tensor result = out.defined() ? out : dst;
  return issue(context, {result}, {src, dst}, [&](const Issue& is, std::vector<Tensor>&) {
    if (input.numel() == 0) return;
    const void* send = rank_ == root ? src.raw_data() : dst.raw_data();
    const ncclDataType_t type = nccl_dtype(input.dtype());
    run_body_nccl(is, dst.is_same(result), "ncclBroadcast", [&] {
      return ncclBroadcast(send, dst.raw_data(), static_cast<size_t>(input.numel()), type, root, is.comm, is.stream);
    });
    if (!dst.is_same(result)) raw::copy_(result, dst);
  });
}

WorkPtr NcclProcessGroup::do_batch_p2p(const std::vector<P2POp>& ops) {
  const std::string context = op_context("batch_p2p");
  std::vector<Tensor> buffers;  // what travels: contiguous sends, contiguous receive buffers
  std::vector<Tensor> results;  // the caller's receive tensors
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    check_device(op.tensor, context, op.kind == P2POp::Kind::send ? "a send tensor" : "a receive tensor");
    if (op.kind == P2POp::Kind::send) {
      buffers.push_back(raw::contiguous(op.tensor));
    } else {
      buffers.push_back(op.tensor.is_contiguous() ? op.tensor
                                                  : empty_on(op.tensor.shape(), op.tensor.dtype(), device()));
      results.push_back(op.tensor);
    }
  }
  // Receives straight into the caller's tensors (the CP ring's): nothing follows the NCCL calls on the
  // communication stream, so their launch is deferred.
  bool copy_out = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    copy_out = copy_out || (ops[i].kind == P2POp::Kind::recv && !buffers[i].is_same(ops[i].tensor));
  }
  std::vector<Tensor> keep = buffers;
  return issue(context, results, std::move(keep), [&](const Issue& is, std::vector<Tensor>&) {
    std::vector<ncclDataType_t> types;
    for (const Tensor& b : buffers) types.push_back(nccl_dtype(b.dtype()));
    // Tags are not NCCL's: messages between two ranks match in issue order, which is what the
    // ProcessGroup contract promises for one tag; distinct tags must also be issued in the same order.
    run_body_nccl(is, !copy_out, "grouped ncclSend/ncclRecv", [&] {
      return in_group([&] {
        for (size_t i = 0; i < ops.size(); ++i) {
          const Tensor& b = buffers[i];
          if (b.numel() == 0) continue;
          const size_t count = static_cast<size_t>(b.numel());
          const ncclResult_t status = ops[i].kind == P2POp::Kind::send
                                          ? ncclSend(b.raw_data(), count, types[i], ops[i].peer, is.comm, is.stream)
                                          : ncclRecv(b.raw_data(), count, types[i], ops[i].peer, is.comm, is.stream);
          if (nccl_failed(status)) return status;
        }
        return ncclSuccess;
      });
    });
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == P2POp::Kind::recv && !buffers[i].is_same(ops[i].tensor)) raw::copy_(ops[i].tensor, buffers[i]);
    }
  });
}

WorkPtr NcclProcessGroup::do_barrier() {
  return issue(
      op_context("barrier"), {}, {},
      [&](const Issue& is, std::vector<Tensor>& staging) {
        const Tensor token = empty_on({1}, DType::i32, device());
        staging.push_back(token);
        run_nccl(
            "ncclAllReduce",
            [&] {
              return ncclAllReduce(token.raw_data(), token.raw_data(), 1, ncclInt32, ncclSum, is.comm, is.stream);
            },
            is.context);
      },
      /*host_blocking=*/true);
}

}  // namespace cpf::dist::nccl
