// How the SSD backward's dB / dC kernel (ssd_dbc_kernel, SsdScanBackward.cu) spreads a group's
// heads over blocks. Each block sums its 64 rows' per-head state terms over the group's heads one
// after another. At short sequences there are few blocks (4 per chunk and group: 128 at s = 8192
// with one group, one per SM and one latency-bound warp group each), so the heads are split over
// up to 8x more blocks, each summing its slice in fp32 into a slice buffer that a second kernel
// adds in slice order (deterministic). A function of the shape only: the results do not depend
// on the device. Plain C++, so that the rule is unit-tested without a GPU.
#pragma once

#include <cstdint>

namespace hcp::cuda {

// Row tiles per chunk in ssd_dbc_kernel (256-row chunks, 64-row tiles).
inline constexpr int64_t kSsdDbcTilesPerChunk = 4;
// The split stops before the grid exceeds this many blocks.
inline constexpr int64_t kSsdDbcTargetBlocks = 1024;

// The number of slices of each group's heads: the largest divisor d <= 8 of heads / groups with
// blocks * d <= kSsdDbcTargetBlocks, where blocks = kSsdDbcTilesPerChunk * chunks * batch * groups
// (1 when even 2 would exceed it).
inline int ssd_dbc_head_slices(int64_t chunks, int64_t batch, int64_t groups, int64_t heads) {
  const int64_t blocks = kSsdDbcTilesPerChunk * chunks * batch * groups;
  const int64_t per_group = heads / groups;
  int slices = 1;
  for (int d = 2; d <= 8; d++) {
    if (per_group % d == 0 && blocks * d <= kSsdDbcTargetBlocks) slices = d;
  }
  return slices;
}

// The slice buffer's floats: one fp32 dB / dC [batch, seq, groups, state] per slice when there
// are several, none otherwise.
inline int64_t ssd_dbc_slice_floats(int64_t slices, int64_t batch, int64_t seq, int64_t groups,
                                    int64_t state) {
  return slices > 1 ? slices * batch * seq * groups * state : 0;
}

}  // namespace hcp::cuda
