#include "framework/distributed/launcher.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <new>
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

// std::bad_alloc says only "std::bad_alloc": name the rank's phase and what to change.
std::string out_of_memory_message(const char* doing, int n_ranks) {
  return std::string("out of host memory (std::bad_alloc) while ") + doing + " with " + std::to_string(n_ranks) +
         " rank(s) in this process; lower the model or batch size or the rank count, or raise the memory limit";
}

int cuda_device_count() {
  return has_device_backend(DeviceType::cuda) ? device_backend(DeviceType::cuda).device_count() : 0;
}

// The thread backend behind the LaunchWorld interface.
class ThreadLaunchWorld final : public LaunchWorld {
 public:
  ThreadLaunchWorld(int n_ranks, std::chrono::milliseconds timeout, int omp_threads)
      : world_(thread::ThreadWorld::create(
            n_ranks, {.timeout = timeout, .omp_threads_per_rank = omp_threads, .name = "world"})) {}
  ProcessGroupPtr join(int rank, Device) override { return world_->group(rank); }
  void abort(int rank, const std::string& reason) override { world_->abort(rank, reason); }
  bool aborted() const override { return world_->aborted(); }
  std::string abort_reason() const override { return world_->abort_reason(); }

 private:
  std::shared_ptr<thread::ThreadWorld> world_;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<Backend, LaunchWorldFactory>& registry() {
  static std::map<Backend, LaunchWorldFactory> factories;
  return factories;
}

}  // namespace

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::thread: return "thread";
    case Backend::nccl: return "nccl";
  }
  return "?";
}

void register_launch_backend(Backend backend, LaunchWorldFactory factory) {
  std::lock_guard lock(registry_mutex());
  registry()[backend] = std::move(factory);
}

bool has_launch_backend(Backend backend) {
  if (backend == Backend::thread) return true;
  std::lock_guard lock(registry_mutex());
  return registry().count(backend) > 0;
}

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
  std::unique_ptr<LaunchWorld> world;
  if (options.backend == Backend::thread) {
    try {
      world = std::make_unique<ThreadLaunchWorld>(n_ranks, options.timeout, omp_threads);
    } catch (const std::bad_alloc&) {
      CPF_FAIL("launch: out of host memory (std::bad_alloc) while creating the thread world of ", n_ranks,
               " ranks; lower the rank count or raise the memory limit");
    }
  } else {
    LaunchWorldFactory factory;
    {
      std::lock_guard lock(registry_mutex());
      auto it = registry().find(options.backend);
      if (it != registry().end()) factory = it->second;
    }
    CPF_CHECK(factory, "launch: the ", backend_name(options.backend),
              " backend is not part of this program; link cpf_distributed_nccl (built with -DCPF_WITH_CUDA=ON "
              "and -DCPF_WITH_NCCL=ON), or use the thread backend");
    CPF_CHECK(options.devices != DevicePolicy::cpu, "launch: the ", backend_name(options.backend),
              " backend runs one rank per GPU; DevicePolicy::cpu is not possible with it");
    world = factory(n_ranks, options);
  }
  std::vector<Device> devices;
  for (int r = 0; r < n_ranks; ++r) {
    devices.push_back(options.backend == Backend::thread ? rank_device(r, options.devices) : Device::cuda(r));
  }
  std::vector<RankContext> contexts(static_cast<size_t>(n_ranks));
  std::string failure;
  {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(n_ranks));
    for (int r = 0; r < n_ranks; ++r) {
      auto body = [&world, &fn, &ctx = contexts[static_cast<size_t>(r)], &devices, n_ranks, r, omp_threads] {
#if defined(CPF_WITH_OPENMP)
        omp_set_num_threads(omp_threads);
#else
        (void)omp_threads;
#endif
        // The first failure aborts the world; it is the one reported (later errors on the other
        // ranks are usually the abort itself).
        const char* doing = "joining the world group";
        try {
          const Device device = devices[static_cast<size_t>(r)];
          ctx = {.rank = r, .world_size = n_ranks, .device = device, .world = world->join(r, device)};
          doing = "running";
          fn(ctx);
        } catch (const std::bad_alloc&) {
          world->abort(r, out_of_memory_message(doing, n_ranks));
        } catch (const std::exception& e) {
          world->abort(r, e.what());
        } catch (...) {
          world->abort(r, "an exception that is not a std::exception");
        }
      };
      // A thread that cannot start (thread or memory limits) fails the launch: the ranks already
      // running leave their collectives through the abort, and are joined before the error is thrown.
      try {
        threads.emplace_back(std::move(body));
      } catch (const std::exception& e) {
        world->abort(r, "could not start the thread of rank " + std::to_string(r) + " of " + std::to_string(n_ranks) +
                            " (" + e.what() +
                            "); lower the rank count (parallel.dp x parallel.cp) or raise the "
                            "thread and memory limits (ulimit -u, ulimit -v)");
        break;
      }
    }
    for (std::thread& t : threads) t.join();
    if (world->aborted()) failure = world->abort_reason();
    contexts.clear();  // drop the handles so the world (and its progress threads) goes away here
    world.reset();
  }
  CPF_CHECK(failure.empty(), "launch: ", failure);
}

}  // namespace cpf::dist
