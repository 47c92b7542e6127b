#include "runtime/data/DocumentOrder.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "runtime/data/IndexedDataset.h"

namespace hcp::data {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  return Mix64(state_);
}

uint64_t SplitMix64::Below(uint64_t n) {
  // (2^64 - n) mod n, in unsigned arithmetic: the numbers below it would make r mod n biased.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = Next();
    if (r >= threshold) return r % n;
  }
}

std::vector<int64_t> DocumentPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), int64_t{0});
  SplitMix64 rng(Mix64(seed) ^ Mix64(static_cast<uint64_t>(epoch) + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

DocumentOrder::DocumentOrder(const IndexedDataset& dataset, uint64_t seed)
    : seed_(seed),
      tokens_(dataset.tokens()),
      starts_(dataset.document_starts().begin(), dataset.document_starts().end()) {}

const DocumentOrder::Pass& DocumentOrder::PassFor(int64_t epoch) const {
  if (pass_.epoch == epoch) return pass_;
  pass_.epoch = epoch;
  const auto documents = static_cast<int64_t>(starts_.size()) - 1;
  pass_.order = DocumentPermutation(documents, seed_, epoch);
  pass_.ends.resize(pass_.order.size());
  int64_t end = 0;
  for (size_t k = 0; k < pass_.order.size(); ++k) {
    const int64_t d = pass_.order[k];
    end += starts_[d + 1] - starts_[d];
    pass_.ends[k] = end;
  }
  return pass_;
}

void DocumentOrder::Map(int64_t epoch, int64_t position, std::span<int64_t> out) const {
  std::lock_guard<std::mutex> hold(*lock_);
  const Pass& pass = PassFor(epoch);
  // The first document that ends after `position` holds it (empty ones end where the one before
  // does, so they are passed over).
  auto k = static_cast<size_t>(std::upper_bound(pass.ends.begin(), pass.ends.end(), position) -
                               pass.ends.begin());
  size_t filled = 0;
  while (filled < out.size() && k < pass.order.size()) {
    const int64_t d = pass.order[k];
    const int64_t doc_start_in_stream = pass.ends[k] - (starts_[d + 1] - starts_[d]);
    const int64_t offset = position + static_cast<int64_t>(filled) - doc_start_in_stream;
    const int64_t piece =
        std::min<int64_t>(pass.ends[k] - (position + static_cast<int64_t>(filled)),
                          static_cast<int64_t>(out.size() - filled));
    for (int64_t t = 0; t < piece; ++t) out[filled + t] = starts_[d] + offset + t;
    filled += static_cast<size_t>(piece);
    ++k;
  }
}

}  // namespace hcp::data
