// Training metrics: one JSON object per line per step (a "JSON lines" file), and the live
// progress line printed to the terminal.
//
// A line: {"step":12,"loss":4.321,"lr":0.0003,"grad_norm":1.23,"tokens":49152,
//          "tokens_per_s":1234.5,"elapsed_s":40.1,"skipped":false}
//   step          steps completed, this one included (1 for the first step; equal to the
//                 checkpoint's TrainState::step after it); the LR schedule's step was step - 1
//   loss          the step's mean loss; null when not finite (JSON has no NaN)
//   lr            learning rate used
//   grad_norm     global gradient norm before clipping; null when not finite
//   tokens        tokens trained on so far, all ranks, this step included
//   tokens_per_s  throughput of this step (or a smoothed rate; the writer's choice)
//   elapsed_s     seconds since the run (or the resumed run) started
//   skipped       the update was skipped (non-finite loss or gradients; see AdamW.h)
// After a step followed by a held-out evaluation (--eval-data, --eval-every), its line also has
//   eval_loss     the mean per-token loss over every valid target of the evaluation's windows,
//                 with the weights after this step; null when not finite
//   eval_tokens   the inputs it scored (whole global batches of the eval data, from its start)
// e.g. {"step":20,"loss":2.1,...,"skipped":false,"eval_loss":2.3456,"eval_tokens":256}; the
// other lines do not have them.
// Each line is written with one write(2) on an O_APPEND descriptor, so a crash leaves at worst
// a partial last line; the reader ignores it, and the writer cuts it off when a resumed run
// reopens the file (a fresh run never appends to an existing file: see MetricsMode). A run resumed
// from an older checkpoint writes some steps again: the reader keeps the last record of each step,
// so the file reads as the resumed run's history.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hcp::train {

struct MetricsRecord {
  int64_t step = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  int64_t tokens = 0;
  double tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  double elapsed_s = std::numeric_limits<double>::quiet_NaN();
  bool skipped = false;
  double eval_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t eval_tokens = 0;  // 0: no evaluation after this step
  // The MoE load-balancing loss (the mean of the step's micro-batches'), for a plan with it; NaN
  // (and not written) for one without. `loss` stays the language-model loss: the step's
  // objective is loss + coefficient * router_aux_loss.
  double router_aux_loss = std::numeric_limits<double>::quiet_NaN();
  bool evaluated() const { return eval_tokens > 0; }
};

// The record as one JSON line, '\n' included. Non-finite numbers become null.
std::string MetricsJsonLine(const MetricsRecord& record);
// One line (without its '\n'); `what` starts the error message ("m.jsonl line 3").
// step and loss are required; the other fields default as in MetricsRecord; unknown fields are
// ignored (later versions may add some); null reads as NaN.
absl::StatusOr<MetricsRecord> ParseMetricsLine(std::string_view line, std::string_view what);

// How a run opens its metrics file. Either way a file that is not a regular file is refused,
// and a refused file is left as it was.
enum class MetricsMode {
  // A fresh run: the file must not exist or be empty, since appending a new run to another
  // file (or to a data file named by mistake) would mix two histories or destroy the file.
  kNew,
  // A resumed run continues its own history: an existing file must read as a metrics log (every
  // line a record, a partial last line allowed); it is created if missing.
  kContinue,
};

class MetricsWriter {
 public:
  // Opens `path` for appending (see MetricsMode). A partial last line of a continued log (what a
  // crash in the middle of a write leaves) is cut off first.
  static absl::StatusOr<MetricsWriter> Open(const std::string& path, MetricsMode mode);

  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  const std::string& path() const { return path_; }
  // Appends one line, with one write(2): visible to readers (and safe from a crash of this
  // process) when it returns.
  absl::Status Append(const MetricsRecord& record);
  // fsync: also safe from a crash of the machine (call it when a checkpoint is written).
  absl::Status Sync();

 private:
  MetricsWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

struct MetricsLog {
  std::vector<MetricsRecord> records;  // sorted by step, one per step (the last one written)
  bool partial_last_line = false;      // a last line without '\n' that did not parse was ignored
  int64_t replaced = 0;                // records superseded by a later one for the same step
};

// Reads a metrics file. A line that does not parse is an error naming the file and line,
// except a partial last line (no '\n' at its end), which is ignored. Blank lines are skipped.
absl::StatusOr<MetricsLog> ReadMetrics(const std::string& path);

// Seconds left, assuming the steps left go at the average pace of the steps done:
// elapsed_s / steps_done * steps_left; NaN when steps_done <= 0.
double EstimateEta(double elapsed_s, int64_t steps_done, int64_t steps_left);

// "step 12/100  loss 4.3210  lr 3.0e-04  |g| 1.23  1,234 tok/s  ETA 0:01:23", with
// "  eval loss 4.5678" after an evaluation and "  skipped" at the end for a skipped step.
// Non-finite values print as "nan" / "inf", an unknown rate as "- tok/s", an unknown ETA (NaN) as
// "-:--:--".
std::string FormatProgress(const MetricsRecord& record, int64_t total_steps, double eta_s);

}  // namespace hcp::train
