// Splitting a CPU kernel's independent work over threads. The caller says how many threads a
// kernel may use (CpuExecutor::Options::threads); there is no pool and no global setting: the
// threads live for one call. Kernels split work only where the pieces write disjoint outputs,
// each computed exactly as on one thread, so results never depend on the count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace hcp::cpu {

struct Threads {
  int count = 1;
};

// fn(begin, end) on contiguous pieces of [0, n) whose bounds are multiples of `align` (but the
// last), at most threads.count pieces and none under `min_items` items; the calling thread takes
// the first piece. Returns after every piece is done.
template <typename F>
void parallel_for(Threads threads, int64_t n, int64_t min_items, int64_t align, F&& fn) {
  if (n <= 0) return;
  const int64_t units = (n + align - 1) / align;
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(min_items, 1));
  const int64_t pieces = std::clamp<int64_t>(std::min<int64_t>(threads.count, most), 1, units);
  if (pieces <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  auto bounds = [&](int64_t piece) { return std::min(n, units * piece / pieces * align); };
  std::vector<std::thread> others;
  others.reserve(pieces - 1);
  for (int64_t piece = 1; piece < pieces; ++piece) {
    // pieces <= units: every piece has at least one unit.
    others.emplace_back([&fn, begin = bounds(piece), end = bounds(piece + 1)] { fn(begin, end); });
  }
  fn(int64_t{0}, bounds(1));
  for (std::thread& t : others) t.join();
}

}  // namespace hcp::cpu
