#pragma once
// The closing line of `cpformer train`:
//
//   done: step 2000/3000 in 0:33 | train loss 0.0846 (mean of steps 1901-2000) | eval loss 0.0401 |
//         exact match 96.5% (193/200) | 8.19M tok | 251k tok/s | MFU 41.3% |
//         target exact match >= 95.0% reached at step 2000 | runs/default
//
// "train loss" is the loss of the last step line (the mean over the steps it covers), so the summary
// and the log agree. tok/s is this call's training steps' tokens over their time, from the steps after
// its first step line (which holds the one-time setup) when there are more lines; evaluations and
// checkpoints excluded. MFU appears on GPUs whose peak is known (device_peak.h).
#include <string>

#include "apps/config/config.h"
#include "apps/trainer/trainer.h"

namespace cpf::trainer {

std::string summary_line(const TrainConfig& config, const TrainOutcome& outcome);

// Appends `line` to the run folder's train.log (the console lines the CLI prints after the trainer).
void append_to_train_log(const TrainOutcome& outcome, const std::string& line);

}  // namespace cpf::trainer
