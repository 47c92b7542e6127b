// Metrics as JSON lines (writer, reader, crash tolerance, resume) and the progress line.
#include "runtime/train/Metrics.h"

#include <sys/stat.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

using testing::FailsWith;
using testing::ReadFileBytes;
using testing::ScratchDir;
using testing::WriteFileBytes;

MetricsRecord Record(int64_t step, double loss) {
  MetricsRecord r;
  r.step = step;
  r.loss = loss;
  r.lr = 3e-4;
  r.grad_norm = 1.25;
  r.tokens = 4096 * step;
  r.tokens_per_s = 1000.5;
  r.elapsed_s = 2.0 * step;
  return r;
}

TEST(Metrics, LineFormat) {
  EXPECT_EQ(MetricsJsonLine(Record(3, 4.5)),
            "{\"step\":3,\"loss\":4.5,\"lr\":0.0003,\"grad_norm\":1.25,\"tokens\":12288,"
            "\"tokens_per_s\":1000.5,\"elapsed_s\":6.0,\"skipped\":false}\n");
  MetricsRecord skipped = Record(4, std::numeric_limits<double>::quiet_NaN());
  skipped.grad_norm = std::numeric_limits<double>::infinity();
  skipped.skipped = true;
  const std::string line = MetricsJsonLine(skipped);
  EXPECT_NE(line.find("\"loss\":null"), std::string::npos) << line;
  EXPECT_NE(line.find("\"grad_norm\":null"), std::string::npos) << line;
  EXPECT_NE(line.find("\"skipped\":true"), std::string::npos) << line;
}

TEST(Metrics, LinesRoundTrip) {
  MetricsRecord r = Record(12, 4.321);
  r.lr = 2.9999999e-4;  // doubles survive exactly
  absl::StatusOr<MetricsRecord> back = ParseMetricsLine(MetricsJsonLine(r), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 12);
  EXPECT_EQ(back->loss, 4.321);
  EXPECT_EQ(back->lr, r.lr);
  EXPECT_EQ(back->tokens, r.tokens);
  EXPECT_EQ(back->elapsed_s, r.elapsed_s);
  EXPECT_FALSE(back->skipped);
  absl::StatusOr<MetricsRecord> nan =
      ParseMetricsLine(R"({"step":1,"loss":null,"skipped":true,"future_field":[1]})", "x");
  ASSERT_TRUE(nan.ok()) << nan.status();
  EXPECT_TRUE(std::isnan(nan->loss));
  EXPECT_TRUE(std::isnan(nan->lr));  // absent
  EXPECT_TRUE(nan->skipped);
}

// The held-out loss rides on its step's line, and only there.
TEST(Metrics, EvalFieldsOnlyAfterAnEvaluation) {
  MetricsRecord r = Record(6, 4.5);
  const std::string plain = MetricsJsonLine(r);
  EXPECT_EQ(plain.find("eval_"), std::string::npos) << plain;
  r.eval_loss = 4.75;
  r.eval_tokens = 384;
  const std::string line = MetricsJsonLine(r);
  EXPECT_NE(line.find(R"("skipped":false,"eval_loss":4.75,"eval_tokens":384})"), std::string::npos)
      << line;
  absl::StatusOr<MetricsRecord> back = ParseMetricsLine(line, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->evaluated());
  EXPECT_EQ(back->eval_loss, 4.75);
  EXPECT_EQ(back->eval_tokens, 384);
  back = ParseMetricsLine(plain, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->evaluated());
  EXPECT_TRUE(std::isnan(back->eval_loss));
  // A non-finite held-out loss is null, and the evaluation still shows.
  r.eval_loss = std::numeric_limits<double>::infinity();
  back = ParseMetricsLine(MetricsJsonLine(r), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->evaluated());
  EXPECT_TRUE(std::isnan(back->eval_loss));
  EXPECT_TRUE(
      FailsWith(ParseMetricsLine(R"({"step":1,"loss":1,"eval_tokens":-3})", "m line 1").status(),
                "m line 1: \"eval_tokens\" is negative"));
}

TEST(Metrics, BadLinesSayWhatIsWrong) {
  EXPECT_TRUE(FailsWith(ParseMetricsLine(R"({"loss":1})", "m line 2").status(),
                        "m line 2: missing \"step\""));
  EXPECT_TRUE(FailsWith(ParseMetricsLine(R"({"step":1})", "m").status(), "missing \"loss\""));
  EXPECT_TRUE(FailsWith(ParseMetricsLine(R"({"step":1.5,"loss":1})", "m").status(),
                        "\"step\" is not an integer"));
  EXPECT_TRUE(FailsWith(ParseMetricsLine(R"({"step":1,"loss":"x"})", "m").status(),
                        "\"loss\" is not a number"));
  EXPECT_TRUE(FailsWith(ParseMetricsLine(R"({"step":1,"loss":1,"skipped":1})", "m").status(),
                        "\"skipped\" is not true or false"));
  EXPECT_TRUE(FailsWith(ParseMetricsLine("[1]", "m").status(), "not a JSON object"));
  EXPECT_TRUE(FailsWith(ParseMetricsLine("{", "m").status(), "not valid JSON"));
}

TEST(Metrics, WriterAppendsAndReaderReads) {
  ScratchDir dir;
  {
    absl::StatusOr<MetricsWriter> writer = MetricsWriter::Open(dir / "m.jsonl", MetricsMode::kNew);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int step = 1; step <= 3; ++step)
      ASSERT_TRUE(writer->Append(Record(step, 5.0 - step)).ok());
    ASSERT_TRUE(writer->Sync().ok());
    // Visible before the writer closes.
    absl::StatusOr<MetricsLog> log = ReadMetrics(dir / "m.jsonl");
    ASSERT_TRUE(log.ok());
    EXPECT_EQ(log->records.size(), 3u);
  }
  absl::StatusOr<MetricsWriter> again =
      MetricsWriter::Open(dir / "m.jsonl", MetricsMode::kContinue);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->Append(Record(4, 0.5)).ok());
  absl::StatusOr<MetricsLog> log = ReadMetrics(dir / "m.jsonl");
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->records.size(), 4u);
  EXPECT_EQ(log->records[3].step, 4);
  EXPECT_EQ(log->records[3].loss, 0.5);
  EXPECT_FALSE(log->partial_last_line);
}

// A crash in the middle of a line leaves a fragment: the reader ignores it, and the writer cuts
// it off before appending, so the file stays readable.
TEST(Metrics, PartialLastLineIsToleratedAndCutOff) {
  ScratchDir dir;
  const std::string path = dir / "m.jsonl";
  std::string text = MetricsJsonLine(Record(1, 3.0)) + MetricsJsonLine(Record(2, 2.0));
  const std::string third = MetricsJsonLine(Record(3, 1.0));
  WriteFileBytes(path, text + third.substr(0, 20));
  absl::StatusOr<MetricsLog> log = ReadMetrics(path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->records.size(), 2u);
  EXPECT_TRUE(log->partial_last_line);

  {
    absl::StatusOr<MetricsWriter> writer = MetricsWriter::Open(path, MetricsMode::kContinue);
    ASSERT_TRUE(writer.ok());
    EXPECT_EQ(ReadFileBytes(path), text);
    ASSERT_TRUE(writer->Append(Record(3, 1.0)).ok());
  }
  log = ReadMetrics(path);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->records.size(), 3u);
  EXPECT_FALSE(log->partial_last_line);

  // A file that is one fragment is cut to nothing.
  WriteFileBytes(dir / "f.jsonl", "{\"step\":1,\"lo");
  ASSERT_TRUE(MetricsWriter::Open(dir / "f.jsonl", MetricsMode::kContinue).ok());
  EXPECT_EQ(ReadFileBytes(dir / "f.jsonl"), "");
  // A complete last line without '\n' is still read.
  WriteFileBytes(dir / "g.jsonl", "{\"step\":1,\"loss\":2}");
  log = ReadMetrics(dir / "g.jsonl");
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->records.size(), 1u);
}

// A fresh run never appends to an existing file, and a resumed one only to a metrics log: a data
// file named by mistake stays byte for byte.
TEST(Metrics, WriterRefusesFilesThatAreNotItsOwn) {
  ScratchDir dir;
  const std::string log = MetricsJsonLine(Record(1, 3.0)) + MetricsJsonLine(Record(2, 2.0));
  WriteFileBytes(dir / "old.jsonl", log);
  EXPECT_TRUE(FailsWith(MetricsWriter::Open(dir / "old.jsonl", MetricsMode::kNew).status(),
                        "already exists"));
  EXPECT_EQ(ReadFileBytes(dir / "old.jsonl"), log);

  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  WriteFileBytes(dir / "tokens.bin", data);
  for (MetricsMode mode : {MetricsMode::kNew, MetricsMode::kContinue}) {
    absl::Status refused = MetricsWriter::Open(dir / "tokens.bin", mode).status();
    EXPECT_FALSE(refused.ok());
    EXPECT_EQ(ReadFileBytes(dir / "tokens.bin"), data);
  }
  EXPECT_TRUE(FailsWith(MetricsWriter::Open(dir / "tokens.bin", MetricsMode::kContinue).status(),
                        "is not a metrics log (line 1"));
  // Text without a newline is no crash's fragment of a record either.
  WriteFileBytes(dir / "notes.txt", "remember the milk");
  EXPECT_TRUE(FailsWith(MetricsWriter::Open(dir / "notes.txt", MetricsMode::kContinue).status(),
                        "is not a metrics log"));
  EXPECT_EQ(ReadFileBytes(dir / "notes.txt"), "remember the milk");
  // A bad line after good ones.
  WriteFileBytes(dir / "mixed.jsonl", log + "garbage\n");
  EXPECT_TRUE(FailsWith(MetricsWriter::Open(dir / "mixed.jsonl", MetricsMode::kContinue).status(),
                        "(line 3: not a metrics record)"));
  EXPECT_TRUE(FailsWith(MetricsWriter::Open(dir.path(), MetricsMode::kContinue).status(),
                        "Is a directory"));
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  EXPECT_TRUE(FailsWith(MetricsWriter::Open(dir / "pipe", MetricsMode::kNew).status(),
                        "is not a regular file"));
  // An empty or missing file is fine in either mode.
  WriteFileBytes(dir / "empty.jsonl", "");
  EXPECT_TRUE(MetricsWriter::Open(dir / "empty.jsonl", MetricsMode::kNew).ok());
  EXPECT_TRUE(MetricsWriter::Open(dir / "new.jsonl", MetricsMode::kContinue).ok());
}

TEST(Metrics, BadLineInTheMiddleIsAnError) {
  ScratchDir dir;
  WriteFileBytes(dir / "m.jsonl",
                 MetricsJsonLine(Record(1, 3.0)) + "garbage\n\n" + MetricsJsonLine(Record(2, 2.0)));
  EXPECT_TRUE(FailsWith(ReadMetrics(dir / "m.jsonl").status(), "m.jsonl line 2: not valid JSON"));
  EXPECT_TRUE(FailsWith(ReadMetrics(dir / "none.jsonl").status(), "cannot open metrics file"));
  // A device or a FIFO would be read without end.
  EXPECT_TRUE(FailsWith(ReadMetrics("/dev/zero").status(),
                        "/dev/zero is not a metrics file (not a regular file)"));
  WriteFileBytes(dir / "blank.jsonl",
                 std::string("\n") += MetricsJsonLine(Record(1, 3.0)) + "  \n");
  absl::StatusOr<MetricsLog> blank = ReadMetrics(dir / "blank.jsonl");
  ASSERT_TRUE(blank.ok()) << blank.status();
  EXPECT_EQ(blank->records.size(), 1u);
}

// Resumed from the checkpoint of step 2 after steps 3 and 4 were logged: the second records of
// steps 3 and 4 win.
TEST(Metrics, LaterRecordsOfAStepWin) {
  ScratchDir dir;
  std::string text;
  for (int step : {1, 2, 3, 4}) text += MetricsJsonLine(Record(step, 10.0 + step));
  for (int step : {3, 4, 5}) text += MetricsJsonLine(Record(step, 20.0 + step));
  WriteFileBytes(dir / "m.jsonl", text);
  absl::StatusOr<MetricsLog> log = ReadMetrics(dir / "m.jsonl");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->records.size(), 5u);
  EXPECT_EQ(log->replaced, 2);
  EXPECT_EQ(log->records[1].loss, 12.0);
  EXPECT_EQ(log->records[2].loss, 23.0);
  EXPECT_EQ(log->records[4].step, 5);
}

TEST(Progress, Line) {
  MetricsRecord r;
  r.step = 12;
  r.loss = 4.321;
  r.lr = 3e-4;
  r.grad_norm = 1.234;
  r.tokens_per_s = 1234.4;
  EXPECT_EQ(FormatProgress(r, 100, 83),
            "step 12/100  loss 4.3210  lr 3.0e-04  |g| 1.23  1,234 tok/s  ETA 0:01:23");
  r.loss = std::numeric_limits<double>::quiet_NaN();
  r.grad_norm = std::numeric_limits<double>::infinity();
  r.tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  r.skipped = true;
  EXPECT_EQ(FormatProgress(r, 100, std::nan("")),
            "step 12/100  loss nan  lr 3.0e-04  |g| inf  - tok/s  ETA -:--:--  skipped");
  r.eval_loss = 5.04321;
  r.eval_tokens = 256;
  EXPECT_EQ(FormatProgress(r, 100, std::nan("")),
            "step 12/100  loss nan  lr 3.0e-04  |g| inf  - tok/s  ETA -:--:--  eval loss 5.0432  "
            "skipped");
}

TEST(Progress, Eta) {
  EXPECT_DOUBLE_EQ(EstimateEta(10.0, 5, 20), 40.0);
  EXPECT_DOUBLE_EQ(EstimateEta(10.0, 5, 0), 0.0);
  EXPECT_DOUBLE_EQ(EstimateEta(10.0, 5, -3), 0.0);
  EXPECT_TRUE(std::isnan(EstimateEta(10.0, 0, 20)));
}

}  // namespace
}  // namespace hcp::train
