// The examples' Eigen MLP (examples/common/eigen_mlp.hpp): its gradients are right, the same bits
// call after call and replica after replica, and under every strategy it trains to the bits of
// Mirrored, across processes too (tests/strategy's programs, started by the local launcher).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "eigen_training.hpp"
#include "jobs.hpp"
#include "mlp.hpp"
#include "processes.hpp"

namespace {

using cohort::testing::parameters_of;
using cohort::testing::small_eigen_model;
using cohort::testing::small_task_data;

// `examples` examples of `features` standard normal features, labels cycling through `classes`.
example::Batch random_batch(std::size_t examples, std::size_t features, std::int32_t classes,
                            std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal;
  example::Batch batch;
  batch.features = features;
  batch.inputs.resize(examples * features);
  for (float& input : batch.inputs) input = normal(engine);
  for (std::size_t example = 0; example < examples; ++example) {
    batch.labels.push_back(static_cast<std::int32_t>(example) % classes);
  }
  return batch;
}

template <class Model>
std::vector<typename Model::value_type> gradients_of(Model& model, const example::Batch& batch,
                                                     double* loss = nullptr) {
  const double summed = model.forward_backward(batch);
  if (loss != nullptr) *loss = summed;
  const auto gradients = model.gradients();
  return {gradients.begin(), gradients.end()};
}

// The reference of the multi-process tests, on the Eigen MLP of `threads` threads.
std::vector<float> mirrored_parameters(std::size_t replicas, std::size_t threads,
                                       std::size_t micro_batches, std::uint64_t steps) {
  return cohort::testing::mirrored_training(small_eigen_model(threads), steps, replicas,
                                            micro_batches);
}

}  // namespace

TEST_CASE("a thread team runs every part once per run, on threads of its own, and so does a copy") {
  example::ThreadTeam team(3);
  example::ThreadTeam copy = team;
  for (example::ThreadTeam* runs : {&team, &copy}) {
    REQUIRE(runs->size() == 3);
    std::array<std::atomic<int>, 3> calls{};
    std::array<std::thread::id, 3> threads{};
    for (int run = 0; run < 1000; ++run) {
      runs->run([&](std::size_t part) {
        calls[part].fetch_add(1);
        threads[part] = std::this_thread::get_id();
      });
    }
    for (const auto& count : calls) CHECK(count.load() == 1000);
    CHECK(threads[0] == std::this_thread::get_id());
    CHECK(threads[1] != threads[0]);
    CHECK(threads[2] != threads[0]);
    CHECK(threads[2] != threads[1]);
  }
}

TEST_CASE(
    "the double Eigen MLP's gradients match central differences of its loss, on 1 and 3 "
    "threads") {
  const example::Batch batch = random_batch(5, 6, 3, 21);
  for (std::size_t threads : {1, 3}) {
    CAPTURE(threads);
    example::BasicEigenMlp<double> model({6, 40, 24, 3}, 5, threads);
    const std::vector<double> analytic = gradients_of(model, batch);
    const auto parameters = model.parameters();
    constexpr double kStep = 1e-6;
    // Every parameter on 1 thread; on 3, every 13th (each layer's weights and biases among them):
    // each probe is two passes of the thread team, which beside busy programs wait their turn.
    const std::size_t stride = threads == 1 ? 1 : 13;
    double worst = 0.0;
    for (std::size_t i = 0; i < parameters.size(); i += stride) {
      const double kept = parameters[i];
      parameters[i] = kept + kStep;
      const double above = model.forward_backward(batch);
      parameters[i] = kept - kStep;
      const double below = model.forward_backward(batch);
      parameters[i] = kept;
      const double numeric = (above - below) / (2 * kStep);
      worst = std::max(worst, std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric)));
    }
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("EigenMlp starts from Mlp's parameters and computes its loss and gradients to rounding") {
  const std::vector<std::size_t> layers{8, 40, 24, 4};
  example::EigenMlp eigen(layers, 3);
  example::Mlp loops(layers, 3);
  REQUIRE(parameters_of(eigen) == parameters_of(loops));
  const example::Batch batch = random_batch(13, 8, 4, 5);
  double eigen_loss = 0.0;
  double loops_loss = 0.0;
  const std::vector<float> eigen_gradients = gradients_of(eigen, batch, &eigen_loss);
  const std::vector<float> loops_gradients = gradients_of(loops, batch, &loops_loss);
  CHECK(eigen_loss == doctest::Approx(loops_loss).epsilon(1e-5));
  float largest = 0.0f;
  float worst = 0.0f;
  for (std::size_t i = 0; i < eigen_gradients.size(); ++i) {
    largest = std::max(largest, std::abs(loops_gradients[i]));
    worst = std::max(worst, std::abs(eigen_gradients[i] - loops_gradients[i]));
  }
  CHECK(largest > 0.0f);
  CHECK(worst <= 1e-5f * largest);
}

TEST_CASE(
    "the float Eigen MLP gives the same bits call after call and copy after copy, on 1 and "
    "2 threads") {
  const example::Batch batch = random_batch(13, 8, 4, 5);
  const example::Batch larger = random_batch(29, 8, 4, 6);
  for (std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    example::EigenMlp model = small_eigen_model(threads);
    double first_loss = 0.0;
    const std::vector<float> first = gradients_of(model, batch, &first_loss);
    // A larger batch in between: the buffers grow, and the gradients are overwritten, not added.
    gradients_of(model, larger);
    double again_loss = 0.0;
    CHECK(gradients_of(model, batch, &again_loss) == first);
    CHECK(again_loss == first_loss);
    example::EigenMlp copy = model;
    CHECK(gradients_of(copy, batch) == first);
  }
}

TEST_CASE("the Eigen MLP reports each layer's gradients ready as soon as they are final") {
  const example::Batch batch = random_batch(13, 8, 4, 5);
  example::EigenMlp model = small_eigen_model(1);
  const std::vector<float> expected = gradients_of(model, batch);
  const std::vector<std::size_t> layers = model.layers();
  std::vector<float> seen(expected.size(), -1.0f);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  const auto gradients = model.gradients();
  model.forward_backward(batch, [&](std::size_t begin, std::size_t end) {
    ranges.emplace_back(begin, end);
    // What is reported is final: it equals the complete pass's, and stays so to the end.
    std::copy(gradients.begin() + static_cast<std::ptrdiff_t>(begin),
              gradients.begin() + static_cast<std::ptrdiff_t>(end),
              seen.begin() + static_cast<std::ptrdiff_t>(begin));
  });
  CHECK(seen == expected);
  // One range per layer, last layer first, together the whole gradient.
  REQUIRE(ranges.size() == layers.size() - 1);
  CHECK(ranges.front().second == expected.size());
  CHECK(ranges.back().first == 0);
  for (std::size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i].second == ranges[i - 1].first);
}

TEST_CASE(
    "Mirrored with 1, 2, 3 and 4 replicas trains the Eigen MLP to the same bits, on 1 and 2 "
    "threads per replica") {
  for (std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    const std::vector<float> one = mirrored_parameters(1, threads, 8, 30);
    CHECK(one != parameters_of(small_eigen_model(threads)));
    CHECK(mirrored_parameters(2, threads, 8, 30) == one);
    CHECK(mirrored_parameters(3, threads, 8, 30) == one);  // 2, 2 and 4 micro-batches
    CHECK(mirrored_parameters(4, threads, 8, 30) == one);
  }
}

#if defined(COHORT_RUN)

namespace {

namespace fs = std::filesystem;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;

// cohort-run ARGUMENTS..., to completion within 120 s; the chief's parameters from OUT.
std::vector<float> launched_parameters(std::vector<std::string> command, const fs::path& out,
                                       const fs::path& log) {
  command.insert(command.begin(), COHORT_RUN);
  cohort::testing::output_of_success(command, log);
  const std::string bytes = read_file(out);
  std::vector<float> parameters(bytes.size() / sizeof(float));
  std::memcpy(parameters.data(), bytes.data(), parameters.size() * sizeof(float));
  return parameters;
}

}  // namespace

TEST_CASE(
    "MultiWorkerMirrored with 2x1, 2x2 and 3x1 processes trains the Eigen MLP to "
    "Mirrored's bits, 3 workers dealt 12 or 8 micro-batches") {
  TemporaryDirectory directory("cohort-eigen-multi-worker");
  struct Job {
    std::size_t workers, local_replicas, threads, micro_batches;
  };
  // 2 x 2: two local replicas of two threads each; 3 workers fold 4 micro-batches each of 12, or
  // 2, 2 and 4 of 8 (core/sharding.hpp, Deal).
  for (const Job job : {Job{2, 1, 1, 8}, Job{2, 2, 2, 8}, Job{3, 1, 1, 12}, Job{3, 1, 1, 8}}) {
    CAPTURE(job.workers);
    CAPTURE(job.local_replicas);
    const fs::path out = directory.path / "parameters.bin";
    fs::remove(out);
    const auto parameters = launched_parameters(
        {"--np", std::to_string(job.workers), "--", COHORT_TRAINER,
         std::to_string(job.local_replicas), "30", out.string(), "--eigen",
         std::to_string(job.threads), "--micro-batches", std::to_string(job.micro_batches)},
        out, directory.path / "log.txt");
    CHECK(parameters == mirrored_parameters(job.workers * job.local_replicas, job.threads,
                                            job.micro_batches, 30));
  }
}

TEST_CASE("ParameterServer<Sync> with 2 servers trains the Eigen MLP to Mirrored's bits") {
  TemporaryDirectory directory("cohort-eigen-ps");
  const fs::path out = directory.path / "parameters.bin";
  const auto parameters =
      launched_parameters({"--np", "2", "--ps", "2", "--timeout-s", "100", "--", COHORT_PS_TRAINER,
                           "sync", "30", out.string(), "--eigen", "1"},
                          out, directory.path / "log.txt");
  CHECK(parameters == mirrored_parameters(2, 1, 8, 30));
}

#endif  // COHORT_RUN
