// parallel_for: every item once, in pieces on aligned bounds, no more pieces than allowed; and
// the kernels that split their work over threads give the same bits with any count.
#include <algorithm>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/kernels/cpu/Parallel.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

struct Pieces {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  std::set<std::thread::id> threads;
};

Pieces Split(int count, int64_t n, int64_t min_items, int64_t align) {
  Pieces run;
  std::mutex lock;
  parallel_for(Threads{count}, n, min_items, align, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> guard(lock);
    run.pieces.emplace_back(begin, end);
    run.threads.insert(std::this_thread::get_id());
  });
  std::sort(run.pieces.begin(), run.pieces.end());
  return run;
}

TEST(ParallelFor, EveryItemOnceOnAlignedBounds) {
  for (int count : {1, 2, 3, 8}) {
    for (int64_t n : {1, 5, 64, 203}) {
      for (int64_t align : {1, 4}) {
        const Pieces run = Split(count, n, /*min_items=*/1, align);
        ASSERT_FALSE(run.pieces.empty());
        EXPECT_LE(static_cast<int64_t>(run.pieces.size()), count);
        EXPECT_EQ(run.pieces.size(), run.threads.size()) << "one thread per piece";
        int64_t next = 0;
        for (const auto& [begin, end] : run.pieces) {
          EXPECT_EQ(begin, next);
          EXPECT_LT(begin, end);
          EXPECT_EQ(begin % align, 0);
          next = end;
        }
        EXPECT_EQ(next, n) << count << " threads, n " << n << ", align " << align;
      }
    }
  }
}

TEST(ParallelFor, SmallWorkStaysOnTheCallingThread) {
  const Pieces few = Split(8, 100, /*min_items=*/60, 1);
  EXPECT_EQ(few.pieces.size(), 1u);
  EXPECT_EQ(*few.threads.begin(), std::this_thread::get_id());
  EXPECT_EQ(Split(8, 100, /*min_items=*/30, 1).pieces.size(), 3u);  // 100 / 30
  EXPECT_TRUE(Split(4, 0, 1, 1).pieces.empty());
}

// Big enough to split: ~2^22 multiply-adds per thread (Gemm.cpp's kMinThreadWork) at 28 rows.
TEST(ParallelKernels, GemmGivesTheSameBitsOnAnyNumberOfThreads) {
  std::mt19937 rng(71);
  const int64_t m = 203, n = 300, k = 500;
  for (bool ta : {false, true}) {
    const std::vector<float> a = testing::to_float(testing::random_vec(rng, m * k));
    const std::vector<float> b = testing::to_float(testing::random_vec(rng, k * n));
    std::vector<float> one(m * n);
    gemm<float>(ta, false, m, n, k, 1.5f, a.data(), ta ? m : k, b.data(), n, 0.0f, one.data(), n);
    for (int count : {3, 8}) {
      std::vector<float> many(m * n, -1.0f);
      gemm<float>(ta, false, m, n, k, 1.5f, a.data(), ta ? m : k, b.data(), n, 0.0f, many.data(), n,
                  Threads{count});
      EXPECT_EQ(many, one) << count << " threads, trans_a " << ta;
    }
  }
}

TEST(ParallelKernels, MoeExpertsGiveTheSameBitsOnAnyNumberOfThreads) {
  std::mt19937 rng(72);
  const int64_t tokens = 64, hidden = 24, inner = 16, experts = 5, k = 2;
  const std::vector<float> x = testing::to_float(testing::random_vec(rng, tokens * hidden));
  const std::vector<float> dout = testing::to_float(testing::random_vec(rng, tokens * hidden));
  const std::vector<float> gates =
      testing::to_float(testing::random_vec(rng, tokens * k, 0.1, 0.9));
  const std::vector<float> w_in =
      testing::to_float(testing::random_vec(rng, experts * 2 * inner * hidden));
  const std::vector<float> w_out =
      testing::to_float(testing::random_vec(rng, experts * hidden * inner));
  std::vector<int32_t> indices(tokens * k);
  for (int64_t s = 0; s < tokens * k; s++) {
    indices[s] = static_cast<int32_t>((s * 7 + s / 3) % experts);
  }
  indices[5] = -1;  // a slot without an expert
  struct Result {
    std::vector<float> out, dx, dgates, dw_in, dw_out;
    bool operator==(const Result&) const = default;
  };
  auto run = [&](int count) {
    Result r{std::vector<float>(tokens * hidden), std::vector<float>(tokens * hidden),
             std::vector<float>(tokens * k), std::vector<float>(w_in.size()),
             std::vector<float>(w_out.size())};
    moe_experts_forward<float>(r.out.data(), x.data(), gates.data(), indices.data(), w_in.data(),
                               w_out.data(), tokens, hidden, inner, experts, k, Threads{count});
    moe_experts_backward<float>(r.dx.data(), r.dgates.data(), r.dw_in.data(), r.dw_out.data(),
                                dout.data(), x.data(), gates.data(), indices.data(), w_in.data(),
                                w_out.data(), tokens, hidden, inner, experts, k, Threads{count});
    return r;
  };
  const Result one = run(1);
  for (int count : {2, 3, 8}) EXPECT_TRUE(run(count) == one) << count << " threads";
}

TEST(ParallelKernels, SsdScanGivesTheSameBitsOnAnyNumberOfThreads) {
  std::mt19937 rng(73);
  const SsdShape shape{
      .batch = 2, .seq = 37, .heads = 4, .head_dim = 3, .groups = 2, .state = 5, .chunk = 8};
  const int64_t xs = shape.batch * shape.seq * shape.heads * shape.head_dim;
  const int64_t bcs = shape.batch * shape.seq * shape.groups * shape.state;
  const int64_t states = shape.batch * shape.heads * shape.head_dim * shape.state;
  const std::vector<float> x = testing::to_float(testing::random_vec(rng, xs));
  const std::vector<float> dt =
      testing::to_float(testing::random_vec(rng, shape.batch * shape.seq * shape.heads, 0.1, 1));
  const std::vector<float> A = testing::to_float(testing::random_vec(rng, shape.heads, -1, -0.1));
  const std::vector<float> B = testing::to_float(testing::random_vec(rng, bcs));
  const std::vector<float> C = testing::to_float(testing::random_vec(rng, bcs));
  const std::vector<float> D = testing::to_float(testing::random_vec(rng, shape.heads));
  const std::vector<float> init = testing::to_float(testing::random_vec(rng, states));
  const std::vector<float> dy = testing::to_float(testing::random_vec(rng, xs));
  const std::vector<float> dfinal = testing::to_float(testing::random_vec(rng, states));
  // Forward, then backward; every output one after another.
  auto run = [&](int count) {
    std::vector<float> y(xs), final_state(states), dx(xs), ddt(dt.size()), dA(shape.heads), dB(bcs),
        dC(bcs), dD(shape.heads), dinit(states);
    ssd_scan_forward<float>(y.data(), final_state.data(), x.data(), dt.data(), A.data(), B.data(),
                            C.data(), D.data(), init.data(), shape, Threads{count});
    ssd_scan_backward<float>(dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(),
                             dinit.data(), dy.data(), dfinal.data(), x.data(), dt.data(), A.data(),
                             B.data(), C.data(), D.data(), init.data(), shape, Threads{count});
    for (const std::vector<float>* v : {&final_state, &dx, &ddt, &dA, &dB, &dC, &dD, &dinit}) {
      y.insert(y.end(), v->begin(), v->end());
    }
    return y;
  };
  const std::vector<float> one = run(1);
  for (int count : {3, 8}) EXPECT_EQ(run(count), one) << count << " threads";
}

}  // namespace
}  // namespace hcp::cpu
