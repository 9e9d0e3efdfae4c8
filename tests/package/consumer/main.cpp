// A consumer of cohort::cohort: uses real parts of the library and returns nonzero if any is wrong.
// It trains in one process, so it needs only what cohort::cohort needs (Boost and threads): the
// package.*.one_process tests build it where OpenSSL, nlohmann_json and xxHash cannot be found,
// and the checks below make sure that the headers it includes do not include them either.
#include <cohort/cohort.hpp>
#include <cstdio>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "cohort/core/options.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/device/cpu.hpp"

#if defined(OPENSSL_VERSION_NUMBER) || defined(NLOHMANN_JSON_VERSION_MAJOR) || \
    defined(XXH_VERSION_MAJOR) || defined(BOOST_ASIO_VERSION)
#error "cohort's one-process headers include what only cohort::tcp may need"
#endif

#ifdef COHORT_CONSUMER_TCP
int check_tcp();  // tcp.cpp
#endif

namespace {

struct Line {
  using value_type = float;
  using batch_type = std::vector<float>;
  std::vector<float> weights = std::vector<float>(2, 0.0f);
  std::vector<float> grads = std::vector<float>(2, 0.0f);
  std::span<float> parameters() { return weights; }
  std::span<float> gradients() { return grads; }
  // Loss (w0 + w1 x - 2x)^2 / 2 per example x, summed; its gradient is the residual times (1, x).
  double forward_backward(const batch_type& batch) {
    double loss = 0.0;
    grads.assign(2, 0.0f);
    for (float x : batch) {
      const float residual = weights[0] + weights[1] * x - 2.0f * x;
      loss += 0.5 * residual * residual;
      grads[0] += residual;
      grads[1] += residual * x;
    }
    return loss;
  }
};

// The inputs 0, 1/8, ..., 7/8.
struct Points {
  std::size_t size() const { return 8; }
  std::vector<float> batch(std::span<const std::size_t> indices) const {
    std::vector<float> xs;
    for (std::size_t index : indices) xs.push_back(static_cast<float>(index) / 8.0f);
    return xs;
  }
};

}  // namespace

template <>
struct cohort::ModelTraits<Line> : cohort::ModelMembers<Line> {};

static_assert(cohort::Model<Line>);
static_assert(!cohort::Model<int>);

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: wrong: %s\n", what);
      ++failures;
    }
  };

  // Element i of input r is r + i: small integers, so every order gives the exact sum.
  constexpr int kInputs = 5;
  constexpr std::size_t kLength = 3000;  // spans several reduction blocks
  std::vector<std::vector<float>> inputs(kInputs, std::vector<float>(kLength));
  std::vector<const float*> pointers;
  for (int r = 0; r < kInputs; ++r) {
    for (std::size_t i = 0; i < kLength; ++i) inputs[r][i] = static_cast<float>(r + i);
    pointers.push_back(inputs[r].data());
  }
  std::vector<float> out(kLength);
  cohort::device::cpu::reduce_tree<float>(cohort::ReduceOp::kSum, pointers, out);
  bool sums_right = true;
  for (std::size_t i = 0; i < kLength; ++i) sums_right &= out[i] == static_cast<float>(10 + 5 * i);
  expect(sums_right, "reduce_tree sums 5 inputs");

  const std::string order = cohort::tree::fold(
      5, [](std::size_t i) { return std::to_string(i); },
      [](const std::string& a, const std::string& b) {
        std::string joined = "(";  // appended piece by piece: GCC 12's false -Wrestrict
        joined += a;
        joined += '+';
        joined += b;
        return joined += ')';
      });
  expect(order == "(((0+1)+(2+3))+4)", "tree::fold order for 5 leaves");

  Line model;
  Line replica = model;
  cohort::ModelTraits<Line>::forward_backward(replica, {1.0f, 2.0f, 3.0f});
  expect(cohort::ModelTraits<Line>::gradients(replica)[0] != 0.0f, "ModelMembers forwards");
  expect(cohort::ModelTraits<Line>::gradients(model)[0] == 0.0f, "a copy is a replica");

  try {
    cohort::options::require_positive("Options::learning_rate", -1.0);
    expect(false, "require_positive throws");
  } catch (const std::system_error& error) {
    expect(error.code().category().name() == std::string("cohort"), "error category");
    expect(std::string(error.what()).find("learning_rate") != std::string::npos,
           "the error names the field");
  }

  // Training in one process: two replicas, a checkpoint (Boost.Serialization), and a restore into
  // a trainer of one replica. The checkpoint goes to the working directory, the consumer's own.
  const cohort::Trainer<Line>::Options options{
      .global_batch = 8, .micro_batches = 2, .progress = cohort::Progress::kSilent};
  cohort::Trainer trainer(model, cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::optimizer::Sgd({.learning_rate = 0.5}), options);
  const cohort::Report report = trainer.fit(Points(), {.epochs = 20});
  expect(report.steps == 20 && report.loss.back() < report.loss.front(),
         "training lowers the loss");
  trainer.save("consumer.ckpt");
  cohort::Trainer restored(model, cohort::strategy::Mirrored<>({.replicas = 1}),
                           cohort::optimizer::Sgd({.learning_rate = 0.5}), options);
  restored.restore("consumer.ckpt");
  expect(restored.step() == 20 && restored.model().weights == trainer.model().weights,
         "a checkpoint restores the parameters");

#ifdef COHORT_CONSUMER_TCP
  failures += check_tcp();
#endif

  if (failures == 0) std::puts("consumer: cohort works");
  return failures == 0 ? 0 : 1;
}
