// A small hand-written training-step plan for test_plan_step --tiny, in two versions: "f32" (every
// float buffer f32: what the CPU reference runs) and "bf16" (the dtypes the compiler's --dtype bf16
// plans have: bf16 weights and activations, fp32 for the Mamba dt/A/D chain, the SSD states, the
// attention lse and the loss). It lets the CUDA executor and backend run end to end against the
// CPU before the compiler writes bf16 plans, on shapes the CUDA kernels take.
//
// The model, 2 sequences of 512 tokens, vocabulary 512, hidden 128:
//   x0 = embed(ids)
//   x1 = x0 + mamba(rms_norm(x0)):  in_proj -> [x | B | C | dt], causal conv on x, dt' = softplus(
//        dt + dt_bias) in fp32, A = -exp(A_log), SSD scan (2 heads of 64, state 128, chunk 256,
//        D), out_proj
//   x2 = x1 + attention(rms_norm(x1)): q, k, v projections (2 query heads, 1 kv head of 64),
//        causal attention, o_proj
//   x4 = cast(cast(silu(x2)) to f32) back  (both directions of cast)
//   loss = cross_entropy(rms_norm(x4) @ embed^T, targets) * loss_scale  (tied LM head)
// and the backward of all of it, every parameter's gradient written once.
#pragma once

#include "absl/status/statusor.h"
#include "runtime/plan/Plan.h"

namespace hcp::test {

// dtype F32: the f32 plan; BF16: the bf16 plan.
absl::StatusOr<plan::Plan> TinyPlan(plan::DType dtype);

}  // namespace hcp::test
