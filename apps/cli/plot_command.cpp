// `cpformer plot RUN [RUN ...]`: the loss and exact-match charts of one or several runs (run_plot.h)
// as an SVG, and a PNG next to it when a converter (rsvg-convert, or ImageMagick's convert) is on PATH.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "apps/cli/cli.h"
#include "apps/cli/command_table.h"
#include "apps/report/checked_file.h"
#include "apps/report/run_plot.h"
#include "apps/trainer/trainer.h"

extern char** environ;

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

std::optional<std::string> find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return std::nullopt;
  const std::string dirs = path;
  for (size_t at = 0; at <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', at), dirs.size());
    const fs::path candidate = fs::path(end == at ? "." : dirs.substr(at, end - at)) / program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    at = end + 1;
  }
  return std::nullopt;
}

// Runs `argv` (no shell) and returns "" on success, else why it failed.
std::string run_program(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), nullptr, nullptr, args.data(), environ);
  if (rc != 0) return "cannot start " + argv[0] + ": " + std::strerror(rc);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return "cannot wait for " + argv[0] + ": " + std::strerror(errno);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return argv[0] + (WIFEXITED(status) ? " exited with " + std::to_string(WEXITSTATUS(status))
                                      : " was killed by signal " + std::to_string(WTERMSIG(status)));
}

// The PNG next to `svg`: a line saying what was written, or why not.
std::string write_png(const fs::path& svg) {
  const fs::path png = fs::path(svg).replace_extension(".png");
  std::vector<std::string> argv;
  if (const auto rsvg = find_on_path("rsvg-convert")) {
    argv = {*rsvg, "-o", png.string(), svg.string()};
  } else if (const auto convert = find_on_path("convert")) {
    argv = {*convert, "-density", "110", svg.string(), png.string()};
  } else {
    return "no PNG: neither rsvg-convert (librsvg2-bin) nor convert (imagemagick) is on PATH";
  }
  const std::string failure = run_program(argv);
  if (!failure.empty()) return "warning: PNG not written: " + failure + " (the SVG is complete)";
  return "wrote " + png.string();
}

fs::path output_path(const CommandLine& line) {
  if (const auto out = line.value("--out")) {
    if (fs::path(*out).extension() != ".svg") {
      throw UsageError("--out " + *out + ": expected a file name ending in .svg (the PNG, when made, gets .png)",
                       line.command);
    }
    return *out;
  }
  std::error_code ec;
  if (line.positional.size() == 1 && fs::is_directory(line.positional[0], ec)) {
    return fs::path(line.positional[0]) / "loss.svg";
  }
  return "loss.svg";
}

int run_plot(const CommandLine& line, std::ostream& out, std::ostream&, bool) {
  if (line.positional.empty()) throw UsageError("'plot' needs at least one run folder", line.command);
  const fs::path svg = output_path(line);
  int64_t first_step = 0;
  if (const auto from = line.value("--from-step")) {
    first_step = parse_integer_option("--from-step", *from);
    if (first_step < 0) throw UsageError("--from-step " + *from + ": expected a step >= 0", line.command);
  }
  std::vector<RunMetrics> runs;
  std::set<std::string> names;
  for (const auto& run : line.positional) {
    // Two folders with the same name (runs/a/x, runs/b/x) are told apart by their path.
    std::string name = run_label(run);
    if (!names.insert(name).second) name = run;
    try {
      runs.push_back(records_from_step(read_run_metrics(run, name), first_step));
    } catch (const Error& e) {
      throw DataError(e.message());
    }
  }
  write_file_atomically(svg.string(), render_svg(runs_chart(runs)));
  out << "wrote " << svg.string() << "\n";
  if (!line.has("--no-png")) out << write_png(svg) << "\n";
  return kExitOk;
}

}  // namespace

CommandSpec plot_command() {
  return {
      .name = "plot",
      .arguments = "RUN [RUN ...]",
      .summary = "draw loss and exact match of runs against steps and tokens (SVG, PNG)",
      .description =
          "RUN is a run folder (or its metrics.jsonl). Four panels: loss against steps and against training\n"
          "tokens, held-out exact match against steps and tokens; train loss solid, held-out loss and exact\n"
          "match dashed with a marker per evaluation; one colour per run, named in the legend. Writes\n"
          "RUN/loss.svg for one run folder, ./loss.svg for several (or --out), and a PNG beside it when\n"
          "rsvg-convert or ImageMagick's convert is on PATH. --from-step draws only the records from that step\n"
          "on, so the axes fit the late part of long runs (where curves that differ by 1% still overlap at full\n"
          "scale).",
      .options = {{"--out", "FILE.svg", "where to write the SVG (default: RUN/loss.svg, or ./loss.svg for several)"},
                  {"--from-step", "N", "draw the records of steps >= N only (default: all)"},
                  {"--no-png", "", "write only the SVG"}},
      .run = run_plot};
}

}  // namespace cpf::trainer
