#include "runtime/kernels/cuda/ChunkTable.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace hcp::cuda {
namespace {

struct Entry {
  int64_t first_chunk;
};

// The tables adamw_update_many builds: each tensor's first chunk, from its chunk count.
std::vector<Entry> table_of(const std::vector<int64_t>& chunk_counts) {
  std::vector<Entry> table;
  int64_t next = 0;
  for (int64_t n : chunk_counts) {
    table.push_back({next});
    next += n;
  }
  return table;
}

// Every chunk finds the tensor that owns it, empty tensors (first, between, last) owning none.
TEST(ChunkTable, EveryChunkFindsItsTensor) {
  const std::vector<std::vector<int64_t>> layouts = {
      {1}, {5}, {1, 1, 1}, {3, 0, 2}, {0, 4}, {2, 0}, {0, 0, 1, 0, 0}, {7, 1, 0, 0, 3, 12, 1}};
  for (const std::vector<int64_t>& counts : layouts) {
    const std::vector<Entry> table = table_of(counts);
    int64_t chunk = 0;
    for (size_t t = 0; t < counts.size(); ++t) {
      for (int64_t k = 0; k < counts[t]; ++k, ++chunk) {
        EXPECT_EQ(tensor_of_chunk(table.data(), static_cast<int64_t>(table.size()), chunk),
                  static_cast<int64_t>(t))
            << "chunk " << chunk;
      }
    }
  }
}

// tiny's table: 586 tensors, ~106,000 chunks; the lookup agrees with a linear scan.
TEST(ChunkTable, ManyTensors) {
  std::vector<int64_t> counts;
  for (int i = 0; i < 586; ++i) counts.push_back(i % 7 == 0 ? 0 : (i * 37) % 400 + 1);
  const std::vector<Entry> table = table_of(counts);
  int64_t chunk = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    for (int64_t k = 0; k < counts[t]; ++k, ++chunk) {
      ASSERT_EQ(tensor_of_chunk(table.data(), static_cast<int64_t>(table.size()), chunk),
                static_cast<int64_t>(t));
    }
  }
}

}  // namespace
}  // namespace hcp::cuda
