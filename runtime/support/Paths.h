// Guarding a command's outputs against its inputs: a careless `-o` that names an input (the same
// file through a link, `./`, `..` or another spelling) must be refused before anything is
// written, since writing would destroy the input.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace hcp {

// Whether `a` and `b` name the same file: the same device and inode where both exist (hard and
// symbolic links, any spelling of the path), else the same absolute, normalised path with
// symbolic links of its existing part resolved.
bool SameFile(const std::string& a, const std::string& b);

// InvalidArgument when `output` (what `option` names, e.g. "-o" or "--save") is one of `inputs`:
// "-o cfg.json is the input cfg.json: writing it would destroy the input; choose another file".
absl::Status RefuseOutputOntoInput(std::string_view option, const std::string& output,
                                   const std::vector<std::string>& inputs);

}  // namespace hcp
