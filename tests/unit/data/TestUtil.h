// Helpers shared by the data tests: the file helpers of tests/unit/ScratchFiles.h and FailsWith and
// WriteIndexed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/IndexedDataset.h"
#include "tests/unit/FailsWith.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp::data::testing {

using hcp::testing::FailsWith;
using hcp::testing::ReadFileBytes;
using hcp::testing::ScratchDir;
using hcp::testing::WriteFileBytes;

// An indexed dataset at dir/name of `documents`.
inline void WriteIndexed(const ScratchDir& dir, const std::string& name,
                         const std::vector<std::vector<uint32_t>>& documents,
                         TokenDType dtype = TokenDType::U16) {
  absl::StatusOr<IndexedDatasetWriter> writer = IndexedDatasetWriter::Create(dir / name, dtype);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const auto& d : documents) ASSERT_TRUE(writer->AddDocument(d).ok());
  ASSERT_TRUE(writer->Finish().ok());
}

}  // namespace hcp::data::testing
