// The SSD log-decay (a segment's total dt * A) and its gradients against runtime/kernels/cpu's
// ssd_log_decay and ssd_log_decay_backward.
#include <cmath>
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// Both sides sum double products in double and round once to fp32; only the summation order
// differs (slabs of rows, then slabs in order, against one running sum), far below fp32's half
// ulp, so the fp32 results agree to about one ulp at most.
constexpr double kTolSum = 1e-6;
// ddt is one double product rounded once, as the CPU's: exact.
constexpr double kExact = 0.0;

// With `documents` (the longest document; 0: none), packed documents: rows whose last document
// starts in them get -infinity, the others (one document across the row) their sum.
void log_decay_case(Context& ctx, int64_t batch, int64_t seq, int64_t heads, bool time,
                    int32_t documents = 0) {
  if (!ctx.wants("ssd_log_decay")) return;
  const std::string shape = shape_str({batch, seq, heads}) + (documents > 0 ? " documents" : "");
  // dt as after softplus (positive, around 0.01-0.1); A = -exp(A_log), negative.
  const std::vector<float> dt = randu(batch * seq * heads, ctx.seed(), 1e-3f, 0.1f, false);
  const std::vector<float> A = randu(heads, ctx.seed(), -16.f, -1.f, false);
  const std::vector<float> dg = randn(batch * heads, ctx.seed(), 1.f, false);
  Dev<float> d_dt = to_device<float>(dt), d_A = to_device<float>(A), d_dg = to_device<float>(dg);
  const std::vector<int32_t> positions =
      documents > 0 ? packed_positions(batch, seq, ctx.seed(), documents, 1)
                    : std::vector<int32_t>();
  const Dev<int32_t> d_positions = to_device_i32(positions);
  const int32_t* positions_host = documents > 0 ? positions.data() : nullptr;
  Dev<float> g(batch * heads), ddt(batch * seq * heads), dA(heads);
  Dev<uint8_t> ws = scratch(ssd_log_decay_workspace_bytes(batch, seq, heads));
  g.poison();
  ddt.poison();
  dA.poison();
  auto forward = [&] {
    check(ssd_log_decay_forward(ctx.stream(), g.get(), d_dt.get(), d_A.get(), batch, seq, heads,
                                ws.workspace(), documents > 0 ? d_positions.get() : nullptr));
  };
  auto backward = [&] {
    check(ssd_log_decay_backward(ctx.stream(), ddt.get(), dA.get(), d_dg.get(), d_dt.get(),
                                 d_A.get(), batch, seq, heads, ws.workspace()));
  };
  forward();
  backward();
  ctx.sync();

  std::vector<float> g_ref(batch * heads), ddt_ref(batch * seq * heads), dA_ref(heads);
  cpu::ssd_log_decay<float>(g_ref.data(), dt.data(), A.data(), batch, seq, heads, positions_host);
  cpu::ssd_log_decay_backward<float>(ddt_ref.data(), dA_ref.data(), dg.data(), dt.data(), A.data(),
                                     batch, seq, heads);
  // Reads dt once (and writes ddt once in the backward): memory-bound.
  const double bytes = 4.0 * batch * seq * heads;
  const double ms_fwd = time ? ctx.time_ms(forward) : -1;
  std::vector<Output> forward_outputs;
  if (documents > 0) {
    // -infinity entries are compared apart (rel_rms takes finite numbers).
    std::vector<float> g_got = g.download(), g_sums, g_ref_sums;
    double infinities = 0;
    for (size_t i = 0; i < g_ref.size(); i++) {
      if (std::isinf(g_ref[i])) {
        infinities += g_got[i] == g_ref[i] ? 0 : 1;
      } else {
        g_sums.push_back(g_got[i]);
        g_ref_sums.push_back(g_ref[i]);
      }
    }
    forward_outputs = {{"g (-inf rows)", infinities, 0.0},
                       {"g (sums)", rel_rms(g_sums, g_ref_sums), kTolSum}};
  } else {
    forward_outputs = {{"g", rel_rms(g.download(), g_ref), kTolSum}};
  }
  ctx.report("ssd_log_decay.forward", shape, forward_outputs, ms_fwd,
             time ? tbps(bytes, ms_fwd) : "");
  const double ms_bwd = time ? ctx.time_ms(backward) : -1;
  ctx.report("ssd_log_decay.backward", shape,
             {{"ddt", rel_rms(ddt.download(), ddt_ref), kExact},
              {"dA", rel_rms(dA.download(), dA_ref), kTolSum}},
             ms_bwd, time ? tbps(2 * bytes, ms_bwd) : "");
}

}  // namespace

void test_ssd_log_decay(Context& ctx) {
  // Odd sizes: a partial head block, a partial slab, several slabs and batch rows.
  log_decay_case(ctx, 3, 2500, 37, false);
  log_decay_case(ctx, 2, 1, 5, false);
  // Packed documents: rows whose first (continued) document of 200 tokens ends in them, and rows
  // within it.
  log_decay_case(ctx, 8, 300, 37, false, 200);
  log_decay_case(ctx, 4, 150, 37, false, 200);
  if (!ctx.options().big) return;
  // 64K-token sequences (one shard of a long context) with 48 and 128 Mamba heads.
  log_decay_case(ctx, 1, 65536, 48, true);
  log_decay_case(ctx, 2, 65536, 128, true);
}

}  // namespace hcp::cuda::test
