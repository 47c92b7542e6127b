// Helpers shared by the data tests: the file helpers of tests/unit/ScratchFiles.h and a status
// matcher.
#pragma once

#include "tests/unit/FailsWith.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp::data::testing {

using hcp::testing::FailsWith;
using hcp::testing::ReadFileBytes;
using hcp::testing::ScratchDir;
using hcp::testing::WriteFileBytes;

}  // namespace hcp::data::testing
