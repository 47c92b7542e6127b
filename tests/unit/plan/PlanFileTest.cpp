// Plan files: round trip through PlanBuilder and LoadPlan, and every header and FlatBuffer-level
// error (bad magic, other version, truncation at every length, trailing bytes, identifier,
// corrupt payload, fields the schema leaves open).
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
#include "tests/unit/plan/TinyLm.h"

namespace hcp::plan {
namespace {

using hcp::testing::TinyLm;
using ::testing::HasSubstr;

std::string ErrorOf(std::string_view bytes) {
  absl::StatusOr<Plan> plan = ParsePlan(bytes, "test.plan");
  if (plan.ok()) return "(loaded)";
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  return std::string(plan.status().message());
}

// A payload written with the generated API directly, for what PlanBuilder cannot express.
std::string WrapPayload(flatbuffers::FlatBufferBuilder& fbb) {
  std::string file = EncodePlanHeader(fbb.GetSize());
  file.append(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
  return file;
}

TEST(PlanFile, HeaderLayout) {
  const std::string header = EncodePlanHeader(0x0102030405060708ull);
  ASSERT_EQ(header.size(), kPlanHeaderBytes);
  EXPECT_EQ(header.substr(0, 8), std::string("HCPPLAN\0", 8));
  EXPECT_EQ(header.substr(8, 4), std::string("\x09\x00\x00\x00", 4));  // version 9, LE
  EXPECT_EQ(header.substr(12, 4), std::string(4, '\0'));               // reserved
  EXPECT_EQ(header.substr(16, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
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
  std::string bytes = TinyLm().Bytes();
  bytes[8] = 6;
  EXPECT_EQ(ErrorOf(bytes),
            "test.plan: plan schema version 6, this runtime reads version 9: recompile the plan "
            "with this hybridcp");
}

TEST(PlanFile, TruncatedAtEveryLength) {
  const std::string bytes = TinyLm().Bytes();
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::string error = ErrorOf(std::string_view(bytes).substr(0, length));
    if (length < kPlanHeaderBytes) {
      EXPECT_THAT(error, HasSubstr("shorter than the 24-byte header")) << length;
    } else {
      EXPECT_THAT(error, HasSubstr("truncated")) << length;
    }
  }
}

TEST(PlanFile, TrailingBytes) {
  EXPECT_THAT(ErrorOf(TinyLm().Bytes() + "x"), HasSubstr("trailing bytes: 1 bytes after"));
}

TEST(PlanFile, PayloadSizeLies) {
  // A header that claims less than the file holds reads as trailing bytes, more as truncated;
  // a size near 2^64 must not wrap around.
  std::string bytes = TinyLm().Bytes();
  bytes[16 + 7] = '\xFF';
  EXPECT_THAT(ErrorOf(bytes), HasSubstr("truncated"));
}

TEST(PlanFile, WrongFileIdentifier) {
  std::string bytes = TinyLm().Bytes();
  // The identifier sits at payload bytes 4..7.
  bytes[kPlanHeaderBytes + 4] = 'X';
  EXPECT_THAT(ErrorOf(bytes), HasSubstr("no \"HCPP\" file identifier"));
}

TEST(PlanFile, CorruptPayloadFailsVerification) {
  std::string bytes = TinyLm().Bytes();
  // The root offset (payload bytes 0..3) pointing far outside the buffer.
  bytes[kPlanHeaderBytes + 2] = '\x7F';
  EXPECT_THAT(ErrorOf(bytes), HasSubstr("fails FlatBuffers verification"));
  // A payload of only the identifier.
  std::string tiny = EncodePlanHeader(8) + std::string("\0\0\0\0HCPP", 8);
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

TEST(KernelTable, NamesRoundTrip) {
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelInfo& info = GetKernelInfo(KernelId(i));
    EXPECT_EQ(info.id, KernelId(i));
    EXPECT_EQ(FindKernel(info.name), KernelId(i)) << info.name;
  }
  EXPECT_EQ(KernelName(KernelId::RmsNormForward), "rms_norm.forward");
  EXPECT_FALSE(FindKernel("nope").has_value());
}

}  // namespace
}  // namespace hcp::plan
