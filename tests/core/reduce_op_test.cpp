#include "cohort/core/reduce_op.hpp"

#include <doctest/doctest.h>

using cohort::ReduceOp;

TEST_CASE("combine applies each reduce op") {
  CHECK(cohort::combine(ReduceOp::kSum, 3.0, 4.0) == 7.0);
  CHECK(cohort::combine(ReduceOp::kProduct, 3.0, 4.0) == 12.0);
  CHECK(cohort::combine(ReduceOp::kMin, 3, -4) == -4);
  CHECK(cohort::combine(ReduceOp::kMax, 3, -4) == 3);
  static_assert(cohort::combine(ReduceOp::kSum, 1, 2) == 3);  // usable at compile time
}

TEST_CASE("every reduce op has a distinct name") {
  CHECK(cohort::name(ReduceOp::kSum) == "sum");
  CHECK(cohort::name(ReduceOp::kProduct) == "prod");
  CHECK(cohort::name(ReduceOp::kMin) == "min");
  CHECK(cohort::name(ReduceOp::kMax) == "max");
}
