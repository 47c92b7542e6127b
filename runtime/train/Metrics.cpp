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
#include "runtime/support/Format.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

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

// Whether the file at `fd` reads as a metrics log, without reading more than its lines (a big
// data file named by mistake fails at its first line): every complete line a record or blank,
// and a last line without '\n' the start of one (what a crash mid-write leaves).
absl::Status CheckIsMetricsLog(int fd, const std::string& path) {
  constexpr size_t kLongestLine = 64 * 1024;
  const auto not_metrics = [&](int64_t line_number, std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--metrics %s is not a metrics log (line %d: %s): a resumed run appends only to its own "
        "metrics; name a new file",
        path, line_number, std::string(why)));
  };
  std::string line;
  char buffer[4096];
  int64_t line_number = 1;
  for (off_t at = 0;;) {
    ssize_t n = ::pread(fd, buffer, sizeof(buffer), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", path, errno);
    if (n == 0) break;
    at += n;
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] != '\n') {
        line.push_back(buffer[i]);
        if (line.size() > kLongestLine) return not_metrics(line_number, "longer than any record");
        continue;
      }
      if (line.find_first_not_of(" \t\r") != std::string::npos) {
        absl::StatusOr<MetricsRecord> record = ParseMetricsLine(line, "");
        if (!record.ok()) return not_metrics(line_number, "not a metrics record");
      }
      line.clear();
      ++line_number;
    }
  }
  // MetricsJsonLine's records start so; a fragment that does not is something else.
  const std::string_view start = R"({"step":)";
  const size_t k = std::min(line.size(), start.size());
  if (line.compare(0, k, start, 0, k) != 0) return not_metrics(line_number, "not a metrics record");
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
  if (!std::isnan(r.router_aux_loss)) line["router_aux_loss"] = Number(r.router_aux_loss);
  if (r.evaluated()) {
    line["eval_loss"] = Number(r.eval_loss);
    line["eval_tokens"] = r.eval_tokens;
  }
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
  HCP_RETURN_IF_ERROR(ReadNumber(object, "router_aux_loss", false, &r.router_aux_loss, what));
  HCP_RETURN_IF_ERROR(ReadNumber(object, "eval_loss", false, &r.eval_loss, what));
  HCP_RETURN_IF_ERROR(ReadInteger(object, "eval_tokens", false, &r.eval_tokens, what));
  if (r.eval_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": \"eval_tokens\" is negative"));
  }
  return r;
}

// ------------------------------------------------------------------------------------------------

absl::StatusOr<MetricsWriter> MetricsWriter::Open(const std::string& path, MetricsMode mode) {
  // No O_CREAT on an existing file and no O_TRUNC ever: what is there is checked before the
  // first byte changes.
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) {
    fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  MetricsWriter writer(path, fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--metrics %s is not a regular file; name a new .jsonl file", path));
  }
  if (st.st_size == 0) return writer;
  if (mode == MetricsMode::kNew) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "--metrics %s already exists (%s): a new run does not append to another file; name a "
        "new file, remove this one, or continue its run with --resume",
        path, FormatBytes(static_cast<uint64_t>(st.st_size))));
  }
  HCP_RETURN_IF_ERROR(CheckIsMetricsLog(fd, path));
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
  // A line a step: a run of ten million steps writes about 1.5 GB. What is larger, or not a file
  // at all (/dev/zero, a FIFO), is not a metrics file and would be read without end.
  constexpr uint64_t kLargestMetricsFile = uint64_t{4} << 30;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 &&
      (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kLargestMetricsFile)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not a metrics file (%s)", path,
        S_ISREG(st.st_mode)
            ? FormatBytes(static_cast<uint64_t>(st.st_size)) + ", more than any run writes"
            : std::string("not a regular file")));
  }
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
  if (!std::isnan(r.router_aux_loss)) line += absl::StrCat("  aux ", Fixed4(r.router_aux_loss));
  if (r.evaluated()) line += absl::StrCat("  eval loss ", Fixed4(r.eval_loss));
  if (r.skipped) line += "  skipped";
  return line;
}

}  // namespace hcp::train
