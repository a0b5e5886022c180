// Collective bus bandwidth of NcclProcessGroup against the same NCCL calls issued directly, on all
// visible GPUs (one rank thread per GPU, dist::launch with Backend::nccl), bf16, 64 MiB to 1 GiB.
//
//   NCCL_NVLS_ENABLE=0 ./gpu_nccl_bench [--max-mib 1024] [--ranks N]
//
// Sizes follow nccl-tests: the per-rank buffer for all_reduce and all_to_all, the gathered output
// for all_gather. Bus bandwidth = size / time * factor, factor 2(n-1)/n for all_reduce and (n-1)/n
// for all_gather and all_to_all, so figures compare across world sizes and with nccl-tests.
// "ours" is the blocking-form pattern a trainer uses (the _async call with out given, then wait());
// "NCCL" is nccl::issue_direct on the same communicator and stream. Each figure is the median of 5
// timed batches (host clock around a batch of launches closed by a device synchronisation, aligned
// across ranks by a barrier), the slowest rank's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "framework/distributed/launcher.h"
#include "framework/distributed/nccl/nccl_direct.h"
#include "framework/distributed/nccl/nccl_init.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/random.h"

namespace {

using namespace cpf;
using dist::nccl::DirectOp;

struct Row {
  std::string op;
  double mib = 0;
  double ours = 0;  // bus GB/s
  double nccl = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call: median over batches of `reps` calls, the slowest rank's (max over ranks).
double time_per_call(dist::RankContext& ctx, int reps, const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();  // warm-up: connections, allocator cache
  cuda::synchronize(ctx.device.index);
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    ctx.world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) call();
    cuda::synchronize(ctx.device.index);
    batches.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  Tensor mine = full({1}, median(batches), {.dtype = DType::f64, .device = ctx.device});
  return ctx.world->all_reduce(mine, dist::ReduceOp::max).to_vector<double>()[0];
}

}  // namespace

int main(int argc, char** argv) {
  int max_mib = 1024;
  int ranks = cuda::device_count();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--max-mib") == 0) max_mib = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--ranks") == 0) ranks = std::atoi(argv[i + 1]);
  }
  if (ranks < 2) {
    std::printf("gpu_nccl_bench: needs at least 2 GPUs, %d visible; nothing to measure\n", cuda::device_count());
    return 0;
  }
  std::printf("gpu_nccl_bench: %d ranks (one per GPU), NCCL %d, bf16, NCCL_NVLS_ENABLE=%s\n", ranks,
              dist::nccl::nccl_version(),
              std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
  std::vector<Row> rows;
  std::mutex mutex;
  dist::launch(
      ranks,
      [&](dist::RankContext& ctx) {
        const int n = ctx.world_size;
        for (int mib = 64; mib <= max_mib; mib *= 4) {
          const int64_t bytes = int64_t(mib) << 20;
          const int64_t elems = bytes / 2;  // bf16
          const int reps = mib <= 64 ? 20 : (mib <= 256 ? 10 : 5);
          Generator gen(1234 + ctx.rank);
          const auto opts = TensorOptions{.dtype = DType::bf16, .device = ctx.device};
          // all_reduce: a buffer of `bytes`, in place.
          {
            Tensor x = uniform({elems}, -1, 1, opts, &gen);
            const double ours =
                time_per_call(ctx, reps, [&] { ctx.world->all_reduce_async(x, dist::ReduceOp::sum, x)->wait(); });
            const double direct =
                time_per_call(ctx, reps, [&] { dist::nccl::issue_direct(*ctx.world, DirectOp::all_reduce_sum, x, x); });
            const double factor = 2.0 * (n - 1) / n;
            std::lock_guard lock(mutex);
            if (ctx.rank == 0)
              rows.push_back({"all_reduce", double(mib), bytes * factor / ours / 1e9, bytes * factor / direct / 1e9});
          }
          // all_gather: `bytes` gathered in total, bytes / n from each rank.
          {
            Tensor x = uniform({elems / n}, -1, 1, opts, &gen);
            Tensor out = empty({elems / n * n}, opts);
            const double ours = time_per_call(ctx, reps, [&] { ctx.world->all_gather_async(x, 0, out)->wait(); });
            const double direct =
                time_per_call(ctx, reps, [&] { dist::nccl::issue_direct(*ctx.world, DirectOp::all_gather, x, out); });
            const double factor = double(n - 1) / n;
            const double total = double(out.numel()) * 2;
            std::lock_guard lock(mutex);
            if (ctx.rank == 0)
              rows.push_back({"all_gather", double(mib), total * factor / ours / 1e9, total * factor / direct / 1e9});
          }
          // all_to_all: a buffer of `bytes` per rank, split evenly.
          {
            Tensor x = uniform({elems / n * n}, -1, 1, opts, &gen);
            Tensor out = empty({elems / n * n}, opts);
            const double ours = time_per_call(ctx, reps, [&] { ctx.world->all_to_all_async(x, 0, 0, out)->wait(); });
            const double direct =
                time_per_call(ctx, reps, [&] { dist::nccl::issue_direct(*ctx.world, DirectOp::all_to_all, x, out); });
            const double factor = double(n - 1) / n;
            const double total = double(x.numel()) * 2;
            std::lock_guard lock(mutex);
            if (ctx.rank == 0)
              rows.push_back({"all_to_all", double(mib), total * factor / ours / 1e9, total * factor / direct / 1e9});
          }
        }
      },
      {.timeout = std::chrono::seconds(300), .backend = dist::Backend::nccl});
  std::printf("\n%-12s | %8s | %12s | %12s | %6s\n", "op", "size", "ours GB/s", "NCCL GB/s", "ratio");
  std::printf("-------------+----------+--------------+--------------+-------\n");
  for (const Row& r : rows) {
    std::printf("%-12s | %5.0f MiB | %12.1f | %12.1f | %5.1f%%\n", r.op.c_str(), r.mib, r.ours, r.nccl,
                100.0 * r.ours / r.nccl);
  }
  return 0;
}
