// The 16-bit floating-point formats on the host: the gradient's format on the wire where a job asks
// for half the bytes (MultiWorkerMirrored's and ParameterServer's Options::wire, collective::Wire).
//
//   bfloat16  the upper half of a float: the same sign and 8-bit exponent, 7 bits of mantissa. A
//             float's range, 8 significant bits.
//   float16   IEEE 754 binary16: 5 bits of exponent, 10 of mantissa. 11 significant bits, but a
//             range of 6.0e-8 (subnormal) to 65504: a larger magnitude becomes infinity.
//
// round_to_bfloat16 and round_to_float16 round a float to the nearest value of the format, ties to
// even, as CUDA's __float2bfloat16_rn and __float2half_rn do (infinities stay, NaN stays NaN, a
// float beyond the format's largest becomes infinity), and return it as a float; Bfloat16 and
// Float16 hold the 16 bits that travel. A float that the rounding returned packs into its format
// and back without a change, so a tree whose every node is rounded (ReduceOp::kSumBfloat16,
// kSumFloat16) can cross a wire in 2 bytes an element and keep its bits.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace cohort {

namespace detail {

struct BfloatFormat {
  static constexpr std::uint16_t encode(float value) {
    const auto bits = std::bit_cast<std::uint32_t>(value);
    if ((bits & 0x7fffffffU) > 0x7f800000U) {  // NaN: kept quiet, its payload cut
      return static_cast<std::uint16_t>(((bits | 0x00400000U) & 0xffff0000U) >> 16);
    }
    return static_cast<std::uint16_t>((bits + 0x7fffU + ((bits >> 16) & 1U)) >> 16);
  }
  static constexpr float decode(std::uint16_t bits) {
    return std::bit_cast<float>(std::uint32_t{bits} << 16);
  }
};

struct HalfFormat {
  static constexpr std::uint16_t encode(float value) {
#if defined(__F16C__) || defined(__aarch64__)
    // The processor's conversion, which loops vectorize (F16C's vcvtps2ph, AArch64's fcvt): the
    // same rounding as below (IEEE's), in a fraction of its time (docs/benchmarks.md, "Rounded
    // sums": bench_collective's merge labelled sum_fp16).
    if (!std::is_constant_evaluated()) {
      return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
    }
#endif
    const auto bits = std::bit_cast<std::uint32_t>(value);
    const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
    const std::uint32_t magnitude = bits & 0x7fffffffU;
    if (magnitude > 0x7f800000U) {  // NaN: quiet, its payload cut, as the processors' conversions
      return sign | 0x7e00U | static_cast<std::uint16_t>((magnitude >> 13) & 0x3ffU);
    }
    // From 65520, halfway between the largest (65504) and 65536, ties to even: infinity.
    if (magnitude >= 0x477ff000U) return sign | 0x7c00U;
    if (magnitude >= 0x38800000U) {  // a normal float16, from 2^-14: the exponent rebiased
      const std::uint32_t rebiased = magnitude - 0x38000000U;
      return sign | static_cast<std::uint16_t>((rebiased + 0xfffU + ((rebiased >> 13) & 1U)) >> 13);
    }
    if (magnitude <= 0x33000000U) return sign;  // up to 2^-25, half the smallest subnormal: zero
    // A subnormal float16, in units of 2^-24: the float's 24-bit significand shifted, rounded.
    const std::uint32_t significand = (magnitude & 0x7fffffU) | 0x800000U;
    const std::uint32_t shift = 126U - (magnitude >> 23);  // 14 to 24
    std::uint32_t units = significand >> shift;
    const std::uint32_t rest = significand & ((1U << shift) - 1U);
    const std::uint32_t half = 1U << (shift - 1U);
    if (rest > half || (rest == half && (units & 1U) != 0U)) ++units;
    return sign | static_cast<std::uint16_t>(units);
  }
  static constexpr float decode(std::uint16_t bits) {
#if defined(__F16C__) || defined(__aarch64__)
    if (!std::is_constant_evaluated()) return static_cast<float>(std::bit_cast<_Float16>(bits));
#endif
    const std::uint32_t sign = std::uint32_t{bits & 0x8000U} << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fU;
    const std::uint32_t mantissa = bits & 0x3ffU;
    if (exponent == 0x1fU) return std::bit_cast<float>(sign | 0x7f800000U | (mantissa << 13));
    if (exponent != 0U) {
      return std::bit_cast<float>(sign | ((exponent + 112U) << 23) | (mantissa << 13));
    }
    const float subnormal = static_cast<float>(mantissa) * 0x1p-24F;  // exact
    return sign != 0U ? -subnormal : subnormal;
  }
};

}  // namespace detail

// A value of a 16-bit format: its bits, and arithmetic as on a GPU (in float, rounded once).
template <class Format>
struct NarrowFloat {
  std::uint16_t bits = 0;

  // The value of the format nearest `value`.
  static constexpr NarrowFloat round(float value) { return {Format::encode(value)}; }
  constexpr float widen() const { return Format::decode(bits); }

  friend constexpr NarrowFloat operator+(NarrowFloat a, NarrowFloat b) {
    return round(a.widen() + b.widen());
  }
  friend constexpr NarrowFloat operator*(NarrowFloat a, NarrowFloat b) {
    return round(a.widen() * b.widen());
  }
  friend constexpr bool operator<(NarrowFloat a, NarrowFloat b) { return a.widen() < b.widen(); }
};

using Bfloat16 = NarrowFloat<detail::BfloatFormat>;
using Float16 = NarrowFloat<detail::HalfFormat>;

// `value` rounded to the nearest bfloat16 (float16), as a float.
constexpr float round_to_bfloat16(float value) { return Bfloat16::round(value).widen(); }
constexpr float round_to_float16(float value) { return Float16::round(value).widen(); }

}  // namespace cohort
