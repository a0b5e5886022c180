#pragma once
// A small SVG line-chart writer: a grid of panels, each with axes, "nice" ticks, grid lines and
// line series (solid or dashed, optionally with point markers), and one legend above the panels.
// It writes plain SVG 1.1 (no scripts, no external fonts or styles), which browsers, ImageMagick and
// rsvg render alike; `cpformer plot` and the trainer's loss.svg use it (run_plot.h).
#include <string>
#include <utility>
#include <vector>

namespace cpf::trainer {

struct ChartSeries {
  std::string label;  // for tooltips (<title>); the legend is separate
  std::string color;  // "#1f77b4"
  bool dashed = false;
  bool markers = false;  // a circle at every point
  // (x, y) in data units; a non-finite y breaks the line there.
  std::vector<std::pair<double, double>> points;
};

enum class AxisFormat { plain, count, percent };  // 0.25 / 1.2M / 25%

struct ChartPanel {
  std::string title;
  std::string x_label, y_label;
  AxisFormat x_format = AxisFormat::plain, y_format = AxisFormat::plain;
  std::vector<ChartSeries> series;
  std::string empty_note;  // shown instead of axes when no series has a finite point
};

struct LegendEntry {
  std::string label;
  std::string color;
  bool dashed = false;
  bool markers = false;
};

struct Chart {
  std::string title;
  int columns = 2;
  std::vector<ChartPanel> panels;
  std::vector<LegendEntry> legend;
};

// Up to `max_ticks` + 2 round tick values (1, 2, 2.5 or 5 times a power of ten) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 6);
std::string format_tick(double value, AxisFormat format);
// & < > " ' as entities: run names and paths go into the SVG as text.
std::string xml_escape(const std::string& text);

std::string render_svg(const Chart& chart);

}  // namespace cpf::trainer
