// The format a gradient crosses between processes in (collective/wire.hpp): what the option reads
// from the environment, and what a replica refuses. tests/strategy/multi_worker_test.cpp trains
// with it across processes.
#include "cohort/collective/wire.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/collective/local.hpp"
#include "cohort/core/error.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/strategy/detail/mirrored_replica.hpp"
#include "cohort/strategy/multi_worker_mirrored.hpp"

namespace {

using cohort::collective::Wire;
using Options = cohort::strategy::MultiWorkerMirrored<>::Options;

// An environment of one variable, COHORT_WIRE=value.
cohort::cluster::Environment wire_of(std::string value) {
  return [value](std::string_view name) -> std::optional<std::string> {
    if (name == "COHORT_WIRE") return value;
    return std::nullopt;
  };
}

}  // namespace

TEST_CASE(
    "COHORT_WIRE chooses the format where the program leaves the default, and names itself "
    "when it is neither fp32, bf16 nor fp16") {
  using cohort::strategy::detail::with_environment;
  CHECK(with_environment(Options{}, wire_of("bf16")).wire == Wire::kBfloat16);
  CHECK(with_environment(Options{}, wire_of("fp16")).wire == Wire::kFloat16);
  CHECK(with_environment(Options{}, wire_of("fp32")).wire == Wire::kFloat32);
  CHECK(with_environment(Options{.wire = Wire::kBfloat16}, wire_of("fp32")).wire ==
        Wire::kBfloat16);  // the program's choice wins
  CHECK(cohort::collective::gradient_sum(Wire::kBfloat16) == cohort::ReduceOp::kSumBfloat16);
  CHECK(cohort::collective::gradient_sum(Wire::kFloat16) == cohort::ReduceOp::kSumFloat16);
  CHECK(cohort::collective::gradient_sum(Wire::kFloat32) == cohort::ReduceOp::kSum);
  for (const Wire wire : {Wire::kFloat32, Wire::kBfloat16, Wire::kFloat16}) {
    CHECK(cohort::collective::wire_of(cohort::collective::gradient_sum(wire)) == wire);
  }
  try {
    (void)with_environment(Options{}, wire_of("fp8"));
    FAIL("COHORT_WIRE=fp8 was taken");
  } catch (const cohort::ConfigError& error) {
    CHECK(std::string(error.what()).find("COHORT_WIRE") != std::string::npos);
    CHECK(std::string(error.what()).find("expected fp32, bf16 or fp16") != std::string::npos);
  }
}

TEST_CASE("a narrow wire packs every node of its tree into 2 bytes and back unchanged") {
  using cohort::collective::pack;
  using cohort::collective::widen;
  for (const Wire wire : {Wire::kBfloat16, Wire::kFloat16}) {
    CAPTURE(std::string(cohort::collective::name(wire)));
    CHECK(cohort::collective::element_bytes(wire, sizeof(float)) == 2);
    std::vector<float> nodes;
    for (const float value : {0.1f, -3.7f, 1e-3f, 1000.5f, 0.0f, -0.0f}) {
      nodes.push_back(cohort::combine(cohort::collective::gradient_sum(wire), value, 0.0f));
    }
    std::vector<std::uint16_t> bits(nodes.size());
    pack(wire, std::span<const float>(nodes), std::span(bits));
    std::vector<float> back(nodes.size());
    widen(wire, std::span<const std::uint16_t>(bits), std::span(back));
    CHECK(back == nodes);
  }
  CHECK(cohort::collective::element_bytes(Wire::kFloat32, sizeof(double)) == sizeof(double));
}

TEST_CASE("a replica summing in bfloat16 refuses a model of double values, naming the option") {
  cohort::collective::Local local({.ranks = 1});
  cohort::strategy::detail::MirroredReplica<cohort::collective::LocalCommunicator> replica(
      0, local.communicator(0), {},
      {.bucket = {.bytes = 64}, .gradient_sum = cohort::ReduceOp::kSumBfloat16});
  CHECK_NOTHROW((void)replica.gradient_sum_storage<float>(8));
  try {
    (void)replica.gradient_sum_storage<double>(8);
    FAIL("a double gradient was taken");
  } catch (const cohort::ConfigError& error) {
    CHECK(std::string(error.what()).find("wire") != std::string::npos);
    CHECK(std::string(error.what()).find("sums float gradients only") != std::string::npos);
  }
}
