#pragma once
// `cpformer check-config`: the report on a config that passed every config check (load_train_config),
// plus what `train` checks before its first step that the config alone cannot say: the data and
// held-out files (opened when present), the CUDA device and the NCCL backend this build and machine
// have. The first line reads "<file>: OK" only when every one of those was checked; otherwise it says
// "NOT fully checked" and names each thing it could not check, because train may refuse the config
// there (a config may be checked before its data is downloaded, or on a machine without GPUs).
#include <ostream>
#include <string>
#include <vector>

#include "apps/config/config.h"

namespace cpf::trainer {

struct RuntimeNeed {
  std::string what;  // "data files", "held-out files", "cuda device", "nccl backend"
  bool checked = false;
  std::string detail;  // what was found, or why it could not be checked
};

// The data files, held-out files, device and backend `config` needs, each checked where this machine
// can. Throws DataError when present files cannot be read (train would stop the same way).
std::vector<RuntimeNeed> check_runtime_needs(const TrainConfig& config);

// The whole report: verdict line, model, data, parallel, compute, then one line per runtime need.
void print_config_check(const std::string& name, const TrainConfig& config, std::ostream& out);

}  // namespace cpf::trainer
