// trainer::LossWindow: the steps since the last progress line. Their losses travel once per window,
// not once per step: every replica keeps its folds, and one all-reduce of the window gives each
// step's sum in the same tree on every replica, so a step costs one collective. The chief's first
// replica keeps them in the Report and prints the progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "cohort/core/reduce_op.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/trainer/agreement.hpp"
#include "cohort/trainer/metrics_log.hpp"
#include "cohort/trainer/options.hpp"
#include "cohort/trainer/progress.hpp"

namespace cohort::trainer {

class LossWindow {
 public:
  // `reports`: whether this replica keeps the Report and prints (the chief's first).
  LossWindow(bool reports, Progress progress, std::uint64_t steps_per_epoch,
             std::uint64_t global_batch)
      : reports_(reports),
        inverse_batch_(1.0 / static_cast<double>(global_batch)),
        printer_(reports ? progress : Progress::kSilent, steps_per_epoch, global_batch) {}

  // A step's summed loss over this replica's micro-batches, and its times.
  void add(double loss, const StepTimes& times) {
    losses_.push_back(loss);
    times_.push_back(times);
    fit_times_ += times;
  }

  bool empty() const { return losses_.empty(); }

  // After a pause that is not training (an evaluation): the next progress line's examples/s
  // leaves it out.
  void restart_clock() { printer_.restart_clock(); }

  // This replica's times over the whole fit, the window's all-reduces included.
  const StepTimes& fit_times() const { return fit_times_; }

  // A window that takes over from `earlier` of the same fit (after an elastic job's regroup:
  // trainer/elastic.hpp): its times count in the fit's, and the steps `earlier` reported are not
  // reported again. Its losses are lost with the worker.
  void continue_fit(const LossWindow& earlier) {
    fit_times_ += earlier.fit_times_;
    first_unreported_ = earlier.first_unreported_;
  }

  // Ends the window at `last_step`: the all-reduce of its losses, then on the reporting replica
  // the Report's losses, the progress line (`periodic`: a log_every line) and its line in the
  // metrics log, when there is one (`learning_rate`: the last step's). A step that this replica
  // reported before, computed again after an elastic job rebuilt an earlier state (to the same
  // bits), counts only in the times.
  template <class Communicator, class D>
  void close(std::uint64_t last_step, bool periodic, double learning_rate,
             Communicator& communicator, Agreement<D>& agreement, trace::Recorder* recorder,
             MetricsLog* metrics, Report& report) {
    const trace::Span span(recorder, trace::Phase::kLossAllReduce, {.step = last_step});
    const auto start = std::chrono::steady_clock::now();
    agreement.all_reduce(communicator, losses_, ReduceOp::kSum);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    times_.back().communication += seconds;
    fit_times_.communication += seconds;
    if (reports_) {
      const std::uint64_t first_step = last_step + 1 - losses_.size();
      for (std::size_t i = 0; i < losses_.size(); ++i) {
        report.times += times_[i];
        const std::uint64_t step = first_step + i;
        if (step < first_unreported_) continue;
        first_unreported_ = step + 1;
        const double mean_loss = losses_[i] * inverse_batch_;
        report.loss.push_back(mean_loss);
        const auto line =
            printer_.report(step, mean_loss, times_[i], periodic && i + 1 == losses_.size());
        if (line && metrics != nullptr) {
          metrics->losses(line->step, line->epochs, line->loss, learning_rate,
                          line->examples_per_second);
        }
      }
    }
    losses_.clear();
    times_.clear();
  }

 private:
  bool reports_;
  double inverse_batch_;
  ProgressPrinter printer_;
  std::vector<double> losses_;  // this replica's loss fold of each step of the window
  std::vector<StepTimes> times_;
  StepTimes fit_times_;
  std::uint64_t first_unreported_ = 0;  // the reporting replica: the first step not reported yet
};

}  // namespace cohort::trainer
