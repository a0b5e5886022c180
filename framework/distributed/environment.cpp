#include "framework/distributed/environment.h"

#include <cstdint>
#include <cstdlib>

#include "framework/core/error.h"

namespace cpf::dist {
namespace {

// The variable's value as an integer, or an error naming it and the launcher.
std::optional<int> int_var(const EnvLookup& env, const std::string& name, const char* launcher, bool required) {
  const std::optional<std::string> text = env(name);
  if (!text) {
    CPF_CHECK(!required, "launch environment (", launcher, "): ", name,
              " is not set; the launcher sets it, or export it yourself");
    return std::nullopt;
  }
  size_t used = 0;
  long long value = 0;
  bool ok = !text->empty();
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    ok = false;
  }
  CPF_CHECK(ok && used == text->size() && value >= INT32_MIN && value <= INT32_MAX, "launch environment (", launcher,
            "): ", name, "='", *text, "' is not an integer");
  return static_cast<int>(value);
}

std::string string_var(const EnvLookup& env, const std::string& name, const char* launcher) {
  const std::optional<std::string> text = env(name);
  CPF_CHECK(text && !text->empty(), "launch environment (", launcher, "): ", name, text ? " is empty" : " is not set",
            "; set it to the address of the host running rank 0");
  return *text;
}

// The checks every launcher shares.
void validate(const LaunchEnvironment& e, const std::string& rank_var, const std::string& size_var,
              const std::string& local_var) {
  const char* l = e.launcher.c_str();
  CPF_CHECK(e.world_size >= 1, "launch environment (", l, "): ", size_var, "=", e.world_size, " must be at least 1");
  CPF_CHECK(e.rank >= 0 && e.rank < e.world_size, "launch environment (", l, "): ", rank_var, "=", e.rank,
            " is not in 0..", e.world_size - 1, " (", size_var, "=", e.world_size, ")");
  CPF_CHECK(e.local_rank >= 0 && e.local_rank < e.world_size, "launch environment (", l, "): ", local_var, "=",
            e.local_rank, " is not in 0..", e.world_size - 1, " (", size_var, "=", e.world_size, ")");
  CPF_CHECK(e.local_world_size == 0 || e.local_rank < e.local_world_size, "launch environment (", l, "): ", local_var,
            "=", e.local_rank, " is not below the local world size ", e.local_world_size);
  CPF_CHECK(e.master_port >= 1 && e.master_port <= 65535, "launch environment (", l, "): MASTER_PORT=", e.master_port,
            " is not a TCP port (1..65535)");
}

// Where rank 0's host and port (MASTER_ADDR, MASTER_PORT) come from differs per launcher.
void read_master_torchrun(const EnvLookup& env, LaunchEnvironment& e) {
  e.master_addr = string_var(env, "MASTER_ADDR", "torchrun");
  e.master_port = *int_var(env, "MASTER_PORT", "torchrun", true);
}

void read_master_openmpi(const EnvLookup& env, LaunchEnvironment& e) {
  CPF_CHECK(env("MASTER_ADDR") && env("MASTER_PORT"), "launch environment (openmpi): MASTER_ADDR and MASTER_PORT ",
            "must be exported to every rank (mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500); missing: ",
            env("MASTER_ADDR") ? "" : "MASTER_ADDR ", env("MASTER_PORT") ? "" : "MASTER_PORT");
  e.master_addr = string_var(env, "MASTER_ADDR", "openmpi");
  e.master_port = *int_var(env, "MASTER_PORT", "openmpi", true);
}

// MASTER_ADDR / MASTER_PORT when exported, else the job's first node and a port derived from the job id.
void read_master_slurm(const EnvLookup& env, LaunchEnvironment& e) {
  if (env("MASTER_ADDR")) {
    e.master_addr = string_var(env, "MASTER_ADDR", "slurm");
  } else {
    std::optional<std::string> nodes = env("SLURM_JOB_NODELIST");
    if (!nodes) nodes = env("SLURM_NODELIST");
    CPF_CHECK(nodes && !nodes->empty(), "launch environment (slurm): neither MASTER_ADDR nor SLURM_JOB_NODELIST ",
              "(SLURM_NODELIST) is set; export MASTER_ADDR=<host of rank 0>");
    e.master_addr = first_slurm_host(*nodes);
  }
  if (env("MASTER_PORT")) {
    e.master_port = *int_var(env, "MASTER_PORT", "slurm", true);
  } else {
    const std::optional<int> job = int_var(env, "SLURM_JOB_ID", "slurm", false);
    CPF_CHECK(job.has_value(),
              "launch environment (slurm): neither MASTER_PORT nor SLURM_JOB_ID is set; export "
              "MASTER_PORT=<free port on the host of rank 0>");
    e.master_port = 20000 + (*job % 20000 + 20000) % 20000;
  }
}

// One row per launcher: the variables that place a process in the job, and where its master is.
// A launcher is recognised by its rank variable, tried in this order.
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* world_size_fallback;  // read when world_size is not set; nullptr: world_size is required
  const char* local_rank;
  const char* local_world_size;  // optional (0 when not set)
  void (*read_master)(const EnvLookup& env, LaunchEnvironment& e);
};

constexpr LauncherVars kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", nullptr, "LOCAL_RANK", "LOCAL_WORLD_SIZE", read_master_torchrun},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr, "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", read_master_openmpi},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
     read_master_slurm},
};

LaunchEnvironment read_with(const EnvLookup& env, const LauncherVars& vars) {
  const char* l = vars.launcher;
  LaunchEnvironment e;
  e.launcher = l;
  e.rank = *int_var(env, vars.rank, l, true);
  const bool fallback = vars.world_size_fallback != nullptr;
  const std::optional<int> size = int_var(env, vars.world_size, l, !fallback);
  const bool size_set = size.has_value();
  e.world_size = size_set ? *size : *int_var(env, vars.world_size_fallback, l, true);
  e.local_rank = *int_var(env, vars.local_rank, l, true);
  e.local_world_size = int_var(env, vars.local_world_size, l, false).value_or(0);
  vars.read_master(env, e);
  validate(e, vars.rank, size_set ? vars.world_size : vars.world_size_fallback, vars.local_rank);
  return e;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

// See LaunchEnvironment::rendezvous_port, rendezvous_token and rendezvous_bind.
static LaunchEnvironment with_rendezvous_port(LaunchEnvironment e, const EnvLookup& env) {
  if (env("CPF_RENDEZVOUS_PORT")) {
    e.rendezvous_port = *int_var(env, "CPF_RENDEZVOUS_PORT", e.launcher.c_str(), true);
    CPF_CHECK(e.rendezvous_port >= 1 && e.rendezvous_port <= 65535, "launch environment (", e.launcher,
              "): CPF_RENDEZVOUS_PORT=", e.rendezvous_port, " is not a TCP port (1..65535)");
  } else if (e.launcher == "torchrun" && env("TORCHELASTIC_RUN_ID")) {
    CPF_CHECK(e.master_port < 65535, "launch environment (torchrun): MASTER_PORT=", e.master_port,
              " leaves no next port for the rendezvous (torchrun's agent holds MASTER_PORT); set CPF_RENDEZVOUS_PORT");
    e.rendezvous_port = e.master_port + 1;
  } else {
    e.rendezvous_port = e.master_port;
  }
  e.rendezvous_token = env("CPF_RENDEZVOUS_TOKEN").value_or("");
  e.rendezvous_bind = env("CPF_RENDEZVOUS_BIND").value_or("");
  CPF_CHECK(!env("CPF_RENDEZVOUS_BIND") || !e.rendezvous_bind.empty(), "launch environment (", e.launcher,
            "): CPF_RENDEZVOUS_BIND is set but empty; unset it (rank 0 listens on MASTER_ADDR's address) or set ",
            "an address (0.0.0.0, :: or * for every interface)");
  return e;
}

static std::optional<LaunchEnvironment> read_launcher(const EnvLookup& env) {
  if (!env("RANK") && (env("WORLD_SIZE") || env("LOCAL_RANK"))) {
    CPF_FAIL("launch environment (torchrun): ", env("WORLD_SIZE") ? "WORLD_SIZE" : "LOCAL_RANK",
             " is set but RANK is not; set RANK (0..WORLD_SIZE-1) for every process");
  }
  for (const LauncherVars& vars : kLaunchers) {
    if (env(vars.rank)) return read_with(env, vars);
  }
  return std::nullopt;
}

std::optional<LaunchEnvironment> read_launch_environment(const EnvLookup& env) {
  std::optional<LaunchEnvironment> e = read_launcher(env);
  if (e) e = with_rendezvous_port(*e, env);
  return e;
}

std::string first_slurm_host(const std::string& nodelist) {
  // Up to the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  const size_t open = first.find('[');
  if (open == std::string::npos) {
    CPF_CHECK(!first.empty(), "launch environment (slurm): cannot read a host from the node list '", nodelist, "'");
    return first;
  }
  const size_t close = first.find(']', open);
  CPF_CHECK(close != std::string::npos && close > open + 1, "launch environment (slurm): cannot read the node list '",
            nodelist, "' (unbalanced brackets)");
  // "[03-05,07]": the first range's first number, with its zero padding.
  const std::string inside = first.substr(open + 1, close - open - 1);
  const size_t end = inside.find_first_of(",-");
  return first.substr(0, open) + inside.substr(0, end) + first.substr(close + 1);
}

}  // namespace cpf::dist
