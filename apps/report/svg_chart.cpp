#include "apps/report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace cpf::trainer {
namespace {

constexpr double kPanelWidth = 520, kPanelHeight = 340;
constexpr double kMarginLeft = 70, kMarginRight = 20, kMarginTop = 34, kMarginBottom = 48;
constexpr double kTitleHeight = 36, kLegendRow = 22;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  bool empty() const { return !(lo <= hi); }
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
};

// Maps data coordinates to the plot area of one panel.
struct Frame {
  double left, top, width, height;
  double x0, x1, y0, y1;
  double x(double v) const { return left + (x1 == x0 ? 0.5 : (v - x0) / (x1 - x0)) * width; }
  double y(double v) const { return top + height - (y1 == y0 ? 0.5 : (v - y0) / (y1 - y0)) * height; }
};

void render_axes(std::string& svg, const ChartPanel& panel, const Frame& f, const std::vector<double>& xt,
                 const std::vector<double>& yt) {
  svg += "<g class=\"axes\" font-size=\"11\" fill=\"#333\">\n";
  for (double t : xt) {
    const double px = f.x(t);
    svg += "<line class=\"grid\" x1=\"" + num(px) + "\" y1=\"" + num(f.top) + "\" x2=\"" + num(px) + "\" y2=\"" +
           num(f.top + f.height) + "\" stroke=\"#e5e5e5\"/>\n";
    svg += "<text class=\"tick\" x=\"" + num(px) + "\" y=\"" + num(f.top + f.height + 15) +
           "\" text-anchor=\"middle\">" + xml_escape(format_tick(t, panel.x_format)) + "</text>\n";
  }
  for (double t : yt) {
    const double py = f.y(t);
    svg += "<line class=\"grid\" x1=\"" + num(f.left) + "\" y1=\"" + num(py) + "\" x2=\"" + num(f.left + f.width) +
           "\" y2=\"" + num(py) + "\" stroke=\"#e5e5e5\"/>\n";
    svg += "<text class=\"tick\" x=\"" + num(f.left - 6) + "\" y=\"" + num(py + 4) + "\" text-anchor=\"end\">" +
           xml_escape(format_tick(t, panel.y_format)) + "</text>\n";
  }
  svg += "<rect class=\"frame\" x=\"" + num(f.left) + "\" y=\"" + num(f.top) + "\" width=\"" + num(f.width) +
         "\" height=\"" + num(f.height) + "\" fill=\"none\" stroke=\"#888\"/>\n";
  svg += "<text class=\"x-label\" x=\"" + num(f.left + f.width / 2) + "\" y=\"" + num(f.top + f.height + 34) +
         "\" text-anchor=\"middle\" font-size=\"12\">" + xml_escape(panel.x_label) + "</text>\n";
  // Horizontal, above the axis: rotated text is mis-rendered by ImageMagick's own SVG renderer.
  svg += "<text class=\"y-label\" x=\"" + num(f.left) + "\" y=\"" + num(f.top - 7) +
         "\" text-anchor=\"start\" font-size=\"11\">" + xml_escape(panel.y_label) + "</text>\n";
  svg += "</g>\n";
}

// Pixel coordinates of one unbroken run of points. A long run (a million steps) is thinned per pixel
// column to its first, lowest, highest and last point: the drawn line looks the same (spikes kept),
// and the file stays small.
std::vector<std::pair<double, double>> thin_to_pixels(const std::vector<std::pair<double, double>>& run) {
  if (run.size() <= 4 * kPanelWidth) return run;
  std::vector<std::pair<double, double>> kept;
  size_t begin = 0;
  while (begin < run.size()) {
    size_t end = begin;
    size_t lo = begin, hi = begin;
    while (end < run.size() && std::floor(run[end].first) == std::floor(run[begin].first)) {
      if (run[end].second < run[lo].second) lo = end;
      if (run[end].second > run[hi].second) hi = end;
      ++end;
    }
    for (size_t i : {begin, std::min(lo, hi), std::max(lo, hi), end - 1}) {
      if (kept.empty() || kept.back() != run[i]) kept.push_back(run[i]);
    }
    begin = end;
  }
  return kept;
}

void render_series(std::string& svg, const ChartSeries& s, const Frame& f) {
  svg += "<g class=\"series\" stroke=\"" + s.color + "\" fill=\"none\"><title>" + xml_escape(s.label) + "</title>\n";
  std::vector<std::pair<double, double>> run;  // pixels of the unbroken stretch so far
  auto flush = [&] {
    if (run.empty()) return;
    std::string points;
    for (const auto& [px, py] : thin_to_pixels(run)) points += (points.empty() ? "" : " ") + num(px) + "," + num(py);
    // Stroke and fill on the element itself: some renderers (ImageMagick's own) do not inherit them.
    svg += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.8\"" +
           std::string(s.dashed ? " stroke-dasharray=\"6 4\"" : "") + " points=\"" + points + "\"/>\n";
    run.clear();
  };
  for (const auto& [x, y] : s.points) {
    if (!std::isfinite(x) || !std::isfinite(y)) {
      flush();
      continue;
    }
    run.emplace_back(f.x(x), f.y(y));
  }
  flush();
  if (s.markers) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      svg += "<circle cx=\"" + num(f.x(x)) + "\" cy=\"" + num(f.y(y)) + "\" r=\"2.6\" fill=\"" + s.color + "\"/>\n";
    }
  }
  svg += "</g>\n";
}

void render_panel(std::string& svg, const ChartPanel& panel, double left, double top) {
  svg += "<g class=\"panel\">\n<text class=\"panel-title\" x=\"" + num(left + kPanelWidth / 2) + "\" y=\"" +
         num(top + 20) + "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" + xml_escape(panel.title) +
         "</text>\n";
  Range xr, yr;
  for (const auto& s : panel.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xr.add(x);
      yr.add(y);
    }
  }
  Frame f{left + kMarginLeft,
          top + kMarginTop,
          kPanelWidth - kMarginLeft - kMarginRight,
          kPanelHeight - kMarginTop - kMarginBottom,
          0,
          1,
          0,
          1};
  if (xr.empty()) {
    svg += "<rect class=\"frame\" x=\"" + num(f.left) + "\" y=\"" + num(f.top) + "\" width=\"" + num(f.width) +
           "\" height=\"" + num(f.height) + "\" fill=\"none\" stroke=\"#ccc\"/>\n<text class=\"empty-note\" x=\"" +
           num(f.left + f.width / 2) + "\" y=\"" + num(f.top + f.height / 2) +
           "\" text-anchor=\"middle\" font-size=\"12\" fill=\"#777\">" + xml_escape(panel.empty_note) +
           "</text>\n</g>\n";
    return;
  }
  const std::vector<double> xt = nice_ticks(xr.lo, xr.hi), yt = nice_ticks(yr.lo, yr.hi);
  f.x0 = std::min(xr.lo, xt.front());
  f.x1 = std::max(xr.hi, xt.back());
  f.y0 = std::min(yr.lo, yt.front());
  f.y1 = std::max(yr.hi, yt.back());
  render_axes(svg, panel, f, xt, yt);
  for (const auto& s : panel.series) render_series(svg, s, f);
  svg += "</g>\n";
}

// One row per entry would be tall with many runs: entries flow left to right and wrap.
double render_legend(std::string& svg, const std::vector<LegendEntry>& legend, double width, double top) {
  svg += "<g class=\"legend\" font-size=\"12\">\n";
  double x = 20, y = top + 14;
  for (const auto& e : legend) {
    const double w = 40 + 7.0 * static_cast<double>(e.label.size());
    if (x + w > width - 10 && x > 20) {
      x = 20;
      y += kLegendRow;
    }
    svg += "<g class=\"legend-entry\"><line x1=\"" + num(x) + "\" y1=\"" + num(y - 4) + "\" x2=\"" + num(x + 26) +
           "\" y2=\"" + num(y - 4) + "\" stroke=\"" + e.color + "\" stroke-width=\"2\"" +
           (e.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>";
    // A round <rect>, not a <circle>: ImageMagick's own renderer draws stray lines after a legend circle.
    if (e.markers) {
      svg += "<rect x=\"" + num(x + 10.4) + "\" y=\"" + num(y - 6.6) +
             "\" width=\"5.2\" height=\"5.2\" rx=\"2.6\" fill=\"" + e.color + "\"/>";
    }
    svg += "<text x=\"" + num(x + 32) + "\" y=\"" + num(y) + "\">" + xml_escape(e.label) + "</text></g>\n";
    x += w;
  }
  svg += "</g>\n";
  return legend.empty() ? 0 : y - top + 10;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, max_ticks);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step) * step;
  // From the tick at or below lo to the first tick at or above hi.
  for (int i = 0; ticks.size() < static_cast<size_t>(max_ticks) + 4; ++i) {
    const double t = first + i * step;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    if (t >= hi - step * 1e-9) break;
  }
  return ticks;
}

std::string format_tick(double v, AxisFormat format) {
  char buf[32];
  const double a = std::abs(v);
  if (format == AxisFormat::percent) {
    std::snprintf(buf, sizeof buf, "%g%%", std::round(v * 1000) / 10);
  } else if (format == AxisFormat::count && a >= 1e9) {
    std::snprintf(buf, sizeof buf, "%gG", v / 1e9);
  } else if (format == AxisFormat::count && a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
  } else if (format == AxisFormat::count && a >= 1e3) {
    std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? '?' : c;
    }
  }
  return out;
}

std::string render_svg(const Chart& chart) {
  const int columns = std::max(1, chart.columns);
  const int rows = (static_cast<int>(chart.panels.size()) + columns - 1) / columns;
  const double width = kPanelWidth * columns + 20;
  std::string legend;
  const double legend_height = render_legend(legend, chart.legend, width, kTitleHeight);
  const double panels_top = kTitleHeight + legend_height;
  const double height = panels_top + kPanelHeight * rows + 10;
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    num(width) + "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
                    "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text class=\"chart-title\" x=\"" + num(width / 2) +
         "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" "
         "font-weight=\"bold\">" +
         xml_escape(chart.title) + "</text>\n";
  svg += legend;
  for (size_t i = 0; i < chart.panels.size(); ++i) {
    const double left = 10 + kPanelWidth * static_cast<double>(static_cast<int>(i) % columns);
    const double top = panels_top + kPanelHeight * static_cast<double>(static_cast<int>(i) / columns);
    render_panel(svg, chart.panels[i], left, top);
  }
  return svg + "</svg>\n";
}

}  // namespace cpf::trainer
