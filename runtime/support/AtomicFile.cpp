#include "runtime/support/AtomicFile.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "runtime/support/Status.h"

namespace hcp {
namespace {

absl::Status ErrnoError(std::string_view what, const std::string& path, int err) {
  return absl::InternalError(absl::StrFormat("%s %s: %s", what, path, std::strerror(err)));
}

// Makes the rename itself durable: without this a crash can forget the new directory entry.
absl::Status SyncDirectoryOf(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync directory", dir, err);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(std::string path) {
  std::string temp_path = absl::StrFormat("%s.tmp.%d", path, static_cast<int>(::getpid()));
  std::FILE* file = std::fopen(temp_path.c_str(), "wbe");  // 'e': O_CLOEXEC
  if (file == nullptr) return ErrnoError("cannot create", temp_path, errno);
  return AtomicFileWriter(std::move(path), std::move(temp_path), file);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      file_(other.file_),
      done_(other.done_) {
  other.file_ = nullptr;
  other.done_ = true;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (done_) return;
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  std::remove(temp_path_.c_str());
  done_ = true;
}

absl::Status AtomicFileWriter::Write(const void* data, size_t size) {
  if (done_) return absl::FailedPreconditionError("write after commit to " + path_);
  if (size == 0) return absl::OkStatus();
  if (std::fwrite(data, 1, size, file_) != size) {
    int err = errno;
    Abandon();
    return ErrnoError("cannot write", temp_path_, err);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (done_) return absl::FailedPreconditionError("commit twice to " + path_);
  // Every step is checked: buffered data may only fail to reach the disk at fflush or fclose.
  if (std::fflush(file_) != 0) {
    int err = errno;
    Abandon();
    return ErrnoError("cannot write", temp_path_, err);
  }
  if (::fsync(::fileno(file_)) != 0) {
    int err = errno;
    Abandon();
    return ErrnoError("cannot fsync", temp_path_, err);
  }
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    int err = errno;
    Abandon();
    return ErrnoError("cannot close", temp_path_, err);
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    Abandon();
    return ErrnoError(absl::StrFormat("cannot rename %s to", temp_path_), path_, err);
  }
  done_ = true;
  return SyncDirectoryOf(path_);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  HCP_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  HCP_RETURN_IF_ERROR(writer.Write(contents.data(), contents.size()));
  return writer.Commit();
}

}  // namespace hcp
