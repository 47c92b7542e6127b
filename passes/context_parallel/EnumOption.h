// Enum-valued pass options, spelled by the names of the enum's TableGen cases. llvm::cl's parser
// for clEnumValN values refuses a wrong one with "Cannot find option named 'zz'!"; this one names
// the valid values, and they are written only once, in the enum's definition.
#pragma once

#include <cstdint>
#include <string>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace hcp {

// For a TableGen I32Enum whose cases are numbered 0, 1, ... (stringifyEnum gives "" past them).
template <typename Enum>
class EnumOptionParser : public llvm::cl::basic_parser<Enum> {
 public:
  using llvm::cl::basic_parser<Enum>::basic_parser;

  bool parse(llvm::cl::Option& option, llvm::StringRef, llvm::StringRef arg, Enum& value) {
    for (uint32_t i = 0; !name(i).empty(); ++i) {
      if (name(i) == arg) {
        value = static_cast<Enum>(i);
        return false;
      }
    }
    return option.error("unknown value '" + arg + "'; expected " + names(", ", " or "));
  }

  // `--layout=<contiguous|zigzag>` in --help.
  llvm::StringRef getValueName() const override {
    static const std::string valueName = names("|", "|");
    return valueName;
  }

  // What llvm::cl::opt prints for --print-options: `--layout = zigzag (default: contiguous)`.
  void printOptionDiff(const llvm::cl::Option& option, Enum value,
                       const llvm::cl::OptionValue<Enum>& fallback, size_t width) const {
    this->printOptionName(option, width);
    llvm::outs() << "= " << stringifyEnum(value) << " (default: "
                 << (fallback.hasValue() ? stringifyEnum(fallback.getValue()) : "*no default*")
                 << ")\n";
  }

 private:
  static llvm::StringRef name(uint32_t i) { return stringifyEnum(static_cast<Enum>(i)); }

  // "a, b or c".
  static std::string names(llvm::StringRef separator, llvm::StringRef last) {
    std::string text(name(0));
    for (uint32_t i = 1; !name(i).empty(); ++i)
      text += (name(i + 1).empty() ? last : separator).str() + name(i).str();
    return text;
  }
};

}  // namespace hcp
