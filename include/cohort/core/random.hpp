// Portable pseudo-random numbers for everything cohort derives from a seed.
//
// The standard engines produce specified sequences, but the standard distributions do not: two
// standard libraries may shuffle differently with the same engine. Reproducibility across
// machines therefore needs the bounded integers and the shuffle defined here.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace cohort::random {

// SplitMix64's output function: spreads nearby seeds (0, 1, 2, ...) over the whole state space.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A stream of its own for each purpose (epoch order, initialization, ...) from one user seed.
constexpr std::uint64_t derive(std::uint64_t seed, std::uint64_t stream) {
  return mix(seed ^ mix(stream));
}

// Uniform in [0, bound), bound >= 1: reject the low (2^64 mod bound) values, after which the
// remainder is unbiased; the same numbers on every platform.
inline std::uint64_t below(std::mt19937_64& engine, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const std::uint64_t value = engine();
    if (value >= threshold) return value % bound;
  }
}

// Fisher-Yates permutation of 0 .. n-1.
inline std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 engine(seed);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[below(engine, i)]);
  return order;
}

// Uniform in [0, 1) with the 53 bits a double holds.
inline double uniform(std::mt19937_64& engine) {
  return static_cast<double>(engine() >> 11) * 0x1.0p-53;
}

// Standard normal by Box-Muller.
inline double normal(std::mt19937_64& engine) {
  const double u1 = 1.0 - uniform(engine);  // (0, 1]: log is finite
  const double u2 = uniform(engine);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace cohort::random
