// The CPU backend: runs one plan step on the fp32 reference kernels of runtime/kernels/cpu.
//
// One wrapper per line of KernelTable.txt (CpuBackend.cpp, in table order) unpacks the step's
// buffers, ints and floats and calls the kernel, so a wrapper and its kernel can be read side
// by side (the collectives' kernels are in Collectives.h). The wrappers keep small scratch of their
// own where the plan does not carry a saved value (rms_norm's rstd and cross_entropy's lse are
// recomputed in the backward).
#pragma once

#include <array>
#include <cstddef>

#include "absl/status/status.h"
#include "runtime/comm/Communicator.h"
#include "runtime/kernels/cpu/Parallel.h"
#include "runtime/plan/Plan.h"

namespace hcp::cpu {

// Base address of each arena, indexed by plan::Arena; each holds plan.arena_bytes[arena] bytes.
using ArenaBases = std::array<std::byte*, plan::kNumArenas>;

// Runs step `step_index` of `plan`, which must have passed plan::ValidatePlan (the wrappers
// rely on its element counts and int ranges). Data-dependent errors (a token id outside the
// vocabulary, a target outside it, an expert index outside [0, experts)) come back as
// InvalidArgument starting with the step: "step 3 (embedding.forward): token id ...".
// The collectives (plan::IsCollective) communicate on `comm`, whose mesh must be the plan's
// (cp, dp and ep); they never fail by themselves (see Communicator.h), except the expert-parallel
// kernels on an expert index out of range, after joining every exchange. The GEMMs, the MoE
// experts and the SSD scans use up to `threads` threads (the same results with any count).
absl::Status RunCpuStep(const plan::Plan& plan, size_t step_index, const ArenaBases& arenas,
                        comm::Communicator& comm, Threads threads = {});

}  // namespace hcp::cpu
