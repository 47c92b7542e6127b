// Plan files: a 24-byte header, the FlatBuffer of plan.fbs, then a checksum of all of it.
//
//   offset  size  field
//        0     8  magic "HCPPLAN\0"
//        8     4  schema version, little-endian uint32 (kPlanSchemaVersion)
//       12     4  reserved, 0
//       16     8  payload size n in bytes, little-endian uint64
//       24     n  FlatBuffer, file identifier "HCPP"
//     24+n     4  CRC32C of bytes [0, 24+n), little-endian
//
// The checksum is a trailer, after the bytes it covers, so the whole file is one CRC codeword
// and every guarantee of runtime/support/Crc32c.h holds for any change anywhere in it, the
// checksum's own bits included: every change of 1 or 3 bits and every burst of up to 32 bits is
// refused, and every 2-bit change in a plan of up to 256 MiB (plans are well under 1 MiB). (A
// 64-bit hash would only make an unnoticed change unlikely; the CRC makes these impossible.)
//
// Loading checks, in order: the magic, the version, the checksum, the payload size against the
// file, the FlatBuffers verifier, the fields the schema leaves optional or open (absent names,
// enum values out of range, unknown kernels), then every semantic rule of ValidatePlan. Only a
// plan that passes all of them comes back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/plan/Plan.h"

namespace hcp::plan {

// Bumped on any change to plan.fbs, to the file's layout or to the meaning of a kernel's arguments.
// 2: Mesh (context and data parallelism), conv halos, the collectives of context parallelism.
// 3: the loss_scale input.
// 4: expert parallelism: Mesh.ep, sharded parameters (Parameter.shards, full_shape), the
//    moe_experts_ep kernels.
// 5: the ssd_final_state kernels (context parallelism's state-only segment summary).
// 6: the ssd_add_initial_state kernels (a segment's zero-start scan corrected by its incoming
//    state).
// 7: the gemm_add kernel (a GEMM with its following add folded in).
// 8: the conv kernels' silu flag (a causal conv1d with the SiLU after it folded in).
// 9: the moe_experts kernels' keep_h flag (the experts' first product kept for the backward).
// 10: the CRC32C trailer (a checksum of the whole file).
// 11: the schedule: Step.stream and Step.join_before (hcp-overlap-collectives).
// 12: Plan.model_config, the config.json text (checkpoints carry it).
// 13: the MoE load-balancing loss: Plan.router_aux_loss, the router_load and router_aux_loss
//     kernels; packed documents: Plan.position_ids and the sequence kernels' documents flag and
//     positions.
// 14: rms_norm.backward's has_residual flag (the residual stream's gradient added in).
inline constexpr uint32_t kPlanSchemaVersion = 16;
inline constexpr char kPlanMagic[8] = {'H', 'C', 'P', 'P', 'L', 'A', 'N', '\0'};
inline constexpr size_t kPlanHeaderBytes = 24;
inline constexpr size_t kPlanChecksumBytes = 4;
// FlatBuffers addresses its buffer with 32-bit offsets.
inline constexpr uint64_t kMaxPlanPayloadBytes = (1ull << 31) - 1;

// The plan file holding `payload` (a plan FlatBuffer): the header, the payload, the checksum.
std::string EncodePlanFile(std::string_view payload);

// Parses and validates a whole plan file held in memory. `source` (a path, or a label such as
// "<memory>") starts every error message.
absl::StatusOr<Plan> ParsePlan(std::string_view bytes, std::string_view source);
// The bytes of the plan file at `path` (refusing sizes no plan can have), unparsed.
absl::StatusOr<std::string> ReadPlanFile(const std::string& path);
// Reads `path` and parses it.
absl::StatusOr<Plan> LoadPlan(const std::string& path);

// A stable 64-bit hash of a plan file's bytes (FNV-1a), for telling plans apart across ranks
// (comm::CheckRanksAgree), and its text: "a1b2c3d4e5f60718".
uint64_t PlanBytesHash(std::string_view bytes);
std::string HashString(uint64_t hash);

// One rank's plan: loaded and validated, or the error; the hash of the file's bytes (0 if the
// file could not be read). Every rank of a job loads its own and then agrees with the others
// (comm::CheckRanksAgree), so a plan that fails on one rank is an error on every rank.
struct RankPlan {
  absl::StatusOr<Plan> plan;
  uint64_t hash = 0;
};
RankPlan LoadPlanForRank(const std::string& path);
// The same from bytes in memory; `source` starts error messages (as ParsePlan's).
RankPlan ParsePlanForRank(std::string_view bytes, std::string_view source);

}  // namespace hcp::plan
