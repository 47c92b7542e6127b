// Writing a file so that readers see either the old contents or the complete new ones, never a
// torn file: write `path.tmp.<pid>`, flush and fsync it, rename it over `path`, fsync the
// directory. A crash or a failed write (disk full) leaves any existing `path` untouched.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hcp {

class AtomicFileWriter {
 public:
  // Creates the temporary file next to `path` (so the rename stays within one filesystem).
  static absl::StatusOr<AtomicFileWriter> Create(std::string path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  // Without a successful Commit, closes and removes the temporary file.
  ~AtomicFileWriter();

  absl::Status Write(const void* data, size_t size);
  // Flushes, fsyncs and closes the temporary file, renames it over `path`, fsyncs the directory.
  // On failure the temporary file is removed and `path` keeps its old contents.
  absl::Status Commit();

  const std::string& path() const { return path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, std::FILE* file)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), file_(file) {}
  void Abandon();

  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
  bool done_ = false;  // committed or abandoned: nothing left to clean up
};

// Convenience: the whole file from one buffer.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace hcp
