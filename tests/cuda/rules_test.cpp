// Host-only checks of the CUDA layer: they run on every machine, GPU or not.
#include <doctest/doctest.h>

#include <concepts>
#include <string>
#include <type_traits>

#include "cohort/collective/nccl.hpp"
#include "cohort/cuda/launch.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/sgd.hpp"

namespace {

namespace opt = cohort::optimizer;

// The kernels call the rule the optimizer builds for its own CPU step, never a copy of it, and
// read and write exactly its kStateSlots values per parameter.
template <class O, class P>
constexpr bool kernel_uses_cpu_rule() {
  using Rule = decltype(std::declval<const O&>().template rule<P>(opt::StepContext{}));
  return cohort::cuda::kRuleSlots<Rule> == O::kStateSlots;
}
static_assert(std::same_as<decltype(std::declval<const opt::Adam&>().rule<float>({})),
                           opt::AdamRule<float, opt::WeightDecay::kCoupled>>);
static_assert(std::same_as<decltype(std::declval<const opt::AdamW&>().rule<float>({})),
                           opt::AdamRule<float, opt::WeightDecay::kDecoupled>>);
static_assert(kernel_uses_cpu_rule<opt::Sgd, float>());
static_assert(kernel_uses_cpu_rule<opt::Momentum, float>());
static_assert(kernel_uses_cpu_rule<opt::Adam, float>());
static_assert(kernel_uses_cpu_rule<opt::AdamW, float>());
static_assert(kernel_uses_cpu_rule<opt::AdamW, double>());
static_assert(cohort::cuda::kNormBlock == cohort::device::cpu::kNormBlock,
              "the GPU norm must use the CPU's block size, or the sums differ");
static_assert(cohort::device::Device<cohort::device::Cuda>);

}  // namespace

TEST_CASE("COHORT_CUDA_CHECK names the call, the code and its text") {
  try {
    COHORT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no DeviceError");
  } catch (const cohort::DeviceError& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("(1)") != std::string::npos);
    CHECK(what.find("invalid argument") != std::string::npos);
    CHECK(e.code() == cohort::Errc::kDevice);
  }
}

TEST_CASE("device::cuda::device_count answers without throwing, GPU or not") {
  const int count = cohort::device::cuda::device_count();
  CHECK(count >= 0);
  CHECK((count == 0) == !cohort::device::cuda::unavailable().empty());
}

TEST_CASE("sum_of_squares_workspace covers both levels of the tree") {
  CHECK(cohort::cuda::sum_of_squares_workspace(0) == 2);
  CHECK(cohort::cuda::sum_of_squares_workspace(1) == 2);
  CHECK(cohort::cuda::sum_of_squares_workspace(4096) == 2);
  CHECK(cohort::cuda::sum_of_squares_workspace(4097) == 4);
}

TEST_CASE("NcclCommunicator, Stream, Event and Buffer move without throwing and are never copied") {
  using cohort::collective::NcclCommunicator;
  using cohort::device::cuda::Buffer;
  using cohort::device::cuda::Event;
  using cohort::device::cuda::Stream;
  CHECK(std::is_nothrow_move_constructible_v<NcclCommunicator>);
  CHECK(std::is_nothrow_move_assignable_v<NcclCommunicator>);
  CHECK_FALSE(std::is_copy_constructible_v<NcclCommunicator>);
  CHECK_FALSE(std::is_copy_assignable_v<NcclCommunicator>);
  CHECK(std::is_nothrow_move_constructible_v<Stream>);
  CHECK(std::is_nothrow_move_constructible_v<Event>);
  CHECK(std::is_nothrow_move_constructible_v<Buffer<std::byte>>);
  CHECK_FALSE(std::is_copy_constructible_v<Stream>);
  CHECK_FALSE(std::is_copy_constructible_v<Event>);
}

TEST_CASE("an empty Event owns nothing, so ending it touches no device") {
  cohort::device::cuda::Event none;
  CHECK(none.get() == nullptr);
  cohort::device::cuda::Event moved = std::move(none);
  CHECK(moved.get() == nullptr);
}
