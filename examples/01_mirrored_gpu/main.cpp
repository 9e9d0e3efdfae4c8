// Trains the demo's MLP on GPUs: Mirrored<device::Cuda, collective::Nccl> over the visible GPUs
// (as many as split the micro-batches: the largest power of two up to both; or the counts given
// with --replicas), the model's forward and backward in cuBLAS and kernels of
// its own (cuda_mlp.hpp). Prints held-out accuracy, examples per second per GPU count, and whether
// the final parameters are the same bits for every GPU count. The task, the initial parameters and
// the settings are example 00's, so the accuracy is comparable with its CPU runs (not the bits:
// cuBLAS sums in another order than the host loops).
#include <algorithm>
#include <bit>
#include <cohort/cohort.hpp>
#include <cohort/device/cuda.hpp>
#include <cohort/strategy/mirrored_cuda.hpp>
#include <cstdio>
#include <vector>

#include "cuda_mlp.hpp"
#include "demo.hpp"

namespace {

example::Outcome train_on_gpus(const example::DemoSettings& settings, const example::DemoData& data,
                               std::size_t gpus) {
  using namespace cohort;
  const std::vector<std::size_t>& layers = settings.layers;
  example::Mlp initial(layers, settings.seed);  // example 00's initial parameters
  const auto start = ModelTraits<example::Mlp>::parameters(initial);
  Trainer trainer(example::CudaMlp(layers, {start.begin(), start.end()}),
                  strategy::Mirrored<device::Cuda, collective::Nccl>({.replicas = gpus}),
                  optimizer::Adam({.learning_rate = settings.learning_rate}),
                  {.global_batch = settings.batch,
                   .micro_batches = settings.micro_batches,
                   .seed = settings.seed,
                   .log_every = settings.log_every,
                   .progress = settings.quiet ? Progress::kSilent : Progress::kAuto});
  const Report report = trainer.fit(data.training(), {.epochs = settings.epochs});
  // The trained parameters, evaluated by a host Mlp of the same layout.
  const std::vector<float> parameters = trainer.model().host_parameters();
  std::ranges::copy(parameters, ModelTraits<example::Mlp>::parameters(initial).begin());
  return {report.examples_per_second, example::accuracy(initial, data.held_out), parameters};
}

}  // namespace

int main(int argc, char** argv) {
  example::DemoSettings settings;
  std::vector<std::size_t> gpu_counts;
  CLI::App app{"Mirrored data-parallel training of an MLP on GPUs (cuBLAS, NCCL)"};
  app.add_option("--replicas", gpu_counts,
                 "GPU counts to train with, in turn (default: every visible GPU, down to a "
                 "power of two that divides --micro-batches)")
      ->expected(1, 16);
  example::add_demo_options(app, settings);
  CLI11_PARSE(app, argc, argv);

  const int visible = cohort::device::cuda::device_count();
  if (visible == 0) {
    std::fprintf(stderr, "mirrored_gpu: no usable GPU: %s\n",
                 cohort::device::cuda::unavailable().c_str());
    return 1;
  }
  if (gpu_counts.empty()) {
    // Each replica takes an aligned power-of-two block of micro-batches (docs/architecture.md).
    gpu_counts.push_back(
        std::bit_floor(std::min(static_cast<std::size_t>(visible), settings.micro_batches)));
  }

  try {
    const example::DemoData data(settings);
    data.print();
    std::printf("%d visible GPU(s)\n", visible);
    std::vector<example::Outcome> outcomes;
    for (std::size_t gpus : gpu_counts) {
      std::printf("\nMLP %s, Mirrored<device::Cuda, collective::Nccl> on %zu GPU(s):\n",
                  example::describe(settings.layers).c_str(), gpus);
      outcomes.push_back(train_on_gpus(settings, data, gpus));
    }

    std::printf("\n%8s %14s %8s %10s %18s\n", "GPUs", "examples/s", "speedup", "accuracy",
                "parameters");
    bool identical = true;
    for (std::size_t run = 0; run < outcomes.size(); ++run) {
      const example::Outcome& outcome = outcomes[run];
      identical = identical && outcome.parameters == outcomes[0].parameters;
      std::printf(
          "%8zu %14.0f %7.2fx %9.2f%% %18llx\n", gpu_counts[run], outcome.examples_per_second,
          outcome.examples_per_second / outcomes[0].examples_per_second, 100.0 * outcome.accuracy,
          static_cast<unsigned long long>(example::fingerprint(outcome.parameters)));
    }
    if (outcomes.size() > 1) {
      std::printf("\nfinal parameters bit-identical across GPU counts: %s\n",
                  identical ? "yes" : "NO");
    }
    return 0;
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
