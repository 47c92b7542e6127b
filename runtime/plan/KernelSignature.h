// What a kernel's signature says, as data: the types of the table that gen_kernel_table.py
// writes from KernelTable.txt (KernelTable.gen.h), read by the generic checks (KernelCheck.h).
// Nothing here knows a particular kernel.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace hcp::plan {

// How an int argument is checked: a size is >= 1, a flag 0 or 1, a plain int only by the
// kernel's range rules.
enum class IntKind : uint8_t { Size, Flag, Int };

// A buffer's element type: the plan's storage type for tensors (f32 or bf16), or always f32, or
// int32.
enum class DTypeRule : uint8_t { Storage, F32, I32 };

struct IntSpec {
  std::string_view name;
  IntKind kind;
};

// One factor of a buffer's shape: ints[index] + constant (index < 0: the constant alone), then
// divided by ints[divisor] when divisor >= 0 (experts / ep), rounded up when ceil (the number of
// chunks of a sequence, ceil(seq / chunk)).
struct Factor {
  int8_t index = -1;
  int64_t constant = 0;
  int8_t divisor = -1;
  bool ceil = false;
};

struct BufferSpec {
  std::string_view name;
  DTypeRule dtype;
  std::span<const Factor> shape;  // the product is the element count
  int8_t present_if = -1;         // the flag int without which the buffer is absent; -1: always
  bool at_least = false;          // the buffer may hold more elements than the shape
};

// An upper bound of a range rule: ints[plus] - ints[minus] + constant (absent terms: -1).
struct Bound {
  int8_t plus = -1;
  int8_t minus = -1;
  int64_t constant = 0;
};

enum class RuleKind : uint8_t {
  Range,            // lo <= ints[a] <= hi
  Divisible,        // ints[a] % ints[b] == 0
  SameDType,        // every buffer of the step has one dtype
  SegmentsPerRank,  // ints[a] is the mesh layout's segments per rank
  SegmentLength,    // ints[a] is seq / (cp * segments per rank)
  LocalSequence,    // ints[a] is seq / cp
  ExpertParallel,   // ints[a] is the mesh's ep and ints[b] (experts) splits over it
};

struct RuleSpec {
  RuleKind kind;
  int8_t a = -1;
  int8_t b = -1;
  int64_t lo = 0;
  Bound hi;
  std::string_view words;  // what hi is, for the message ("vocab-1", "2^31-1")
};

struct KernelSignature {
  std::string_view name;  // as plans and exec.launch spell it: "ssd_scan.backward"
  bool collective;        // communicates: every rank of its group runs it, in the same order
  bool beside;            // a collective that may run beside the compute stream (KernelTable.txt)
  std::span<const IntSpec> ints;
  std::span<const std::string_view> floats;
  std::span<const BufferSpec> ins;
  std::span<const BufferSpec> outs;
  std::span<const RuleSpec> rules;

  // The index of the int called `name`, or -1.
  constexpr int IntIndex(std::string_view int_name) const {
    for (size_t i = 0; i < ints.size(); ++i) {
      if (ints[i].name == int_name) return static_cast<int>(i);
    }
    return -1;
  }
};

// The buffer lists of a step as Encode() writes them (Buffer: a plan's buffer index, an MLIR
// value), with the ints and floats in the table's order.
template <typename Buffer>
struct EncodedStep {
  std::vector<Buffer> ins;
  std::vector<Buffer> outs;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

}  // namespace hcp::plan
