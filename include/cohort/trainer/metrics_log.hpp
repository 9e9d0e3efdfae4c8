// trainer::MetricsLog: Options::metrics (or COHORT_METRICS=<file>): the chief writes one JSON
// object per line, flushed as it goes, so that a user can follow a run, plot it
// (tools/plot-metrics) or compare runs:
//
//   {"step": 200, "epoch": 2, "loss": 0.0812, "learning_rate": 0.00093, "examples_per_second":
//   51234}
//   {"step": 200, "epoch": 2, "validation": {"loss": 0.0901, "correct": 0.9712}}
//
// A "loss" line for every progress line (Options::log_every steps, each epoch's end and the fit's
// last step): step is the number of steps done, epoch the epochs done (a fraction within one),
// loss the mean loss per example over the steps since the line before, learning_rate the one the
// last of them used (the optimizer's, times the schedule's factor), examples_per_second over
// those steps. A "validation" line after every evaluation (trainer/validation.hpp): each mean by
// its name. The file is started anew by a Trainer's first fit, and appended to when the run
// resumes from a checkpoint (Options::checkpoint.resume), where the steps redone since that
// checkpoint appear twice: the later line is the one that counts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/trainer/options.hpp"

namespace cohort::trainer {

class MetricsLog {
 public:
  // Opens `file` (its directory made), truncated unless `append`.
  MetricsLog(const std::filesystem::path& file, bool append) : file_(file) {
    std::error_code ignored;
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ignored);
    out_.reset(std::fopen(file.c_str(), append ? "a" : "w"));
    if (!out_) {
      throw ConfigError("metrics " + file.string() +
                        ": cannot be opened for writing (Options::metrics or COHORT_METRICS)");
    }
  }

  void losses(std::uint64_t steps, double epochs, double loss, double learning_rate,
              double examples_per_second) {
    std::string line = head(steps, epochs);
    line += ", \"loss\": " + number(loss) + ", \"learning_rate\": " + number(learning_rate) +
            ", \"examples_per_second\": " + number(examples_per_second) + "}\n";
    write(line);
  }

  void validation(std::uint64_t steps, double epochs, const Evaluation& evaluation) {
    std::string line = head(steps, epochs) + ", \"validation\": {";
    for (std::size_t i = 0; i < evaluation.means.size(); ++i) {
      if (i != 0) line += ", ";
      line += quoted(evaluation.means[i].first) + ": " + number(evaluation.means[i].second);
    }
    write(line + "}}\n");
  }

 private:
  struct Close {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  static std::string head(std::uint64_t steps, double epochs) {
    return "{\"step\": " + std::to_string(steps) + ", \"epoch\": " + number(epochs);
  }

  // Each value as the shortest text that reads back as it; JSON has no infinity or NaN: those
  // are null.
  static std::string number(double value) {
    return std::isfinite(value) ? options::shortest(value) : "null";
  }

  static std::string quoted(std::string_view text) {
    std::string out = "\"";
    for (const char c : text) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
        out += escaped;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

  void write(const std::string& line) {
    if (std::fputs(line.c_str(), out_.get()) < 0 || std::fflush(out_.get()) != 0) {
      throw ConfigError("metrics " + file_.string() + ": a line could not be written");
    }
  }

  std::filesystem::path file_;
  std::unique_ptr<std::FILE, Close> out_;
};

// The chief's log where Options::metrics, or else COHORT_METRICS, names a file, appended to where
// `append`, else started anew; none otherwise. Opened by the chief's first fit, appending where
// the run resumes from a checkpoint, and by a worker that becomes the chief of an elastic job
// (trainer/segments.hpp), appending: where the file lies on a file system both chiefs see, it goes
// on as one.
inline std::unique_ptr<MetricsLog> open_metrics_log(const TrainerOptions& options, bool append) {
  std::filesystem::path file = options.metrics;
  if (file.empty()) {
    if (const char* variable = std::getenv("COHORT_METRICS"); variable && *variable)
      file = variable;
  }
  if (file.empty()) return nullptr;
  return std::make_unique<MetricsLog>(file, append);
}

}  // namespace cohort::trainer
