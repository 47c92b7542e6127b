// How SSD kernels spread a group's heads over blocks (runtime/kernels/cuda/SsdHeadSlices.h). The
// backward's dB / dC kernel: slices divide the group's heads, the grid stays within the target,
// the choice is the largest such, and the slice buffer stays within 32 MiB. The chunk states'
// kernel: heads per block divide the group's heads, one head a block while every block fits in
// one wave, more where that saves whole waves of B's bytes.
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

// The chunk states' kernel on 132 SMs, two blocks each, Granite's chunk (256) and state (128).
int OuterHeads(int64_t blocks, int64_t group_heads, int64_t head_dim = 64) {
  return ssd_outer_heads_per_block(blocks, group_heads, head_dim, 256, 128, 132, 2);
}

TEST(SsdOuterHeads, GraniteTinyShapes) {
  // 48 heads of 64 in one group, batch 1: s = 8192 (32 chunks): 256 blocks of 6 heads, one wave;
  // s = 65536 (256 chunks): 8 heads a block.
  EXPECT_EQ(OuterHeads(32, 48), 6);
  EXPECT_EQ(OuterHeads(256, 48), 8);
  // test_sequence_kernels' cases for several heads a block: s = 2048 with one group, and with
  // two groups of 24; 3 a block at s = 4096 in one group.
  EXPECT_EQ(OuterHeads(8, 48), 2);
  EXPECT_EQ(OuterHeads(16, 24), 2);
  EXPECT_EQ(OuterHeads(16, 48), 3);
  // Everything in one wave anyway: one head a block (B's bytes saved would not shorten it).
  EXPECT_EQ(OuterHeads(4, 6), 1);
  EXPECT_EQ(OuterHeads(1, 48), 1);
}

TEST(SsdOuterHeads, DivideTheGroupsHeads) {
  for (int64_t blocks : {1, 8, 32, 100, 256, 1024}) {
    for (int64_t group_heads : {1, 2, 3, 7, 11, 24, 48, 64, 128}) {
      for (int64_t head_dim : {32, 64}) {
        const int d = OuterHeads(blocks, group_heads, head_dim);
        ASSERT_GE(d, 1);
        ASSERT_LE(d, 8);
        EXPECT_EQ(group_heads % d, 0) << blocks << " blocks, " << group_heads << " heads";
        // A launch of one wave at one head a block keeps one head a block.
        if (blocks * group_heads <= 264) {
          EXPECT_EQ(d, 1) << blocks << " blocks, " << group_heads << " heads";
        }
      }
    }
  }
}

}  // namespace
}  // namespace hcp::cuda
