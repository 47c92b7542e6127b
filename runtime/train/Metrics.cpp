#include "runtime/train/Metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/support/Status.h"
#include "runtime/train/Format.h"
#include "runtime/weights/Json.h"

namespace hcp::train {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ordered_json Number(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

absl::Status ErrnoError(std::string_view what, const std::string& path, int err) {
  return absl::InternalError(
      absl::StrFormat("%s %s: %s", std::string(what), path, std::strerror(err)));
}

absl::Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot write", path, errno);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Cuts the file back to just after its last '\n' (to 0 when there is none) if it does not end
// with one.
absl::Status CutPartialLastLine(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path, errno);
  off_t end = st.st_size;
  char buffer[4096];
  while (end > 0) {
    const off_t begin = std::max<off_t>(0, end - static_cast<off_t>(sizeof(buffer)));
    const size_t count = static_cast<size_t>(end - begin);
    ssize_t n = ::pread(fd, buffer, count, begin);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(count)) return ErrnoError("cannot read", path, errno);
    for (size_t i = count; i > 0; --i) {
      if (buffer[i - 1] == '\n') {
        const off_t keep = begin + static_cast<off_t>(i);
        if (keep != st.st_size && ::ftruncate(fd, keep) != 0) {
          return ErrnoError("cannot truncate", path, errno);
        }
        return absl::OkStatus();
      }
    }
    end = begin;
  }
  if (st.st_size > 0 && ::ftruncate(fd, 0) != 0) return ErrnoError("cannot truncate", path, errno);
  return absl::OkStatus();
}

// A required or optional number field; null -> NaN.
absl::Status ReadNumber(const json& object, const char* key, bool required, double* out,
                        std::string_view what) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: missing \"%s\"", std::string(what), key));
  }
  if (it->is_null()) {
    *out = std::numeric_limits<double>::quiet_NaN();
  } else if (it->is_number()) {
    *out = it->get<double>();
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"%s\" is not a number", std::string(what), key));
  }
  return absl::OkStatus();
}

absl::Status ReadInteger(const json& object, const char* key, bool required, int64_t* out,
                         std::string_view what) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: missing \"%s\"", std::string(what), key));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() <= uint64_t{INT64_MAX}) {
    *out = static_cast<int64_t>(it->get<uint64_t>());
  } else if (it->is_number_integer() && !it->is_number_unsigned()) {
    *out = it->get<int64_t>();
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"%s\" is not an integer", std::string(what), key));
  }
  return absl::OkStatus();
}

// NaN and inf spelled plainly (glibc would print "-nan"), or "" for a finite value.
std::string NonFinite(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return "";
}
std::string Fixed4(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.4f", value) : NonFinite(value);
}
std::string Fixed2(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.2f", value) : NonFinite(value);
}
std::string Sci1(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.1e", value) : NonFinite(value);
}

}  // namespace

std::string MetricsJsonLine(const MetricsRecord& r) {
  ordered_json line;
  line["step"] = r.step;
  line["loss"] = Number(r.loss);
  line["lr"] = Number(r.lr);
  line["grad_norm"] = Number(r.grad_norm);
  line["tokens"] = r.tokens;
  line["tokens_per_s"] = Number(r.tokens_per_s);
  line["elapsed_s"] = Number(r.elapsed_s);
  line["skipped"] = r.skipped;
  return line.dump() + "\n";
}

absl::StatusOr<MetricsRecord> ParseMetricsLine(std::string_view line, std::string_view what) {
  HCP_ASSIGN_OR_RETURN(json object, ParseJsonStrict(line, what));
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": not a JSON object"));
  }
  MetricsRecord r;
  HCP_RETURN_IF_ERROR(ReadInteger(object, "step", true, &r.step, what));
  HCP_RETURN_IF_ERROR(ReadNumber(object, "loss", true, &r.loss, what));
  HCP_RETURN_IF_ERROR(ReadNumber(object, "lr", false, &r.lr, what));
  HCP_RETURN_IF_ERROR(ReadNumber(object, "grad_norm", false, &r.grad_norm, what));
  HCP_RETURN_IF_ERROR(ReadInteger(object, "tokens", false, &r.tokens, what));
  HCP_RETURN_IF_ERROR(ReadNumber(object, "tokens_per_s", false, &r.tokens_per_s, what));
  HCP_RETURN_IF_ERROR(ReadNumber(object, "elapsed_s", false, &r.elapsed_s, what));
  if (auto it = object.find("skipped"); it != object.end()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToAbsl(what), ": \"skipped\" is not true or false"));
    }
    r.skipped = it->get<bool>();
  }
  return r;
}

// ------------------------------------------------------------------------------------------------

absl::StatusOr<MetricsWriter> MetricsWriter::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  MetricsWriter writer(path, fd);
  HCP_RETURN_IF_ERROR(CutPartialLastLine(fd, path));
  return writer;
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status MetricsWriter::Append(const MetricsRecord& record) {
  if (fd_ < 0) return absl::FailedPreconditionError("metrics writer is closed");
  return WriteAll(fd_, MetricsJsonLine(record), path_);
}

absl::Status MetricsWriter::Sync() {
  if (fd_ < 0) return absl::FailedPreconditionError("metrics writer is closed");
  if (::fsync(fd_) != 0) return ErrnoError("cannot fsync", path_, errno);
  return absl::OkStatus();
}

absl::StatusOr<MetricsLog> ReadMetrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open metrics file ", path));
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));

  MetricsLog log;
  std::map<int64_t, MetricsRecord> by_step;
  size_t begin = 0;
  for (int64_t line_number = 1; begin < text.size(); ++line_number) {
    size_t end = text.find('\n', begin);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    absl::StatusOr<MetricsRecord> record =
        ParseMetricsLine(line, absl::StrFormat("%s line %d", path, line_number));
    if (!record.ok()) {
      if (!terminated) {
        log.partial_last_line = true;
        break;
      }
      return record.status();
    }
    auto [it, inserted] = by_step.insert_or_assign(record->step, *record);
    if (!inserted) ++log.replaced;
  }
  for (auto& [step, record] : by_step) log.records.push_back(record);
  return log;
}

// ------------------------------------------------------------------------------------------------

double EstimateEta(double elapsed_s, int64_t steps_done, int64_t steps_left) {
  if (steps_done <= 0) return std::numeric_limits<double>::quiet_NaN();
  return elapsed_s / static_cast<double>(steps_done) *
         static_cast<double>(std::max<int64_t>(steps_left, 0));
}

std::string FormatProgress(const MetricsRecord& r, int64_t total_steps, double eta_s) {
  // Rates beyond 9e18 tok/s are not real; the bound keeps llround defined.
  const bool rate_known =
      std::isfinite(r.tokens_per_s) && r.tokens_per_s >= 0 && r.tokens_per_s < 9e18;
  const std::string rate = rate_known ? FormatCount(std::llround(r.tokens_per_s)) : "-";
  std::string line =
      absl::StrFormat("step %d/%d  loss %s  lr %s  |g| %s  %s tok/s  ETA %s", r.step, total_steps,
                      Fixed4(r.loss), Sci1(r.lr), Fixed2(r.grad_norm), rate, FormatDuration(eta_s));
  if (r.skipped) line += "  skipped";
  return line;
}

}  // namespace hcp::train
