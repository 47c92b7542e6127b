// How SSD kernels spread a group's heads over blocks; plain C++, so that the rules are unit-tested
// without a GPU.
//
// The backward's dB / dC kernel (ssd_dbc_kernel, SsdScanBackward.cu). Each block sums its 64 rows'
// per-head state terms over the group's heads one after another. At short sequences there are few
// blocks (4 per chunk and group: 128 at s = 8192 with one group, one per SM and one latency-bound
// warp group each), so the heads are split over up to 8x more blocks, each summing its slice in
// fp32 into a slice buffer that a second kernel adds in slice order (deterministic). A function of
// the shape only: the results do not depend on the device. Plain C++, so that the rule is
// unit-tested without a GPU.
#pragma once

#include <algorithm>
#include <climits>
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

// The chunk states' kernel (ssd_chunk_outer_kernel, SsdScan.cu): a block serves several heads of
// one group one after another, reading the chunk's B (or C), shared by the group, once. Of the
// divisors d <= 8 of the group's heads, the one whose launch moves the fewest bytes per SM,
// counting each wave of blocks (`blocks_per_sm` an SM) whole: a head moves its x (chunk x
// head_dim bf16) and its state (head_dim x state fp32), a block also B (chunk x state bf16); the
// smallest d of equals. `blocks` is chunks x batch x groups (the blocks of one head each).
inline int ssd_outer_heads_per_block(int64_t blocks, int64_t group_heads, int64_t head_dim,
                                     int64_t chunk, int64_t state, int64_t sms,
                                     int64_t blocks_per_sm) {
  const int64_t slots = std::max<int64_t>(1, sms * blocks_per_sm);
  const int64_t head_bytes = 2 * chunk * head_dim + 4 * head_dim * state,
                b_bytes = 2 * chunk * state;
  int best = 1;
  int64_t best_bytes = INT64_MAX;
  for (int d = 1; d <= 8; d++) {
    if (group_heads % d != 0) continue;
    const int64_t waves = (blocks * (group_heads / d) + slots - 1) / slots;
    const int64_t bytes = waves * (b_bytes + d * head_bytes);
    if (bytes < best_bytes) {
      best = d;
      best_bytes = bytes;
    }
  }
  return best;
}

}  // namespace hcp::cuda
