// The translation unit whose compile time benchmarks/build/compile_time measures: a user's
// one-file program that trains the examples' MLP with the strategies it names. The script
// compiles it three times, defining CLIENT_MIRRORED, CLIENT_MULTI_WORKER_MIRRORED and
// CLIENT_PARAMETER_SERVER to 1 or 0, so each strategy's cost is measured by the same source.
#include <cohort/optimizer/adam.hpp>
#include <cohort/trainer.hpp>
#include <cstdio>
#include <utility>

#if CLIENT_MIRRORED
#include <cohort/strategy/mirrored.hpp>
#endif
#if CLIENT_MULTI_WORKER_MIRRORED
#include <cohort/strategy/multi_worker_mirrored.hpp>
#endif
#if CLIENT_PARAMETER_SERVER
#include <cohort/strategy/parameter_server.hpp>
#endif

#include "clusters.hpp"
#include "mlp.hpp"

namespace {

// What a program does with a strategy: fit, save, restore, fit on.
template <class Strategy>
double train(Strategy strategy, const example::ClusterData& data) {
  cohort::Trainer trainer(example::Mlp({8, 64, 10}, 1), std::move(strategy),
                          cohort::optimizer::Adam({.learning_rate = 1e-3}),
                          {.global_batch = 256, .micro_batches = 8, .seed = 1});
  const cohort::Report first = trainer.fit(data, {.epochs = 1});
  trainer.save("client.ckpt");
  trainer.restore("client.ckpt");
  const cohort::Report second = trainer.fit(data, {.epochs = 2});
  return first.seconds + second.seconds;
}

}  // namespace

int main(int argc, char**) {
  const example::ClusterTask task({.seed = 1});
  const example::ClusterData data = task.sample(10'000, 0);
  double seconds = 0.0;
#if CLIENT_MIRRORED
  if (argc == 1) seconds += train(cohort::strategy::Mirrored<>({.replicas = 2}), data);
#endif
#if CLIENT_MULTI_WORKER_MIRRORED
  if (argc == 2) {
    seconds += train(cohort::strategy::MultiWorkerMirrored<>({.local_replicas = 1}), data);
  }
#endif
#if CLIENT_PARAMETER_SERVER
  if (argc == 3) seconds += train(cohort::strategy::ParameterServer<>({}), data);
#endif
  std::printf("%.3f\n", seconds);
  return 0;
}
