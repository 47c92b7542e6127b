// Helpers of the multi-rank tests (test_comm, run under mpirun -np N): the world communicator,
// plans of a few steps run by CpuExecutor on a mesh, and the sharding of global tensors that the
// plan's sequence layout implies, so every test can compare one rank's piece of a distributed
// computation with the same piece of the single-rank computation on the whole sequence.
//
// Every rank runs every test, in the same order, and must reach the same collectives: tests
// compare with EXPECT_* after communicating, and ASSERT_* only on what every rank agrees on
// (statuses that went through AgreeOnStatus, or facts of the mesh).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"

namespace hcp::testing {

// The world communicator of the test process (MpiMain.cpp), without a mesh.
comm::Communicator& World();
// A fresh communicator over the world (collective: every rank calls it at the same point).
std::unique_ptr<comm::Communicator> NewWorldCommunicator();
// A fresh communicator with `mesh` (whose cp * dp must be the world size).
std::unique_ptr<comm::Communicator> NewCommunicator(const plan::Mesh& mesh);

using Vec = std::vector<double>;

inline Vec RandomVec(std::mt19937& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = dist(rng);
  return v;
}
inline std::vector<float> ToFloat(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
inline Vec ToDouble(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// ||a - b|| / ||b|| (b the reference); NaN-safe (NaN gives infinity).
inline double RelRms(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  const double r = std::sqrt(num / std::max(den, 1e-300));
  return std::isnan(r) ? INFINITY : r;
}
// fp32 computations against a double reference (context-parallel.md: fp32 ~1e-5).
inline constexpr double kFp32Tolerance = 1e-5;

// This cp rank's part of a global [batch, seq, inner] tensor: its segments of every sequence,
// [batch, segs * len, inner].
inline Vec Shard(const Vec& global, int64_t batch, int64_t seq, int64_t inner,
                 const plan::Mesh& mesh, int64_t cp_index) {
  const int64_t len = seq / mesh.segments();
  Vec local;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t k = 0; k < mesh.segments_per_rank(); ++k) {
      const int64_t from = (b * seq + mesh.GlobalSegment(cp_index, k) * len) * inner;
      local.insert(local.end(), global.begin() + from, global.begin() + from + len * inner);
    }
  }
  return local;
}
// The same for a [batch, heads, seq] tensor (attention's lse): [batch, heads, segs * len].
inline Vec ShardLast(const Vec& global, int64_t outer, int64_t seq, const plan::Mesh& mesh,
                     int64_t cp_index) {
  return Shard(global, outer, seq, 1, mesh, cp_index);
}

// A plan of a few steps over activations the test fills, run on every rank of `comm`.
class DistPlan {
 public:
  DistPlan(int64_t micro_batch, int64_t seq, const plan::Mesh& mesh) {
    b_.set_shape(micro_batch, seq).set_mesh(mesh);
    const plan::PlanBuilder::InputBuffers inputs = b_.AllocateInputs();
    input_ids_ = inputs.input_ids;
    targets_ = inputs.targets;
    loss_ = Buffer("loss", {1});
    b_.set_loss(loss_);
  }
  plan::PlanBuilder& builder() { return b_; }
  uint32_t input_ids() const { return input_ids_; }
  uint32_t targets() const { return targets_; }
  uint32_t loss() const { return loss_; }

  uint32_t Buffer(const std::string& name, std::vector<int64_t> shape) {
    return b_.Allocate(name, plan::Arena::Activations, std::move(shape));
  }
  // A buffer filled with `values` before the run.
  uint32_t Input(const std::string& name, std::vector<int64_t> shape, const Vec& values) {
    const uint32_t index = Buffer(name, std::move(shape));
    inputs_.push_back({index, ToFloat(values)});
    return index;
  }
  void Step(const std::string& kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs,
            std::vector<int64_t> ints, std::vector<double> floats = {}) {
    b_.AddStep(kernel, std::move(ins), std::move(outs), std::move(ints), std::move(floats));
  }

  // Builds and loads the plan, creates its executor on `comm` and fills the inputs; the
  // executor stays for RunStep() and Get(). Collective.
  absl::Status Create(comm::Communicator& comm) {
    absl::StatusOr<std::string> bytes = b_.Finish();
    absl::StatusOr<plan::Plan> plan =
        bytes.ok() ? plan::ParsePlan(*bytes, "dist test") : bytes.status();
    if (!plan.ok()) return comm::AgreeOnStatus(comm, plan.status());
    absl::StatusOr<std::unique_ptr<CpuExecutor>> exec =
        CpuExecutor::Create(*plan, comm, CpuExecutor::Options{.poison_activations = true});
    if (!exec.ok()) return exec.status();
    exec_ = *std::move(exec);
    for (const auto& [index, values] : inputs_) {
      std::span<float> buffer = exec_->F32Buffer(index);
      std::copy(values.begin(), values.end(), buffer.begin());
    }
    return absl::OkStatus();
  }
  absl::Status RunStep() { return exec_->RunStep(); }
  absl::Status Run(comm::Communicator& comm) {
    if (absl::Status s = Create(comm); !s.ok()) return s;
    return RunStep();
  }
  Vec Get(uint32_t index) const {
    std::span<float> buffer = exec_->F32Buffer(index);
    return Vec(buffer.begin(), buffer.end());
  }
  CpuExecutor& executor() { return *exec_; }

 private:
  plan::PlanBuilder b_;
  uint32_t input_ids_ = 0, targets_ = 0, loss_ = 0;
  std::vector<std::pair<uint32_t, std::vector<float>>> inputs_;
  std::unique_ptr<CpuExecutor> exec_;
};

inline std::string LayoutName(plan::SequenceLayout layout) {
  return std::string(plan::SequenceLayoutName(layout));
}

}  // namespace hcp::testing
