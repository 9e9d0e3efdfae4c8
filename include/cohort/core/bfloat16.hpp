// bfloat16 on the host: the gradient's format on the wire where a job asks for half the bytes
// (MultiWorkerMirrored's Options::wire, collective::Wire).
//
// A bfloat16 is the upper half of a float: the same sign and 8-bit exponent, 7 bits of mantissa.
// round_to_bfloat16 rounds a float to the nearest one, ties to even, as CUDA's
// __float2bfloat16_rn does (infinities stay, NaN stays NaN, a float beyond the largest bfloat16
// becomes infinity), and returns it as a float; Bfloat16 holds the 16 bits that travel. A float
// that round_to_bfloat16 returned packs into a Bfloat16 and back without a change, so a tree whose
// every node is rounded (ReduceOp::kSumBfloat16) can cross a wire in 2 bytes an element and keep
// its bits.
#pragma once

#include <bit>
#include <cstdint>

namespace cohort {

constexpr float round_to_bfloat16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffU) > 0x7f800000U) {  // NaN: kept quiet, its payload cut
    return std::bit_cast<float>((bits | 0x00400000U) & 0xffff0000U);
  }
  const std::uint32_t rounded = bits + 0x7fffU + ((bits >> 16) & 1U);
  return std::bit_cast<float>(rounded & 0xffff0000U);
}

struct Bfloat16 {
  std::uint16_t bits = 0;

  // The bfloat16 nearest `value` (round_to_bfloat16).
  static constexpr Bfloat16 round(float value) {
    return {
        static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(round_to_bfloat16(value)) >> 16)};
  }
  constexpr float widen() const { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

  // Arithmetic as on a GPU: in float, rounded once.
  friend constexpr Bfloat16 operator+(Bfloat16 a, Bfloat16 b) {
    return round(a.widen() + b.widen());
  }
  friend constexpr Bfloat16 operator*(Bfloat16 a, Bfloat16 b) {
    return round(a.widen() * b.widen());
  }
  friend constexpr bool operator<(Bfloat16 a, Bfloat16 b) { return a.widen() < b.widen(); }
};

}  // namespace cohort
