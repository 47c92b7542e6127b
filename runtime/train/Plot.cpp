#include "runtime/train/Plot.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Status.h"
#include "runtime/train/Metrics.h"

namespace hcp::train {
namespace {

// Tableau 10: distinct, and readable on white.
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Tick labels of one axis: in thousands ("20k") when the axis reaches 10,000, in millions from
// one million, in billions from one billion, chosen by the axis's largest value so that every
// label of the axis has the same unit; as many decimals as the tick spacing needs; 0 as "0".
struct LabelUnit {
  double scale = 1;
  const char* suffix = "";
};

LabelUnit UnitOf(const AxisTicks& ticks) {
  const double m = std::max(std::abs(ticks.lo), std::abs(ticks.hi));
  if (m >= 1e9) return {1e9, "G"};
  if (m >= 1e6) return {1e6, "M"};
  if (m >= 1e4) return {1e3, "k"};
  return {};
}

std::string TickLabel(double value, double step, LabelUnit unit) {
  if (std::abs(value) < step * 1e-9) return "0";  // no "-0", "1e-17" or "0.0M"
  const int decimals =
      std::clamp(-static_cast<int>(std::floor(std::log10(step / unit.scale) + 1e-9)), 0, 12);
  return absl::StrFormat("%.*f%s", decimals, value / unit.scale, unit.suffix);
}

std::string Num(double v) { return absl::StrFormat("%.2f", v); }

}  // namespace

AxisTicks NiceTicks(double lo, double hi, int target, bool integer_step) {
  AxisTicks ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return ticks;
  if (lo > hi) std::swap(lo, hi);
  if (hi - lo <= std::abs(hi) * 1e-12) {
    const double half = std::max(std::abs(lo) * 0.5, 0.5);
    lo -= half;
    hi += half;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / power;
  double step = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  step *= power;
  if (integer_step) step = std::max(step, 1.0);
  ticks.step = step;
  ticks.lo = std::floor(lo / step + 1e-9) * step;
  ticks.hi = std::ceil(hi / step - 1e-9) * step;
  const int64_t count = std::llround((ticks.hi - ticks.lo) / step);
  for (int64_t i = 0; i <= count; ++i)
    ticks.values.push_back(ticks.lo + static_cast<double>(i) * step);
  return ticks;
}

absl::StatusOr<std::string> RenderLossSvg(const std::vector<PlotSeries>& series,
                                          const PlotOptions& o) {
  if (series.empty()) return absl::InvalidArgumentError("nothing to plot: no runs given");
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
  double y_min = x_min, y_max = -x_min;
  for (const PlotSeries& s : series) {
    if (s.x.size() != s.y.size()) {
      return absl::InvalidArgumentError(absl::StrFormat("run %s has %d x values but %d y values",
                                                        s.name, s.x.size(), s.y.size()));
    }
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]);
      x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]);
      y_max = std::max(y_max, s.y[i]);
    }
  }
  if (!std::isfinite(x_min)) {
    return absl::InvalidArgumentError("nothing to plot: no run has a finite point");
  }
  const double left = o.margin_left, right = o.width - o.margin_right;
  const double top = o.margin_top, bottom = o.height - o.margin_bottom;
  if (!(right > left && bottom > top)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plot of %dx%d has no room inside its margins", o.width, o.height));
  }
  const AxisTicks xt = NiceTicks(x_min, x_max, 8, /*integer_step=*/true);
  const AxisTicks yt = NiceTicks(y_min, y_max, 6);
  auto px = [&](double x) { return left + (x - xt.lo) / (xt.hi - xt.lo) * (right - left); };
  auto py = [&](double y) { return bottom - (y - yt.lo) / (yt.hi - yt.lo) * (bottom - top); };

  std::string svg;
  absl::StrAppendFormat(&svg,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
                        o.width, o.height, o.width, o.height);
  absl::StrAppendFormat(&svg, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", o.width,
                        o.height);
  absl::StrAppendFormat(
      &svg, "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\" font-size=\"16\">%s</text>\n",
      Num((left + right) / 2), Num(top / 2 + 6), Escape(o.title));

  // Grid and ticks.
  svg += "<g class=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (double x : xt.values) {
    absl::StrAppendFormat(&svg, "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\"/>\n", Num(px(x)),
                          Num(top), Num(px(x)), Num(bottom));
  }
  for (double y : yt.values) {
    absl::StrAppendFormat(&svg, "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\"/>\n", Num(left),
                          Num(py(y)), Num(right), Num(py(y)));
  }
  svg += "</g>\n<g class=\"axes\" stroke=\"black\" stroke-width=\"1\">\n";
  absl::StrAppendFormat(&svg, "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\"/>\n", Num(left),
                        Num(bottom), Num(right), Num(bottom));
  absl::StrAppendFormat(&svg, "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\"/>\n", Num(left),
                        Num(top), Num(left), Num(bottom));
  for (double x : xt.values) {
    absl::StrAppendFormat(&svg, "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\"/>\n", Num(px(x)),
                          Num(bottom), Num(px(x)), Num(bottom + 5));
  }
  for (double y : yt.values) {
    absl::StrAppendFormat(&svg, "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\"/>\n", Num(left - 5),
                          Num(py(y)), Num(left), Num(py(y)));
  }
  svg += "</g>\n<g class=\"tick-labels\">\n";
  for (double x : xt.values) {
    absl::StrAppendFormat(&svg, "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n",
                          Num(px(x)), Num(bottom + 18), TickLabel(x, xt.step, UnitOf(xt)));
  }
  for (double y : yt.values) {
    absl::StrAppendFormat(&svg, "<text x=\"%s\" y=\"%s\" text-anchor=\"end\">%s</text>\n",
                          Num(left - 8), Num(py(y) + 4), TickLabel(y, yt.step, UnitOf(yt)));
  }
  svg += "</g>\n";
  absl::StrAppendFormat(&svg, "<text x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n",
                        Num((left + right) / 2), Num(o.height - 12),
                        o.x_axis == PlotXAxis::kStep ? "step" : "tokens");
  absl::StrAppendFormat(&svg,
                        "<text x=\"16\" y=\"%s\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 16 %s)\">loss</text>\n",
                        Num((top + bottom) / 2), Num((top + bottom) / 2));

  // Each run's colour; a dashed series (a run's held-out loss) takes its run's.
  std::vector<const char*> colours;
  size_t run = 0;
  for (size_t r = 0; r < series.size(); ++r) {
    if (r > 0 && !series[r].dashed) ++run;
    colours.push_back(kColours[run % std::size(kColours)]);
  }
  constexpr const char* kDash = " stroke-dasharray=\"6 4\"";

  // The runs.
  for (size_t r = 0; r < series.size(); ++r) {
    const PlotSeries& s = series[r];
    const char* colour = colours[r];
    absl::StrAppendFormat(&svg,
                          "<g class=\"%s\" data-name=\"%s\" stroke=\"%s\" fill=\"none\" "
                          "stroke-width=\"1.5\"%s>\n",
                          s.dashed ? "eval" : "run", Escape(s.name), colour, s.dashed ? kDash : "");
    std::vector<std::pair<double, double>> stretch;
    auto flush = [&] {
      if (stretch.size() == 1) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%s\" cy=\"%s\" r=\"2\" fill=\"%s\"/>\n",
                              Num(stretch[0].first), Num(stretch[0].second), colour);
      } else if (stretch.size() > 1) {
        svg += "<polyline points=\"";
        for (size_t i = 0; i < stretch.size(); ++i) {
          absl::StrAppend(&svg, i ? " " : "", Num(stretch[i].first), ",", Num(stretch[i].second));
        }
        svg += "\"/>\n";
      }
      stretch.clear();
    };
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        stretch.emplace_back(px(s.x[i]), py(s.y[i]));
      } else {
        flush();
      }
    }
    flush();
    svg += "</g>\n";
  }

  // The legend, top right inside the plot area.
  size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
  const double legend_w = 40 + 7.0 * static_cast<double>(longest);
  const double legend_h = 8 + 18.0 * static_cast<double>(series.size());
  const double lx = right - legend_w - 8, ly = top + 8;
  absl::StrAppendFormat(&svg,
                        "<g class=\"legend\">\n<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" "
                        "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999999\"/>\n",
                        Num(lx), Num(ly), Num(legend_w), Num(legend_h));
  for (size_t r = 0; r < series.size(); ++r) {
    const double y = ly + 16 + 18.0 * static_cast<double>(r);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"%s\" "
                          "stroke-width=\"2\"%s/>\n",
                          Num(lx + 8), Num(y - 4), Num(lx + 28), Num(y - 4), colours[r],
                          series[r].dashed ? kDash : "");
    absl::StrAppendFormat(&svg, "<text x=\"%s\" y=\"%s\">%s</text>\n", Num(lx + 34), Num(y),
                          Escape(series[r].name));
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

absl::StatusOr<std::vector<PlotSeries>> LoadLossCurves(const std::vector<std::string>& paths,
                                                       PlotXAxis x_axis) {
  if (paths.empty()) return absl::InvalidArgumentError("no metrics files to plot");
  std::map<std::string, int> name_count;
  for (const std::string& path : paths) {
    ++name_count[std::filesystem::path(path).filename().string()];
  }
  std::vector<PlotSeries> curves;
  for (const std::string& path : paths) {
    HCP_ASSIGN_OR_RETURN(MetricsLog log, ReadMetrics(path));
    if (log.records.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no metrics records (empty file)"));
    }
    PlotSeries curve;
    const std::string file_name = std::filesystem::path(path).filename().string();
    curve.name = name_count[file_name] > 1 ? path : file_name;
    bool any_finite = false;
    for (const MetricsRecord& r : log.records) {
      curve.x.push_back(x_axis == PlotXAxis::kStep ? static_cast<double>(r.step)
                                                   : static_cast<double>(r.tokens));
      curve.y.push_back(r.loss);
      any_finite = any_finite || std::isfinite(r.loss);
    }
    if (!any_finite) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no finite loss to plot"));
    }
    PlotSeries eval;
    eval.name = curve.name + " (eval)";
    eval.dashed = true;
    for (const MetricsRecord& r : log.records) {
      if (!r.evaluated()) continue;
      eval.x.push_back(x_axis == PlotXAxis::kStep ? static_cast<double>(r.step)
                                                  : static_cast<double>(r.tokens));
      eval.y.push_back(r.eval_loss);
    }
    curves.push_back(std::move(curve));
    if (!eval.x.empty()) curves.push_back(std::move(eval));
  }
  return curves;
}

absl::Status PlotMetricsFiles(const std::vector<std::string>& metrics_paths,
                              const std::string& svg_path, const PlotOptions& options) {
  HCP_ASSIGN_OR_RETURN(std::vector<PlotSeries> curves,
                       LoadLossCurves(metrics_paths, options.x_axis));
  HCP_ASSIGN_OR_RETURN(std::string svg, RenderLossSvg(curves, options));
  return WriteFileAtomically(svg_path, svg);
}

}  // namespace hcp::train
