#include "runtime/support/DType.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace hcp {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
  }
  return "?";
}

std::string_view SafetensorsName(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

uint64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
  }
  return 0;
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    if (SafetensorsName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unsupported dtype \"%s\" (supported: F32, BF16, F16, I32, I64)",
                      absl::CEscape(absl::string_view(name.data(), name.size()))));
}

}  // namespace hcp
