// How the SSD backward's dB / dC kernel splits a group's heads over blocks
// (runtime/kernels/cuda/SsdHeadSlices.h): slices divide the group's heads, the grid stays within
// the target, the choice is the largest such, and the slice buffer stays within 32 MiB.
#include "runtime/kernels/cuda/SsdHeadSlices.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace hcp::cuda {
namespace {

TEST(SsdHeadSlices, GraniteTinyShapes) {
  // 48 heads in one group, batch 1: s = 8192 (32 chunks, 128 blocks), 16384, 65536.
  EXPECT_EQ(ssd_dbc_head_slices(32, 1, 1, 48), 8);
  EXPECT_EQ(ssd_dbc_head_slices(64, 1, 1, 48), 4);
  EXPECT_EQ(ssd_dbc_head_slices(256, 1, 1, 48), 1);
  // Heads that no small number divides stay whole; a prime group size of 7 splits in 7.
  EXPECT_EQ(ssd_dbc_head_slices(1, 1, 1, 11), 1);
  EXPECT_EQ(ssd_dbc_head_slices(1, 1, 1, 7), 7);
}

TEST(SsdHeadSlices, DivideTheHeadsWithinTheTargetAndTakeTheLargest) {
  for (int64_t chunks : {1, 2, 3, 7, 32, 64, 100, 256, 512}) {
    for (int64_t batch : {1, 2, 4}) {
      for (int64_t groups : {1, 2, 8}) {
        for (int64_t per_group : {1, 2, 3, 5, 6, 12, 48, 64}) {
          const int64_t heads = groups * per_group;
          const int slices = ssd_dbc_head_slices(chunks, batch, groups, heads);
          const int64_t blocks = kSsdDbcTilesPerChunk * chunks * batch * groups;
          ASSERT_GE(slices, 1);
          ASSERT_LE(slices, 8);
          EXPECT_EQ(per_group % slices, 0) << per_group << " heads in " << slices;
          if (slices > 1) {
            EXPECT_LE(blocks * slices, kSsdDbcTargetBlocks);
          }
          for (int d = slices + 1; d <= 8; d++) {
            EXPECT_FALSE(per_group % d == 0 && blocks * d <= kSsdDbcTargetBlocks)
                << d << " slices would also do";
          }
          // The slice buffer: fp32 [slices, batch, seq, groups, 128] for any seq in the chunks.
          const int64_t bytes = 4 * ssd_dbc_slice_floats(slices, batch, chunks * 256, groups, 128);
          EXPECT_LE(bytes, int64_t{32} << 20);
          if (slices == 1) {
            EXPECT_EQ(bytes, 0);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace hcp::cuda
