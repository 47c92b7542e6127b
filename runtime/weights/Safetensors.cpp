#include "runtime/weights/Safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Crc32c.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied as it is");

namespace {

using nlohmann::json;

// Conversions go through a bounded buffer so reading a huge bf16 tensor does not need a second
// copy of it in memory.
constexpr int64_t kChunkElements = int64_t{1} << 20;

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

// Product of the dims, or an error for a negative dim or an overflow of int64.
absl::StatusOr<int64_t> NumElements(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", dim));
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      return absl::InvalidArgumentError("shape has more elements than int64 can count");
    }
  }
  return numel;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// One header entry: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}.
absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const json& entry,
                                      uint64_t data_size) {
  if (!entry.is_object()) return absl::InvalidArgumentError("entry is not a JSON object");
  TensorInfo info;
  info.name = name;

  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError("\"dtype\" is missing or not a string");
  }
  HCP_ASSIGN_OR_RETURN(info.dtype, ParseSafetensorsDType(dtype->get_ref<const std::string&>()));

  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return absl::InvalidArgumentError("\"shape\" is missing or not an array");
  }
  for (const json& dim : *shape) {
    if (dim.is_number_unsigned() && dim.get<uint64_t>() <= uint64_t{INT64_MAX}) {
      info.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
    } else if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape->dump(), " has a negative dimension"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape->dump(), " holds something other than a dimension"));
    }
  }
  HCP_ASSIGN_OR_RETURN(info.numel, NumElements(info.shape));

  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError("\"data_offsets\" is missing or not [begin, end]");
  }
  info.begin = (*offsets)[0].get<uint64_t>();
  info.end = (*offsets)[1].get<uint64_t>();
  if (info.begin > info.end || info.end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data_offsets [%d, %d] are not a range within the data section (%d bytes)",
                        info.begin, info.end, data_size));
  }
  // numel * size cannot overflow in 128 bits; compare there rather than risk it in 64.
  unsigned __int128 expected =
      static_cast<unsigned __int128>(info.numel) * static_cast<uint64_t>(DTypeSize(info.dtype));
  if (expected != info.end - info.begin) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s needs %d bytes but data_offsets [%d, %d] hold %d", SafetensorsName(info.dtype),
        ShapeString(info.shape), static_cast<uint64_t>(expected), info.begin, info.end,
        info.end - info.begin));
  }
  return info;
}

// A checksum as Crc32cHex writes it: eight lowercase hex digits.
std::optional<uint32_t> ParseCrc(std::string_view text) {
  if (text.size() != 8) return std::nullopt;
  uint32_t crc = 0;
  for (char c : text) {
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    crc = (crc << 4) | static_cast<uint32_t>(digit);
  }
  return crc;
}

// Whether bits (one element of a float dtype, as stored) are a NaN or an infinity: the exponent
// all ones.
bool NonFiniteBits(DType dtype, const uint8_t* element) {
  if (dtype == DType::F32) {
    uint32_t bits;
    std::memcpy(&bits, element, 4);
    return (bits & 0x7F800000u) == 0x7F800000u;
  }
  uint16_t bits;
  std::memcpy(&bits, element, 2);
  return dtype == DType::BF16 ? (bits & 0x7F80u) == 0x7F80u : (bits & 0x7C00u) == 0x7C00u;
}

float ElementAsF32(DType dtype, const uint8_t* element) {
  if (dtype == DType::F32) {
    float value;
    std::memcpy(&value, element, 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, element, 2);
  return dtype == DType::BF16 ? Bf16ToF32(bits) : F16ToF32(bits);
}

absl::Status ReadWhole(int fd, uint64_t offset, uint64_t size, void* out) {
  auto* bytes = static_cast<uint8_t*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd, bytes, std::min<uint64_t>(size, 1u << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(std::strerror(errno));
    if (n == 0) return absl::DataLossError("file ended early (truncated after it was opened?)");
    bytes += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;  // owns the descriptor from here on, so every return closes it
  file.path_ = path;
  file.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd_ < 0) {
    int err = errno;
    std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  struct stat st;
  if (::fstat(file.fd_, &st) != 0) return Corrupt(path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(path + ": not a regular file");
  uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return Corrupt(path, absl::StrFormat("%d bytes is too short for a safetensors file "
                                         "(8-byte header length missing)",
                                         file_size));
  }
  uint8_t length_bytes[8];
  if (absl::Status s = ReadWhole(file.fd_, 0, 8, length_bytes); !s.ok()) {
    return Corrupt(path, s.message());
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return Corrupt(path, absl::StrFormat("header length %d is absurd (over 100 MiB): not a "
                                         "safetensors file, or a corrupt one",
                                         header_size));
  }
  if (header_size > file_size - 8) {
    return Corrupt(path,
                   absl::StrFormat("header length %d runs past the end of the file (%d bytes)",
                                   header_size, file_size));
  }
  std::string header(header_size, '\0');
  if (absl::Status s = ReadWhole(file.fd_, 8, header_size, header.data()); !s.ok()) {
    return Corrupt(path, s.message());
  }
  file.data_start_ = 8 + header_size;
  uint64_t data_size = file_size - file.data_start_;

  absl::StatusOr<json> parsed = ParseJsonStrict(header, path + ": header");
  if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
  if (!parsed->is_object()) return Corrupt(path, "header is not a JSON object");

  for (const auto& [key, value] : parsed->items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Corrupt(path, "__metadata__ is not a JSON object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return Corrupt(path,
                         absl::StrCat("__metadata__ value of ", Quote(mkey), " is not a string"));
        }
        const std::string& text = mvalue.get_ref<const std::string&>();
        if (mkey.rfind(kCrc32cKeyPrefix, 0) == 0) {
          std::optional<uint32_t> crc = ParseCrc(text);
          if (!crc) {
            return Corrupt(path, absl::StrCat("__metadata__ ", Quote(mkey), " is ", Quote(text),
                                              ", not a checksum (8 hex digits)"));
          }
          file.checksums_[mkey.substr(sizeof(kCrc32cKeyPrefix) - 1)] = *crc;
        } else {
          file.metadata_[mkey] = text;
        }
      }
      continue;
    }
    absl::StatusOr<TensorInfo> info = ParseEntry(key, value, data_size);
    if (!info.ok()) {
      return Corrupt(path, absl::StrCat("tensor ", Quote(key), ": ", info.status().message()));
    }
    file.tensors_.emplace(key, *std::move(info));
  }
  // A file with checksums has one for every tensor and none for a tensor it does not hold (a
  // corrupt header could otherwise drop a tensor from the check).
  if (!file.checksums_.empty()) {
    for (const auto& [name, crc] : file.checksums_) {
      if (!file.tensors_.count(name)) {
        return Corrupt(path, absl::StrCat("__metadata__ holds a checksum of tensor ", Quote(name),
                                          ", which the file does not hold"));
      }
    }
    for (const auto& [name, info] : file.tensors_) {
      if (!file.checksums_.count(name)) {
        return Corrupt(path, absl::StrCat("tensor ", Quote(name),
                                          " has no checksum, while the other tensors have one"));
      }
    }
  }

  // Tensors may not share bytes. Gaps are tolerated (the format has no use for them, but they
  // do no harm to a reader).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, info] : file.tensors_) {
    if (info.begin != info.end) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& next = *by_offset[i];
    if (next.begin < prev.end) {
      return Corrupt(
          path, absl::StrFormat("tensors %s [%d, %d] and %s [%d, %d] overlap", Quote(prev.name),
                                prev.begin, prev.end, Quote(next.name), next.begin, next.end));
    }
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)),
      checksums_(std::move(other.checksums_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
    checksums_ = std::move(other.checksums_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<const TensorInfo*> SafetensorsFile::Get(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", Quote(name)));
  }
  return info;
}

absl::Status SafetensorsFile::ReadAt(uint64_t offset, uint64_t size, void* out,
                                     std::string_view name) const {
  absl::Status status = ReadWhole(fd_, data_start_ + offset, size, out);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path_, ": reading tensor ", Quote(name), ": ",
                                                    status.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsFile::ReadBytes(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const TensorInfo* info, Get(name));
  std::vector<uint8_t> bytes(info->end - info->begin);
  HCP_RETURN_IF_ERROR(ReadAt(info->begin, bytes.size(), bytes.data(), name));
  return bytes;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const TensorInfo* info, Get(name));
  std::vector<float> out(info->numel);
  HCP_RETURN_IF_ERROR(ReadF32Range(name, 0, info->numel, out.data()));
  return out;
}

absl::Status SafetensorsFile::ReadF32Range(std::string_view name, int64_t begin, int64_t count,
                                           float* out) const {
  HCP_ASSIGN_OR_RETURN(const TensorInfo* info, Get(name));
  if (!IsFloatDType(info->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", Quote(name), " is ",
                                                   ToAbsl(SafetensorsName(info->dtype)),
                                                   ", not a float tensor"));
  }
  if (begin < 0 || count < 0 || count > info->numel - begin) {
    return absl::OutOfRangeError(
        absl::StrFormat("%s: tensor %s has %d elements; cannot read "
                        "[%d, %d)",
                        path_, Quote(name), info->numel, begin, begin + count));
  }
  const int64_t size = DTypeSize(info->dtype);
  const uint64_t first = info->begin + static_cast<uint64_t>(begin * size);
  if (info->dtype == DType::F32) return ReadAt(first, count * size, out, name);

  std::vector<uint16_t> chunk(std::min(count, kChunkElements));
  for (int64_t done = 0; done < count; done += kChunkElements) {
    int64_t n = std::min(count - done, kChunkElements);
    HCP_RETURN_IF_ERROR(ReadAt(first + done * size, n * size, chunk.data(), name));
    if (info->dtype == DType::BF16) {
      for (int64_t i = 0; i < n; ++i) out[done + i] = Bf16ToF32(chunk[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) out[done + i] = F16ToF32(chunk[i]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> SafetensorsFile::ReadInt(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const TensorInfo* info, Get(name));
  std::vector<int64_t> out(info->numel);
  if (info->dtype == DType::I64) {
    HCP_RETURN_IF_ERROR(ReadAt(info->begin, info->numel * 8, out.data(), name));
  } else if (info->dtype == DType::I32) {
    std::vector<int32_t> narrow(info->numel);
    HCP_RETURN_IF_ERROR(ReadAt(info->begin, info->numel * 4, narrow.data(), name));
    std::copy(narrow.begin(), narrow.end(), out.begin());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", Quote(name), " is ",
                                                   ToAbsl(SafetensorsName(info->dtype)),
                                                   ", not an integer tensor"));
  }
  return out;
}

absl::Status SafetensorsFile::Verify() const {
  constexpr uint64_t kChunkBytes = uint64_t{8} << 20;
  std::vector<uint8_t> chunk;
  for (const auto& [name, info] : tensors_) {
    const bool is_float = IsFloatDType(info.dtype);
    const uint64_t element = static_cast<uint64_t>(DTypeSize(info.dtype));
    uint32_t crc = 0;
    int64_t non_finite = -1;  // the first NaN or infinity, by element index
    float non_finite_value = 0;
    // Chunks hold whole elements (kChunkBytes is a multiple of every element size).
    for (uint64_t done = 0; done < info.end - info.begin; done += chunk.size()) {
      chunk.resize(std::min(kChunkBytes, info.end - info.begin - done));
      HCP_RETURN_IF_ERROR(ReadAt(info.begin + done, chunk.size(), chunk.data(), name));
      crc = Crc32c(crc, chunk.data(), chunk.size());
      if (!is_float || non_finite >= 0) continue;
      for (uint64_t at = 0; at < chunk.size(); at += element) {
        if (NonFiniteBits(info.dtype, chunk.data() + at)) {
          non_finite = static_cast<int64_t>((done + at) / element);
          non_finite_value = ElementAsF32(info.dtype, chunk.data() + at);
          break;
        }
      }
    }
    if (auto want = checksums_.find(name); want != checksums_.end() && want->second != crc) {
      return absl::DataLossError(absl::StrFormat(
          "%s: tensor %s does not match its checksum (crc32c %s recorded, %s read): the file was "
          "changed or damaged after it was written",
          path_, Quote(name), Crc32cHex(want->second), Crc32cHex(crc)));
    }
    if (non_finite >= 0) {
      return RefuseNonFinite(std::span(&non_finite_value, 1), non_finite, info.numel, name, path_);
    }
  }
  return absl::OkStatus();
}

absl::Status RefuseNonFinite(std::span<const float> values, int64_t first, int64_t numel,
                             std::string_view name, std::string_view where) {
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (std::isfinite(v)) continue;
    const char* what = std::isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf";
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor %s holds %s at element %d (of %d): refusing to train from it",
                        where, Quote(name), what, first + static_cast<int64_t>(i), numel));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Writing.

absl::StatusOr<int64_t> TensorBytesToWrite(const TensorToWrite& tensor) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(tensor.name), ": ", what));
  };
  absl::StatusOr<int64_t> numel = NumElements(tensor.shape);
  if (!numel.ok()) return error(numel.status().message());
  const bool is_float = IsFloatDType(tensor.dtype);
  const size_t given = is_float ? tensor.f32.size() : tensor.ints.size();
  const size_t other = is_float ? tensor.ints.size() : tensor.f32.size();
  if (given != static_cast<uint64_t>(*numel) || other != 0) {
    return error(absl::StrFormat("%s %s needs %d %s values; got %d float and %d int values",
                                 SafetensorsName(tensor.dtype), ShapeString(tensor.shape), *numel,
                                 is_float ? "float" : "integer", tensor.f32.size(),
                                 tensor.ints.size()));
  }
  if (tensor.dtype == DType::I32) {
    for (size_t i = 0; i < tensor.ints.size(); ++i) {
      int64_t v = tensor.ints[i];
      if (v < INT32_MIN || v > INT32_MAX) {
        return error(absl::StrFormat("element %d = %d does not fit in I32", i, v));
      }
    }
  }
  int64_t bytes;
  if (__builtin_mul_overflow(*numel, DTypeSize(tensor.dtype), &bytes)) {
    return error("byte size overflows int64");
  }
  return bytes;
}

namespace {

// Hands `sink` the tensor's bytes as stored, converted a bounded chunk at a time.
template <typename Sink>
absl::Status ForEachChunk(const TensorToWrite& tensor, Sink&& sink) {
  switch (tensor.dtype) {
    case DType::F32:
      return sink(tensor.f32.data(), tensor.f32.size_bytes());
    case DType::I64:
      return sink(tensor.ints.data(), tensor.ints.size_bytes());
    case DType::BF16:
    case DType::F16: {
      std::vector<uint16_t> chunk;
      for (size_t done = 0; done < tensor.f32.size(); done += kChunkElements) {
        size_t n = std::min<size_t>(tensor.f32.size() - done, kChunkElements);
        chunk.resize(n);
        for (size_t i = 0; i < n; ++i) {
          float v = tensor.f32[done + i];
          chunk[i] = tensor.dtype == DType::BF16 ? F32ToBf16(v) : F32ToF16(v);
        }
        HCP_RETURN_IF_ERROR(sink(chunk.data(), n * sizeof(uint16_t)));
      }
      return absl::OkStatus();
    }
    case DType::I32: {
      std::vector<int32_t> chunk;
      for (size_t done = 0; done < tensor.ints.size(); done += kChunkElements) {
        size_t n = std::min<size_t>(tensor.ints.size() - done, kChunkElements);
        chunk.assign(tensor.ints.begin() + done, tensor.ints.begin() + done + n);
        HCP_RETURN_IF_ERROR(sink(chunk.data(), n * sizeof(int32_t)));
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown dtype");
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("writing ", path, ": ", what));
  };
  // Everything is checked before the file is created.
  std::vector<const TensorToWrite*> sorted;
  std::vector<int64_t> bytes;
  for (const TensorToWrite& tensor : tensors) sorted.push_back(&tensor);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& name = sorted[i]->name;
    if (name.empty() || name == "__metadata__" || !IsValidUtf8(name)) {
      return error(absl::StrCat("tensor name ", Quote(name), " cannot be written"));
    }
    if (i > 0 && name == sorted[i - 1]->name) {
      return error(absl::StrCat("tensor ", Quote(name), " is given twice"));
    }
    absl::StatusOr<int64_t> size = TensorBytesToWrite(*sorted[i]);
    if (!size.ok()) return error(size.status().message());
    bytes.push_back(*size);
  }
  std::map<std::string, std::string> header_metadata = metadata;
  // transformers' from_pretrained refuses a safetensors file without a "format" it knows.
  header_metadata.emplace("format", "pt");
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return error(absl::StrCat("metadata ", Quote(key), " is not valid UTF-8"));
    }
    if (key.rfind(kCrc32cKeyPrefix, 0) == 0) {
      return error(absl::StrCat("metadata ", Quote(key), " would pass for a tensor checksum"));
    }
  }
  // The checksums go into the header, before the data: a first pass over each tensor's bytes.
  for (const TensorToWrite* tensor : sorted) {
    uint32_t crc = 0;
    HCP_RETURN_IF_ERROR(ForEachChunk(*tensor, [&](const void* data, size_t size) {
      crc = Crc32c(crc, data, size);
      return absl::OkStatus();
    }));
    header_metadata[kCrc32cKeyPrefix + tensor->name] = Crc32cHex(crc);
  }

  // ordered_json keeps insertion order: __metadata__ first, then tensors by name.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!header_metadata.empty()) header["__metadata__"] = header_metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    header[sorted[i]->name] = {{"dtype", std::string(SafetensorsName(sorted[i]->dtype))},
                               {"shape", sorted[i]->shape},
                               {"data_offsets", {offset, offset + bytes[i]}}};
    offset += bytes[i];
  }
  std::string text = header.dump();
  // Pad with spaces (JSON whitespace, which the format allows) so data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  HCP_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  HCP_RETURN_IF_ERROR(writer.Write(length, sizeof(length)));
  HCP_RETURN_IF_ERROR(writer.Write(text.data(), text.size()));
  for (const TensorToWrite* tensor : sorted) {
    HCP_RETURN_IF_ERROR(ForEachChunk(
        *tensor, [&](const void* data, size_t size) { return writer.Write(data, size); }));
  }
  return writer.Commit();
}

}  // namespace hcp
