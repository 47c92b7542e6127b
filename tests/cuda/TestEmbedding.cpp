// Embedding lookup and its backward against runtime/kernels/cpu.
#include <climits>
#include <cmath>
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// bf16 out: one rounding of table * multiplier (forward) or of an fp32 sum (backward).
constexpr double kTolBf16 = 4e-3;
constexpr float kMultiplier = 12.f;  // granite's embedding_multiplier

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Token ids with a skewed distribution: a quarter of the tokens use one of 20 "hot" ids (long
// segments in the backward's sort), the rest are uniform over the vocabulary.
std::vector<int32_t> skewed_ids(Context& ctx, int64_t tokens, int64_t vocab) {
  std::vector<int32_t> ids = randint(tokens, ctx.seed(), 0, static_cast<int32_t>(vocab));
  const std::vector<int32_t> hot = randint(20, ctx.seed(), 0, static_cast<int32_t>(vocab));
  const std::vector<int32_t> pick = randint(tokens, ctx.seed(), 0, 80);
  for (int64_t t = 0; t < tokens; t++) {
    if (pick[t] < 20) ids[t] = hot[pick[t]];
  }
  return ids;
}

void forward_case(Context& ctx, int64_t tokens, int64_t vocab, int64_t hidden, bool big) {
  if (!ctx.wants("embedding.forward")) return;
  const std::vector<float> table = randn(vocab * hidden, ctx.seed(), 0.02f);
  const std::vector<int32_t> ids = skewed_ids(ctx, tokens, vocab);
  Dev<bf16> d_table = to_device<bf16>(table), out(tokens * hidden);
  Dev<int32_t> d_ids = to_device_i32(ids), bad(1);
  out.poison();
  bad.upload_raw({INT32_MAX});
  auto launch = [&] {
    check(embedding_forward(ctx.stream(), out.get(), d_ids.get(), d_table.get(), tokens, vocab,
                            hidden, kMultiplier, bad.get()));
  };
  launch();
  ctx.sync();
  std::vector<float> ref(tokens * hidden);
  if (!cpu::embedding_forward<float>(ref.data(), ids.data(), table.data(), tokens, vocab, hidden,
                                     kMultiplier)
           .ok()) {
    die("embedding oracle refused valid ids");
  }
  const double bad_error = bad.download_raw()[0] == INT32_MAX ? 0.0 : 1.0;
  const double ms = big ? ctx.time_ms(launch) : -1;
  ctx.report(
      "embedding.forward", shape_str({tokens, vocab, hidden}),
      {{"out", rel_rms(out.download(), rounded(ref)), kTolBf16}, {"no_bad_id", bad_error, 0.0}}, ms,
      big ? tbps(4.0 * tokens * hidden + 4.0 * tokens, ms) : "");
}

// Ids outside the vocabulary: the first bad position is reported, those rows are NaN, the others
// are right.
void bad_id_case(Context& ctx) {
  if (!ctx.wants("embedding.forward")) return;
  const int64_t tokens = 40, vocab = 300, hidden = 24;
  const std::vector<float> table = randn(vocab * hidden, ctx.seed(), 0.02f);
  std::vector<int32_t> ids = randint(tokens, ctx.seed(), 0, static_cast<int32_t>(vocab));
  ids[30] = -1;
  ids[17] = static_cast<int32_t>(vocab + 5);
  Dev<bf16> d_table = to_device<bf16>(table), out(tokens * hidden);
  Dev<int32_t> d_ids = to_device_i32(ids), bad(1);
  out.poison();
  bad.upload_raw({INT32_MAX});
  check(embedding_forward(ctx.stream(), out.get(), d_ids.get(), d_table.get(), tokens, vocab,
                          hidden, kMultiplier, bad.get()));
  ctx.sync();
  const std::vector<float> got = out.download();
  std::vector<int32_t> fixed = ids;
  fixed[30] = fixed[17] = 0;
  std::vector<float> ref(tokens * hidden);
  (void)cpu::embedding_forward<float>(ref.data(), fixed.data(), table.data(), tokens, vocab, hidden,
                                      kMultiplier);
  std::vector<float> good_got, good_ref;
  double nan_rows = 0.0;
  for (int64_t t = 0; t < tokens; t++) {
    for (int64_t c = 0; c < hidden; c++) {
      if (t == 17 || t == 30) {
        if (!std::isnan(got[t * hidden + c])) nan_rows = 1.0;
      } else {
        good_got.push_back(got[t * hidden + c]);
        good_ref.push_back(round_bf16(ref[t * hidden + c]));
      }
    }
  }
  const double position = bad.download_raw()[0] == 17 ? 0.0 : 1.0;
  ctx.report("embedding.forward bad ids", shape_str({tokens, vocab, hidden}),
             {{"out", rel_rms(good_got, good_ref), kTolBf16},
              {"bad_position", position, 0.0},
              {"nan_rows", nan_rows, 0.0}});
}

// Token ids as byte-level text gives them: the first 64 ids only, id floor(64 u^3) for uniform
// u, so id 0 takes a quarter of the tokens (rows of far more than one warp's kWarpRowLimit).
std::vector<int32_t> text_like_ids(Context& ctx, int64_t tokens) {
  std::vector<int32_t> ids = randint(tokens, ctx.seed(), 0, 1 << 20);
  for (int32_t& id : ids) {
    const double u = id / double{1 << 20};
    id = static_cast<int32_t>(64 * u * u * u);
  }
  return ids;
}

void backward_case(Context& ctx, int64_t tokens, int64_t vocab, int64_t hidden, bool big,
                   bool text_like = false) {
  if (!ctx.wants("embedding.backward")) return;
  std::vector<int32_t> ids =
      text_like ? text_like_ids(ctx, tokens) : skewed_ids(ctx, tokens, vocab);
  // A frequent id, often a hot one; for text-like ids a rare one, so that the hottest rows are
  // summed.
  const int64_t padding_idx = text_like ? 63 : ids[0];
  if (!big && tokens > 10) {
    ids[3] = -3;  // outside the table: skipped by both
    ids[9] = static_cast<int32_t>(vocab + 2);
  }
  const std::vector<float> dout = randn(tokens * hidden, ctx.seed(), 1.f);
  Dev<bf16> d_dout = to_device<bf16>(dout), dtable(vocab * hidden);
  Dev<int32_t> d_ids = to_device_i32(ids);
  Dev<uint8_t> ws = scratch(embedding_backward_workspace_bytes(tokens, vocab));
  dtable.poison();
  auto launch = [&] {
    check(embedding_backward(ctx.stream(), dtable.get(), d_dout.get(), d_ids.get(), tokens, vocab,
                             hidden, kMultiplier, padding_idx, ws.workspace()));
  };
  launch();
  ctx.sync();
  std::vector<float> ref(vocab * hidden);
  cpu::embedding_backward<float>(ref.data(), dout.data(), ids.data(), tokens, vocab, hidden,
                                 kMultiplier, padding_idx);
  const double ms = big ? ctx.time_ms(launch) : -1;
  ctx.report("embedding.backward", shape_str({tokens, vocab, hidden}) + (text_like ? " text" : ""),
             {{"dtable", rel_rms(dtable.download(), rounded(ref)), kTolBf16}}, ms,
             big ? tbps(2.0 * tokens * hidden + 2.0 * vocab * hidden + 4.0 * tokens, ms) : "");
}

}  // namespace

void test_embedding(Context& ctx) {
  forward_case(ctx, 37, 1000, 100, false);
  bad_id_case(ctx);
  backward_case(ctx, 37, 1000, 100, false);
  backward_case(ctx, 300, 50, 2100, false);  // hidden above one warp pass (2048 columns)
  backward_case(ctx, 1, 7, 8, false);
  // Rows of far more than one warp's tokens (the long-rows kernel), with 2 slabs of its columns
  // and a short last one, and one hot row as the padding id.
  backward_case(ctx, 900, 70, 2100, false, /*text_like=*/true);
  backward_case(ctx, 400, 3, 40, false, /*text_like=*/true);  // most ids outside the table
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny: vocab 100352, hidden 1536, 8192 tokens; and byte-level text's ids.
  forward_case(ctx, 8192, 100352, 1536, true);
  backward_case(ctx, 8192, 100352, 1536, true);
  backward_case(ctx, 8192, 100352, 1536, true, /*text_like=*/true);
}

}  // namespace hcp::cuda::test
