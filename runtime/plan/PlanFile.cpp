#include "runtime/plan/PlanFile.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "flatbuffers/flatbuffers.h"
#include "runtime/plan/plan_generated.h"
#include "runtime/support/Crc32c.h"
#include "runtime/support/Status.h"

namespace hcp::plan {

// The C++ enums are plain copies of the schema's; keep them in step.
static_assert(static_cast<int>(DType::F32) == fb::DType_F32 &&
              static_cast<int>(DType::BF16) == fb::DType_BF16 &&
              static_cast<int>(DType::I32) == fb::DType_I32 && kNumDTypes == fb::DType_MAX + 1);
static_assert(static_cast<int>(Arena::Parameters) == fb::Arena_Parameters &&
              static_cast<int>(Arena::Gradients) == fb::Arena_Gradients &&
              static_cast<int>(Arena::Activations) == fb::Arena_Activations &&
              static_cast<int>(Arena::Inputs) == fb::Arena_Inputs &&
              kNumArenas == fb::Arena_MAX + 1);
static_assert(static_cast<int>(ParamInit::Normal) == fb::ParamInit_Normal &&
              static_cast<int>(ParamInit::Zeros) == fb::ParamInit_Zeros &&
              static_cast<int>(ParamInit::Ones) == fb::ParamInit_Ones &&
              static_cast<int>(ParamInit::LogArange) == fb::ParamInit_LogArange &&
              kNumParamInits == fb::ParamInit_MAX + 1);
static_assert(static_cast<int>(SequenceLayout::Contiguous) == fb::SequenceLayout_Contiguous &&
              static_cast<int>(SequenceLayout::Zigzag) == fb::SequenceLayout_Zigzag &&
              kNumSequenceLayouts == fb::SequenceLayout_MAX + 1);

namespace {

void PutLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t GetLittleEndian(std::string_view in, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<uint8_t>(in[offset + i])} << (8 * i);
  }
  return value;
}

// The verifier checks a vector's bounds but aligns only its 4-byte length, so a corrupt file
// can place 8-byte elements at any address: copy the bytes rather than read them in place.
// (FlatBuffers is little-endian, like every host this runs on.)
static_assert(std::endian::native == std::endian::little);
template <typename T>
std::vector<T> ToVector(const flatbuffers::Vector<T>* v) {
  if (v == nullptr) return {};
  std::vector<T> out(v->size());
  if (!out.empty()) std::memcpy(out.data(), v->Data(), out.size() * sizeof(T));
  return out;
}

// The FlatBuffer -> Plan copy. The verifier has already proven every access in bounds; what is
// left to check here is what the schema leaves open: absent names, enum values outside the
// schema's, kernel names outside the table.
absl::StatusOr<Plan> FromFlatBuffer(const fb::Plan& root) {
  Plan plan;
  if (root.producer()) plan.producer = root.producer()->str();
  if (root.model()) plan.model = root.model()->str();
  if (root.model_config()) plan.model_config = root.model_config()->str();
  plan.seq = root.seq();
  plan.micro_batch = root.micro_batch();
  plan.flops_per_step = root.flops_per_step();
  plan.input_ids = root.input_ids();
  plan.targets = root.targets();
  plan.loss = root.loss();
  plan.loss_scale = root.loss_scale();
  if (root.position_ids().has_value()) plan.position_ids = *root.position_ids();
  if (const fb::RouterAuxLoss* aux = root.router_aux_loss()) {
    plan.router_aux_loss = Plan::RouterAuxLoss{
        .coefficient = aux->coefficient(), .scale = aux->scale(), .loss = aux->loss()};
  }
  if (const fb::Mesh* mesh = root.mesh()) {
    if (mesh->layout() < fb::SequenceLayout_MIN || mesh->layout() > fb::SequenceLayout_MAX) {
      return absl::InvalidArgumentError(
          absl::StrFormat("mesh has sequence layout %d, expected 0..%d (contiguous, zigzag)",
                          static_cast<int>(mesh->layout()), kNumSequenceLayouts - 1));
    }
    plan.mesh = Mesh{.cp = mesh->cp(),
                     .dp = mesh->dp(),
                     .layout = static_cast<SequenceLayout>(mesh->layout()),
                     .ep = mesh->ep()};
  }

  const std::vector<uint64_t> arena_bytes = ToVector(root.arena_bytes());
  const size_t num_arenas = arena_bytes.size();
  if (num_arenas != kNumArenas) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "arena_bytes has %d entries, expected %d (parameters, gradients, activations, inputs)",
        num_arenas, kNumArenas));
  }
  for (int a = 0; a < kNumArenas; ++a) plan.arena_bytes[a] = arena_bytes[a];

  if (const auto* buffers = root.buffers()) {
    plan.buffers.reserve(buffers->size());
    for (uint32_t i = 0; i < buffers->size(); ++i) {
      const fb::Buffer* b = buffers->Get(i);
      if (b->name() == nullptr || b->name()->size() == 0) {
        return absl::InvalidArgumentError(absl::StrFormat("buffer %d has no name", i));
      }
      if (b->arena() < fb::Arena_MIN || b->arena() > fb::Arena_MAX) {
        return absl::InvalidArgumentError(
            absl::StrFormat("buffer %d '%s' has arena %d, expected 0..%d", i, b->name()->str(),
                            static_cast<int>(b->arena()), kNumArenas - 1));
      }
      if (b->dtype() < fb::DType_MIN || b->dtype() > fb::DType_MAX) {
        return absl::InvalidArgumentError(
            absl::StrFormat("buffer %d '%s' has dtype %d, expected 0..%d", i, b->name()->str(),
                            static_cast<int>(b->dtype()), kNumDTypes - 1));
      }
      plan.buffers.push_back(Buffer{
          .name = b->name()->str(),
          .arena = static_cast<Arena>(b->arena()),
          .offset = b->offset(),
          .elements = b->elements(),
          .dtype = static_cast<DType>(b->dtype()),
          .shape = ToVector(b->shape()),
      });
    }
  }

  if (const auto* parameters = root.parameters()) {
    plan.parameters.reserve(parameters->size());
    for (uint32_t i = 0; i < parameters->size(); ++i) {
      const fb::Parameter* p = parameters->Get(i);
      if (p->name() == nullptr || p->name()->size() == 0) {
        return absl::InvalidArgumentError(absl::StrFormat("parameter %d has no name", i));
      }
      if (p->init() < fb::ParamInit_MIN || p->init() > fb::ParamInit_MAX) {
        return absl::InvalidArgumentError(
            absl::StrFormat("parameter %d '%s' has init %d, expected 0..%d", i, p->name()->str(),
                            static_cast<int>(p->init()), kNumParamInits - 1));
      }
      plan.parameters.push_back(Parameter{
          .name = p->name()->str(),
          .buffer = p->buffer(),
          .gradient = p->gradient(),
          .init = static_cast<ParamInit>(p->init()),
          .std = p->std(),
          .shards = p->shards(),
          .full_shape = ToVector(p->full_shape()),
      });
    }
  }

  if (const auto* steps = root.steps()) {
    plan.steps.reserve(steps->size());
    for (uint32_t i = 0; i < steps->size(); ++i) {
      const fb::Step* s = steps->Get(i);
      if (s->kernel() == nullptr) {
        return absl::InvalidArgumentError(absl::StrFormat("step %d has no kernel", i));
      }
      std::optional<KernelId> kernel = FindKernel(s->kernel()->str());
      if (!kernel) {
        return absl::InvalidArgumentError(
            absl::StrFormat("step %d: unknown kernel '%s' (not in this runtime's KernelTable.txt)",
                            i, absl::CHexEscape(s->kernel()->str())));
      }
      if (s->stream() < fb::Stream_MIN || s->stream() > fb::Stream_MAX) {
        return absl::InvalidArgumentError(absl::StrFormat("step %d: stream %d is not a stream", i,
                                                          static_cast<int>(s->stream())));
      }
      plan.steps.push_back(Step{
          .kernel = *kernel,
          .ins = ToVector(s->ins()),
          .outs = ToVector(s->outs()),
          .ints = ToVector(s->ints()),
          .floats = ToVector(s->floats()),
          .stream = static_cast<Stream>(s->stream()),
          .join_before = s->join_before(),
      });
    }
  }
  return plan;
}

absl::Status OtherVersionError(uint32_t version) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "plan schema version %d, this runtime reads version %d: recompile the plan with this "
      "hybridcp",
      version, kPlanSchemaVersion));
}

std::string DamagedMessage(std::string_view detail) {
  return absl::StrFormat("checksum mismatch: the plan is damaged (%s); compile it again", detail);
}

// What the damage looks like, for the message: a file cut short or grown, or changed bytes.
std::string DamageDetail(std::string_view bytes, uint32_t stored, uint32_t computed) {
  const uint64_t payload_size = GetLittleEndian(bytes, 16, 8);
  if (payload_size > kMaxPlanPayloadBytes) {
    return absl::StrFormat("its header gives a payload of %d bytes, more than a plan can hold",
                           payload_size);
  }
  const uint64_t expected = kPlanHeaderBytes + payload_size + kPlanChecksumBytes;
  if (bytes.size() < expected) {
    return absl::StrFormat("the file has %d of the %d bytes its header gives", bytes.size(),
                           expected);
  }
  if (bytes.size() > expected) {
    const uint64_t extra = bytes.size() - expected;
    return absl::StrFormat("the file has %d byte%s after the %d its header gives", extra,
                           extra == 1 ? "" : "s", expected);
  }
  return absl::StrFormat("checksum 0x%08x stored, 0x%08x computed", stored, computed);
}

// The version and the checksum, after the magic. An older plan (with no checksum) is named by its
// version. Damage is told apart from another version, and a damaged header field from a file cut
// short or grown, by the checksum: when it holds over the header as this runtime and this file's
// length say it should read, the differing header fields are what is damaged.
absl::Status CheckVersionAndChecksum(std::string_view bytes) {
  const uint32_t version = static_cast<uint32_t>(GetLittleEndian(bytes, 8, 4));
  if (bytes.size() < kPlanHeaderBytes + kPlanChecksumBytes) {
    if (version != kPlanSchemaVersion) return OtherVersionError(version);
    // No checksum to compare: the detail is the file's size against its header's.
    return absl::InvalidArgumentError(DamagedMessage(DamageDetail(bytes, 0, 0)));
  }
  const std::string_view content = bytes.substr(0, bytes.size() - kPlanChecksumBytes);
  const uint32_t stored = static_cast<uint32_t>(GetLittleEndian(bytes, content.size(), 4));
  const uint32_t computed = Crc32c(content);
  if (version == kPlanSchemaVersion && computed == stored) return absl::OkStatus();

  const uint64_t payload_size = GetLittleEndian(bytes, 16, 8);
  const uint64_t held = content.size() - kPlanHeaderBytes;
  std::string header(content.substr(0, 8));  // the magic
  PutLittleEndian(header, kPlanSchemaVersion, 4);
  header.append(content.substr(12, 4));  // reserved
  PutLittleEndian(header, held, 8);
  if ((version != kPlanSchemaVersion || payload_size != held) &&
      Crc32c(content.substr(kPlanHeaderBytes), Crc32c(header)) == stored) {
    std::vector<std::string> fields;
    if (version != kPlanSchemaVersion) {
      fields.push_back(absl::StrFormat("its header's schema version reads %d, not %d", version,
                                       kPlanSchemaVersion));
    }
    if (payload_size != held) {
      fields.push_back(
          absl::StrFormat("its header's payload size reads %d, not %d", payload_size, held));
    }
    return absl::InvalidArgumentError(DamagedMessage(absl::StrJoin(fields, "; ")));
  }
  if (version != kPlanSchemaVersion) return OtherVersionError(version);
  return absl::InvalidArgumentError(DamagedMessage(DamageDetail(bytes, stored, computed)));
}

absl::StatusOr<Plan> ParseUnprefixed(std::string_view bytes) {
  if (bytes.size() < kPlanHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a hybridcp plan: %d bytes, shorter than the %d-byte header",
                        bytes.size(), kPlanHeaderBytes));
  }
  if (bytes.substr(0, sizeof(kPlanMagic)) != std::string_view(kPlanMagic, sizeof(kPlanMagic))) {
    return absl::InvalidArgumentError("not a hybridcp plan (bad magic)");
  }
  HCP_RETURN_IF_ERROR(CheckVersionAndChecksum(bytes));
  // The checksum holds, so a size that disagrees with the file was written so.
  const uint64_t payload_size = GetLittleEndian(bytes, 16, 8);
  const uint64_t held = bytes.size() - kPlanHeaderBytes - kPlanChecksumBytes;
  if (payload_size != held) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the header gives a %d-byte payload, the file holds %d bytes between header and checksum",
        payload_size, held));
  }
  if (payload_size > kMaxPlanPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload of %d bytes is larger than a FlatBuffer can be", payload_size));
  }
  // A private copy: FlatBuffers reads scalars in place, so the payload must sit at an address
  // aligned for its largest scalar (8), whatever the caller's bytes are.
  std::vector<uint64_t> aligned((payload_size + 7) / 8);
  std::memcpy(aligned.data(), bytes.data() + kPlanHeaderBytes, payload_size);
  const auto* payload = reinterpret_cast<const uint8_t*>(aligned.data());

  if (payload_size < 8 || !fb::PlanBufferHasIdentifier(payload)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload is not a plan FlatBuffer (no \"%s\" file identifier)", fb::PlanIdentifier()));
  }
  flatbuffers::Verifier::Options options;
  options.max_tables = 10'000'000;  // one per buffer, parameter and step: large models have many
  flatbuffers::Verifier verifier(payload, payload_size, options);
  if (!fb::VerifyPlanBuffer(verifier)) {
    return absl::InvalidArgumentError(
        "payload fails FlatBuffers verification (corrupt or not written by hybridcp)");
  }
  HCP_ASSIGN_OR_RETURN(Plan plan, FromFlatBuffer(*fb::GetPlan(payload)));
  HCP_RETURN_IF_ERROR(ValidatePlan(plan));
  return plan;
}

}  // namespace

std::string EncodePlanFile(std::string_view payload) {
  std::string file(kPlanMagic, sizeof(kPlanMagic));
  PutLittleEndian(file, kPlanSchemaVersion, 4);
  PutLittleEndian(file, 0, 4);  // reserved
  PutLittleEndian(file, payload.size(), 8);
  file.append(payload);
  PutLittleEndian(file, Crc32c(file), 4);
  return file;
}

absl::StatusOr<Plan> ParsePlan(std::string_view bytes, std::string_view source) {
  absl::StatusOr<Plan> plan = ParseUnprefixed(bytes);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        std::string(source) + ": " + std::string(plan.status().message()));
  }
  return plan;
}

absl::StatusOr<std::string> ReadPlanFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("cannot open plan '%s': %s", path, std::strerror(errno)));
  }
  const std::streamoff size = in.tellg();
  if (size < 0 ||
      static_cast<uint64_t>(size) > kPlanHeaderBytes + kMaxPlanPayloadBytes + kPlanChecksumBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes is not a plan file size", path, static_cast<int64_t>(size)));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) {
    return absl::DataLossError(absl::StrFormat("%s: read failed", path));
  }
  return bytes;
}

absl::StatusOr<Plan> LoadPlan(const std::string& path) {
  HCP_ASSIGN_OR_RETURN(std::string bytes, ReadPlanFile(path));
  return ParsePlan(bytes, path);
}

uint64_t PlanBytesHash(std::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string HashString(uint64_t hash) { return absl::StrFormat("%016x", hash); }

RankPlan ParsePlanForRank(std::string_view bytes, std::string_view source) {
  return RankPlan{.plan = ParsePlan(bytes, source), .hash = PlanBytesHash(bytes)};
}

RankPlan LoadPlanForRank(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadPlanFile(path);
  if (!bytes.ok()) return RankPlan{.plan = bytes.status(), .hash = 0};
  return ParsePlanForRank(*bytes, path);
}

}  // namespace hcp::plan
