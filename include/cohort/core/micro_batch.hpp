// Which micro-batch a forward_backward computes, for a model that draws random numbers (dropout).
//
// A micro-batch is the unit of work and of the reduction tree (trainer/trainer.hpp): the same
// micro-batch, with the same examples, is computed on any replica count, strategy and launcher, and
// after a restore. A model whose forward draws random numbers keeps the bits the same everywhere
// when it draws them from a stream of that micro-batch's own, and not from one generator that
// replica threads share in the order the scheduler runs them:
//
//   double forward_backward(Net& net, const Batch& batch) {
//     std::mt19937_64 draws(cohort::random_stream(*cohort::current_micro_batch()));
//     ...  // dropout masks from `draws`
//   }
//
// The LibTorch adapter does this for its modules (adapters/torch.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cohort/core/random.hpp"

namespace cohort {

struct MicroBatch {
  std::uint64_t seed = 0;  // Trainer::Options::seed
  std::uint64_t step = 0;  // counted since the run began, restored checkpoints included
  std::size_t index = 0;   // the micro-batch's place in the step, 0 .. micro_batches - 1
};

// A seed for the micro-batch's random draws: a function of the three fields only, different for
// every (seed, step, index), and apart from the streams cohort derives for the data order.
constexpr std::uint64_t random_stream(const MicroBatch& micro_batch) {
  constexpr std::uint64_t kDrawsStream = 0x6d6963726f2d6261;  // "micro-ba": no other stream's
  return random::derive(
      random::derive(random::derive(micro_batch.seed, kDrawsStream), micro_batch.step),
      micro_batch.index);
}

namespace detail {
inline thread_local const MicroBatch* current_micro_batch = nullptr;
}  // namespace detail

// The micro-batch this thread's forward_backward computes, while the Trainer calls it; nullptr
// outside (a forward_backward that the program calls itself).
inline const MicroBatch* current_micro_batch() noexcept { return detail::current_micro_batch; }

// The Trainer's scope around each forward_backward call.
class MicroBatchScope {
 public:
  // Holds its own copy, so that a temporary names the micro-batch for the scope's whole life.
  explicit MicroBatchScope(const MicroBatch& micro_batch) noexcept
      : micro_batch_(micro_batch), previous_(detail::current_micro_batch) {
    detail::current_micro_batch = &micro_batch_;
  }
  MicroBatchScope(const MicroBatchScope&) = delete;
  MicroBatchScope& operator=(const MicroBatchScope&) = delete;
  ~MicroBatchScope() { detail::current_micro_batch = previous_; }

 private:
  MicroBatch micro_batch_;
  const MicroBatch* previous_;
};

}  // namespace cohort
