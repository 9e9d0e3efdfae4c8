// trainer::StepFold: one replica's sum of its micro-batches' gradients and losses in a step, in the
// canonical tree (core/reduction_tree.hpp), which the strategy continues across replicas. For a
// model with gradient readiness (core/model.hpp) the ranges of the last micro-batch are folded
// and handed to the replica while its backward pass goes on, so the strategy can reduce the first
// buckets meanwhile; otherwise the whole fold is one range after the last micro-batch. Either way
// each element's sum follows the same tree, so the bits are the same. The fold's reduction is the
// strategy's (strategy::ChoosesGradientSum): under ReduceOp::kSumBfloat16 (kSumFloat16) every leaf
// is rounded to bfloat16 (float16) and every merge rounds, as the communicators' merges do, on the
// host's replicas.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "cohort/core/model.hpp"
#include "cohort/core/readiness.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/device/device.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::trainer {

template <class M, device::Device D>
class StepFold {
 public:
  using T = ValueType<M>;
  using Place = typename D::Place;

  // A gradient of the fold: a buffer of its own at the replica's place, or, for the sum, storage
  // that the strategy lends (strategy::LendsGradientStorage) or the model's own gradient
  // (lend_sum_storage).
  class Gradient {
   public:
    std::span<T> span() { return lent_.empty() ? owned_.span() : lent_; }
    std::span<const T> span() const { return lent_.empty() ? owned_.span() : lent_; }
    std::size_t size() const { return span().size(); }
    // Keeps what it holds where that is `count` elements, else holds a buffer of its own.
    void hold(std::size_t count, const Place& place) {
      if (size() == count) return;
      lent_ = {};
      owned_ = device::Buffer<D, T>(count, place);
    }
    // Storage lent (none: the buffer of its own again, which it keeps from segment to segment).
    void lend(std::span<T> storage) {
      lent_ = storage;
      if (!storage.empty()) owned_ = {};
    }

   private:
    device::Buffer<D, T> owned_;
    std::span<T> lent_;
  };

  // The fold's addition. Out of line on purpose: the model's forward_backward usually inlines
  // into the micro-batch loop, and with this vector loop inlined beside it GCC 12 compiled the
  // model measurably slower (examples/00_mirrored_cpu: about 8% fewer examples/s on 1 replica,
  // with 1% more instructions: another register allocation of the model's loops).
  struct AddInto {
    Place place;
    ReduceOp sum = ReduceOp::kSum;
    [[gnu::noinline]] void operator()(Gradient& left, const Gradient& right) const {
      add(left.span(), right.span());
    }
    [[gnu::noinline]] void part(Gradient& left, const Gradient& right, std::size_t begin,
                                std::size_t count) const {
      add(left.span().subspan(begin, count),
          std::span<const T>(right.span()).subspan(begin, count));
    }
    void add(std::span<T> left, std::span<const T> right) const {
      if constexpr (std::same_as<D, device::Cpu>) {
        if (sum != ReduceOp::kSum) {
          device::cpu::combine_into<T>(sum, left, right);
          return;
        }
      }
      D::add_into(place, left, right);
    }
  };

  // `sum`: the reduction of the strategy's gradient sum, kSum or, for replicas on the host,
  // kSumBfloat16 or kSumFloat16.
  StepFold(M& model, const Place& place, ReduceOp sum = ReduceOp::kSum)
      : model_(model),
        gradients_(ModelTraits<M>::gradients(model)),
        place_(place),
        sum_(sum),
        gradient_fold_(AddInto{place, sum}),
        loss_fold_(&add_loss) {
    COHORT_ASSERT((sum == ReduceOp::kSum || std::same_as<D, device::Cpu>));
  }

  // Where the sum is kept for every step of the fit: `storage`, the strategy's; else, where the
  // replica folds one micro-batch a step (`leaves`), the model's own gradients, the one leaf being
  // the sum, which the strategy then reduces where the model wrote it, with no copy (for a model
  // of 20M parameters, 80 MB a step); else a buffer of the fold's.
  void lend_sum_storage(std::span<T> storage, std::size_t leaves) {
    if (storage.empty() && leaves == 1) storage = gradients_;
    gradient_fold_.result_slot().lend(storage);
  }

  void reset() {
    gradient_fold_.reset();
    loss_fold_.reset();
  }

  // A micro-batch that is not the last of a step with readiness.
  template <class Batch>
  void add(const Batch& batch) {
    const double loss = ModelTraits<M>::forward_backward(model_, batch);
    gradient_fold_.push([&](Gradient& slot) {
      slot.hold(gradients_.size(), place_);
      take_leaf(gradients_, slot.span());
    });
    loss_fold_.push([&](double& slot) { slot = loss; });
  }

  // After the last add: the whole fold is one range, handed over at once.
  template <class Replica, class O>
  void hand_over(Replica& replica, strategy::Update<T, O>& update) {
    update.gradient_sum = gradient_fold_.result().span();
    replica.begin_step(update);
    replica.gradients_ready(update, 0, update.gradient_sum.size());
  }

  // The last micro-batch of a step, with gradient readiness: each range the model reports final
  // is folded at once (the fold's remaining merges, on that range only) and handed to the
  // replica, which may start reducing it while the backward pass goes on.
  template <class Batch, class Replica, class O>
  void add_last_with_readiness(const Batch& batch, Replica& replica,
                               strategy::Update<T, O>& update) {
    Gradient& leaf = gradient_fold_.begin_last();
    leaf.hold(gradients_.size(), place_);
    update.gradient_sum = gradient_fold_.result_slot().span();
    replica.begin_step(update);
    ReadinessCheck readiness;
    readiness.begin(gradients_.size());
    auto ready = [&](std::size_t begin, std::size_t end) {
      readiness.add(begin, end);
      const std::size_t count = end - begin;
      take_leaf(gradients_.subspan(begin, count), leaf.span().subspan(begin, count));
      gradient_fold_.finish_part([&](Gradient& left, Gradient& right) {
        AddInto{place_, sum_}.part(left, right, begin, count);
      });
      replica.gradients_ready(update, begin, end);
    };
    const double loss = ModelTraits<M>::forward_backward(model_, batch, GradientReady(ready));
    readiness.require_complete();
    gradient_fold_.end_last();
    loss_fold_.push([&](double& slot) { slot = loss; });
  }

  // The step's summed loss over this replica's micro-batches.
  double loss() { return loss_fold_.result(); }

 private:
  static void add_loss(double& left, const double& right) { left += right; }

  // A micro-batch's gradient as a leaf of the fold's tree: copied (unless the leaf is the model's
  // gradient itself: lend_sum_storage), and rounded under a rounded sum (kSumBfloat16,
  // kSumFloat16).
  void take_leaf(std::span<const T> gradient, std::span<T> leaf) const {
    if (gradient.data() != leaf.data()) D::copy(place_, gradient, leaf);
    if constexpr (std::same_as<D, device::Cpu>) device::cpu::round_to_leaves<T>(sum_, leaf);
  }

  M& model_;
  std::span<T> gradients_;
  Place place_;
  ReduceOp sum_;
  tree::StreamingFold<Gradient, AddInto> gradient_fold_;
  tree::StreamingFold<double, decltype(&add_loss)> loss_fold_;
};

}  // namespace cohort::trainer
