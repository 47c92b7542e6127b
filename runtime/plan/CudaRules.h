// What the CUDA backend can run, as rules over a plan alone: plain C++ without CUDA, so that the
// compiler checks a bf16 plan against the same rules the backend applies before it runs one.
#pragma once

#include "absl/status/status.h"
#include "runtime/plan/Plan.h"

namespace hcp::cuda_backend {

// Whether every step of `plan` (already plan::ValidatePlan'ed) can run on the CUDA backend; the
// error names the step (plan::StepLabel) and lists what is wrong with it:
//   - each buffer has the dtype the CUDA kernel takes:
//       "step 12 (ssd_scan.forward): input 1 'act.7' is bf16, the CUDA kernel takes f32";
//   - the shapes are ones the kernels support (SSD: chunk 256, state 128, head_dim 32 or 64;
//     attention: head_dim 64 or 128; norms: dim <= 32768; conv: width <= 8; routing:
//     experts <= 256, k <= 16; ...).
absl::Status CheckPlanRunsOnCuda(const plan::Plan& plan);

}  // namespace hcp::cuda_backend
