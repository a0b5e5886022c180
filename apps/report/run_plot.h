#pragma once
// Loss and accuracy charts of training runs, from their metrics.jsonl: four panels (loss against
// steps, exact match against steps, loss against tokens, exact match against tokens), train loss as a
// solid line, held-out loss and exact match dashed with a marker at every evaluation, one colour per
// run and a legend naming the runs. `cpformer plot` draws several runs over each other; the trainer
// draws its own run as loss.svg in the run folder when it ends.
#include <optional>
#include <string>
#include <vector>

#include "apps/report/svg_chart.h"

namespace cpf::trainer {

struct RunMetrics {
  struct Step {
    int64_t step = 0;
    double loss = 0;                // NaN when the record holds null (a non-finite loss)
    std::optional<int64_t> tokens;  // training tokens of steps 1..step; older runs did not record it
  };
  struct Eval {
    int64_t step = 0;
    std::optional<double> loss, accuracy;
  };
  std::string name;  // the legend's label
  std::string path;  // the metrics.jsonl read
  std::vector<Step> steps;
  std::vector<Eval> evals;
};

// The legend name of a run argument: its folder's name ("runs/default/" -> "default",
// "runs/x/metrics.jsonl" -> "x").
std::string run_label(const std::string& run);

// Reads RUN/metrics.jsonl (or RUN itself, when it names a .jsonl file). Throws cpf::Error naming the
// path: no such folder or file, a line that is not a metrics record (file:line), no records at all.
// A torn last line (no newline: a crash mid-write) is skipped, as the trainer does on resume.
RunMetrics read_run_metrics(const std::string& run, const std::string& name);

// The run's records from step `first_step` on (steps and evaluations), for a chart of a run's tail whose
// axes fit the late values. Throws cpf::Error naming the run and its last step when none is left.
RunMetrics records_from_step(const RunMetrics& run, int64_t first_step);

// The four-panel chart of `runs`; the title names them.
Chart runs_chart(const std::vector<RunMetrics>& runs);

// The trainer's end-of-run plot: RUN_DIR/loss.svg from RUN_DIR/metrics.jsonl, written atomically.
// Returns false (writing nothing) when the run has no step record yet.
bool write_run_plot(const std::string& run_dir);

}  // namespace cpf::trainer
