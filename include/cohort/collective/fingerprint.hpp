// Fingerprints: what a rank believes the current collective is, packed into the 64-bit tag of
// every frame it sends, so that ranks that called different collectives find out at once and can
// say what each called ("all_reduce(float, 4099, sum)" against "broadcast(float, 4099, root 0)").
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "cohort/collective/collective.hpp"
#include "cohort/core/narrow_float.hpp"
#include "cohort/core/reduce_op.hpp"

namespace cohort::collective {

enum class DataType : std::uint8_t { kFloat32, kFloat64, kInt32, kInt64, kBfloat16, kFloat16 };

template <class T>
inline constexpr bool is_element =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, Bfloat16> || std::is_same_v<T, Float16>;

template <class T>
constexpr DataType data_type_of() {
  static_assert(is_element<T>,
                "cohort: collectives take float, double, std::int32_t, std::int64_t, Bfloat16 or "
                "Float16 elements");
  if constexpr (std::is_same_v<T, float>) {
    return DataType::kFloat32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DataType::kFloat64;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return DataType::kInt32;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return DataType::kInt64;
  } else if constexpr (std::is_same_v<T, Bfloat16>) {
    return DataType::kBfloat16;
  } else {
    return DataType::kFloat16;
  }
}

constexpr const char* name(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat64:
      return "double";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat16:
      return "float16";
  }
  return "unknown";
}

// What one rank asked for in one call. Every rank of a call must ask for the same.
struct Fingerprint {
  Operation operation = Operation::kBarrier;
  DataType type = DataType::kInt32;
  std::uint16_t detail = 0;  // the ReduceOp for reductions, the root for broadcast, else 0
  std::uint64_t count = 0;   // all_gather: input length; reduce_scatter: output length

  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;

  // Packed into a frame's tag: operation (8 bits) | type (8) | detail (16) | count (32, modulo
  // 2^32: enough to tell calls apart, not a limit on the count).
  std::uint64_t tag() const {
    return (std::uint64_t{static_cast<std::uint8_t>(operation)} << 56) |
           (std::uint64_t{static_cast<std::uint8_t>(type)} << 48) | (std::uint64_t{detail} << 32) |
           (count & 0xffffffffULL);
  }

  static Fingerprint from_tag(std::uint64_t tag) {
    return {static_cast<Operation>(tag >> 56), static_cast<DataType>((tag >> 48) & 0xff),
            static_cast<std::uint16_t>((tag >> 32) & 0xffff), tag & 0xffffffffULL};
  }

  // "all_reduce(float, 7, sum)", "broadcast(float, 7, root 0)", "barrier()"
  std::string describe() const {
    std::string text = std::string(name(operation)) + "(";
    if (operation != Operation::kBarrier) {
      text += std::string(collective::name(type)) + ", " + std::to_string(count);
    }
    if (operation == Operation::kAllReduce || operation == Operation::kReduceScatter) {
      text += ", " + std::string(cohort::name(static_cast<ReduceOp>(detail)));
    }
    if (operation == Operation::kBroadcast) text += ", root " + std::to_string(detail);
    return text + ")";
  }
};

}  // namespace cohort::collective
