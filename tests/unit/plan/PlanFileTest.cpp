// Plan files: round trip through PlanBuilder and LoadPlan, and every header, checksum and
// FlatBuffer-level error (bad magic, other version, damage, truncation at every length, trailing
// bytes, identifier, corrupt payload, fields the schema leaves open). Changes behind a correct
// checksum (Reseal) stand for a faulty writer.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "flatbuffers/flatbuffers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/plan/plan_generated.h"
#include "runtime/support/Crc32c.h"
#include "tests/unit/plan/TinyLm.h"

namespace hcp::plan {
namespace {

using hcp::testing::Reseal;
using hcp::testing::TinyLm;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ErrorOf(std::string_view bytes) {
  absl::StatusOr<Plan> plan = ParsePlan(bytes, "test.plan");
  if (plan.ok()) return "(loaded)";
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  return std::string(plan.status().message());
}

// A payload written with the generated API directly, for what PlanBuilder cannot express.
std::string WrapPayload(flatbuffers::FlatBufferBuilder& fbb) {
  return EncodePlanFile(
      std::string_view(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize()));
}

TEST(PlanFile, Layout) {
  const std::string file = EncodePlanFile("123456789");
  ASSERT_EQ(file.size(), kPlanHeaderBytes + 9 + kPlanChecksumBytes);
  EXPECT_EQ(file.substr(0, 8), std::string("HCPPLAN\0", 8));
  EXPECT_EQ(file.substr(8, 4), std::string("\x10\x00\x00\x00", 4));  // version 16, LE
  EXPECT_EQ(file.substr(12, 4), std::string(4, '\0'));               // reserved
  EXPECT_EQ(file.substr(16, 8), std::string("\x09\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(file.substr(24, 9), "123456789");
  // The trailer: the CRC32C of everything before it, little-endian.
  const uint32_t crc = Crc32c(file.substr(0, 33));
  EXPECT_EQ(file.substr(33),
            std::string({static_cast<char>(crc), static_cast<char>(crc >> 8),
                         static_cast<char>(crc >> 16), static_cast<char>(crc >> 24)}));
}

TEST(PlanFile, RoundTripKeepsEveryField) {
  TinyLm lm;
  absl::StatusOr<std::string> bytes = lm.builder.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Plan> plan = ParsePlan(*bytes, "tiny");
  ASSERT_TRUE(plan.ok()) << plan.status();

  EXPECT_EQ(plan->producer, "hybridcp");
  EXPECT_EQ(plan->model, "tiny-lm");
  EXPECT_EQ(plan->micro_batch, TinyLm::kMicroBatch);
  EXPECT_EQ(plan->seq, TinyLm::kSeq);
  EXPECT_EQ(plan->tokens(), TinyLm::kTokens);
  EXPECT_EQ(plan->flops_per_step, 1234.0);
  EXPECT_EQ(plan->input_ids, lm.ids);
  EXPECT_EQ(plan->targets, lm.targets);
  EXPECT_EQ(plan->loss, lm.loss);
  for (int a = 0; a < kNumArenas; ++a) {
    EXPECT_EQ(plan->arena_bytes[a], lm.builder.arena_bytes(Arena(a))) << a;
  }
  ASSERT_EQ(plan->buffers.size(), lm.builder.num_buffers());
  for (uint32_t i = 0; i < plan->buffers.size(); ++i) {
    const Buffer& got = plan->buffers[i];
    const Buffer& want = lm.builder.buffer(i);
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.arena, want.arena);
    EXPECT_EQ(got.offset, want.offset);
    EXPECT_EQ(got.offset % kBufferAlignment, 0u);
    EXPECT_EQ(got.elements, want.elements);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
  }
  ASSERT_EQ(plan->parameters.size(), 2u);
  EXPECT_EQ(plan->parameters[0].name, TinyLm::kTable);
  EXPECT_EQ(plan->parameters[0].buffer, lm.table);
  EXPECT_EQ(plan->parameters[0].gradient, lm.dtable);
  EXPECT_EQ(plan->parameters[0].init, ParamInit::Normal);
  EXPECT_EQ(plan->parameters[0].std, 0.5);
  EXPECT_EQ(plan->parameters[1].init, ParamInit::Ones);
  EXPECT_EQ(plan->buffers[lm.dnorm].name, std::string(TinyLm::kNorm) + ".grad");
  ASSERT_EQ(plan->steps.size(), lm.builder.num_steps());
  const Step& gemm = plan->steps[lm.head_gemm_step];
  EXPECT_EQ(gemm.kernel, KernelId::Gemm);
  EXPECT_EQ(gemm.ins, (std::vector<uint32_t>{lm.h, lm.table}));
  EXPECT_EQ(gemm.outs, (std::vector<uint32_t>{lm.logits_raw}));
  EXPECT_EQ(gemm.ints,
            (std::vector<int64_t>{0, 1, TinyLm::kTokens, TinyLm::kVocab, TinyLm::kHidden}));
  EXPECT_EQ(gemm.floats, (std::vector<double>{1.0}));
  EXPECT_EQ(plan->steps[lm.ce_forward_step].kernel, KernelId::CrossEntropyForward);
  EXPECT_EQ(StepLabel(*plan, lm.norm_step), "step 1 (rms_norm.forward)");
  // No mesh in the file: one rank.
  EXPECT_EQ(plan->mesh, Mesh{});
  EXPECT_EQ(plan->local_tokens(), TinyLm::kTokens);
}

TEST(PlanFile, MeshRoundTrips) {
  // seq 8 on cp=2 x dp=3, zigzag: 4 segments of 2 tokens, 4 tokens per rank and sequence.
  PlanBuilder b;
  b.set_shape(2, 8).set_mesh(Mesh{.cp = 2, .dp = 3, .layout = SequenceLayout::Zigzag});
  auto [ids, targets, loss_scale] = b.AllocateInputs();
  EXPECT_EQ(b.buffer(ids).shape, (std::vector<int64_t>{2, 4}));
  b.set_loss(b.Allocate("loss", Arena::Activations, {1}));
  absl::StatusOr<std::string> bytes = b.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Plan> plan = ParsePlan(*bytes, "mesh");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->mesh, (Mesh{.cp = 2, .dp = 3, .layout = SequenceLayout::Zigzag}));
  EXPECT_EQ(plan->mesh.world(), 6);
  EXPECT_EQ(plan->mesh.segments(), 4);
  EXPECT_EQ(plan->tokens(), 16);
  EXPECT_EQ(plan->local_seq(), 4);
  EXPECT_EQ(plan->local_tokens(), 8);
}

TEST(PlanFile, MeshLayouts) {
  // zigzag over cp=4: rank r holds segments r and 7-r.
  const Mesh zigzag{.cp = 4, .dp = 1, .layout = SequenceLayout::Zigzag};
  const int64_t holds[4][2] = {{0, 7}, {1, 6}, {2, 5}, {3, 4}};
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t j = zigzag.GlobalSegment(r, k);
      EXPECT_EQ(j, holds[r][k]);
      EXPECT_EQ(zigzag.OwnerOf(j).cp_index, r);
      EXPECT_EQ(zigzag.OwnerOf(j).k, k);
    }
  }
  const Mesh contiguous{.cp = 4, .dp = 2};
  EXPECT_EQ(contiguous.segments(), 4);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(contiguous.GlobalSegment(r, 0), r);
    EXPECT_EQ(contiguous.OwnerOf(r).cp_index, r);
  }
}

TEST(PlanFile, WriteAndLoad) {
  TinyLm lm;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("hcp_plan_test_" + std::to_string(getpid()) + ".plan"))
                               .string();
  ASSERT_TRUE(lm.builder.Write(path).ok());
  absl::StatusOr<Plan> plan = LoadPlan(path);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->steps.size(), lm.builder.num_steps());
  std::filesystem::remove(path);

  absl::StatusOr<Plan> missing = LoadPlan(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(path));
}

TEST(PlanFile, WriteRefusesAnInvalidPlan) {
  TinyLm lm;
  lm.builder.step(lm.norm_step).ints = {TinyLm::kTokens, TinyLm::kHidden + 1};
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("hcp_plan_bad_" + std::to_string(getpid()) + ".plan"))
                               .string();
  absl::Status status = lm.builder.Write(path);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("step 1 (rms_norm.forward)"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(PlanFile, BadMagic) {
  std::string bytes = TinyLm().Bytes();
  bytes[3] = 'X';
  EXPECT_THAT(ErrorOf(bytes), HasSubstr("test.plan: not a hybridcp plan"));
  EXPECT_THAT(ErrorOf("this is a text file, not a plan at all"), HasSubstr("not a hybridcp plan"));
}

TEST(PlanFile, OtherVersion) {
  // A plan of version 9: the same FlatBuffer, no checksum.
  std::string old = TinyLm().Bytes();
  old.resize(old.size() - kPlanChecksumBytes);
  old[8] = 9;
  EXPECT_EQ(ErrorOf(old),
            "test.plan: plan schema version 9, this runtime reads version 16: recompile the plan "
            "with this hybridcp");
  // A later version, with a checksum of its own.
  std::string later = TinyLm().Bytes();
  later[8] = 17;
  Reseal(later);
  EXPECT_THAT(ErrorOf(later), HasSubstr("plan schema version 17, this runtime reads version 16"));
}

// The config.json a plan carries comes back as written; one that is not a JSON object is refused
// (checkpoints would carry it).
TEST(PlanFile, CarriesTheModelConfig) {
  TinyLm with_config;
  with_config.builder.set_model_config(R"({"model_type": "granitemoehybrid", "vocab_size": 8})");
  absl::StatusOr<Plan> plan = ParsePlan(with_config.Bytes(), "test.plan");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->model_config, R"({"model_type": "granitemoehybrid", "vocab_size": 8})");
  TinyLm bad;
  bad.builder.set_model_config("[1, 2]");
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("the plan's config.json is not a JSON object"));
  bad.builder.set_model_config("{\"a\": ");
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("the plan's config.json: not valid JSON"));
}

// The load-balancing loss's coefficient, scale input and result come back as written; a scale
// outside the inputs, overlapping another input, or a coefficient that is not positive is refused.
TEST(PlanFile, CarriesTheLoadBalancingLoss) {
  TinyLm with_aux;
  const uint32_t scale = with_aux.builder.Allocate("aux_loss_scale", Arena::Inputs, {1});
  with_aux.builder.set_router_aux_loss(
      {.coefficient = 0.01, .scale = scale, .loss = with_aux.loss});
  absl::StatusOr<Plan> plan = ParsePlan(with_aux.Bytes(), "test.plan");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->router_aux_loss.has_value());
  EXPECT_EQ(plan->router_aux_loss->coefficient, 0.01);
  EXPECT_EQ(plan->router_aux_loss->scale, scale);
  EXPECT_EQ(plan->router_aux_loss->loss, with_aux.loss);
  EXPECT_FALSE(ParsePlan(TinyLm().Bytes(), "test.plan")->router_aux_loss.has_value());

  TinyLm bad;
  bad.builder.set_router_aux_loss({.coefficient = 0.01, .scale = bad.loss, .loss = bad.loss});
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("the load-balancing loss's scale buffer"));
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("is in the activations arena, not the inputs"));
  bad.builder.set_router_aux_loss({.coefficient = 0.01, .scale = bad.ids, .loss = bad.loss});
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("its scale buffer"));
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("'input_ids' is i32"));
  const uint32_t other = bad.builder.Allocate("aux_loss_scale", Arena::Inputs, {1});
  bad.builder.set_router_aux_loss({.coefficient = 0, .scale = other, .loss = bad.loss});
  EXPECT_THAT(ErrorOf(bad.Bytes()),
              HasSubstr("the load-balancing loss's coefficient is 0, expected a positive number"));
  bad.builder.set_router_aux_loss({.coefficient = 1, .scale = other, .loss = 9999});
  EXPECT_THAT(ErrorOf(bad.Bytes()), HasSubstr("its loss is buffer 9999, but the plan has"));
}

TEST(PlanFile, DamageIsNamedSo) {
  const std::string bytes = TinyLm().Bytes();
  const size_t size = bytes.size();
  // A changed byte in the FlatBuffer, or in the checksum itself.
  for (size_t at : {kPlanHeaderBytes + 100, size - 1}) {
    std::string damaged = bytes;
    damaged[at] ^= 0x10;
    const std::string error = ErrorOf(damaged);
    EXPECT_THAT(error,
                StartsWith("test.plan: checksum mismatch: the plan is damaged (checksum 0x"));
    EXPECT_THAT(error, EndsWith(" computed); compile it again"));
  }
  // A damaged version field is no other version, a damaged size field no truncation.
  std::string version = bytes;
  version[8] ^= 0x04;
  EXPECT_EQ(ErrorOf(version),
            "test.plan: checksum mismatch: the plan is damaged (its header's schema version reads "
            "20, not 16); compile it again");
  std::string payload_size = bytes;
  payload_size[16 + 7] ^= 0x80;  // near 2^64: must not wrap around
  EXPECT_EQ(ErrorOf(payload_size),
            absl::StrFormat("test.plan: checksum mismatch: the plan is damaged (its header's "
                            "payload size reads %d, not %d); compile it again",
                            (uint64_t{1} << 63) + (size - 28), size - 28));
}

TEST(PlanFile, TruncatedAtEveryLength) {
  const std::string bytes = TinyLm().Bytes();
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::string error = ErrorOf(std::string_view(bytes).substr(0, length));
    if (length < kPlanHeaderBytes) {
      EXPECT_THAT(error, HasSubstr("not a hybridcp plan: " + std::to_string(length) +
                                   " bytes, shorter than the 24-byte header"));
    } else {
      EXPECT_EQ(error,
                absl::StrFormat("test.plan: checksum mismatch: the plan is damaged (the file "
                                "has %d of the %d bytes its header gives); compile it "
                                "again",
                                length, bytes.size()));
    }
  }
}

TEST(PlanFile, TrailingBytes) {
  const std::string bytes = TinyLm().Bytes();
  EXPECT_THAT(ErrorOf(bytes + "x"),
              HasSubstr(absl::StrFormat("damaged (the file has 1 byte after the %d its header "
                                        "gives)",
                                        bytes.size())));
  EXPECT_THAT(ErrorOf(bytes + "xyz"), HasSubstr("(the file has 3 bytes after the"));
}

TEST(PlanFile, PayloadSizeLiesBehindACorrectChecksum) {
  std::string bytes = TinyLm().Bytes();
  const size_t payload = bytes.size() - kPlanHeaderBytes - kPlanChecksumBytes;
  bytes[16] ^= 0x01;
  Reseal(bytes);
  EXPECT_THAT(ErrorOf(bytes),
              HasSubstr(absl::StrFormat("the header gives a %d-byte payload, the file holds %d "
                                        "bytes between header and checksum",
                                        payload ^ 1, payload)));
}

TEST(PlanFile, WrongFileIdentifier) {
  std::string bytes = TinyLm().Bytes();
  // The identifier sits at payload bytes 4..7.
  bytes[kPlanHeaderBytes + 4] = 'X';
  Reseal(bytes);
  EXPECT_THAT(ErrorOf(bytes), HasSubstr("no \"HCPP\" file identifier"));
}

TEST(PlanFile, CorruptPayloadFailsVerification) {
  std::string bytes = TinyLm().Bytes();
  // The root offset (payload bytes 0..3) pointing far outside the buffer.
  bytes[kPlanHeaderBytes + 2] = '\x7F';
  Reseal(bytes);
  EXPECT_THAT(ErrorOf(bytes), HasSubstr("fails FlatBuffers verification"));
  // A payload of only the identifier.
  const std::string tiny = EncodePlanFile(std::string("\0\0\0\0HCPP", 8));
  EXPECT_THAT(ErrorOf(tiny), HasSubstr("fails FlatBuffers verification"));
}

TEST(PlanFile, ArenaBytesMustHaveFourEntries) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint64_t> arenas = {64, 64, 64};
  fb::FinishPlanBuffer(fbb, fb::CreatePlanDirect(fbb, "p", "m", 1, 1, &arenas));
  EXPECT_THAT(ErrorOf(WrapPayload(fbb)), HasSubstr("arena_bytes has 3 entries, expected 4"));

  flatbuffers::FlatBufferBuilder empty;
  fb::FinishPlanBuffer(empty, fb::CreatePlanDirect(empty));
  EXPECT_THAT(ErrorOf(WrapPayload(empty)), HasSubstr("arena_bytes has 0 entries"));
}

TEST(PlanFile, AbsentFieldsAndOpenEnums) {
  {
    TinyLm lm;
    lm.builder.buffer(lm.h).name = "";  // written as an absent field
    EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr(absl::StrFormat("buffer %d has no name", lm.h)));
  }
  {
    TinyLm lm;
    lm.builder.buffer(lm.h).arena = Arena(9);
    EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr("'act.h' has arena 9, expected 0..3"));
  }
  {
    TinyLm lm;
    lm.builder.buffer(lm.h).dtype = DType(5);
    EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr("'act.h' has dtype 5, expected 0..2"));
  }
  {
    TinyLm lm;
    lm.builder.parameter(1).init = ParamInit(4);
    EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr("'model.norm.weight' has init 4"));
  }
  {
    TinyLm lm;
    lm.builder.parameter(0).name = "";
    EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr("parameter 0 has no name"));
  }
  {
    TinyLm lm;
    lm.builder.step(2).kernel = "";
    EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr("step 2 has no kernel"));
  }
  {
    TinyLm lm;
    lm.builder.set_mesh(Mesh{.cp = 1, .dp = 1, .layout = SequenceLayout(3)});
    EXPECT_THAT(ErrorOf(lm.Bytes()),
                HasSubstr("mesh has sequence layout 3, expected 0..1 (contiguous, zigzag)"));
  }
}

TEST(PlanFile, UnknownKernel) {
  TinyLm lm;
  lm.builder.step(lm.norm_step).kernel = "layer_norm.forward";
  EXPECT_THAT(ErrorOf(lm.Bytes()), HasSubstr("step 1: unknown kernel 'layer_norm.forward'"));
}

TEST(PlanFile, AlignedCopyOfUnalignedInput) {
  // ParsePlan copies the payload, so bytes at any address load (and UBSan sees no misaligned
  // reads).
  const std::string bytes = TinyLm().Bytes();
  std::string shifted = "x" + bytes;
  EXPECT_TRUE(ParsePlan(std::string_view(shifted).substr(1), "shifted").ok());
}

}  // namespace
}  // namespace hcp::plan
