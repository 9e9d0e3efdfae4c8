#include "cohort/core/reduce_op.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

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
  CHECK(cohort::name(ReduceOp::kSumBfloat16) == "sum_bf16");
  CHECK(cohort::name(ReduceOp::kSumFloat16) == "sum_fp16");
}

TEST_CASE("a float rounds to the nearest bfloat16, ties to even") {
  using cohort::round_to_bfloat16;
  constexpr float kUlp = 1.0f / 128;  // of a bfloat16 in [1, 2): 7 bits of mantissa
  CHECK(round_to_bfloat16(1.0f) == 1.0f);
  CHECK(round_to_bfloat16(1.0f + kUlp / 2) == 1.0f);                            // a tie, to even
  CHECK(round_to_bfloat16(1.0f + 3 * kUlp / 2) == 1.0f + 2 * kUlp);             // a tie, to even
  CHECK(round_to_bfloat16(1.0f + kUlp / 2 + 1.0f / (1 << 20)) == 1.0f + kUlp);  // past the tie
  CHECK(round_to_bfloat16(-1.0f - kUlp / 4) == -1.0f);
  CHECK(std::signbit(round_to_bfloat16(-0.0f)));
  CHECK(round_to_bfloat16(std::numeric_limits<float>::infinity()) ==
        std::numeric_limits<float>::infinity());
  CHECK(round_to_bfloat16(std::numeric_limits<float>::max()) ==
        std::numeric_limits<float>::infinity());  // beyond the largest bfloat16
  CHECK(std::isnan(round_to_bfloat16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(round_to_bfloat16(std::numeric_limits<float>::signaling_NaN())));
  static_assert(round_to_bfloat16(3.0f) == 3.0f);  // usable at compile time
}

// Narrow (Bfloat16, Float16) packs and unpacks each of `values` rounded unchanged, and adds as
// the rounded sum `op`: 1 plus half an ulp of 1 (`half_ulp`) is a tie, to even.
template <class Narrow>
void check_packs_and_adds(ReduceOp op, std::initializer_list<float> values, float half_ulp) {
  for (const float value : values) {
    const float rounded = cohort::combine(op, value, 0.0f);
    CHECK(Narrow::round(value).widen() == rounded);
    CHECK(Narrow::round(rounded).widen() == rounded);
  }
  CHECK((Narrow::round(1.0f) + Narrow::round(half_ulp)).widen() == 1.0f);
  CHECK(cohort::combine(op, 1.0f, half_ulp) == 1.0f);
  CHECK(cohort::combine(ReduceOp::kSum, 1.0f, half_ulp) == 1.0f + half_ulp);
  CHECK(cohort::combine(op, 1.0f, 4 * half_ulp) == 1.0f + 4 * half_ulp);
  CHECK(cohort::reduces<float>(op));
  CHECK(cohort::reduces<Narrow>(op));
  CHECK_FALSE(cohort::reduces<double>(op));
}

TEST_CASE(
    "each 16-bit format packs and unpacks a rounded float unchanged, and adds as a rounded sum") {
  check_packs_and_adds<cohort::Bfloat16>(ReduceOp::kSumBfloat16,
                                         {1.0f, -3.5f, 1e-30f, 6.02e23f, 0.1f}, 1.0f / 256);
  check_packs_and_adds<cohort::Float16>(ReduceOp::kSumFloat16, {1.0f, -3.5f, 1e-6f, 60000.0f, 0.1f},
                                        1.0f / 2048);
  CHECK_FALSE(cohort::reduces<cohort::Bfloat16>(ReduceOp::kSumFloat16));
  CHECK_FALSE(cohort::reduces<cohort::Float16>(ReduceOp::kSumBfloat16));
  CHECK(cohort::reduces<double>(ReduceOp::kSum));
}

TEST_CASE("a float rounds to the nearest float16, ties to even, overflowing to infinity") {
  using cohort::round_to_float16;
  constexpr float kUlp = 1.0f / 1024;                // of a float16 in [1, 2): 10 bits of mantissa
  CHECK(round_to_float16(1.0f + kUlp / 2) == 1.0f);  // a tie, to even
  CHECK(round_to_float16(1.0f + 3 * kUlp / 2) == 1.0f + 2 * kUlp);  // a tie, to even
  CHECK(round_to_float16(65504.0f) == 65504.0f);                    // the largest
  CHECK(round_to_float16(65519.99f) == 65504.0f);
  CHECK(round_to_float16(65520.0f) == std::numeric_limits<float>::infinity());  // the tie: to even
  CHECK(round_to_float16(-1e10f) == -std::numeric_limits<float>::infinity());
  CHECK(round_to_float16(0x1p-24f) == 0x1p-24f);          // the smallest subnormal
  CHECK(round_to_float16(0x1p-25f) == 0.0f);              // half of it: a tie, to even
  CHECK(round_to_float16(0x1.000002p-25f) == 0x1p-24f);   // past the tie
  CHECK(round_to_float16(0x1.ff8p-15f) == 0x1.ff8p-15f);  // the largest subnormal
  CHECK(round_to_float16(0x1.ffcp-15f) == 0x1p-14f);      // a tie, to even: the smallest normal
  CHECK(std::signbit(round_to_float16(-0.0f)));
  CHECK(std::isnan(round_to_float16(std::numeric_limits<float>::quiet_NaN())));
  static_assert(round_to_float16(3.0f) == 3.0f);  // usable at compile time
#if defined(__FLT16_MAX__)
  // Against the compiler's own conversion, at bit patterns spread over every float.
  for (std::uint64_t bits = 0; bits <= 0xffffffffU; bits += 4093) {
    const float value = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (std::isnan(value)) continue;
    const float expected = static_cast<float>(static_cast<_Float16>(value));
    CAPTURE(bits);
    REQUIRE(std::bit_cast<std::uint32_t>(round_to_float16(value)) ==
            std::bit_cast<std::uint32_t>(expected));
  }
#endif
}
