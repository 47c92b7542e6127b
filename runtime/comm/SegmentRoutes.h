// Who talks to whom in the context-parallel collectives, from the mesh alone: the same routes for
// every backend (runtime/backends/cpu/Collectives.cpp over a Communicator, runtime/backends/cuda/
// CudaBackendCollectives.cpp over NCCL).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm/Communicator.h"
#include "runtime/plan/Plan.h"

namespace hcp::comm {

// The cp rank that holds global segment j, or kNoRank if there is no segment j or cp rank `me`
// holds it itself (no message then).
inline int RemoteOwner(const plan::Mesh& mesh, int64_t me, int64_t j) {
  if (j < 0 || j >= mesh.segments()) return kNoRank;
  const int64_t owner = mesh.OwnerOf(j).cp_index;
  return owner == me ? kNoRank : static_cast<int>(owner);
}

// The (query segment, key segment) pairs of one ring-attention step, when cp rank `me` holds the
// K/V block of cp rank `source`: local segment indices and global positions of their first rows
// (segments of `len` tokens). When causal, a key segment entirely after a query segment is
// skipped: positions are whole segments, so a key segment is entirely before, the same as, or
// entirely after a query segment.
struct SegmentPair {
  int64_t kq, kk, q_pos0, k_pos0;
};
inline std::vector<SegmentPair> VisiblePairs(const plan::Mesh& mesh, int64_t me, int64_t source,
                                             int64_t len, bool causal) {
  std::vector<SegmentPair> pairs;
  for (int64_t kq = 0; kq < mesh.segments_per_rank(); ++kq) {
    for (int64_t kk = 0; kk < mesh.segments_per_rank(); ++kk) {
      const int64_t q_pos0 = mesh.GlobalSegment(me, kq) * len;
      const int64_t k_pos0 = mesh.GlobalSegment(source, kk) * len;
      if (causal && k_pos0 > q_pos0 + len - 1) continue;  // entirely in the future
      pairs.push_back({kq, kk, q_pos0, k_pos0});
    }
  }
  return pairs;
}

}  // namespace hcp::comm
