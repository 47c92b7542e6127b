#include "runtime/exec/ParameterValues.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/kernels/cpu/Parallel.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Init.h"

namespace hcp {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrFormat("[%s]", absl::StrJoin(shape, ", "));
}

// FillNormal over the host's cores: draw j of a tensor depends only on (seed, name, j), so
// pieces filled by different threads give the values of one pass. Pieces of 65,536 draws or
// more: a model's many mid-sized tensors (350m's are mostly under 4M values) gain too, not only
// its largest.
void FillNormalInParallel(float* out, int64_t begin, int64_t n, uint64_t seed,
                          const std::string& name, float stddev) {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::parallel_for(cpu::Threads{threads}, n, int64_t{1} << 16, 1,
                    [&](int64_t first, int64_t last) {
                      FillNormal(out + first, begin + first, last - first, seed, name, stddev);
                    });
}

}  // namespace

ParameterShard ShardOf(const plan::Plan& plan, const plan::Parameter& p, int64_t ep_index) {
  const auto count = static_cast<int64_t>(plan.buffers[p.buffer].elements);
  if (!p.sharded()) return ParameterShard{.begin = 0, .count = count, .full = count};
  return ParameterShard{.begin = ep_index * count, .count = count, .full = count * p.shards};
}

OptimizerSlice OptimizerSliceOf(const plan::Parameter& p, int64_t elements, bool shard,
                                int64_t rank, int64_t ranks) {
  if (!shard || ranks <= 1 || p.sharded() || elements % ranks != 0) {
    return OptimizerSlice{.begin = 0, .count = elements, .split = false};
  }
  const int64_t count = elements / ranks;
  return OptimizerSlice{.begin = rank * count, .count = count, .split = true};
}

uint64_t OptimizerStateBytes(const plan::Plan& plan, bool shard) {
  uint64_t bytes = 0;
  for (const plan::Parameter& p : plan.parameters) {
    const plan::Buffer& b = plan.buffers[p.buffer];
    const OptimizerSlice slice = OptimizerSliceOf(p, static_cast<int64_t>(b.elements), shard,
                                                  /*rank=*/0, plan.mesh.world());
    bytes += static_cast<uint64_t>(slice.count) * OptimizerArrays(b.dtype) * sizeof(float);
  }
  return bytes;
}

void FillInitialValues(const plan::Parameter& p, uint64_t seed, int64_t begin,
                       std::span<float> out) {
  const auto n = static_cast<int64_t>(out.size());
  switch (p.init) {
    case plan::ParamInit::Normal:
      FillNormalInParallel(out.data(), begin, n, seed, p.name, static_cast<float>(p.std));
      return;
    case plan::ParamInit::Zeros:
      FillConstant(out.data(), n, 0.0f);
      return;
    case plan::ParamInit::Ones:
      FillConstant(out.data(), n, 1.0f);
      return;
    case plan::ParamInit::LogArange:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(std::log(double(begin + i + 1)));
      return;
  }
}

absl::Status CheckCheckpointHasParameters(const plan::Plan& plan,
                                          const CheckpointReader& checkpoint) {
  for (const plan::Parameter& p : plan.parameters) {
    const std::vector<int64_t>& shape = plan.FullShape(p);
    if (!checkpoint.Has(p.name)) {
      return absl::NotFoundError(
          absl::StrFormat("checkpoint %s has no tensor '%s' (the plan's parameter of shape %s)",
                          checkpoint.dir(), p.name, ShapeString(shape)));
    }
    HCP_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info(p.name));
    if (!IsFloatDType(info.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("checkpoint %s: tensor '%s' is %s, expected a float tensor",
                          checkpoint.dir(), p.name, SafetensorsName(info.dtype)));
    }
    if (info.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrFormat("checkpoint %s: tensor '%s' has shape %s, the plan expects %s",
                          checkpoint.dir(), p.name, ShapeString(info.shape), ShapeString(shape)));
    }
  }
  return absl::OkStatus();
}

}  // namespace hcp
