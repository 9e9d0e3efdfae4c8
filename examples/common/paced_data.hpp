// A data set whose micro-batches reach each replica at most one every `interval`, as from an input
// pipeline of that speed: the demos' --input-ms. A small model's fit then lasts at least its steps
// times its micro-batches per replica times the interval however fast the machine, long enough to
// kill a worker in its middle and to watch the job go on and take it back (scripts/failures,
// tests/hosts). Where a micro-batch takes longer than the interval to compute, nothing waits.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <thread>

namespace example {

template <class Data>
class PacedData {
 public:
  PacedData(const Data& data, std::chrono::milliseconds interval)
      : data_(&data), interval_(interval) {}

  std::size_t size() const { return data_->size(); }

  // Called on each replica's thread (cohort::Dataset), which waits for its next delivery.
  auto batch(std::span<const std::size_t> indices) const {
    if (interval_.count() > 0) {
      thread_local std::chrono::steady_clock::time_point next_delivery{};
      const auto now = std::chrono::steady_clock::now();
      if (now < next_delivery) std::this_thread::sleep_until(next_delivery);
      next_delivery = std::max(now, next_delivery) + interval_;
    }
    return data_->batch(indices);
  }

 private:
  const Data* data_;
  std::chrono::milliseconds interval_;
};

}  // namespace example
