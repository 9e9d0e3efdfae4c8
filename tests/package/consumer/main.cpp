// A consumer of cohort::cohort: uses real parts of the library and returns nonzero if any is wrong.
#include <cstdio>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/model.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/device/cpu.hpp"

namespace {

struct Line {
  using value_type = float;
  using batch_type = std::vector<float>;
  std::vector<float> weights = std::vector<float>(2, 0.0f);
  std::vector<float> grads = std::vector<float>(2, 0.0f);
  std::span<float> parameters() { return weights; }
  std::span<float> gradients() { return grads; }
  double forward_backward(const batch_type& batch) {
    grads[0] = static_cast<float>(batch.size());
    return 0.0;
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
  expect(cohort::ModelTraits<Line>::gradients(replica)[0] == 3.0f, "ModelMembers forwards");
  expect(cohort::ModelTraits<Line>::gradients(model)[0] == 0.0f, "a copy is a replica");

  try {
    cohort::options::require_positive("Options::learning_rate", -1.0);
    expect(false, "require_positive throws");
  } catch (const std::system_error& error) {
    expect(error.code().category().name() == std::string("cohort"), "error category");
    expect(std::string(error.what()).find("learning_rate") != std::string::npos,
           "the error names the field");
  }

  if (failures == 0) std::puts("consumer: cohort::cohort works");
  return failures == 0 ? 0 : 1;
}
