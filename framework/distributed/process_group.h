#pragma once
// ProcessGroup: the ranks that run one collective together, and the operations they can run.
//
// Every rank of a group calls the same operations in the same order (as with NCCL); a rank's
// operations run one after the other in issue order, like work on one stream. Each operation has an
// asynchronous form returning a Work handle and a blocking form:
//
//   all_reduce      every rank gets the element-wise sum / avg / max / min of all inputs
//   broadcast       every rank gets root's tensor
//   all_gather      every rank gets the inputs concatenated along `dim` in rank order; the sizes
//                   along `dim` may differ between ranks
//   reduce_scatter  the reduction of the inputs, cut along `dim`; rank r keeps piece r. Pieces are
//                   as even as possible (the first size % n ranks get one more) unless `splits`
//                   or a given `out` says otherwise
//   all_to_all      input cut into n equal pieces along split_dim; piece j goes to rank j, and the
//                   pieces received are concatenated along concat_dim in rank order. Ulysses uses
//                   split_dim = heads, concat_dim = sequence and the inverse call on the way back
//   send / recv     point to point, matched by (source, destination, tag) in issue order; a batch
//                   posts all its sends and receives at once, so a ring shift cannot deadlock
//   barrier         returns once every rank arrived
//   new_group       a sub-group; collective over this group (every member calls it with the same
//                   ranks); returns null on ranks that are not in the new group
//
// Tensors may have any dtype (f32, f64, bf16, i32, i64, bool), any strides, any device the backend
// can reach. Reductions accumulate bf16 in f32 and round once; sum and avg are rejected for bool
// (use max = or, min = and), avg is rejected for integers. `out`, when given, receives the result
// (its shape and dtype are checked); all_reduce and broadcast may run in place (out = input).
//
// The public methods validate everything a rank can check alone and name the op and the group in
// their errors; backends implement the protected do_* methods and check what needs several ranks
// (shapes that differ between ranks, mismatched operations). Backends: thread (ranks are threads of
// one process, framework/distributed/thread) and, later, NCCL (framework/distributed/nccl).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "framework/distributed/work.h"
#include "framework/tensor/tensor.h"

namespace cpf::dist {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// One entry of a batched point-to-point call: send `tensor` to `peer`, or receive into `tensor`
// (whose shape and dtype must match what the peer sends) from `peer`.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind = Kind::send;
  Tensor tensor;
  int peer = 0;
  int tag = 0;

  static P2POp send(Tensor tensor, int dst, int tag = 0) { return {Kind::send, std::move(tensor), dst, tag}; }
  static P2POp recv(Tensor out, int src, int tag = 0) { return {Kind::recv, std::move(out), src, tag}; }
};

// The default bound of every wait (collectives, group creation, world creation): 240 s, below the
// 300 s after which the test harnesses (ctest, scripts/gpu/run_suite.sh) kill a test, so a hang
// under the defaults reports itself, naming what it waits for, instead of being killed silently.
inline constexpr std::chrono::milliseconds kDefaultTimeout{240'000};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup() = default;

  // ---- identity ----
  virtual int rank() const = 0;  // in this group, 0..size-1
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;               // "world", "cp", ...
  virtual const std::vector<int>& global_ranks() const = 0;  // world rank of each group rank
  int global_rank() const { return global_ranks()[static_cast<size_t>(rank())]; }
  virtual std::string backend() const = 0;  // "thread", "nccl"
  virtual std::chrono::milliseconds timeout() const = 0;
  // "group 'cp' (global ranks [4,5,6,7])", for messages.
  std::string describe() const;

  // Fails every pending and future operation of every group of this world, on every rank, with an
  // error naming this rank and `reason`. The launcher calls it when a rank throws.
  virtual void abort(const std::string& reason) = 0;

  // ---- asynchronous operations ----
  WorkPtr all_reduce_async(const Tensor& input, ReduceOp op = ReduceOp::sum, const Tensor& out = {});
  WorkPtr broadcast_async(const Tensor& input, int root, const Tensor& out = {});
  WorkPtr all_gather_async(const Tensor& input, int64_t dim = 0, const Tensor& out = {});
  WorkPtr reduce_scatter_async(const Tensor& input, int64_t dim = 0, ReduceOp op = ReduceOp::sum,
                               const Tensor& out = {}, const std::vector<int64_t>& splits = {});
  WorkPtr all_to_all_async(const Tensor& input, int64_t split_dim, int64_t concat_dim, const Tensor& out = {});
  WorkPtr batch_p2p_async(const std::vector<P2POp>& ops);
  WorkPtr send_async(const Tensor& tensor, int dst, int tag = 0);
  WorkPtr recv_async(const Tensor& out, int src, int tag = 0);
  WorkPtr barrier_async();

  // ---- blocking forms ----
  Tensor all_reduce(const Tensor& input, ReduceOp op = ReduceOp::sum);
  void all_reduce_(const Tensor& tensor, ReduceOp op = ReduceOp::sum);  // in place
  Tensor broadcast(const Tensor& input, int root);  // input's shape/dtype on non-roots, data ignored
  void broadcast_(const Tensor& tensor, int root);  // in place
  Tensor all_gather(const Tensor& input, int64_t dim = 0);
  Tensor reduce_scatter(const Tensor& input, int64_t dim = 0, ReduceOp op = ReduceOp::sum,
                        const std::vector<int64_t>& splits = {});
  Tensor all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim);
  std::vector<Tensor> batch_p2p(const std::vector<P2POp>& ops);  // the receive buffers
  void send(const Tensor& tensor, int dst, int tag = 0);
  void recv(const Tensor& out, int src, int tag = 0);
  void barrier();

  // Members are ranks of this group; their order gives the ranks of the new group. Every rank of
  // this group must call it (also those not in `ranks`, which get null), like ncclCommSplit.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name = "");
  // Many disjoint groups at once (ncclCommSplit's role): `partition` lists rank lists of this group that
  // hold every rank exactly once; every rank calls it with the same partition and gets the group of its
  // part. One collective on the thread backend, however many parts (a mesh of 512 thread ranks needs
  // hundreds of groups); other backends create the parts one new_group at a time.
  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& partition, const std::string& name = "");

 protected:
  // Arguments arrive validated: dims normalised, out shaped and typed as the op needs (or
  // undefined), peers and root in range. `out_size` of reduce_scatter is this rank's piece size.
  virtual WorkPtr do_all_reduce(const Tensor& input, ReduceOp op, const Tensor& out) = 0;
  virtual WorkPtr do_broadcast(const Tensor& input, int root, const Tensor& out) = 0;
  virtual WorkPtr do_all_gather(const Tensor& input, int64_t dim, const Tensor& out) = 0;
  virtual WorkPtr do_reduce_scatter(const Tensor& input, int64_t dim, ReduceOp op, const Tensor& out, int64_t out_size,
                                    const std::vector<int64_t>& splits) = 0;
  virtual WorkPtr do_all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim, const Tensor& out) = 0;
  virtual WorkPtr do_batch_p2p(const std::vector<P2POp>& ops) = 0;
  virtual WorkPtr do_barrier() = 0;
  virtual std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks, const std::string& name) = 0;
  // The partition arrives validated. Default: one do_new_group per part, in order.
  virtual std::shared_ptr<ProcessGroup> do_split(const std::vector<std::vector<int>>& partition,
                                                 const std::string& name);

  // "all_reduce on group 'world'": the prefix of every message about one operation.
  std::string op_context(const char* op) const;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// The as-even-as-possible piece sizes of `total` elements over `parts` ranks (tensor_split rule).
std::vector<int64_t> even_splits(int64_t total, int parts);

}  // namespace cpf::dist
