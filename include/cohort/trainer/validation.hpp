// Evaluation on held-out data inside fit, and stopping early:
//
//   auto report = trainer.fit(train, {.epochs = 20},
//                             cohort::validation(held_out, {.every_steps = 0,  // each epoch
//                                                           .stop = [](const cohort::Report& r) {
//                                                             return r.validation.size() > 3 &&
//                                                                    ...;  // no better lately
//                                                           }}));
//   report.validation.back().mean("correct")  // held-out accuracy after the last evaluation
//
// After every every_steps steps (0: at the end of every epoch) and at the end of the fit, every
// replica of every process evaluates the held-out Dataset with its own copy of the model, which
// holds the parameters every replica holds. The examples are taken in index order, global_batch
// at a time (the last batch shorter), and each batch is split into micro_batches micro-batches
// as a training step's is; a replica evaluates the micro-batches it would compute in a step. The
// sums of each batch are folded in the canonical tree, inside the replica and across replicas in
// one all-reduce of every batch's sums, and the batches are added in order: the figures are the
// same bits on any replica count and strategy whose training bits are (ParameterServer<Sync>
// included; under Async each worker evaluates the parameters it last pulled).
//
// What is summed: ModelTraits<M>::evaluate(model, batch), named sums of a forward pass (core/
// model.hpp), or, for a model without it, {"loss", forward_backward's summed loss} (which also
// computes a gradient, unused). Each mean is its sum over the held-out set's size.
//
// `stop`, when given, is called on every process after each evaluation with the report so far
// (the validation figures are every process's; the losses only the chief's); the fit stops
// there, on every process, if it returns true on any (one more all-reduce), and Report::
// stopped_early says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/dataset.hpp"
#include "cohort/core/model.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/trainer/agreement.hpp"
#include "cohort/trainer/options.hpp"

namespace cohort {

struct ValidationOptions {
  std::uint64_t every_steps = 0;  // 0: at the end of every epoch; always at the end of the fit
  std::function<bool(const Report&)> stop{};  // early stopping: true stops the fit
};

// The held-out data of a fit, and when to evaluate it (cohort::validation below).
template <class V>
struct Validation {
  const V& data;
  ValidationOptions options;
};

template <class V>
Validation<V> validation(const V& data, ValidationOptions options = {}) {
  return {data, std::move(options)};
}

namespace trainer {

// A fit without held-out data.
struct NoValidation {};

// One replica's part of an evaluation of `data` with `model`: for each batch, the fold of this
// replica's micro-batches' sums (names[k]'s sum at [batch * names.size() + k]).
template <class M, class V>
class Evaluator {
 public:
  // The replica folds micro-batches [first, first + count) of each batch (sharding::Deal).
  Evaluator(const V& data, std::size_t global_batch, std::size_t micro_batches, std::size_t first,
            std::size_t count)
      : data_(data),
        global_batch_(global_batch),
        micro_batches_(micro_batches),
        first_(first),
        end_(first + count) {
    if (data.size() < micro_batches) {
      options::reject("validation data.size()", data.size(),
                      "must be at least micro_batches (" + std::to_string(micro_batches) +
                          "), so that every replica evaluates some examples");
    }
  }

  // The means over the held-out set, every replica's alike.
  template <class Communicator, class D>
  Evaluation evaluate(M& model, std::uint64_t step, Communicator& communicator,
                      Agreement<D>& agreement) {
    const std::size_t batches = (data_.size() + global_batch_ - 1) / global_batch_;
    sums_.clear();
    for (std::size_t batch = 0; batch < batches; ++batch) fold_batch(model, batch);
    agreement.all_reduce(communicator, sums_, ReduceOp::kSum);
    Evaluation evaluation{.step = step, .means = {}};
    for (std::size_t k = 0; k < names_.size(); ++k) {
      double total = 0.0;
      for (std::size_t batch = 0; batch < batches; ++batch)
        total += sums_[batch * names_.size() + k];
      evaluation.means.emplace_back(names_[k], total / static_cast<double>(data_.size()));
    }
    return evaluation;
  }

 private:
  using Sums = std::vector<double>;

  static void add(Sums& left, const Sums& right) {
    for (std::size_t k = 0; k < left.size(); ++k) left[k] += right[k];
  }

  void fold_batch(M& model, std::size_t batch) {
    const std::size_t begin = batch * global_batch_;
    const std::size_t size = std::min(global_batch_, data_.size() - begin);
    tree::StreamingFold<Sums, decltype(&add)> fold(&add);
    for (std::size_t micro = first_; micro < end_; ++micro) {
      // Sizes differ by at most one: the first size % micro_batches are one longer.
      const std::size_t start =
          begin + micro * (size / micro_batches_) + std::min(micro, size % micro_batches_);
      const std::size_t count = size / micro_batches_ + (micro < size % micro_batches_ ? 1 : 0);
      indices_.resize(count);
      for (std::size_t i = 0; i < count; ++i) indices_[i] = start + i;
      Sums sums = count == 0 ? Sums(names_.size(), 0.0) : sums_of(model);
      fold.push([&](Sums& slot) { slot = std::move(sums); });
    }
    const Sums& folded = fold.result();
    sums_.insert(sums_.end(), folded.begin(), folded.end());
  }

  // One micro-batch's named sums; the names of the first fix those of every other.
  Sums sums_of(M& model) {
    NamedSums named;
    if constexpr (Evaluates<M>) {
      named = ModelTraits<M>::evaluate(model, data_.batch(indices_));
    } else {
      named = {{"loss", ModelTraits<M>::forward_backward(model, data_.batch(indices_))}};
    }
    if (names_.empty()) {
      for (const auto& [name, sum] : named) names_.push_back(name);
    }
    Sums sums;
    for (std::size_t k = 0; k < named.size() && k < names_.size(); ++k) {
      if (named[k].first != names_[k]) {
        options::reject("evaluate()", named[k].first,
                        "names a sum other than the first call's " + names_[k] +
                            ": every call must return the same names in the same order");
      }
      sums.push_back(named[k].second);
    }
    sums.resize(names_.size(), 0.0);
    return sums;
  }

  const V& data_;
  std::size_t global_batch_;
  std::size_t micro_batches_;
  std::size_t first_;  // this replica's micro-batches of each batch
  std::size_t end_;
  std::vector<std::string> names_;
  std::vector<std::size_t> indices_;
  Sums sums_;  // every batch's folded sums, batch-major
};

}  // namespace trainer
}  // namespace cohort
