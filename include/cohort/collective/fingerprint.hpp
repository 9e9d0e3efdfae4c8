// Fingerprints: what a rank believes the current collective is, packed into the 64-bit tag of
// every frame it sends, so that ranks that called different collectives find out at once and can
// say what each called ("all_reduce(float, 4099, sum)" against "broadcast(float, 4099, root 0)").
#pragma once

#include <cstdint>
#include <string>

#include "cohort/collective/collective.hpp"
#include "cohort/core/reduce_op.hpp"

namespace cohort::collective {

enum class DataType : std::uint8_t { kFloat32, kFloat64, kInt32, kInt64 };

template <class T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DataType::kFloat32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DataType::kFloat64;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return DataType::kInt32;
  } else {
    static_assert(std::is_same_v<T, std::int64_t>,
                  "cohort: collectives take float, double, std::int32_t or std::int64_t");
    return DataType::kInt64;
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
  }
  return "unknown";
}

// Layout of the tag: operation (8 bits) | data type (8) | reduce op or root (16) | count (32,
// modulo 2^32: enough to tell calls apart, not a limit on the count).
struct Fingerprint {
  Operation operation;
  DataType type;
  std::uint16_t detail;  // the ReduceOp for reductions, the root for broadcast
  std::uint64_t count;

  std::uint64_t tag() const {
    return (std::uint64_t{static_cast<std::uint8_t>(operation)} << 56) |
           (std::uint64_t{static_cast<std::uint8_t>(type)} << 48) |
           (std::uint64_t{detail} << 32) | (count & 0xffffffffULL);
  }

  static Fingerprint from_tag(std::uint64_t tag) {
    return {static_cast<Operation>(tag >> 56), static_cast<DataType>((tag >> 48) & 0xff),
            static_cast<std::uint16_t>((tag >> 32) & 0xffff), tag & 0xffffffffULL};
  }

  std::string describe() const {
    std::string text = std::string(name(operation)) + "(" + collective::name(type) + ", " +
                       std::to_string(count);
    switch (operation) {
      case Operation::kAllReduce:
      case Operation::kReduceScatter:
        text += std::string(", ") + std::string(cohort::name(static_cast<ReduceOp>(detail)));
        break;
      case Operation::kBroadcast:
        text += ", root " + std::to_string(detail);
        break;
      default:
        break;
    }
    return text + ")";
  }
};

}  // namespace cohort::collective
