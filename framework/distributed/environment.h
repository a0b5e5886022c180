#pragma once
// The rank, world size and rendezvous address a launcher gives each process, read from its
// environment variables. Three launchers are understood, checked in this order:
//
//   torchrun / dist::spawn_local_processes   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//                                            (LOCAL_WORLD_SIZE optional)
//   OpenMPI (mpirun)                         OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                                            OMPI_COMM_WORLD_LOCAL_RANK (OMPI_COMM_WORLD_LOCAL_SIZE);
//                                            MASTER_ADDR and MASTER_PORT exported by the user
//                                            (mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500)
//   SLURM (srun)                             SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS),
//                                            SLURM_LOCALID (SLURM_NTASKS_PER_NODE); MASTER_ADDR
//                                            defaults to the first host of SLURM_JOB_NODELIST
//                                            (or SLURM_NODELIST) and MASTER_PORT to
//                                            20000 + SLURM_JOB_ID % 20000, so jobs sharing a node
//                                            get different ports
//
// A launcher is recognised by its rank variable; then every variable it needs must be present and
// consistent (0 <= rank < world size, 0 <= local rank, port 1..65535), or the error names what is
// missing or wrong.
#include <functional>
#include <optional>
#include <string>

namespace cpf::dist {

struct LaunchEnvironment {
  std::string launcher;  // "torchrun", "openmpi" or "slurm"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // 0: not given
  std::string master_addr;
  int master_port = 0;
  // Where rank 0's TCP rendezvous listens: CPF_RENDEZVOUS_PORT when set; else MASTER_PORT + 1 in
  // processes that torchrun's agent started (TORCHELASTIC_RUN_ID is set: the agent's own store keeps
  // MASTER_PORT); else MASTER_PORT.
  int rendezvous_port = 0;
  // The job's rendezvous secret, CPF_RENDEZVOUS_TOKEN (empty when unset: then allowed on loopback only).
  std::string rendezvous_token;
  // Where rank 0 listens, CPF_RENDEZVOUS_BIND (empty when unset: the address MASTER_ADDR resolves to;
  // "0.0.0.0", "::" or "*" for every interface).
  std::string rendezvous_bind;
};

// Looks a variable up: the value, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup process_environment();

// nullopt when no launcher's rank variable is set (a single process started by hand).
std::optional<LaunchEnvironment> read_launch_environment(const EnvLookup& env = process_environment());

// The first host name of a SLURM node list: "gpu[03-05,07],cpu1" -> "gpu03", "node7,node8" -> "node7".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace cpf::dist
