// What the CUDA tests share: whether a GPU is present, device buffers, random inputs.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/device/cuda.hpp"

namespace cohort::test {

// Evaluated once, at registration: every GPU case carries `* gpu_only()`, so without a GPU
// doctest skips it (and main.cpp exits 77 for ctest's SKIP_RETURN_CODE).
inline bool gpu_present() {
  static const bool present = device::cuda::device_count() > 0;
  return present;
}
inline auto gpu_only() { return doctest::skip(!gpu_present()); }

// Bitwise equality: the claim is identical bits, and it also holds for NaN payloads.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// For cases that need `count` GPUs (their names say how many): skipped where fewer are present.
inline auto gpus_only(int count) { return doctest::skip(device::cuda::device_count() < count); }

// How long a GPU test's collective may wait: a hang fails in a minute with its CommError, well
// inside ctest's limit, instead of at the 5-minute default.
inline constexpr std::chrono::seconds kTestTimeout{60};

// Ends the test program, naming `what`, when the scope that holds it outlives `limit`: a case
// that would hang fails by name, long before ctest's timeout.
class HangGuard {
 public:
  HangGuard(std::string what, std::chrono::seconds limit)
      : thread_([what = std::move(what), limit](std::stop_token stop) {
          std::mutex mutex;
          std::condition_variable_any woken;
          std::unique_lock lock(mutex);
          woken.wait_for(lock, stop, limit, [] { return false; });
          if (stop.stop_requested()) return;
          std::fprintf(stderr, "[cohort] %s: still running after %lld s; aborting\n", what.c_str(),
                       static_cast<long long>(limit.count()));
          std::abort();
        }) {}

 private:
  std::jthread thread_;
};

// A device buffer of n values of T, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_ > 0) COHORT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  T* data() const { return data_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ > 0) {
      COHORT_CUDA_CHECK(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
      // From pageable memory cudaMemcpy may return before the copy lands, and the communicators'
      // non-blocking streams do not wait for the default stream.
      COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      COHORT_CUDA_CHECK(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

// The lengths every kernel is swept over (STYLE.md section 6), plus a few norm-block edges and
// multiples of 16 bytes (4096, 2^20), which the optimizer update takes 16 bytes at a time.
inline const std::vector<std::size_t>& odd_lengths() {
  static const std::vector<std::size_t> lengths = {0,    1,    7,     4095,     4096,
                                                   4097, 4099, 65537, 1u << 20, (1u << 20) + 3};
  return lengths;
}

// Uniform in [-1, 1), fixed seed per call site.
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = dist(engine);
  return values;
}

}  // namespace cohort::test
