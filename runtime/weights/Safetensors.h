// Safetensors files: an 8-byte little-endian header length, a JSON header naming every tensor's
// dtype, shape and byte range, then the data section. Reading validates the whole header before
// anything is used and says what is wrong, naming the file and the tensor.
//
// Every file hybridcp writes carries the CRC32C (runtime/support/Crc32c.h) of each tensor's bytes as stored, in
// the header's "__metadata__" as "hybridcp.crc32c.<tensor name>": "<8 hex digits>" (metadata
// values are strings, so Hugging Face tools read these files as before). SafetensorsFile::Verify
// checks them; a file without them (one written by another tool) is read as it is.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/support/DType.h"

namespace hcp {

// Headers larger than this are refused as corrupt (real checkpoints need well under 1 MiB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// The metadata key prefix of the tensor checksums.
inline constexpr char kCrc32cKeyPrefix[] = "hybridcp.crc32c.";

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  // Byte range within the data section (which starts after the header).
  uint64_t begin = 0;
  uint64_t end = 0;

  int64_t nbytes() const { return static_cast<int64_t>(end - begin); }
};

// An open safetensors file. The header is parsed and validated at Open; tensor data is read on
// demand with pread from a descriptor held open. Why not read the whole file: shards of real
// checkpoints are several GB and a rank usually needs only part of them. Why not mmap: a file
// truncated or replaced under a mapping raises SIGBUS, while pread reports a short read as an
// error; the copy pread costs is needed anyway to convert bf16 to fp32.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }
  // nullptr when there is no such tensor.
  const TensorInfo* Find(std::string_view name) const;
  // The header's "__metadata__" (string -> string) without the tensor checksums; empty when
  // absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Whether the file carries tensor checksums (Open checks that then every tensor has one).
  bool has_checksums() const { return !checksums_.empty(); }

  // Reads every tensor whole: each one's bytes must match its checksum (when the file has them:
  // DataLoss naming the file and the tensor otherwise) and a float tensor must hold no NaN or
  // infinity (RefuseNonFinite's message). What a checkpoint that is resumed must pass.
  absl::Status Verify() const;

  // The tensor's bytes as stored (little-endian).
  absl::StatusOr<std::vector<uint8_t>> ReadBytes(std::string_view name) const;
  // The tensor as fp32, converted from F32, BF16 or F16; integer tensors are refused.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name) const;
  // Elements [begin, begin + count) of the flattened tensor as fp32, into out[0, count): what a
  // rank that holds a slice of a tensor needs.
  absl::Status ReadF32Range(std::string_view name, int64_t begin, int64_t count, float* out) const;
  // The tensor as int64, from I32 or I64; float tensors are refused.
  absl::StatusOr<std::vector<int64_t>> ReadInt(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  absl::StatusOr<const TensorInfo*> Get(std::string_view name) const;
  absl::Status ReadAt(uint64_t offset, uint64_t size, void* out, std::string_view name) const;

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // file offset of the data section
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, uint32_t, std::less<>> checksums_;  // tensor name -> CRC32C
};

// values[i] is element first + i of tensor `name` (numel elements) read from `where` (a file or
// checkpoint directory): the first NaN or infinity among them is refused, "WHERE: tensor 'NAME'
// holds NaN at element 3 (of 64): refusing to train from it" (InvalidArgument). Weights that are
// not finite make every loss NaN, so training from them would only skip steps.
absl::Status RefuseNonFinite(std::span<const float> values, int64_t first, int64_t numel,
                             std::string_view name, std::string_view where);

// One tensor to write. F32, BF16 and F16 take fp32 values in `f32` (rounded to nearest even
// for the 16-bit types); I32 and I64 take `ints` (I32 refuses values out of range). The spans
// must hold exactly numel(shape) values and stay valid during the call.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const float> f32;
  std::span<const int64_t> ints;
};

// Bytes `tensor` takes in a file (numel * element size), after the checks WriteSafetensors does.
absl::StatusOr<int64_t> TensorBytesToWrite(const TensorToWrite& tensor);

// Writes a safetensors file atomically (see AtomicFile.h): header entries and data sorted by
// name, the header padded with spaces so the data section starts 8-byte aligned, the metadata
// given plus every tensor's checksum (a key of `metadata` may not start with kCrc32cKeyPrefix),
// and "format": "pt" unless `metadata` says another format (transformers needs one).
// On any error nothing is left behind and an existing `path` is untouched.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace hcp
