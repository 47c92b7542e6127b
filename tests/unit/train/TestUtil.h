// Helpers shared by the training tests: the file helpers of tests/unit/ScratchFiles.h and status
// matchers.
#pragma once

#include "tests/unit/FailsWith.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp::train::testing {

using hcp::testing::FailsWith;
using hcp::testing::ReadFileBytes;
using hcp::testing::ScratchDir;
using hcp::testing::WriteFileBytes;

}  // namespace hcp::train::testing
