// The generic checks of one step against its kernel's signature (KernelTable.txt): counts,
// int kinds and rules, every buffer's dtype and element count. ValidatePlan runs them on every
// step of a plan; exec.launch's verifier runs them on every launch the compiler makes, so a
// lowering bug fails in the pass that made it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "runtime/plan/KernelTable.h"
#include "runtime/plan/Plan.h"

namespace hcp::plan {

// A buffer as the checks see it. dtype: nullopt for an element type no kernel takes.
struct BufferFacts {
  uint64_t elements = 0;
  std::optional<DType> dtype;
  std::string_view name;
};

struct StepFacts {
  KernelId kernel;
  std::span<const int64_t> ints;
  std::span<const double> floats;
  std::span<const BufferFacts> ins;
  std::span<const BufferFacts> outs;
};

// Where the mesh rules (segments per rank, segment length, local sequence, expert parallel)
// come from: the plan's mesh and global sequence length. Without it they are not checked.
struct SequenceContext {
  const Mesh* mesh;
  int64_t seq;
};

// Buffer counts a step of this kernel must have: the signature's, less the buffers whose flag
// is 0 (a missing int counts as 0).
struct Arity {
  int ins, outs;
};
Arity ExpectedArity(KernelId kernel, std::span<const int64_t> ints);

// OK, or what is wrong in the signature's terms, without the step's label:
//   "input 0 'act.7' has 100 elements, expected rows*dim = 128"
//   "int 2 (m) is 0, expected a positive size"
absl::Status CheckKernelArguments(const StepFacts& step, const SequenceContext* context);

}  // namespace hcp::plan
