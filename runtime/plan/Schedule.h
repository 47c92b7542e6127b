// The plan's schedule: which steps run beside the compute stream and where the compute stream
// waits for them (Plan.h's Step::stream and join_before). The compiler decides it
// (hcp-overlap-collectives); ValidatePlan checks here that it is safe, so a backend may run it as
// it stands.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "runtime/plan/Plan.h"

namespace hcp::plan {

inline constexpr size_t kNotBeside = ~size_t{0};

// Per step: kNotBeside for a step whose kernel may not run beside the compute stream; for one
// that may (RunsBesideCompute), the latest step before which the compute stream may wait for
// it (steps.size(): the end). That is the first later step that communicates (every rank issues
// its collectives in the same order, and one beside the compute stream at a time keeps that
// plain), that writes a byte it reads or writes, or that reads a byte it writes. Two steps that
// only read the same bytes may run side by side.
std::vector<size_t> LatestJoins(const Plan& plan);

// Every step's schedule is one a backend may run: a kCompute step has join_before 0; a kBeside
// step is of a `beside` kernel and is joined before a later step (or the end), no later than
// LatestJoins allows. Errors name the step and what is wrong, in the plan's terms.
absl::Status CheckSchedule(const Plan& plan);

}  // namespace hcp::plan
