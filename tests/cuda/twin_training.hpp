// What the GPU strategy tests train, in one place for the test programs and the worker processes:
// a twin model (twin_model.hpp) on the small task of tests/support/training.hpp, with the
// Trainer options every comparison uses.
#pragma once

#include <cohort/cohort.hpp>
#include <cstdint>
#include <utility>

#include "training.hpp"
#include "twin_model.hpp"

namespace cohort::test {

inline constexpr twin::Shape kTwinShape{.inputs = 8, .hidden = 16, .outputs = 4};
inline constexpr std::uint64_t kTwinSeed = 7;

// Model is CpuTwin or CudaTwin; every progress window (10 steps) all-reduces the losses too.
template <class Model, class Strategy, class Optimizer>
auto make_twin_trainer(Strategy strategy, Optimizer optimizer) {
  return Trainer(Model(kTwinShape, kTwinSeed), std::move(strategy), std::move(optimizer),
                 {.global_batch = 64,
                  .micro_batches = 8,
                  .seed = 11,
                  .log_every = 10,
                  .progress = Progress::kSilent});
}

}  // namespace cohort::test
