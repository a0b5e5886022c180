// Host cost of posting one CP ring shift over NCCL (issue #21): each rank sends 2 tensors (K and V
// blocks, bf16) to rank + 1 and receives 2 from rank - 1 as one batch, as attention/cp/p2p.cpp's
// post_shift does, on all visible GPUs (one rank thread per GPU, dist::launch with Backend::nccl).
//
//   NCCL_NVLS_ENABLE=0 ./gpu_nccl_post_bench [--ranks N] [--shifts 200] [--mib 12] [--busy-us 100]
//
// Three paths post the same grouped ncclSend/ncclRecv:
//   group     ProcessGroup::batch_p2p_async, then Work::wait() (what the CP ring does)
//   direct    nccl::issue_direct_p2p on the group's communicator: the same NCCL calls and the same
//             wait until the non-blocking communicator has launched them, without the group's
//             stream hand-off, events, Work and watchdog entry
//   blocking  nccl::BlockingCommunicator: a second communicator created with blocking = 1, where
//             ncclGroupEnd launches on the calling thread (no NCCL thread, no ncclInProgress polls)
// group - direct is what the ProcessGroup layer costs; direct - blocking is what the non-blocking
// communicator costs. Each path runs three times: "idle" synchronises the device after every shift
// (each post finds an idle GPU), "queued" posts the shifts back to back while the GPU runs behind, and
// "busy" is queued with --busy-us of host work between the post and the wait (what the CP ring does:
// it launches a tile's attention meanwhile), which a launch deferred by the group path overlaps.
// Columns: host microseconds of the posting call alone and of post + wait (busy: with the host work
// between; median and 90th percentile over the shifts), and microseconds per shift done (idle: post
// to device synchronised; queued and busy: the whole run / shifts). Each figure is the slowest rank's.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "framework/distributed/launcher.h"
#include "framework/distributed/nccl/nccl_direct.h"
#include "framework/distributed/nccl/nccl_init.h"
#include "framework/tensor/cuda/cuda.h"

namespace {

using namespace cpf;
using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 10;  // shifts before timing: p2p connections, allocator cache
constexpr int kColumns = 4;  // post median, post+wait median, post p90, per shift

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Ends the program with a message when `seconds` pass before it is destroyed: the blocking
// communicator is unwatched, so a rank that fails or hangs there would block the others for good.
class Deadline {
 public:
  Deadline(int seconds, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock lock(mutex_);
      if (!done_cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
        std::fprintf(stderr, "gpu_nccl_post_bench: %s did not finish within %d s (a rank failed or hangs); exiting\n",
                     what_.c_str(), seconds);
        std::_Exit(2);
      }
    });
  }
  ~Deadline() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// One path: `post` posts a shift, `wait` waits for it as the caller would (may do nothing).
struct Path {
  const char* name;
  std::function<void()> post;
  std::function<void()> wait;
};

// This rank's figures for one path in one regime (kColumns values).
// Host work of `us` microseconds (a spin: the host stays busy, as launching kernels keeps it).
void busy_for(int us) {
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

// `busy_us` > 0: that much host work between each post and its wait.
std::vector<double> measure(const dist::RankContext& ctx, const Path& path, bool queued, int busy_us, int shifts) {
  for (int i = 0; i < kWarmup; ++i) {
    path.post();
    path.wait();
  }
  cuda::synchronize(ctx.device.index);
  ctx.world->barrier();
  std::vector<double> post(static_cast<size_t>(shifts)), post_wait(post.size()), done(post.size());
  const auto run_start = Clock::now();
  for (size_t i = 0; i < post.size(); ++i) {
    const auto t0 = Clock::now();
    path.post();
    const auto t1 = Clock::now();
    busy_for(busy_us);
    path.wait();
    const auto t2 = Clock::now();
    if (!queued) cuda::synchronize(ctx.device.index);
    post[i] = micros(t1 - t0);
    post_wait[i] = micros(t2 - t0);
    done[i] = micros(Clock::now() - t0);
  }
  cuda::synchronize(ctx.device.index);
  const double per_shift = queued ? micros(Clock::now() - run_start) / shifts : quantile(done, 0.5);
  return {quantile(post, 0.5), quantile(post_wait, 0.5), quantile(post, 0.9), per_shift};
}

struct Options {
  int ranks = 0;
  int shifts = 200;
  int mib = 12;
  int busy_us = 100;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return false;
    const int value = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--ranks") == 0) {
      o.ranks = value;
    } else if (std::strcmp(argv[i], "--shifts") == 0) {
      o.shifts = value;
    } else if (std::strcmp(argv[i], "--mib") == 0) {
      o.mib = value;
    } else if (std::strcmp(argv[i], "--busy-us") == 0) {
      o.busy_us = value;
    } else {
      return false;
    }
  }
  return o.shifts >= 1 && o.mib >= 1 && o.busy_us >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.ranks = cuda::device_count();
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr, "usage: gpu_nccl_post_bench [--ranks N] [--shifts S>=1] [--mib M>=1] [--busy-us U>=0]\n");
    return 2;
  }
  if (o.ranks < 2) {
    std::printf("gpu_nccl_post_bench: needs at least 2 GPUs, %d visible; nothing to measure\n", cuda::device_count());
    return 0;
  }
  std::printf(
      "gpu_nccl_post_bench: %d ranks (one per GPU), NCCL %d, per shift 2 sends + 2 receives of %d MiB bf16, "
      "%d shifts, NCCL_NVLS_ENABLE=%s\n",
      o.ranks, dist::nccl::nccl_version(), o.mib, o.shifts,
      std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
  std::vector<std::string> names;
  std::vector<double> table;  // the slowest rank's figures, kColumns per row
  std::mutex mutex;
  dist::launch(o.ranks,
               [&](dist::RankContext& ctx) {
                 const int n = ctx.world_size, next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
                 const auto opts = TensorOptions{.dtype = DType::bf16, .device = ctx.device};
                 const int64_t elems = (int64_t(o.mib) << 20) / 2;
                 const Tensor k = full({elems}, 1.0, opts), v = full({elems}, 2.0, opts);
                 const Tensor k_in = empty({elems}, opts), v_in = empty({elems}, opts);
                 const std::vector<dist::P2POp> ops{dist::P2POp::send(k, next, 0), dist::P2POp::send(v, next, 1),
                                                    dist::P2POp::recv(k_in, prev, 0), dist::P2POp::recv(v_in, prev, 1)};
                 dist::WorkPtr work;
                 std::unique_ptr<dist::nccl::BlockingCommunicator> blocking;
                 {
                   const Deadline deadline(300, "creating the blocking communicator");
                   blocking = std::make_unique<dist::nccl::BlockingCommunicator>(*ctx.world);
                 }
                 const std::vector<Path> paths{
                     {"group batch_p2p_async", [&] { work = ctx.world->batch_p2p_async(ops); }, [&] { work->wait(); }},
                     {"direct issue_direct_p2p", [&] { dist::nccl::issue_direct_p2p(*ctx.world, ops); }, [] {}},
                     {"blocking communicator", [&] { blocking->batch_p2p(ops); }, [] {}},
                 };
                 std::vector<double> mine;
                 std::vector<std::string> rows;
                 for (const char* regime : {"idle", "queued", "busy"}) {
                   const bool queued = std::strcmp(regime, "idle") != 0;
                   const int busy_us = std::strcmp(regime, "busy") == 0 ? o.busy_us : 0;
                   for (const Path& path : paths) {
                     const Deadline deadline(300, std::string("the ") + path.name + " shifts");
                     const std::vector<double> figures = measure(ctx, path, queued, busy_us, o.shifts);
                     mine.insert(mine.end(), figures.begin(), figures.end());
                     char row[64];
                     std::snprintf(row, sizeof(row), "%-25s | %-6s", path.name, regime);
                     rows.push_back(row);
                   }
                 }
                 work.reset();
                 const Tensor slowest = ctx.world->all_reduce(
                     from_vector(mine, {static_cast<int64_t>(mine.size())}, ctx.device), dist::ReduceOp::max);
                 const std::vector<double> values = slowest.to_vector<double>();
                 if (ctx.rank == 0) {
                   std::lock_guard lock(mutex);
                   names = rows;
                   table = values;
                 }
                 // `blocking` goes last, once this rank issues nothing more (BlockingCommunicator's destructor).
                 cuda::synchronize(ctx.device.index);
               },
               {.timeout = std::chrono::seconds(300), .backend = dist::Backend::nccl});
  std::printf("\n%-25s | %-6s | %10s | %13s | %9s | %12s\n", "path", "device", "post us", "post+wait us", "p90 post",
              "us per shift");
  std::printf("--------------------------+--------+------------+---------------+-----------+-------------\n");
  for (size_t r = 0; r < names.size(); ++r) {
    const double* f = &table[r * kColumns];
    std::printf("%s | %10.1f | %13.1f | %9.1f | %12.1f\n", names[r].c_str(), f[0], f[1], f[2], f[3]);
  }
  return 0;
}
