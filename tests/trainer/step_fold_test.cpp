// trainer::StepFold: where a replica's sum of its micro-batches lies when the strategy gets it.
#include "cohort/trainer/step_fold.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <vector>

#include "cohort/device/cpu.hpp"
#include "cohort/strategy/strategy.hpp"

namespace {

// A model whose gradient for batch b is b, 2b, 3b, ..., with or without reporting readiness in two
// ranges (the second half first, as a backward pass does).
template <bool kReady>
struct Counting {
  using value_type = float;
  using batch_type = int;
  std::vector<float> weights = std::vector<float>(6, 0.0f);
  std::vector<float> grads = std::vector<float>(6, 0.0f);
  std::span<float> parameters() { return weights; }
  std::span<float> gradients() { return grads; }
  double forward_backward(const int& batch) {
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>((i + 1) * batch);
    return batch;
  }
  double forward_backward(const int& batch, cohort::GradientReady ready) requires kReady {
    const double loss = forward_backward(batch);
    ready(3, 6);
    ready(0, 3);
    return loss;
  }
};

// A replica that records the sum it is handed and every range made ready.
struct Recording {
  std::span<float> sum;
  std::size_t ready = 0;
  template <class O>
  void begin_step(cohort::strategy::Update<float, O>& update) {
    sum = update.gradient_sum;
  }
  template <class O>
  void gradients_ready(cohort::strategy::Update<float, O>&, std::size_t begin, std::size_t end) {
    ready += end - begin;
  }
};

struct NoOptimizer {};

// What a fold of `batches` hands its replica, where the strategy lends `lent` (empty: nothing):
// where its sum lies and its values.
struct Handed {
  const float* where;
  std::vector<float> values;
};

template <bool kReady>
Handed fold(Counting<kReady>& model, std::span<float> lent, const std::vector<int>& batches,
            Recording& replica) {
  cohort::trainer::StepFold<Counting<kReady>, cohort::device::Cpu> fold(model, {});
  fold.lend_sum_storage(lent, batches.size());
  const NoOptimizer optimizer;
  std::vector<float> state;
  cohort::strategy::Update<float, NoOptimizer> update{.parameters = model.parameters(),
                                                      .gradient_sum = {},
                                                      .optimizer = optimizer,
                                                      .optimizer_state = state};
  const auto handed = [&] {
    return Handed{replica.sum.data(), {replica.sum.begin(), replica.sum.end()}};
  };
  for (std::size_t micro = 0; micro < batches.size(); ++micro) {
    if constexpr (kReady) {
      if (micro + 1 == batches.size()) {
        fold.add_last_with_readiness(batches[micro], replica, update);
        return handed();
      }
    }
    fold.add(batches[micro]);
  }
  fold.hand_over(replica, update);
  return handed();
}

}  // namespace

template <>
struct cohort::ModelTraits<Counting<false>> : cohort::ModelMembers<Counting<false>> {};
template <>
struct cohort::ModelTraits<Counting<true>> : cohort::ModelMembers<Counting<true>> {};

TEST_CASE_TEMPLATE(
    "a replica of one micro-batch a step hands the strategy the model's own gradient as its sum, "
    "with no copy; a replica of several, a sum in the fold's own buffer; and where the strategy "
    "lends storage, the sum in that storage",
    Model, Counting<false>, Counting<true>) {
  Model model;
  Recording replica;
  const Handed one = fold(model, {}, {2}, replica);
  CHECK(one.where == model.gradients().data());
  CHECK(one.values == std::vector<float>{2, 4, 6, 8, 10, 12});
  CHECK(replica.ready == 6);

  Model several;
  Recording folded;
  const Handed sum = fold(several, {}, {2, 3}, folded);
  CHECK(sum.where != several.gradients().data());
  CHECK(sum.values == std::vector<float>{5, 10, 15, 20, 25, 30});
  // The model's own gradient is the last micro-batch's, untouched by the fold.
  CHECK(several.grads == std::vector<float>{3, 6, 9, 12, 15, 18});

  Model lending;
  Recording lent_to;
  std::vector<float> storage(6, -1.0f);
  const Handed into = fold(lending, std::span<float>(storage), {2}, lent_to);
  CHECK(into.where == storage.data());
  CHECK(storage == std::vector<float>{2, 4, 6, 8, 10, 12});
}

TEST_CASE(
    "a gradient of the fold lent nothing keeps the buffer it holds, from segment to segment") {
  cohort::trainer::StepFold<Counting<false>, cohort::device::Cpu>::Gradient gradient;
  gradient.hold(6, {});
  const float* const own = gradient.span().data();
  gradient.lend({});  // a new segment, where the strategy lends nothing
  CHECK(gradient.size() == 6);
  CHECK(gradient.span().data() == own);
  std::vector<float> storage(6);
  gradient.lend(storage);
  CHECK(gradient.span().data() == storage.data());
}
