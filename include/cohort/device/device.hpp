// Devices: where a replica's parameters live and where its per-device math runs.
//
// A device is a tag type with a name. device::Cpu (cpu.hpp) is the reference every other device is
// checked against: its loops define the values, and a device that computes the same operations in
// the same order gives the same bits.
#pragma once

#include <concepts>
#include <string_view>

namespace cohort::device {

template <class D>
concept Device = requires {
  { D::kName } -> std::convertible_to<std::string_view>;
};

}  // namespace cohort::device
