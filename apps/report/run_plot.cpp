#include "apps/report/run_plot.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/report/checked_file.h"
#include "framework/core/error.h"

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

// Distinct on white and for the common colour-vision deficiencies (Okabe-Ito, then Tableau).
const char* const kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                               "#56B4E9", "#000000", "#8c564b", "#7f7f7f", "#bcbd22"};

std::optional<double> number_field(const nlohmann::json& record, const char* key) {
  if (!record.contains(key)) return std::nullopt;
  const auto& v = record[key];
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();  // JSON has no NaN: the logger wrote null
  return std::nullopt;
}

std::string metrics_file_of(const std::string& run) {
  std::error_code ec;
  if (fs::is_directory(run, ec)) {
    const fs::path file = fs::path(run) / "metrics.jsonl";
    CPF_CHECK(fs::is_regular_file(file, ec), run, ": no metrics.jsonl in this folder (is it a run folder? train ",
              "writes run.out_dir/run.name/metrics.jsonl)");
    return file.string();
  }
  CPF_CHECK(fs::exists(run, ec), run, ": no such run folder or metrics file");
  CPF_CHECK(fs::is_regular_file(run, ec), run, ": not a run folder or a metrics.jsonl file");
  return run;
}

void add_record(RunMetrics& m, const nlohmann::json& r, const std::string& where) {
  CPF_CHECK(r.is_object() && r.contains("step") && r["step"].is_number_integer(), where,
            ": not a metrics record (expected a JSON object with an integer \"step\")");
  const int64_t step = r["step"].get<int64_t>();
  if (auto loss = number_field(r, "loss")) {
    RunMetrics::Step s{.step = step, .loss = *loss, .tokens = std::nullopt};
    if (r.contains("tokens") && r["tokens"].is_number_integer()) s.tokens = r["tokens"].get<int64_t>();
    m.steps.push_back(s);
  } else {
    RunMetrics::Eval e{.step = step, .loss = number_field(r, "eval_loss"), .accuracy = number_field(r, "accuracy")};
    if (e.loss || e.accuracy) m.evals.push_back(e);
  }
}

// Tokens seen at `step`, from the step records around it (evaluations record no tokens).
std::optional<double> tokens_at(const RunMetrics& m, int64_t step) {
  const RunMetrics::Step* before = nullptr;
  const RunMetrics::Step* after = nullptr;
  for (const auto& s : m.steps) {
    if (!s.tokens) return std::nullopt;  // a run without token counts has no tokens axis
    if (s.step <= step) before = &s;
    if (s.step >= step && !after) after = &s;
  }
  if (before && before->step == step) return static_cast<double>(*before->tokens);
  const double per_step = before  ? static_cast<double>(*before->tokens) / static_cast<double>(before->step)
                          : after ? static_cast<double>(*after->tokens) / static_cast<double>(after->step)
                                  : std::numeric_limits<double>::quiet_NaN();
  return per_step * static_cast<double>(step);
}

}  // namespace

std::string run_label(const std::string& run) {
  fs::path p = fs::path(run).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "runs/default/"
  if (p.filename() == "metrics.jsonl") p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() || name == "." ? run : name;
}

RunMetrics read_run_metrics(const std::string& run, const std::string& name) {
  RunMetrics m;
  m.name = name;
  m.path = metrics_file_of(run);
  std::ifstream in(m.path, std::ios::binary);
  CPF_CHECK(in.good(), m.path, ": cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  size_t line_no = 0;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\n', at);
    const std::string line = all.substr(at, end == std::string::npos ? std::string::npos : end - at);
    ++line_no;
    at = end == std::string::npos ? all.size() : end + 1;
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() && end == std::string::npos) break;  // torn by a crash mid-write
    add_record(m, record, m.path + ":" + std::to_string(line_no));
  }
  CPF_CHECK(!m.steps.empty() || !m.evals.empty(), m.path, ": no metrics records (the run logged no step yet)");
  // Several sessions of a resumed run append in step order; sort in case a file was concatenated.
  std::stable_sort(m.steps.begin(), m.steps.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  std::stable_sort(m.evals.begin(), m.evals.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return m;
}

RunMetrics records_from_step(const RunMetrics& run, int64_t first_step) {
  RunMetrics tail = run;
  std::erase_if(tail.steps, [&](const RunMetrics::Step& s) { return s.step < first_step; });
  std::erase_if(tail.evals, [&](const RunMetrics::Eval& e) { return e.step < first_step; });
  int64_t last = 0;
  for (const auto& s : run.steps) last = std::max(last, s.step);
  for (const auto& e : run.evals) last = std::max(last, e.step);
  CPF_CHECK(!tail.steps.empty() || !tail.evals.empty(), run.path, ": no records from step ", first_step,
            " on (its last record is step ", last, ")");
  return tail;
}

Chart runs_chart(const std::vector<RunMetrics>& runs) {
  Chart chart;
  std::string names;
  for (const auto& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  chart.title = "cpformer: " + (names.size() > 90 ? std::to_string(runs.size()) + " runs" : names);
  const std::string no_accuracy = "no exact match recorded (synthetic tasks with run.eval_examples > 0)";
  ChartPanel loss_steps{"loss", "step", "loss", AxisFormat::count, AxisFormat::plain, {}, "no loss recorded"};
  ChartPanel acc_steps{"exact match (held-out)", "step", "exact match", AxisFormat::count,
                       AxisFormat::percent,      {},     no_accuracy};
  ChartPanel loss_tokens{"loss", "training tokens",         "loss", AxisFormat::count, AxisFormat::plain,
                         {},     "no token counts recorded"};
  ChartPanel acc_tokens{"exact match (held-out)",  "training tokens",   "exact match",
                        AxisFormat::count,         AxisFormat::percent, {},
                        "no token counts recorded"};
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunMetrics& r = runs[i];
    const std::string color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    ChartSeries train{r.name + " train loss", color, false, false, {}}, train_t = train;
    ChartSeries eval{r.name + " eval loss", color, true, true, {}}, eval_t = eval;
    ChartSeries acc{r.name + " exact match", color, true, true, {}}, acc_t = acc;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const auto& s : r.steps) {
      train.points.emplace_back(static_cast<double>(s.step), s.loss);
      if (s.tokens) train_t.points.emplace_back(static_cast<double>(*s.tokens), s.loss);
    }
    for (const auto& e : r.evals) {
      const double x = static_cast<double>(e.step), tokens = tokens_at(r, e.step).value_or(nan);
      if (e.loss) eval.points.emplace_back(x, *e.loss), eval_t.points.emplace_back(tokens, *e.loss);
      if (e.accuracy) acc.points.emplace_back(x, *e.accuracy), acc_t.points.emplace_back(tokens, *e.accuracy);
    }
    loss_steps.series.push_back(train);
    loss_steps.series.push_back(eval);
    acc_steps.series.push_back(acc);
    loss_tokens.series.push_back(train_t);
    loss_tokens.series.push_back(eval_t);
    acc_tokens.series.push_back(acc_t);
    chart.legend.push_back({r.name, color, false, false});
  }
  chart.legend.push_back({"train loss", "#444", false, false});
  chart.legend.push_back({"held-out loss / exact match", "#444", true, true});
  const bool any_accuracy = std::any_of(runs.begin(), runs.end(), [](const RunMetrics& r) {
    return std::any_of(r.evals.begin(), r.evals.end(),
                       [](const RunMetrics::Eval& e) { return e.accuracy.has_value(); });
  });
  if (!any_accuracy) acc_tokens.empty_note = no_accuracy;  // say what is missing, not both
  chart.panels = {loss_steps, acc_steps, loss_tokens, acc_tokens};
  return chart;
}

bool write_run_plot(const std::string& run_dir) {
  std::error_code ec;
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (!fs::is_regular_file(metrics, ec) || fs::file_size(metrics, ec) == 0) return false;
  const RunMetrics m = read_run_metrics(run_dir, run_label(run_dir));
  if (m.steps.empty()) return false;
  write_file_atomically((fs::path(run_dir) / "loss.svg").string(), render_svg(runs_chart({m})));
  return true;
}

}  // namespace cpf::trainer
