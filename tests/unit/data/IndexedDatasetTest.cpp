// Megatron indexed datasets (.bin/.idx): our writer's files byte for byte against an independent
// packing of the format, round trips, an index as Megatron writes it (a document of two
// sequences), every field's corruption refused with its own message, and random damage that
// either opens consistently or is refused, never crashes (this test runs under ASan + UBSan too).
#include "runtime/data/IndexedDataset.h"

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;
using testing::ReadFileBytes;
using testing::ScratchDir;
using testing::WriteFileBytes;

// Python's struct.pack("<...") by hand, byte by byte: independent of the code under test.
std::string PackLE(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  return out;
}
std::string U8(uint8_t v) { return PackLE(v, 1); }
std::string U16(uint16_t v) { return PackLE(v, 2); }
std::string U64(uint64_t v) { return PackLE(v, 8); }
std::string I32(int32_t v) { return PackLE(static_cast<uint32_t>(v), 4); }
std::string I64(int64_t v) { return PackLE(static_cast<uint64_t>(v), 8); }

// The .idx Megatron's MMapIndexedDatasetBuilder writes: header, lengths, pointers, document index.
struct Index {
  uint8_t code = 8;  // uint16
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> docs;
  uint64_t version = 1;

  std::string Bytes() const {
    std::string out("MMIDIDX\0\0", 9);
    out += U64(version) + U8(code) + U64(lengths.size()) + U64(docs.size());
    for (int32_t l : lengths) out += I32(l);
    for (int64_t p : pointers) out += I64(p);
    for (int64_t d : docs) out += I64(d);
    return out;
  }
};

// Three sequences of 3, 2 and 4 uint16 tokens; document 0 is sequences 0-1, document 1 is
// sequence 2: what preprocess_data.py writes for a document split into sentences.
constexpr int32_t kLengths[] = {3, 2, 4};
Index TwoDocuments() { return Index{8, {3, 2, 4}, {0, 6, 10}, {0, 2, 3}}; }
std::string TwoDocumentsBin() {
  std::string out;
  for (uint16_t t : {10, 11, 12, 20, 21, 30, 31, 32, 65535}) out += U16(t);
  return out;
}

void WriteDataset(const ScratchDir& dir, const std::string& idx, const std::string& bin) {
  WriteFileBytes(dir / "ds.idx", idx);
  WriteFileBytes(dir / "ds.bin", bin);
}

std::vector<uint32_t> ReadAll(const TokenFile& file) {
  std::vector<uint32_t> tokens;
  for (int64_t i = 0; i < file.size(); ++i) tokens.push_back(file.at(i));
  return tokens;
}

// ------------------------------------------------------------------------------------------------
// Writing and reading back

TEST(IndexedDataset, WriterWritesWhatMegatronWrites) {
  ScratchDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir / "ds", TokenDType::U16);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{10, 11, 12}).ok());
  ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{}).ok());
  ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{65535, 0}).ok());
  EXPECT_EQ(writer->documents(), 3);
  EXPECT_EQ(writer->tokens(), 5);
  // Nothing under the prefix before Finish (the .bin is a temporary file so far).
  EXPECT_FALSE(std::filesystem::exists(dir / "ds.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "ds.idx"));
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"ds.bin", "ds.idx"}));

  // One sequence per document: the document index is 0..N.
  EXPECT_EQ(ReadFileBytes(dir / "ds.idx"), (Index{8, {3, 0, 2}, {0, 6, 6}, {0, 1, 2, 3}}.Bytes()));
  EXPECT_EQ(ReadFileBytes(dir / "ds.bin"), U16(10) + U16(11) + U16(12) + U16(65535) + U16(0));
  EXPECT_TRUE(FailsWith(writer->Finish(), "finished already"));
  EXPECT_TRUE(FailsWith(writer->AddDocument(std::vector<uint32_t>{1}), "finished already"));
}

// Empty documents are allowed (Megatron writes one for an empty text): they hold no tokens, and
// the document of a token skips over them.
TEST(IndexedDataset, RoundTripsUint16WithAnEmptyDocument) {
  ScratchDir dir;
  const std::vector<std::vector<uint32_t>> documents = {{1, 2, 3}, {}, {65535}, {7, 8}};
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir / "ds", TokenDType::U16);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const auto& d : documents) ASSERT_TRUE(writer->AddDocument(d).ok());
  ASSERT_TRUE(writer->Finish().ok());

  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(dir / "ds");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->dtype(), TokenDType::U16);
  EXPECT_EQ(ds->sequences(), 4);
  EXPECT_EQ(ds->documents(), 4);
  EXPECT_EQ(ds->tokens(), 6);
  EXPECT_EQ(std::vector<int32_t>(ds->sequence_lengths().begin(), ds->sequence_lengths().end()),
            (std::vector<int32_t>{3, 0, 1, 2}));
  EXPECT_EQ(std::vector<int64_t>(ds->document_starts().begin(), ds->document_starts().end()),
            (std::vector<int64_t>{0, 3, 3, 4, 6}));
  EXPECT_EQ(ReadAll(ds->token_file()), (std::vector<uint32_t>{1, 2, 3, 65535, 7, 8}));
  EXPECT_EQ(ds->token_file().path(), dir / "ds.bin");
  EXPECT_EQ(ds->DocumentOf(0), 0);
  EXPECT_EQ(ds->DocumentOf(2), 0);
  EXPECT_EQ(ds->DocumentOf(3), 2);  // document 1 is empty
  EXPECT_EQ(ds->DocumentOf(5), 3);
}

TEST(IndexedDataset, RoundTripsInt32AndUint8) {
  ScratchDir dir;
  {
    absl::StatusOr<IndexedDatasetWriter> writer =
        IndexedDatasetWriter::Create(dir / "wide", TokenDType::I32);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{70000, 2147483647u}).ok());
    ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{5}).ok());
    ASSERT_TRUE(writer->Finish().ok());
  }
  EXPECT_EQ(ReadFileBytes(dir / "wide.idx"), (Index{4, {2, 1}, {0, 8}, {0, 1, 2}}.Bytes()));
  absl::StatusOr<IndexedDataset> wide = IndexedDataset::Open(dir / "wide");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->dtype(), TokenDType::I32);
  EXPECT_EQ(ReadAll(wide->token_file()), (std::vector<uint32_t>{70000, 2147483647u, 5}));
  EXPECT_EQ(wide->DocumentOf(2), 1);

  {
    absl::StatusOr<IndexedDatasetWriter> writer =
        IndexedDatasetWriter::Create(dir / "bytes", TokenDType::U8);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{255, 0, 9}).ok());
    ASSERT_TRUE(writer->Finish().ok());
  }
  absl::StatusOr<IndexedDataset> bytes = IndexedDataset::Open(dir / "bytes");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->dtype(), TokenDType::U8);
  EXPECT_EQ(ReadAll(bytes->token_file()), (std::vector<uint32_t>{255, 0, 9}));
}

TEST(IndexedDataset, EmptyDatasetOpens) {
  ScratchDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir / "ds", TokenDType::U16);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(writer->Finish().ok());
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(dir / "ds");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->documents(), 0);
  EXPECT_EQ(ds->tokens(), 0);
  EXPECT_EQ(std::vector<int64_t>(ds->document_starts().begin(), ds->document_starts().end()),
            (std::vector<int64_t>{0}));
}

// An index packed here as Megatron's builder writes it, with a document of two sequences.
TEST(IndexedDataset, ReadsMegatronsIndexWithMultiSequenceDocuments) {
  ScratchDir dir;
  WriteDataset(dir, TwoDocuments().Bytes(), TwoDocumentsBin());
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(dir / "ds");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->sequences(), 3);
  EXPECT_EQ(ds->documents(), 2);
  EXPECT_EQ(ds->tokens(), 9);
  EXPECT_EQ(std::vector<int32_t>(ds->sequence_lengths().begin(), ds->sequence_lengths().end()),
            std::vector<int32_t>(std::begin(kLengths), std::end(kLengths)));
  EXPECT_EQ(std::vector<int64_t>(ds->document_starts().begin(), ds->document_starts().end()),
            (std::vector<int64_t>{0, 5, 9}));
  EXPECT_EQ(ReadAll(ds->token_file()),
            (std::vector<uint32_t>{10, 11, 12, 20, 21, 30, 31, 32, 65535}));
  EXPECT_EQ(ds->DocumentOf(4), 0);
  EXPECT_EQ(ds->DocumentOf(5), 1);
}

// The .bin is raw tokens whatever they are: tokens that spell "HCPTOK1\0" are tokens.
TEST(IndexedDataset, BinThatLooksLikeATokenFileIsStillTokens) {
  ScratchDir dir;
  const std::string bin("HCPTOK1\0", 8);
  WriteDataset(dir, Index{8, {4}, {0}, {0, 1}}.Bytes(), bin);
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(dir / "ds");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->token_file().at(0), 0x4348u);  // "HC"
}

// ------------------------------------------------------------------------------------------------
// Writer refusals leave nothing behind

TEST(IndexedDataset, WriterRefusesUint32) {
  ScratchDir dir;
  EXPECT_TRUE(FailsWith(IndexedDatasetWriter::Create(dir / "ds", TokenDType::U32).status(),
                        "Megatron indexed datasets have no uint32 tokens"));
  EXPECT_TRUE(dir.List().empty());
}

TEST(IndexedDataset, WriterInAMissingDirectoryFails) {
  ScratchDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir / "missing/ds", TokenDType::U16);
  EXPECT_FALSE(writer.ok());
  EXPECT_TRUE(dir.List().empty());
}

TEST(IndexedDataset, TokenTooLargeNamesDocumentAndPositionAndLeavesNothing) {
  ScratchDir dir;
  {
    absl::StatusOr<IndexedDatasetWriter> writer =
        IndexedDatasetWriter::Create(dir / "ds", TokenDType::U16);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{1, 2}).ok());
    EXPECT_TRUE(FailsWith(writer->AddDocument(std::vector<uint32_t>{3, 4, 65536}),
                          "token 65536 at position 2 of document 1 does not fit in uint16"));
    // The refused document is not in the dataset.
    EXPECT_EQ(writer->documents(), 1);
    EXPECT_EQ(writer->tokens(), 2);
  }  // destroyed without Finish
  EXPECT_TRUE(dir.List().empty());

  absl::StatusOr<IndexedDatasetWriter> wide =
      IndexedDatasetWriter::Create(dir / "wide", TokenDType::I32);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_TRUE(FailsWith(wide->AddDocument(std::vector<uint32_t>{2147483648u}),
                        "token 2147483648 at position 0 of document 0 does not fit in int32"));
}

// A refused document leaves the writer usable: what it finishes holds the other documents only.
TEST(IndexedDataset, WriterGoesOnAfterARefusedDocument) {
  ScratchDir dir;
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(dir / "ds", TokenDType::U8);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{1}).ok());
  EXPECT_FALSE(writer->AddDocument(std::vector<uint32_t>{2, 256}).ok());
  ASSERT_TRUE(writer->AddDocument(std::vector<uint32_t>{3}).ok());
  ASSERT_TRUE(writer->Finish().ok());
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(dir / "ds");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ReadAll(ds->token_file()), (std::vector<uint32_t>{1, 3}));
}

// ------------------------------------------------------------------------------------------------
// Each field corrupted: its own message

TEST(IndexedDataset, MissingFilesNameBothPaths) {
  ScratchDir dir;
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds is not a Megatron indexed dataset: it needs " + (dir / "ds.idx") +
                            " (missing) and " + (dir / "ds.bin") + " (missing)"));
  WriteFileBytes(dir / "ds.bin", TwoDocumentsBin());
  absl::StatusOr<IndexedDataset> no_idx = IndexedDataset::Open(dir / "ds");
  EXPECT_EQ(no_idx.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      FailsWith(no_idx.status(), "ds.idx (missing) and " + (dir / "ds.bin") + " (present)"));
  std::filesystem::remove(dir / "ds.bin");
  WriteFileBytes(dir / "ds.idx", TwoDocuments().Bytes());
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx (present) and " + (dir / "ds.bin") + " (missing)"));
  std::filesystem::create_directory(dir / "ds.bin");
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "(not a regular file)"));
}

TEST(IndexedDataset, HeaderFieldsAreChecked) {
  ScratchDir dir;
  const std::string bin = TwoDocumentsBin();
  std::string bad_magic = TwoDocuments().Bytes();
  bad_magic[3] = 'X';
  WriteDataset(dir, bad_magic, bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: does not start with the magic \"MMIDIDX\\0\\0\" of a Megatron "
                        "index"));

  Index version = TwoDocuments();
  version.version = 2;
  WriteDataset(dir, version.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: index version 2; only version 1 is read"));

  Index int64 = TwoDocuments();
  int64.code = 5;
  WriteDataset(dir, int64.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: dtype code 5 (int64) is not supported: tokens are uint16 (8) or "
                        "int32 (4), uint8 (1) is read too"));
  Index float32 = TwoDocuments();
  float32.code = 7;
  WriteDataset(dir, float32.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "dtype code 7 (float32)"));
  Index unknown = TwoDocuments();
  unknown.code = 9;
  WriteDataset(dir, unknown.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "dtype code 9 is none of Megatron's (1-8)"));

  WriteDataset(dir, TwoDocuments().Bytes().substr(0, 20), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: 20 bytes, shorter than the 34-byte header"));
  WriteDataset(dir, "", bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "ds.idx: 0 bytes, shorter"));
}

TEST(IndexedDataset, CountsMustFitTheFileSize) {
  ScratchDir dir;
  const std::string bin = TwoDocumentsBin();
  const std::string good = TwoDocuments().Bytes();  // 34 + 12 * 3 + 8 * 3 = 94 bytes
  ASSERT_EQ(good.size(), 94u);

  std::string more_sequences = good;
  more_sequences.replace(18, 8, U64(4));
  WriteDataset(dir, more_sequences, bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: 94 bytes, but its header's 4 sequences and 3 document indices "
                        "need 106 bytes (34 + 12 * sequences + 8 * document indices): truncated"));

  std::string fewer_docs = good;
  fewer_docs.replace(26, 8, U64(2));
  WriteDataset(dir, fewer_docs, bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "need 86 bytes (34 + 12 * sequences + 8 * document indices): extra bytes "
                        "after the document index"));

  std::string huge = good;
  huge.replace(18, 8, U64(~uint64_t{0}));
  WriteDataset(dir, huge, bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "18446744073709551615 sequences and 3 document indices need more bytes "
                        "than it has"));
  huge = good;
  huge.replace(26, 8, U64(uint64_t{1} << 61));
  WriteDataset(dir, huge, bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "need more bytes than it has"));

  WriteDataset(dir, good.substr(0, good.size() - 1), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "ds.idx: 93 bytes"));
  WriteDataset(dir, good + "x", bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: 95 bytes, but its header's 3 sequences and 3 document indices "
                        "need 94 bytes"));

  // No document index at all: not even the 0 it starts with.
  Index none{8, {}, {}, {}};
  WriteDataset(dir, none.Bytes(), "");
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "ds.idx: 0 document indices"));
}

TEST(IndexedDataset, LengthsAndPointersAreChecked) {
  ScratchDir dir;
  const std::string bin = TwoDocumentsBin();
  Index negative = TwoDocuments();
  negative.lengths[1] = -1;
  WriteDataset(dir, negative.Bytes(), bin);
  EXPECT_TRUE(
      FailsWith(IndexedDataset::Open(dir / "ds").status(), "ds.idx: sequence 1 has length -1"));

  Index gap = TwoDocuments();
  gap.pointers[2] = 12;
  WriteDataset(dir, gap.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.idx: sequence 2 starts at byte 12 of " + (dir / "ds.bin") +
                            ", expected 10 (right after sequence 1): sequences that are not "
                            "stored back to back, in order, are not supported"));
  Index first = TwoDocuments();
  first.pointers[0] = 2;
  WriteDataset(dir, first.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "sequence 0 starts at byte 2 of " + (dir / "ds.bin") +
                            ", expected 0 (the start of the file)"));
  // A length that disagrees with the next pointer.
  Index longer = TwoDocuments();
  longer.lengths[0] = 4;
  WriteDataset(dir, longer.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "sequence 1 starts at byte 6 of " + (dir / "ds.bin") + ", expected 8"));
}

TEST(IndexedDataset, BinSizeMustBeTheLengthsSum) {
  ScratchDir dir;
  const std::string bin = TwoDocumentsBin();  // 18 bytes
  WriteDataset(dir, TwoDocuments().Bytes(), bin.substr(0, 16));
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.bin: 16 bytes, but " + (dir / "ds.idx") +
                            "'s 3 sequences hold 9 uint16 tokens = 18 bytes (truncated, or "
                            "another dataset's index)"));
  WriteDataset(dir, TwoDocuments().Bytes(), bin.substr(0, 17));
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(), "ds.bin: 17 bytes"));
  WriteDataset(dir, TwoDocuments().Bytes(), bin + U16(1));
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "ds.bin: 20 bytes, but " + (dir / "ds.idx") +
                            "'s 3 sequences hold 9 uint16 tokens = 18 bytes (extra bytes"));
  // The last length is checked by the size only.
  Index last = TwoDocuments();
  last.lengths[2] = 3;
  WriteDataset(dir, last.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "hold 8 uint16 tokens = 16 bytes (extra bytes"));
  // The same tokens read as int32: 18 bytes are not 9 int32 tokens.
  Index wide = TwoDocuments();
  wide.code = 4;
  wide.pointers = {0, 12, 20};
  WriteDataset(dir, wide.Bytes(), bin);
  EXPECT_TRUE(FailsWith(IndexedDataset::Open(dir / "ds").status(),
                        "hold 9 int32 tokens = 36 bytes (truncated"));
}

TEST(IndexedDataset, DocumentIndexIsChecked) {
  ScratchDir dir;
  const std::string bin = TwoDocumentsBin();
  const auto open_with = [&](std::vector<int64_t> docs) {
    Index index = TwoDocuments();
    index.docs = std::move(docs);
    WriteDataset(dir, index.Bytes(), bin);
    return IndexedDataset::Open(dir / "ds").status();
  };
  EXPECT_TRUE(
      FailsWith(open_with({1, 2, 3}), "ds.idx: the document index starts with 1, expected 0"));
  EXPECT_TRUE(FailsWith(open_with({0, 3, 2, 3}),
                        "ds.idx: document index 2 is 2, less than the 3 before it"));
  EXPECT_TRUE(FailsWith(open_with({0, 2, 2}),
                        "ds.idx: the document index ends with 2, expected the sequence count 3 "
                        "(sequences 2-2 belong to no document)"));
  EXPECT_TRUE(FailsWith(open_with({0, 5, 3}), "ds.idx: document index 1 is 5, beyond the 3"));
  EXPECT_TRUE(FailsWith(open_with({0, -1, 3}), "document index 1 is -1, less than the 0"));
  // Repeated entries are empty documents: allowed.
  EXPECT_TRUE(open_with({0, 0, 2, 2, 3}).ok());
}

// ------------------------------------------------------------------------------------------------
// Random damage: refused with a message, or opened with values that agree with each other

void ExpectConsistentOrRefused(const ScratchDir& dir, const std::string& what) {
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(dir / "ds");
  if (!ds.ok()) {
    EXPECT_FALSE(ds.status().message().empty()) << what;
    return;
  }
  const std::span<const int64_t> starts = ds->document_starts();
  ASSERT_EQ(static_cast<int64_t>(starts.size()), ds->documents() + 1) << what;
  EXPECT_EQ(starts.front(), 0) << what;
  EXPECT_EQ(starts.back(), ds->tokens()) << what;
  for (size_t k = 1; k < starts.size(); ++k) EXPECT_LE(starts[k - 1], starts[k]) << what;
  int64_t sum = 0;
  for (int32_t length : ds->sequence_lengths()) {
    EXPECT_GE(length, 0) << what;
    sum += length;
  }
  EXPECT_EQ(sum, ds->tokens()) << what;
  EXPECT_EQ(ds->tokens() * TokenDTypeBytes(ds->dtype()),
            static_cast<int64_t>(std::filesystem::file_size(dir / "ds.bin")))
      << what;
  for (int64_t i = 0; i < ds->tokens(); ++i) {
    const int64_t k = ds->DocumentOf(i);
    ASSERT_TRUE(k >= 0 && k < ds->documents()) << what;
    EXPECT_TRUE(starts[k] <= i && i < starts[k + 1]) << what;
    (void)ds->token_file().at(i);  // inside the mapping (ASan would say otherwise)
  }
}

TEST(IndexedDataset, RandomDamageNeverCrashes) {
  ScratchDir dir;
  const std::string good = TwoDocuments().Bytes();
  WriteFileBytes(dir / "ds.bin", TwoDocumentsBin());
  // Every single-bit flip.
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = good;
      damaged[byte] = static_cast<char>(damaged[byte] ^ (1 << bit));
      WriteFileBytes(dir / "ds.idx", damaged);
      ExpectConsistentOrRefused(dir, absl::StrFormat("bit %d of byte %d flipped", bit, byte));
    }
  }
  // Every truncation, and every length with garbage appended.
  for (size_t length = 0; length <= good.size(); ++length) {
    WriteFileBytes(dir / "ds.idx", good.substr(0, length));
    ExpectConsistentOrRefused(dir, absl::StrFormat("truncated to %d bytes", length));
  }
  // Random bytes at random places, several at once, with a fixed seed.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> where(0, good.size() - 1);
  std::uniform_int_distribution<int> value(0, 255);
  std::uniform_int_distribution<int> how_many(1, 6);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string damaged = good;
    for (int i = how_many(rng); i > 0; --i) damaged[where(rng)] = static_cast<char>(value(rng));
    WriteFileBytes(dir / "ds.idx", damaged);
    ExpectConsistentOrRefused(dir, absl::StrFormat("trial %d", trial));
  }
  // A damaged .bin length against the good index.
  WriteFileBytes(dir / "ds.idx", good);
  const std::string bin = TwoDocumentsBin();
  for (size_t length = 0; length <= bin.size() + 3; ++length) {
    WriteFileBytes(dir / "ds.bin", length <= bin.size()
                                       ? bin.substr(0, length)
                                       : bin + std::string(length - bin.size(), 'x'));
    ExpectConsistentOrRefused(dir, absl::StrFormat(".bin of %d bytes", length));
  }
}

}  // namespace
}  // namespace hcp::data
