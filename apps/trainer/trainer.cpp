#include "apps/trainer/trainer.h"
#include "apps/trainer/rank_trainer.h"

#include <algorithm>
#include <filesystem>
#include <thread>
#if defined(CPF_WITH_OPENMP)
#include <omp.h>
#endif

#include "apps/report/device_memory.h"
#include "apps/report/run_plot.h"
#include "apps/run/run_folder.h"
#include "apps/trainer/evaluation.h"
#include "apps/trainer/memory_plan.h"
#include "apps/trainer/stop_signals.h"
#include "framework/distributed/environment.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/rendezvous_tcp.h"
#if CPF_HAVE_NCCL
#include "framework/distributed/nccl/nccl_init.h"
#endif

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

// The writing process draws loss.svg from the run's metrics.jsonl (resumed sessions included). The
// run itself succeeded: a plot that cannot be written is a warning line, not a failed run.
void write_loss_plot(std::optional<MetricsLogger>& logger, const std::string& dir) {
  if (!logger) return;
  try {
    write_run_plot(dir);
  } catch (const std::exception& e) {
    logger->note(std::string("warning: loss.svg not written: ") + e.what());
  }
}

}  // namespace

std::shared_ptr<const models::data::DocumentSource> open_training_source(const TrainConfig& config) {
  try {
    auto source = models::data::make_document_source(config.data);
    // A loader over it checks what the source alone cannot (e.g. that it holds any document).
    models::data::DataLoader probe(source, config.data, 0, config.parallel.dp);
    return source;
  } catch (const Error& e) {
    throw DataError(e.message());
  }
}

namespace {

// Started by torchrun / srun / mpirun (or dist::spawn_local_processes): this process is one rank, of a
// world of the config's size.
void check_launch_environment(const TrainConfig& config, const std::optional<dist::LaunchEnvironment>& env, int world) {
  if (!env) return;
  CPF_CHECK(config.parallel.backend == dist::Backend::nccl, "cpformer train was started by ", env->launcher,
            " as rank ", env->rank, " of ", env->world_size,
            ", but parallel.backend is thread (ranks as threads "
            "of one process); set parallel.backend: nccl (or --set parallel.backend=nccl)");
  CPF_CHECK(env->world_size == world, "cpformer train: the launcher started ", env->world_size,
            " processes but parallel.dp x parallel.cp = ", config.parallel.dp, " x ", config.parallel.cp, " = ", world,
            " ranks; make them equal");
}

Sources open_sources(const TrainConfig& config) {
  Sources sources;
  sources.train = open_training_source(config);
  try {
    sources.eval = make_eval_source(config, sources.train);
  } catch (const Error& e) {
    throw DataError("run.eval_path: " + e.message());
  }
  return sources;
}

// The writing process's logger, and its first line: the run's shape.
void start_logger(std::optional<MetricsLogger>& logger, const TrainConfig& config, std::ostream& out, bool progress_bar,
                  const Sources& sources, const std::optional<dist::LaunchEnvironment>& env) {
  const std::string dir = run_dir(config);
  const int world = static_cast<int>(config.parallel.dp * config.parallel.cp);
  logger.emplace(out, LoggerOptions{.metrics_path = (fs::path(dir) / "metrics.jsonl").string(),
                                    .train_log_path = (fs::path(dir) / "train.log").string(),
                                    .total_steps = config.run.steps,
                                    .progress_bar = progress_bar,
                                    .rank = 0,
                                    .heartbeat_seconds = progress_bar ? 0.0 : kHeartbeatSeconds});
  logger->note("cpformer train: " + config.run.name + " | " + sources.train->name() + " | " + std::to_string(world) +
               " rank(s): dp=" + std::to_string(config.parallel.dp) + " cp=" + std::to_string(config.parallel.cp) +
               (config.parallel.cp > 1 ? " (" + cp::comm_type_name(config.parallel.cp_comm_type) + ")" : "") + ", " +
               dist::backend_name(config.parallel.backend) +
               (env ? " (" + env->launcher + ", one process per rank)" : "") + " | " +
               (rank_device_of(config, 0).is_cuda() ? "cuda " : "cpu ") + precision_description(config) +
               " | run folder " + dir);
}

// The memory planner before any work (memory_plan.h): refuses what cannot fit on `device`, returns a
// warning near the limit; nothing on the CPU.
std::optional<std::string> check_device_memory(const TrainConfig& config, Device device) {
  if (!device.is_cuda()) return std::nullopt;
  const std::optional<size_t> capacity = total_device_memory(device);
  return capacity ? check_memory_plan(config, static_cast<double>(*capacity)) : std::nullopt;
}

// Thread ranks far beyond the cores: each gets a sliver of a core, so the start (a model per rank) and every
// step crawl. Said once; the run goes on (Ctrl-C and SIGTERM stay prompt during the start).
std::optional<std::string> thread_rank_warning(const TrainConfig& config, bool process_per_rank) {
  const int64_t ranks = config.parallel.dp * config.parallel.cp;
  const int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  if (process_per_rank || config.parallel.backend != dist::Backend::thread || ranks <= 4 * cores) return std::nullopt;
  return "warning: " + std::to_string(ranks) + " thread ranks on " + std::to_string(cores) +
         " cores: every rank builds its own model and runs its own step on a share of a core, so the start and "
         "each step take about " +
         std::to_string(ranks / cores) +
         " times a rank's work; use fewer ranks (parallel.dp x parallel.cp), or processes on more machines";
}

// The ranks as threads of this process (dist::launch); a rank whose data source failed makes it a DataError.
// False when a stop signal ended the start (the outcome says which; nothing was trained or saved).
bool launch_rank_threads(const TrainConfig& config, Device device0, const std::function<void(dist::RankContext&)>& rank,
                         Shared& shared, MetricsLogger* logger) {
  dist::LaunchOptions options;
  options.devices = device0.is_cuda() ? dist::DevicePolicy::cuda : dist::DevicePolicy::cpu;
  options.omp_threads_per_rank = static_cast<int>(config.run.threads);
  options.backend = config.parallel.backend;
  try {
    dist::launch(static_cast<int>(config.parallel.dp * config.parallel.cp), rank, options);
  } catch (const Error& e) {
    if (shared.data_failed) throw DataError(e.message());  // exit code 3, as for data that cannot be opened
    if (shared.setup_stop_signal == 0) throw;
    // Stopped before the first step: the ranks left (the others' collectives aborted); nothing to save.
    if (logger) {
      logger->note(std::string("stopped by ") + stop_signal_name(shared.setup_stop_signal) +
                   " during setup, before the first step: nothing to save");
    }
    shared.outcome.stop_signal = shared.setup_stop_signal;
    return false;
  }
  return true;
}

}  // namespace

TrainOutcome train(const TrainConfig& config, std::ostream& out, bool progress_bar) {
  // The device check first: its message names run.device and the fix.
  const Device device0 = rank_device_of(config, 0);
  const int world = static_cast<int>(config.parallel.dp * config.parallel.cp);
  const std::optional<dist::LaunchEnvironment> env = dist::read_launch_environment();
  check_launch_environment(config, env, world);
  const std::optional<std::string> memory_warning = check_device_memory(config, device0);
  const bool writer = !env || env->rank == 0;  // the process that writes the run folder and logs
  const std::string dir = run_dir(config);
  const Sources sources = open_sources(config);
  // Ctrl-C / SIGTERM from here on stop the run between steps with a checkpoint.
  const StopSignalScope stop_signals;
  std::optional<RunFolderLock> lock;  // held until the run ends, however it ends
  std::optional<MetricsLogger> logger;
  if (writer) {
    lock.emplace(dir);
    apply_start_mode(config);
    check_checkpoints_writable(config);
    start_logger(logger, config, out, progress_bar, sources, env);
    if (memory_warning) logger->note(*memory_warning);
    if (const std::optional<std::string> space = checkpoint_space_warning(config)) logger->note(*space);
    if (const std::optional<std::string> crowded = thread_rank_warning(config, env.has_value())) logger->note(*crowded);
  }

  Shared shared;
  shared.outcome.run_dir = dir;
  shared.outcome.target_set = config.run.target_accuracy > 0 || config.run.target_loss > 0;
  shared.process_per_rank = env.has_value();
  shared.outcome.reporter = writer;
  auto run_rank = [&](dist::RankContext& ctx) {
    leave_if_stopped_during_setup(shared);
    MetricsLogger* rank_logger = ctx.rank == 0 && logger ? &*logger : nullptr;
    reset_peak_device_memory(ctx.device);  // the step lines' peak is this run's
    RankTrainer rank(config, ctx, shared, sources, rank_logger);
    leave_if_stopped_during_setup(shared);
    if (rank_logger) {
      rank_logger->note("model: " + format_count(static_cast<double>(rank.num_parameters())) + " parameters, " +
                        std::to_string(config.model.num_layers) + " layers, hidden " +
                        std::to_string(config.model.hidden_size));
    }
    try {
      rank.run();
    } catch (const models::data::DataReadError&) {
      shared.data_failed = true;
      throw;
    }
  };
  if (env) {
#if defined(CPF_WITH_OPENMP)
    // What launch() does for rank threads: the cores of this node shared by its ranks.
    const int local_ranks = std::max(1, env->local_world_size);
    omp_set_num_threads(config.run.threads > 0 ? static_cast<int>(config.run.threads)
                                               : std::max(1, omp_get_num_procs() / local_ranks));
#endif
#if CPF_HAVE_NCCL
    dist::RankContext ctx = dist::init_from_environment();
    try {
      run_rank(ctx);
    } catch (const models::data::DataReadError& e) {
      dist::report_failure_to_peers(e.what());
      throw DataError(e.message());  // exit code 3, as for data that cannot be opened
    } catch (const std::exception& e) {
      // The other processes stop now, naming this rank and its message, instead of at their op timeout.
      dist::report_failure_to_peers(e.what());
      throw;
    }
#else
    CPF_FAIL("cpformer train: started by ", env->launcher, " (one process per rank) but this build has no NCCL ",
             "backend; rebuild with -DCPF_WITH_CUDA=ON -DCPF_WITH_NCCL=ON (docs/distributed.md)");
#endif
    write_loss_plot(logger, dir);
    return shared.outcome;
  }
  if (launch_rank_threads(config, device0, run_rank, shared, logger ? &*logger : nullptr)) write_loss_plot(logger, dir);
  return shared.outcome;
}

}  // namespace cpf::trainer
