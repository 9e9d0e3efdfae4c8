// Devices: where a replica's parameters live and where its per-device math runs.
//
// A device is a tag type. device::Cpu (cpu.hpp) is the reference every other device is checked
// against: its loops define the values, and a device that computes the same operations in the
// same order gives the same bits. device::Cuda (cuda.hpp, for cohort::cuda users) is the other.
//
// What the Trainer's step and the mirrored update need of a device D, and nothing more:
//
//   D::kName                       "cpu", "cuda"
//   D::Place                       where one replica lives, a small value that is copied freely:
//                                  nothing for Cpu; the device index and the replica's stream for
//                                  Cuda (device::cuda::Place). The strategy hands one to each
//                                  replica (strategy/strategy.hpp).
//   D::Buffer<T>                   an owning array of T at a place (the gradient fold's slots, the
//                                  optimizer state): Buffer<T>() is empty, Buffer<T>(n, place)
//                                  holds n zeros; span() and size(). Movable, not copyable.
//   D::copy(place, from, to)                 to[i] = from[i]
//   D::add_into(place, inout, in)            inout[i] = inout[i] + in[i]  (cpu::combine_into)
//   D::sum_of_squares(place, x)              cpu::sum_of_squares(x), returned to the host
//   D::step(place, o, parameters, gradients, state, context)
//                                            optimizer o's step (o.step on the CPU)
//   D::step_finite(place, o, parameters, gradients, state, context)
//                                            the same step, returning whether every gradient
//                                            was finite, tested as the update reads it
//                                            (cpu::step_finite); returns when that is known
//   D::first_nonfinite(place, x)             cpu::first_nonfinite(x): the index of the first
//                                            infinity or NaN, x.size() when there is none
//   D::to_host(place, from, host)            host[i] = from[i]
//   D::from_host(place, host, to)            to[i] = host[i]
//   D::synchronize(place)                    waits for everything started at place
//
// Every span but the host ones names memory at the place (device memory for Cuda), and the two
// spans of a copy have the same length (checked). Work at one place runs in the order it was
// called, so its callers need no synchronization of their own; copy, add_into and step may return
// before their work is done (Cuda: they are enqueued on the place's stream), the others return
// when it is. Each function computes what its device::cpu counterpart computes, in the same
// order, so every device gives the CPU's bits.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>

namespace cohort::device {

template <class D>
concept Device = requires(const typename D::Place& place, std::span<float> values,
                          std::span<const float> input,
                          typename D::template Buffer<float>& buffer) {
  { D::kName } -> std::convertible_to<std::string_view>;
  { buffer.span() } -> std::same_as<std::span<float>>;
  { buffer.size() } -> std::convertible_to<std::size_t>;
  D::copy(place, input, values);
  D::add_into(place, values, input);
  { D::sum_of_squares(place, input) } -> std::same_as<double>;
  { D::first_nonfinite(place, input) } -> std::same_as<std::size_t>;
  D::to_host(place, input, values);
  D::from_host(place, input, values);
  D::synchronize(place);
} && std::movable<typename D::template Buffer<float>> &&
    std::constructible_from<typename D::template Buffer<float>, std::size_t, typename D::Place>;

// D's owning array of T (D::Buffer<T>).
template <class D, class T>
using Buffer = typename D::template Buffer<T>;

}  // namespace cohort::device
