// Loss-curve SVGs: well-formed, one polyline per run, gaps for NaN, exact coordinates.
#include "runtime/train/Plot.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/train/Metrics.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

using testing::FailsWith;
using testing::ReadFileBytes;
using testing::ScratchDir;
using testing::WriteFileBytes;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Every element is closed in order; returns "" or what is wrong. Handles <?...?>, <x .../>,
// <x ...> and </x>; attribute values are quoted and hold no '>' (Escape makes it so).
std::string CheckBalanced(const std::string& svg) {
  std::vector<std::string> open;
  size_t pos = 0;
  while ((pos = svg.find('<', pos)) != std::string::npos) {
    const size_t end = svg.find('>', pos);
    if (end == std::string::npos) return "unterminated tag";
    std::string tag = svg.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?') continue;
    if (tag[0] == '/') {
      std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "unexpected </" + name + ">";
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return "";
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = 0; (pos = text.find(what, pos)) != std::string::npos; pos += what.size()) ++n;
  return n;
}

// The points attribute of the k-th polyline.
std::string Points(const std::string& svg, int k) {
  size_t pos = 0;
  for (int i = 0; i <= k; ++i) pos = svg.find("<polyline points=\"", pos) + 18;
  return svg.substr(pos, svg.find('"', pos) - pos);
}

void WriteRun(const std::string& path, const std::vector<double>& losses) {
  absl::StatusOr<MetricsWriter> writer = MetricsWriter::Open(path, MetricsMode::kNew);
  ASSERT_TRUE(writer.ok());
  for (size_t i = 0; i < losses.size(); ++i) {
    MetricsRecord r;
    r.step = static_cast<int64_t>(i) + 1;
    r.loss = losses[i];
    r.tokens = 1000 * r.step;
    ASSERT_TRUE(writer->Append(r).ok());
  }
}

TEST(Plot, NiceTicks) {
  AxisTicks t = NiceTicks(0, 10);
  EXPECT_EQ(t.step, 2);
  EXPECT_EQ(t.values, (std::vector<double>{0, 2, 4, 6, 8, 10}));
  t = NiceTicks(2.3, 9.7);
  EXPECT_EQ(t.lo, 2);
  EXPECT_EQ(t.hi, 10);
  t = NiceTicks(0.31, 0.95);
  EXPECT_DOUBLE_EQ(t.step, 0.1);
  EXPECT_DOUBLE_EQ(t.lo, 0.3);
  EXPECT_DOUBLE_EQ(t.hi, 1.0);
  t = NiceTicks(5, 5);  // one value: a unit range around it
  EXPECT_LT(t.lo, 5);
  EXPECT_GT(t.hi, 5);
  t = NiceTicks(1, 3, 8, /*integer_step=*/true);
  EXPECT_EQ(t.step, 1);
  EXPECT_EQ(t.values, (std::vector<double>{1, 2, 3}));
}

// x 0..10 and y 0..10 both get ticks 0..10, so the three points sit at the left/bottom corner,
// the middle and the right/top corner of the plot area [72, 776] x [44, 424].
TEST(Plot, PointsMapToThePlotArea) {
  absl::StatusOr<std::string> svg = RenderLossSvg({{"run", {0, 5, 10}, {0, 5, 10}}});
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckBalanced(*svg), "");
  EXPECT_EQ(Count(*svg, "<polyline"), 1);
  EXPECT_EQ(Points(*svg, 0), "72.00,424.00 424.00,234.00 776.00,44.00");
  EXPECT_NE(svg->find(">run</text>"), std::string::npos);            // legend
  EXPECT_NE(svg->find(">Training loss</text>"), std::string::npos);  // title
  EXPECT_NE(svg->find(">step</text>"), std::string::npos);           // x label
  EXPECT_NE(svg->find(">10</text>"), std::string::npos);             // a tick label
}

TEST(Plot, NaNLeavesGaps) {
  absl::StatusOr<std::string> svg =
      RenderLossSvg({{"gap", {1, 2, 3, 4, 5}, {1, 2, kNaN, 3, 4}},
                     {"islands", {1, 2, 3, 4, 5, 6}, {1, kNaN, 3, kNaN, 4, 5}}});
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckBalanced(*svg), "");
  EXPECT_EQ(Count(*svg, "<polyline"), 3);  // 2 for "gap", 1 (4..5) for "islands"
  EXPECT_EQ(Count(*svg, "<circle"), 2);    // the lone points 1 and 3 of "islands"
  EXPECT_EQ(Count(*svg, "<g class=\"run\""), 2);
}

TEST(Plot, OnePolylinePerFileWithLegendAndDistinctColours) {
  ScratchDir dir;
  WriteRun(dir / "cp1.jsonl", {5, 4, 3, 2.5});
  WriteRun(dir / "cp2_dp2.jsonl", {5.1, 3.9, 3.1});
  WriteRun(dir / "cp4.jsonl", {4.9, 4.2, 3.0, 2.4, 2.2});
  ASSERT_TRUE(PlotMetricsFiles({dir / "cp1.jsonl", dir / "cp2_dp2.jsonl", dir / "cp4.jsonl"},
                               dir / "loss.svg")
                  .ok());
  const std::string svg = ReadFileBytes(dir / "loss.svg");
  EXPECT_EQ(CheckBalanced(svg), "");
  EXPECT_EQ(Count(svg, "<polyline"), 3);
  for (const char* name : {"cp1.jsonl", "cp2_dp2.jsonl", "cp4.jsonl"}) {
    EXPECT_NE(svg.find(std::string(">") + name + "</text>"), std::string::npos) << name;
  }
  EXPECT_NE(svg.find("stroke=\"#1f77b4\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#ff7f0e\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#2ca02c\""), std::string::npos);
}

// A run's evaluations: a second curve right after its run, dashed in the run's colour, with a
// dashed legend line; the next run takes the next colour.
TEST(Plot, HeldOutLossIsADashedCurveInItsRunsColour) {
  ScratchDir dir;
  {
    absl::StatusOr<MetricsWriter> writer =
        MetricsWriter::Open(dir / "eval.jsonl", MetricsMode::kNew);
    ASSERT_TRUE(writer.ok());
    for (int64_t step = 1; step <= 5; ++step) {
      MetricsRecord r;
      r.step = step;
      r.loss = 6.0 - static_cast<double>(step);
      r.tokens = 100 * step;
      if (step % 2 == 0 || step == 5) {
        r.eval_loss = 7.0 - static_cast<double>(step);
        r.eval_tokens = 128;
      }
      ASSERT_TRUE(writer->Append(r).ok());
    }
  }
  WriteRun(dir / "plain.jsonl", {5, 4, 3});
  absl::StatusOr<std::vector<PlotSeries>> curves =
      LoadLossCurves({dir / "eval.jsonl", dir / "plain.jsonl"}, PlotXAxis::kTokens);
  ASSERT_TRUE(curves.ok()) << curves.status();
  ASSERT_EQ(curves->size(), 3u);
  EXPECT_FALSE((*curves)[0].dashed);
  EXPECT_EQ((*curves)[1].name, "eval.jsonl (eval)");
  EXPECT_TRUE((*curves)[1].dashed);
  EXPECT_EQ((*curves)[1].x, (std::vector<double>{200, 400, 500}));
  EXPECT_EQ((*curves)[1].y, (std::vector<double>{5, 3, 2}));
  EXPECT_EQ((*curves)[2].name, "plain.jsonl");

  absl::StatusOr<std::string> svg = RenderLossSvg(*curves);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckBalanced(*svg), "");
  EXPECT_EQ(Count(*svg, "<g class=\"run\""), 2);
  EXPECT_NE(svg->find("<g class=\"eval\" data-name=\"eval.jsonl (eval)\" stroke=\"#1f77b4\" "
                      "fill=\"none\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\">"),
            std::string::npos)
      << *svg;
  EXPECT_NE(svg->find("data-name=\"plain.jsonl\" stroke=\"#ff7f0e\""), std::string::npos);
  EXPECT_EQ(Count(*svg, "stroke-dasharray"), 2);  // the curve and its legend line
  EXPECT_EQ(Count(*svg, "<polyline"), 3);
}

TEST(Plot, RunsWithTheSameFileNameAreNamedByPath) {
  ScratchDir dir;
  std::filesystem::create_directories(dir / "a");
  std::filesystem::create_directories(dir / "b");
  WriteRun(dir / "a/metrics.jsonl", {3, 2});
  WriteRun(dir / "b/metrics.jsonl", {3, 1});
  absl::StatusOr<std::vector<PlotSeries>> curves =
      LoadLossCurves({dir / "a/metrics.jsonl", dir / "b/metrics.jsonl"});
  ASSERT_TRUE(curves.ok()) << curves.status();
  EXPECT_EQ((*curves)[0].name, dir / "a/metrics.jsonl");
  EXPECT_EQ((*curves)[1].name, dir / "b/metrics.jsonl");
}

TEST(Plot, TokensAxis) {
  ScratchDir dir;
  WriteRun(dir / "m.jsonl", {3, 2, 1});
  absl::StatusOr<std::vector<PlotSeries>> curves =
      LoadLossCurves({dir / "m.jsonl"}, PlotXAxis::kTokens);
  ASSERT_TRUE(curves.ok());
  EXPECT_EQ((*curves)[0].x, (std::vector<double>{1000, 2000, 3000}));
  PlotOptions options;
  options.x_axis = PlotXAxis::kTokens;
  absl::StatusOr<std::string> svg = RenderLossSvg(*curves, options);
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find(">tokens</text>"), std::string::npos);
  // Large values get a unit: 20,000 tokens reads "20k".
  svg = RenderLossSvg({{"big", {0, 20000}, {1, 2}}});
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find(">20k</text>"), std::string::npos);
  svg = RenderLossSvg({{"bigger", {0, 5e6}, {1, 2}}});
  ASSERT_TRUE(svg.ok());
  EXPECT_NE(svg->find(">5.0M</text>"), std::string::npos);
  EXPECT_NE(svg->find(">0.5M</text>"), std::string::npos);
  EXPECT_NE(svg->find(">0</text>"), std::string::npos);
}

TEST(Plot, TextIsEscaped) {
  PlotOptions options;
  options.title = "a<b & \"c\"";
  absl::StatusOr<std::string> svg = RenderLossSvg({{"x<y>", {1, 2}, {1, 2}}}, options);
  ASSERT_TRUE(svg.ok());
  EXPECT_EQ(CheckBalanced(*svg), "");
  EXPECT_NE(svg->find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg->find("x&lt;y&gt;"), std::string::npos);
}

TEST(Plot, BadInputsSayWhatIsWrong) {
  ScratchDir dir;
  WriteFileBytes(dir / "empty.jsonl", "");
  EXPECT_TRUE(FailsWith(PlotMetricsFiles({dir / "empty.jsonl"}, dir / "o.svg"),
                        "empty.jsonl: no metrics records (empty file)"));
  WriteRun(dir / "nan.jsonl", {kNaN, kNaN});
  EXPECT_TRUE(FailsWith(PlotMetricsFiles({dir / "nan.jsonl"}, dir / "o.svg"),
                        "nan.jsonl: no finite loss to plot"));
  EXPECT_TRUE(FailsWith(PlotMetricsFiles({dir / "none.jsonl"}, dir / "o.svg"), "none.jsonl"));
  EXPECT_TRUE(FailsWith(PlotMetricsFiles({}, dir / "o.svg"), "no metrics files"));
  EXPECT_FALSE(std::filesystem::exists(dir / "o.svg"));
  EXPECT_TRUE(FailsWith(RenderLossSvg({}).status(), "no runs given"));
  EXPECT_TRUE(FailsWith(RenderLossSvg({{"r", {1, 2}, {1}}}).status(), "2 x values but 1 y"));
  EXPECT_TRUE(FailsWith(RenderLossSvg({{"r", {1}, {kNaN}}}).status(), "no run has a finite"));
  PlotOptions tiny;
  tiny.width = 50;
  EXPECT_TRUE(FailsWith(RenderLossSvg({{"r", {1}, {1}}}, tiny).status(), "no room"));
}

TEST(Plot, OnePointAndFlatCurvesRender) {
  absl::StatusOr<std::string> svg = RenderLossSvg({{"one", {7}, {2.5}}});
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckBalanced(*svg), "");
  EXPECT_EQ(Count(*svg, "<circle"), 1);
  svg = RenderLossSvg({{"flat", {1, 2, 3}, {2, 2, 2}}});
  ASSERT_TRUE(svg.ok());
  EXPECT_EQ(Count(*svg, "<polyline"), 1);
}

}  // namespace
}  // namespace hcp::train
