// `cpformer plot`: the SVG's structure (well-formed XML, four panels, one legend entry per run, one
// polyline per series, every point inside its panel), runs overlaid, the PNG when a converter
// exists, and every rejected input with its message and exit code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <regex>

#include "apps/report/run_plot.h"
#include "apps/report/svg_chart.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::read_file;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Checks that every element is closed in order and attribute values are quoted; returns "" or the problem.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t at = xml.find('<'); at != std::string::npos; at = xml.find('<', at + 1)) {
    const size_t end = xml.find('>', at);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(at);
    const std::string tag = xml.substr(at + 1, end - at - 1);
    if (tag.empty() || tag[0] == '?') continue;
    if (count(tag, "\"") % 2 != 0) return "odd quotes in <" + tag + ">";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "</" + tag.substr(1) + "> closes nothing open";
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

// A run folder with `steps` step records (every 10 steps, 100 tokens a step) and an evaluation every 20.
std::filesystem::path fake_run(const std::string& name, int steps, double scale, bool with_accuracy = true) {
  const auto dir = scratch_dir(name);
  std::string jsonl;
  for (int s = 10; s <= steps; s += 10) {
    jsonl += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(scale * 3.0 / s) +
             ",\"tokens\":" + std::to_string(100 * s) + ",\"lr\":0.001}\n";
    if (s % 20 == 0) {
      jsonl += "{\"step\":" + std::to_string(s) + ",\"eval_loss\":" + std::to_string(scale * 3.5 / s) +
               (with_accuracy ? ",\"accuracy\":" + std::to_string(s / (steps + 1.0)) : "") + "}\n";
    }
  }
  write_file(dir / "metrics.jsonl", jsonl);
  return dir;
}

// The (x, y) pairs of every polyline and circle.
std::vector<std::pair<double, double>> plotted_points(const std::string& svg) {
  std::vector<std::pair<double, double>> points;
  const std::regex pair(R"((-?[0-9.]+),(-?[0-9.]+))");
  const std::regex polyline(R"re(<polyline[^>]* points="([^"]*)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), polyline); it != std::sregex_iterator(); ++it) {
    const std::string list = (*it)[1];
    for (auto p = std::sregex_iterator(list.begin(), list.end(), pair); p != std::sregex_iterator(); ++p) {
      points.emplace_back(std::stod((*p)[1]), std::stod((*p)[2]));
    }
  }
  return points;
}

TEST(PlotSvg, TwoRunsOverlaidWithALegend) {
  const auto a = fake_run("lr_small", 100, 1.0), b = fake_run("lr_large", 60, 0.8);
  const auto out = scratch_dir("out") / "compare.svg";
  const auto r = run({"plot", a.string(), b.string(), "--out", out.string(), "--no-png"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "wrote " + out.string() + "\n");
  const std::string svg = read_file(out);
  EXPECT_EQ(xml_problem(svg), "") << svg;
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(count(svg, "<g class=\"panel\">"), 4u);
  for (const char* title : {"bold\">loss</text>", "bold\">exact match (held-out)</text>", "12\">step</text>",
                            "12\">training tokens</text>"}) {
    EXPECT_EQ(count(svg, title), 2u) << title;  // panel titles (bold) and x-axis labels (size 12)
  }
  // Legend: each run by name in its own colour, then the two line styles.
  EXPECT_EQ(count(svg, "<g class=\"legend-entry\">"), 4u);
  const std::string name_a = a.filename().string(), name_b = b.filename().string();
  EXPECT_NE(svg.find("stroke=\"#0072B2\" stroke-width=\"2\"/><text x=\"52.00\" y=\"50.00\">" + name_a + "</text>"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(">" + name_b + "</text>"), std::string::npos);
  // Per run: train and eval loss against steps and tokens, exact match against both: 6 lines.
  EXPECT_EQ(count(svg, "<polyline"), 12u);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 2u * 4 + 1) << "eval lines dashed, plus the legend's";
  // Markers: one per evaluation and panel (run a: 5 evaluations, run b: 3) in 4 panels.
  EXPECT_EQ(count(svg, "<circle"), (5u + 3u) * 4);
  EXPECT_EQ(count(svg, "rx=\"2.6\""), 1u) << "the legend's marker";
  // Every point lies inside the drawing.
  const std::regex size(R"re(width="([0-9.]+)" height="([0-9.]+)")re");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, size));
  const double width = std::stod(m[1]), height = std::stod(m[2]);
  const auto points = plotted_points(svg);
  // Run a: 10 step records and 5 evaluations, run b: 6 and 3; train loss twice, eval loss and exact match 4 times.
  EXPECT_EQ(points.size(), (2u * 10 + 4u * 5) + (2u * 6 + 4u * 3));
  for (const auto& [x, y] : points) {
    EXPECT_GT(x, 0);
    EXPECT_LT(x, width);
    EXPECT_GT(y, 0);
    EXPECT_LT(y, height);
  }
}

// --from-step keeps the records of the late steps only, so the axes fit them.
TEST(PlotSvg, FromStepDrawsOnlyTheLateRecords) {
  const auto a = fake_run("tail", 100, 1.0);
  const auto out = scratch_dir("tail_out") / "tail.svg";
  ASSERT_EQ(run({"plot", a.string(), "--from-step", "50", "--out", out.string(), "--no-png"}).code, kExitOk);
  const std::string svg = read_file(out);
  // Steps 50..100 (6 records) twice, evaluations 60, 80, 100 in the four panels.
  EXPECT_EQ(plotted_points(svg).size(), 2u * 6 + 4u * 3);
  EXPECT_EQ(count(svg, "<circle"), 3u * 4);
  // The loss axis fits the tail (train loss 3/50 .. 3/100): its ticks are hundredths, not whole numbers.
  EXPECT_NE(svg.find(">0.06</text>"), std::string::npos) << svg;
}

TEST(PlotSvg, OneRunFolderDefaultsToItsLossSvg) {
  const auto a = fake_run("run", 40, 1.0);
  const auto r = run({"plot", a.string(), "--no-png"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "wrote " + (a / "loss.svg").string() + "\n");
  EXPECT_EQ(xml_problem(read_file(a / "loss.svg")), "");
  // The metrics file itself works too, named after its folder.
  const auto out = scratch_dir("out") / "x.svg";
  ASSERT_EQ(run({"plot", (a / "metrics.jsonl").string(), "--out", out.string(), "--no-png"}).code, kExitOk);
  EXPECT_NE(read_file(out).find(">" + a.filename().string() + "</text>"), std::string::npos);
}

TEST(PlotSvg, WithoutAccuracyOrTokensThePanelsSaySo) {
  const auto dir = scratch_dir("text_run");
  write_file(dir / "metrics.jsonl",
             "{\"step\":5,\"loss\":2.5}\n{\"step\":10,\"loss\":2.0}\n{\"step\":10,\"eval_loss\":2.2}\n");
  const auto out = scratch_dir("out") / "p.svg";
  ASSERT_EQ(run({"plot", dir.string(), "--out", out.string(), "--no-png"}).code, kExitOk);
  const std::string svg = read_file(out);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"empty-note\""), 3u);
  EXPECT_EQ(count(svg, ">no token counts recorded</text>"), 1u);
  EXPECT_EQ(count(svg, ">no exact match recorded (synthetic tasks with run.eval_examples &gt; 0)</text>"), 2u);
  EXPECT_EQ(count(svg, "<polyline"), 2u);  // train and eval loss against steps
}

TEST(PlotSvg, ANonFiniteLossBreaksTheLine) {
  const auto dir = scratch_dir("nan_run");
  write_file(
      dir / "metrics.jsonl",
      "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":2.4}\n{\"step\":3,\"loss\":null}\n{\"step\":4,\"loss\":2.2}\n"
      "{\"step\":5,\"loss\":2.1}\n");
  const auto out = scratch_dir("out") / "p.svg";
  ASSERT_EQ(run({"plot", dir.string(), "--out", out.string(), "--no-png"}).code, kExitOk);
  EXPECT_EQ(count(read_file(out), "<polyline"), 2u);
}

TEST(PlotSvg, NamesAreEscaped) {
  RunMetrics m;
  m.name = "a<b & \"c\"";
  m.steps = {{1, 2.0, 10}, {2, 1.5, 20}};
  const std::string svg = render_svg(runs_chart({m}));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find(">a&lt;b &amp; &quot;c&quot;</text>"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(PlotSvg, AMillionStepsStaySmallAndKeepTheirSpikes) {
  RunMetrics m;
  m.name = "long";
  for (int64_t s = 1; s <= 1000000; ++s) {
    const double spike = s == 654321 ? 40.0 : 0.0;  // one bad step must stay visible
    m.steps.push_back({s, 3.0 / std::sqrt(static_cast<double>(s)) + spike, s * 1000});
  }
  const std::string svg = render_svg(runs_chart({m}));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_LT(svg.size(), 200000u);
  // The spike is the highest point drawn, level with the loss axis' tick "40".
  const auto points = plotted_points(svg);
  double top = 1e9;
  for (const auto& [x, y] : points) top = std::min(top, y);
  const std::regex tick40(R"re(<text class="tick" x="[0-9.]+" y="([0-9.]+)" text-anchor="end">40</text>)re");
  std::smatch t;
  ASSERT_TRUE(std::regex_search(svg, t, tick40)) << "no loss tick at 40";
  EXPECT_NEAR(top, std::stod(t[1]) - 4, 1.0);
}

TEST(PlotSvg, NiceTicksCoverTheRangeWithRoundSteps) {
  EXPECT_EQ(nice_ticks(0, 100), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  const auto ticks = nice_ticks(1.62, 2.47);
  const std::vector<double> expected{1.6, 1.8, 2.0, 2.2, 2.4, 2.6};
  ASSERT_EQ(ticks.size(), expected.size());
  for (size_t i = 0; i < ticks.size(); ++i) EXPECT_NEAR(ticks[i], expected[i], 1e-12);
  const auto flat = nice_ticks(0.05, 0.05);
  EXPECT_LE(flat.front(), 0.05);
  EXPECT_GE(flat.back(), 0.05);
  EXPECT_EQ(format_tick(1500000, AxisFormat::count), "1.5M");
  EXPECT_EQ(format_tick(0.25, AxisFormat::percent), "25%");
  EXPECT_EQ(format_tick(2.5, AxisFormat::plain), "2.5");
}

TEST(PlotPng, WrittenByAConverterOnPathOrTheReasonWhyNot) {
  const auto a = fake_run("run", 40, 1.0);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  const auto out = scratch_dir("out") / "p.svg";
  // No converter reachable: the SVG is written, and the line says why there is no PNG.
  const auto empty = scratch_dir("empty_path");
  setenv("PATH", empty.c_str(), 1);
  const auto none = run({"plot", a.string(), "--out", out.string()});
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(none.code, kExitOk) << none.err;
  EXPECT_EQ(none.out, "wrote " + out.string() +
                          "\nno PNG: neither rsvg-convert (librsvg2-bin) nor convert "
                          "(imagemagick) is on PATH\n");
  const auto with = run({"plot", a.string(), "--out", out.string()});
  EXPECT_EQ(with.code, kExitOk) << with.err;
  if (with.out.find("\nwrote ") == std::string::npos) GTEST_SKIP() << "no SVG converter here: " << with.out;
  const std::string bytes = read_file(std::filesystem::path(out).replace_extension(".png"));
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(PlotPng, AFailingConverterIsAWarningAndTheSvgStays) {
  const auto a = fake_run("run", 40, 1.0);
  const auto bin = scratch_dir("bin");
  write_file(bin / "rsvg-convert", "#!/bin/sh\nexit 3\n");
  std::filesystem::permissions(bin / "rsvg-convert", std::filesystem::perms::owner_all);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", bin.c_str(), 1);
  const auto out = scratch_dir("out") / "p.svg";
  const auto r = run({"plot", a.string(), "--out", out.string()});
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "wrote " + out.string() + "\nwarning: PNG not written: " + (bin / "rsvg-convert").string() +
                       " exited with 3 (the SVG is complete)\n");
  EXPECT_EQ(xml_problem(read_file(out)), "");
}

TEST(PlotErrors, RejectedInputsNameTheProblem) {
  auto expect = [](const std::vector<std::string>& args, int code, const std::string& message) {
    const auto r = run(args);
    EXPECT_EQ(r.code, code) << r.err;
    EXPECT_EQ(r.err.rfind(message, 0), 0u) << r.err << "\nexpected: " << message;
  };
  expect({"plot"}, kExitConfig, "cpformer: 'plot' needs at least one run folder\nusage: cpformer plot");
  const auto a = fake_run("run", 40, 1.0);
  expect({"plot", a.string(), "--out", "x.png"}, kExitConfig,
         "cpformer: --out x.png: expected a file name ending in .svg (the PNG, when made, gets .png)");
  expect({"plot", "/nonexistent/run"}, kExitData,
         "cpformer: data error: /nonexistent/run: no such run folder or metrics file");
  const auto empty_dir = scratch_dir("no_metrics");
  expect({"plot", empty_dir.string()}, kExitData,
         "cpformer: data error: " + empty_dir.string() + ": no metrics.jsonl in this folder (is it a run folder?");
  const auto bad = scratch_dir("bad");
  write_file(bad / "metrics.jsonl", "{\"step\":1,\"loss\":2}\nnot json\n{\"step\":2,\"loss\":1}\n");
  expect({"plot", bad.string()}, kExitData,
         "cpformer: data error: " + (bad / "metrics.jsonl").string() +
             ":2: not a metrics record (expected a JSON object with an integer \"step\")");
  expect({"plot", "/dev/null"}, kExitData, "cpformer: data error: /dev/null: not a run folder or a metrics.jsonl file");
  expect({"plot", a.string(), "--from-step", "-1"}, kExitConfig, "cpformer: --from-step -1: expected a step >= 0");
  expect({"plot", a.string(), "--from-step", "x"}, kExitConfig, "cpformer: --from-step x: expected a number");
  expect({"plot", a.string(), "--from-step", "1000"}, kExitData,
         "cpformer: data error: " + (a / "metrics.jsonl").string() +
             ": no records from step 1000 on (its last record is step 40)");
  const auto blank = scratch_dir("blank");
  write_file(blank / "metrics.jsonl", "");
  expect({"plot", blank.string()}, kExitData,
         "cpformer: data error: " + (blank / "metrics.jsonl").string() + ": no metrics records");
}

TEST(PlotErrors, ATornLastLineIsSkipped) {
  const auto dir = scratch_dir("torn");
  write_file(dir / "metrics.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1}\n{\"step\":3,\"lo");
  const RunMetrics m = read_run_metrics(dir.string(), "torn");
  EXPECT_EQ(m.steps.size(), 2u);
}

}  // namespace
}  // namespace cpf::trainer
