#include "framework/distributed/launcher.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "framework/distributed/thread/thread_process_group.h"
#include "framework/tensor/storage.h"

#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

namespace cpf::dist {
namespace {

int available_cores() {
#if defined(CPF_WITH_OPENMP)
  return omp_get_num_procs();
#else
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#endif
}

int cuda_device_count() {
  return has_device_backend(DeviceType::cuda) ? device_backend(DeviceType::cuda).device_count() : 0;
}

}  // namespace

Device rank_device(int rank, DevicePolicy policy) {
  const int gpus = policy == DevicePolicy::cpu ? 0 : cuda_device_count();
  if (policy == DevicePolicy::cuda) {
    CPF_CHECK(gpus > 0, "launch: cuda devices were requested but ",
              has_device_backend(DeviceType::cuda)
                  ? "no CUDA device is visible"
                  : "this build has no CUDA backend (configure with -DCPF_WITH_CUDA=ON)");
  }
  return gpus > 0 ? Device::cuda(rank % gpus) : Device::cpu();
}

void launch(int n_ranks, const std::function<void(RankContext&)>& fn, const LaunchOptions& options) {
  CPF_CHECK(n_ranks >= 1, "launch: need at least one rank, got ", n_ranks);
  CPF_CHECK(options.omp_threads_per_rank >= 0, "launch: omp_threads_per_rank must be >= 0, got ",
            options.omp_threads_per_rank);
  const int omp_threads =
      options.omp_threads_per_rank > 0 ? options.omp_threads_per_rank : std::max(1, available_cores() / n_ranks);
  std::vector<RankContext> contexts(static_cast<size_t>(n_ranks));
  std::string failure;
  {
    auto world = thread::ThreadWorld::create(
        n_ranks, {.timeout = options.timeout, .omp_threads_per_rank = omp_threads, .name = "world"});
    for (int r = 0; r < n_ranks; ++r) {
      RankContext& ctx = contexts[static_cast<size_t>(r)];
      ctx = {.rank = r, .world_size = n_ranks, .device = rank_device(r, options.devices), .world = world->group(r)};
    }
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(n_ranks));
    for (int r = 0; r < n_ranks; ++r) {
      threads.emplace_back([&world, &fn, &ctx = contexts[static_cast<size_t>(r)], r, omp_threads] {
#if defined(CPF_WITH_OPENMP)
        omp_set_num_threads(omp_threads);
#else
        (void)omp_threads;
#endif
        // The first failure aborts the world; it is the one reported (later errors on the other
        // ranks are usually the abort itself).
        try {
          fn(ctx);
        } catch (const std::exception& e) {
          world->abort(r, e.what());
        } catch (...) {
          world->abort(r, "an exception that is not a std::exception");
        }
      });
    }
    for (std::thread& t : threads) t.join();
    if (world->aborted()) failure = world->abort_reason();
    contexts.clear();  // drop the handles so the world (and its progress threads) goes away here
  }
  CPF_CHECK(failure.empty(), "launch: ", failure);
}

}  // namespace cpf::dist
