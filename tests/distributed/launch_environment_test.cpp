// Reading the launcher variables of torchrun, OpenMPI and SLURM (framework/distributed/environment.h).
#include <gtest/gtest.h>

#include <map>

#include "framework/distributed/environment.h"
#include "framework/distributed/launcher.h"
#include "support/test_utils.h"

namespace cpf::testing {
namespace {

using Vars = std::map<std::string, std::string>;

dist::EnvLookup lookup(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Vars torchrun() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29500"}};
}

TEST(LaunchEnvironment, NoLauncherMeansNone) {
  EXPECT_FALSE(dist::read_launch_environment(lookup({})).has_value());
  EXPECT_FALSE(dist::read_launch_environment(lookup({{"MASTER_ADDR", "x"}, {"PATH", "/bin"}})).has_value());
}

TEST(LaunchEnvironment, Torchrun) {
  const auto e = dist::read_launch_environment(lookup(torchrun()));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "torchrun");
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29500);
}

TEST(LaunchEnvironment, RendezvousPortAvoidsTorchrunsAgentStore) {
  // spawn_local_processes and hand-set variables: the rendezvous listens on MASTER_PORT itself.
  EXPECT_EQ(dist::read_launch_environment(lookup(torchrun()))->rendezvous_port, 29500);
  // A process torchrun's agent started: the agent's store holds MASTER_PORT, so the next port.
  Vars v = torchrun();
  v["TORCHELASTIC_RUN_ID"] = "none";
  EXPECT_EQ(dist::read_launch_environment(lookup(v))->rendezvous_port, 29501);
  // An explicit port wins for every launcher.
  v["CPF_RENDEZVOUS_PORT"] = "31000";
  EXPECT_EQ(dist::read_launch_environment(lookup(v))->rendezvous_port, 31000);
  v["CPF_RENDEZVOUS_PORT"] = "70000";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "CPF_RENDEZVOUS_PORT=70000 is not a TCP port (1..65535)");
  v.erase("CPF_RENDEZVOUS_PORT");
  v["MASTER_PORT"] = "65535";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)),
                   "MASTER_PORT=65535 leaves no next port for the rendezvous (torchrun's agent holds MASTER_PORT)");
}

TEST(LaunchEnvironment, RendezvousTokenAndBindAddressFlowToTheRendezvous) {
  const auto plain = dist::read_launch_environment(lookup(torchrun()));
  EXPECT_EQ(plain->rendezvous_token, "");
  EXPECT_EQ(plain->rendezvous_bind, "");
  Vars v = torchrun();
  v["CPF_RENDEZVOUS_TOKEN"] = "0123456789abcdef0123";
  v["CPF_RENDEZVOUS_BIND"] = "0.0.0.0";
  const auto set = dist::read_launch_environment(lookup(v));
  EXPECT_EQ(set->rendezvous_token, "0123456789abcdef0123");
  EXPECT_EQ(set->rendezvous_bind, "0.0.0.0");
  v["CPF_RENDEZVOUS_BIND"] = "";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)),
                   "launch environment (torchrun): CPF_RENDEZVOUS_BIND is set but empty");
}

TEST(LaunchEnvironment, TorchrunErrorsNameTheVariable) {
  for (const char* name : {"WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Vars v = torchrun();
    v.erase(name);
    EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), std::string(name) + " is not set");
  }
  Vars v = torchrun();
  v.erase("RANK");
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "WORLD_SIZE is set but RANK is not");
  v = torchrun();
  v["RANK"] = "8";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "RANK=8 is not in 0..7 (WORLD_SIZE=8)");
  v = torchrun();
  v["RANK"] = "two";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "RANK='two' is not an integer");
  v = torchrun();
  v["WORLD_SIZE"] = "4x";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "WORLD_SIZE='4x' is not an integer");
  v = torchrun();
  v["WORLD_SIZE"] = "0";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "WORLD_SIZE=0 must be at least 1");
  v = torchrun();
  v["LOCAL_RANK"] = "2";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "LOCAL_RANK=2 is not below the local world size 2");
  v = torchrun();
  v["MASTER_PORT"] = "70000";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "MASTER_PORT=70000 is not a TCP port");
  v = torchrun();
  v["MASTER_ADDR"] = "";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "MASTER_ADDR is empty");
}

TEST(LaunchEnvironment, OpenMpi) {
  Vars v{{"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"},   {"MASTER_PORT", "1234"}};
  const auto e = dist::read_launch_environment(lookup(v));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "openmpi");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 4);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 1234);
  Vars missing = v;
  missing.erase("MASTER_PORT");
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(missing)), "missing: MASTER_PORT");
  missing = v;
  missing.erase("OMPI_COMM_WORLD_SIZE");
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(missing)), "OMPI_COMM_WORLD_SIZE is not set");
  missing = v;
  missing["OMPI_COMM_WORLD_LOCAL_RANK"] = "9";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(missing)), "OMPI_COMM_WORLD_LOCAL_RANK=9 is not in 0..7");
}

TEST(LaunchEnvironment, SlurmDerivesTheAddressAndPort) {
  Vars v{{"SLURM_PROCID", "6"},
         {"SLURM_NTASKS", "8"},
         {"SLURM_LOCALID", "2"},
         {"SLURM_JOB_NODELIST", "gpu[03-05,07],cpu1"},
         {"SLURM_JOB_ID", "123456"}};
  const auto e = dist::read_launch_environment(lookup(v));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "slurm");
  EXPECT_EQ(e->rank, 6);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 2);
  EXPECT_EQ(e->master_addr, "gpu03");
  EXPECT_EQ(e->master_port, 20000 + 123456 % 20000);
  // Explicit MASTER_ADDR/PORT win; SLURM_NPROCS stands in for SLURM_NTASKS.
  v["MASTER_ADDR"] = "head";
  v["MASTER_PORT"] = "29400";
  v.erase("SLURM_NTASKS");
  v["SLURM_NPROCS"] = "8";
  const auto f = dist::read_launch_environment(lookup(v));
  EXPECT_EQ(f->master_addr, "head");
  EXPECT_EQ(f->master_port, 29400);
  EXPECT_EQ(f->world_size, 8);
}

TEST(LaunchEnvironment, SlurmErrors) {
  Vars v{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "7"}};
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "neither MASTER_ADDR nor SLURM_JOB_NODELIST");
  v["SLURM_NODELIST"] = "n1";
  v.erase("SLURM_JOB_ID");
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "neither MASTER_PORT nor SLURM_JOB_ID");
  v["SLURM_JOB_ID"] = "7";
  v.erase("SLURM_LOCALID");
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "SLURM_LOCALID is not set");
  v["SLURM_LOCALID"] = "0";
  v["SLURM_PROCID"] = "2";
  EXPECT_CPF_ERROR(dist::read_launch_environment(lookup(v)), "SLURM_PROCID=2 is not in 0..1 (SLURM_NTASKS=2)");
}

TEST(LaunchEnvironment, TorchrunWinsOverSlurm) {
  // torchrun inside an srun allocation: RANK is per process, SLURM_PROCID per node task.
  Vars v = torchrun();
  v["SLURM_PROCID"] = "0";
  v["SLURM_NTASKS"] = "2";
  EXPECT_EQ(dist::read_launch_environment(lookup(v))->launcher, "torchrun");
}

TEST(LaunchEnvironment, FirstSlurmHost) {
  EXPECT_EQ(dist::first_slurm_host("node7"), "node7");
  EXPECT_EQ(dist::first_slurm_host("node7,node8"), "node7");
  EXPECT_EQ(dist::first_slurm_host("gpu[03-05,07]"), "gpu03");
  EXPECT_EQ(dist::first_slurm_host("rack1-[12,14]-ib"), "rack1-12-ib");
  EXPECT_CPF_ERROR(dist::first_slurm_host("gpu[03"), "unbalanced brackets");
  EXPECT_CPF_ERROR(dist::first_slurm_host(""), "cannot read a host");
}

TEST(LaunchEnvironment, NcclBackendMissingFromThisProgram) {
  // This test binary links cpf_distributed only: the NCCL backend is not registered.
  EXPECT_FALSE(dist::has_launch_backend(dist::Backend::nccl));
  EXPECT_TRUE(dist::has_launch_backend(dist::Backend::thread));
  EXPECT_CPF_ERROR(dist::launch(2, [](dist::RankContext&) {}, {.backend = dist::Backend::nccl}),
                   "the nccl backend is not part of this program; link cpf_distributed_nccl");
}

}  // namespace
}  // namespace cpf::testing
