// Loss curves as an SVG picture, written by hand (no plotting library): runs laid over each
// other, so that runs with different cp/dp splits can be compared at a glance.
//
// The picture: a title, a plot area with a light grid, x and y axes with ticks and labels, one
// run per colour (a cycle of 10 distinct colours), and a legend naming each run. Each run is a
// <g class="run"> holding one <polyline> per stretch of finite points: a non-finite loss (a
// skipped step writes null) leaves a gap, and a finite point alone between gaps is a <circle>.
// Coordinates: the plot area is [margin_left, width - margin_right] x [margin_top,
// height - margin_bottom]; the axes span the "nice" tick ranges of NiceTicks around the data,
// x left to right, y bottom to top.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hcp::train {

// One run: points (x[i], y[i]); y may be NaN (a gap). A dashed series is the held-out loss of
// the run before it: drawn dashed in that run's colour (<g class="eval">, a dashed legend line).
struct PlotSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
  bool dashed = false;
};

enum class PlotXAxis { kStep, kTokens };

struct PlotOptions {
  int width = 800;
  int height = 480;
  int margin_left = 72;
  int margin_right = 24;
  int margin_top = 44;
  int margin_bottom = 56;
  std::string title = "Training loss";
  PlotXAxis x_axis = PlotXAxis::kStep;
};

// Axis range and ticks: the tick spacing is 1, 2 or 5 times a power of ten, chosen so that
// about `target` intervals cover [lo, hi]; the range is widened to whole multiples of it.
// lo == hi is widened to a unit-sized range around the value. With integer_step (the step
// axis) the spacing is at least 1.
struct AxisTicks {
  double lo = 0;
  double hi = 1;
  double step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
};
AxisTicks NiceTicks(double lo, double hi, int target = 6, bool integer_step = false);

// The SVG text. Errors: no series, a series whose x and y differ in length, or no finite point
// in any series.
absl::StatusOr<std::string> RenderLossSvg(const std::vector<PlotSeries>& series,
                                          const PlotOptions& options = {});

// The loss curves of metrics files (Metrics.h): x = step or tokens, y = loss; each run is named
// by its file name, or by the path as given where two runs share a file name. A run with
// evaluations (eval_loss) also gets its held-out curve right after it, dashed, named
// "NAME (eval)", one point per evaluation. An empty file, or one without a finite loss, is an
// error naming it.
absl::StatusOr<std::vector<PlotSeries>> LoadLossCurves(const std::vector<std::string>& paths,
                                                       PlotXAxis x_axis = PlotXAxis::kStep);

// LoadLossCurves + RenderLossSvg, written atomically to svg_path.
absl::Status PlotMetricsFiles(const std::vector<std::string>& metrics_paths,
                              const std::string& svg_path, const PlotOptions& options = {});

}  // namespace hcp::train
