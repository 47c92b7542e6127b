// The order in which training reads the documents of a Megatron indexed dataset, with
// `train --shuffle-seed N`.
//
// Without it the stream is the dataset's .bin as it lies (TokenData.h's batching rule reads it).
// With it, pass `epoch` over the data reads a virtual stream: the dataset's documents in the order
// of DocumentPermutation(documents, seed, epoch), each whole, back to back. It holds the same
// tokens as the .bin (only their order differs), so the batching rule, the wrap-around and the
// DataState (epoch, position in that virtual stream) stay what they are; the order depends on the
// seed, the epoch and the dataset alone, never on the cp/dp split, so a resumed run (any split)
// reads exactly the batches the uninterrupted one would.
//
// The generator is written out so that every platform and standard library gives the same order
// (std::shuffle and the std distributions do not):
//   SplitMix64 (Steele, Lea and Flood 2014): state += 0x9E3779B97F4A7C15; then z = state,
//     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9, z = (z ^ (z >> 27)) * 0x94D049BB133111EB,
//     z ^ (z >> 31) is the next number (Mix64 is that finaliser alone).
//   A pass's generator starts at state = Mix64(seed) ^ Mix64(epoch + 1): no two (seed, epoch)
//     pairs start one SplitMix64 stream a step apart from another.
//   A number below n: draw r until r >= (2^64 - n) mod n, then r mod n (unbiased).
//   Fisher-Yates: order = 0, 1, ..., n - 1; for i = n - 1 down to 1, swap order[i] with
//     order[j], j a number below i + 1.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace hcp::data {

class IndexedDataset;

uint64_t Mix64(uint64_t z);

// SplitMix64 (above).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next();
  // Uniform in [0, n), n > 0.
  uint64_t Below(uint64_t n);

 private:
  uint64_t state_;
};

// The documents 0..n-1 in pass `epoch`'s order for `seed` (the top of this file).
std::vector<int64_t> DocumentPermutation(int64_t n, uint64_t seed, int64_t epoch);

// A dataset's documents in each pass's shuffled order: where a position of that pass's virtual
// stream lies in the .bin. It keeps the documents' lengths and the prefix sums of one pass at a
// time (the last one asked for, rebuilt when another pass is asked for: once per epoch).
class DocumentOrder {
 public:
  DocumentOrder(const IndexedDataset& dataset, uint64_t seed);

  DocumentOrder(DocumentOrder&&) noexcept = default;
  DocumentOrder& operator=(DocumentOrder&&) noexcept = default;

  uint64_t seed() const { return seed_; }
  // Tokens of one pass (the dataset's).
  int64_t tokens() const { return tokens_; }

  // The .bin indices of tokens [position, position + out.size()) of pass `epoch`'s stream, into
  // `out`: a binary search finds the document that holds `position`, then the window is filled
  // a document's piece at a time. The range must lie within the pass.
  void Map(int64_t epoch, int64_t position, std::span<int64_t> out) const;

 private:
  struct Pass {
    int64_t epoch = -1;
    std::vector<int64_t> order;  // the documents in this pass's order
    std::vector<int64_t> ends;   // ends[k]: stream position just past the k-th of them
  };
  const Pass& PassFor(int64_t epoch) const;

  uint64_t seed_ = 0;
  int64_t tokens_ = 0;
  std::vector<int64_t> starts_;  // the dataset's document_starts(): documents() + 1 offsets
  // Map is const (the batcher's reads are); the pass it keeps is a cache, behind a lock in case
  // two threads read.
  std::unique_ptr<std::mutex> lock_ = std::make_unique<std::mutex>();
  mutable Pass pass_;
};

}  // namespace hcp::data
