// What every executor does the same way with parameter values: say which part of each tensor a
// rank holds, fill them from the plan's initialisers, and check a checkpoint against the plan
// before reading anything from it.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CheckpointReader;

// Which elements of p's whole (checkpoint) tensor, flattened row-major, a rank holds: [begin,
// begin + count) of `full`. A sharded parameter (p.shards = the mesh's ep) holds rows
// [i * R / ep, (i + 1) * R / ep) along dim 0, i = the rank's ep_index: begin = i * count.
// Replicated: begin 0, count = full.
struct ParameterShard {
  int64_t begin = 0, count = 0, full = 0;
};
ParameterShard ShardOf(const plan::Plan& plan, const plan::Parameter& p, int64_t ep_index);

// The part of a parameter's local buffer (`elements` values) whose optimizer state a rank keeps
// when the optimizer is sharded over `ranks` ranks (ZeRO-1): rank r keeps the r-th of `ranks`
// equal slices, [r * elements / ranks, (r + 1) * elements / ranks), and `split` is true. The
// whole buffer (split false) without sharding, with one rank, for an expert shard (p.sharded():
// already split over ep) and for a buffer that does not divide into equal slices (the
// collectives that scatter and gather the slices take equal counts; such buffers are small).
struct OptimizerSlice {
  int64_t begin = 0, count = 0;
  bool split = false;
};
OptimizerSlice OptimizerSliceOf(const plan::Parameter& p, int64_t elements, bool shard,
                                int64_t rank, int64_t ranks);

// The fp32 arrays AdamW keeps per value of a parameter stored in `dtype`: m and v, and a master
// copy for a bf16 parameter (an f32 parameter is its own master).
inline int OptimizerArrays(plan::DType dtype) { return dtype == plan::DType::BF16 ? 3 : 2; }
// The AdamW state one rank of `plan` keeps, in bytes: OptimizerArrays per value of its slice of
// each parameter (OptimizerSliceOf over the plan's ranks; every rank's slice is the same size).
uint64_t OptimizerStateBytes(const plan::Plan& plan, bool shard);

// out = elements [begin, begin + out.size()) of parameter p's whole tensor, initialised by
// p.init: Normal keyed by (seed, p.name, element index) (runtime/weights/Init.h), so a parameter
// gets the same values whatever plan, split or executor it is in; Zeros; Ones; LogArange =
// log(1), log(2), ... (Mamba2's A_log). Normal draws run on the host's cores in parallel (a 7B
// model is minutes on one core); the values do not depend on the thread count.
void FillInitialValues(const plan::Parameter& p, uint64_t seed, int64_t begin,
                       std::span<float> out);

// Every parameter of `plan` is in `checkpoint` as a float tensor of the plan's checkpoint shape
// (Plan::FullShape); otherwise the error names the tensor and what is wrong.
absl::Status CheckCheckpointHasParameters(const plan::Plan& plan,
                                          const CheckpointReader& checkpoint);

}  // namespace hcp
