#pragma once
// spawn_local_processes: run n copies of a program on this machine, one per rank, as torchrun does
// for one node.
//
//   SpawnResult r = dist::spawn_local_processes(4, {"/path/cpformer", "train", "cfg.yaml"});
//   if (r.exit_code != 0) std::cerr << r.message << "\n";
//
// Each child gets the parent's environment plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>, CPF_RENDEZVOUS_TOKEN=<a fresh random secret of this
// launch> and NCCL_NVLS_ENABLE=0 (NVLink multicast stays off on the shared GPU machines), then
// `extra_env` (which may override any of them). The children's stdout and stderr are forwarded line
// by line with a "[rank r] " prefix.
//
// If a child exits non-zero or is killed by a signal, the others are terminated (SIGTERM, then
// SIGKILL after `grace`), and the result names the first rank that failed and its status; it never
// hangs on the survivors. "First" is by the time each child ended (a thread per child waits for it),
// so a survivor that exits at once because its peer died is not the one blamed. Children die with the parent
// (PR_SET_PDEATHSIG) and run in their own process groups, so their own children are terminated with them.
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace cpf::dist {

struct SpawnOptions {
  std::map<std::string, std::string> extra_env;
  // Time the other ranks get between SIGTERM and SIGKILL once one failed.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
  // Where the children's output lines go (without the newline); default: this process's stdout,
  // prefixed "[rank r] ".
  std::function<void(int rank, std::string_view line)> output;
  // 0: find a free port.
  int master_port = 0;
};

struct SpawnResult {
  int exit_code = 0;  // 0 when every rank exited 0; else the first failure's code (128 + signal when killed)
  int failed_rank = -1;
  // "rank 1 exited with status 3; terminated the other ranks [0,2]", or "" on success. Ranks that
  // failed by themselves besides the one blamed follow it: "rank 0 exited with status 4 (also: rank 1
  // exited with status 3)". The blamed one is the first seen to end, a heuristic when deaths coincide.
  std::string message;
};

// Runs argv (argv[0] is looked up in PATH when it has no '/') n times. Returns once every child ended.
SpawnResult spawn_local_processes(int n, const std::vector<std::string>& argv, const SpawnOptions& options = {});

}  // namespace cpf::dist
