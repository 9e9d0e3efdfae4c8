// device::Cuda: replicas whose parameters live in the memory of one NVIDIA GPU each.
//
// For cohort::cuda users only (it includes the CUDA runtime's header); CPU users never see it. The
// per-device math is in cuda/launch.hpp (plain C++ declarations, one .cu instantiates them) and
// computes the same operations in the same order as device/cpu.hpp, so GPU bits equal CPU bits
// (docs/gpu.md says where and why).
//
//   device::cuda::device_count()      GPUs visible to this process; 0 when there is no driver or
//                                     no device (never throws: tests skip on it)
//   device::cuda::unavailable()       why there is no GPU, "" when there is one
//   device::cuda::visible_devices()   " (CUDA_VISIBLE_DEVICES=...)" when it is set, else "": for
//                                     messages about device indices
//   COHORT_CUDA_CHECK(call)           throws DeviceError "<call> failed: <code name> (<code>):
//                                     <text> at <file>:<line>" when call returns an error
//   device::cuda::check_launch(name)  the check after a kernel launch (cudaGetLastError)
//   device::cuda::use(device)         cudaSetDevice, checked: every thread sets its device before
//                                     it touches one
//
// Places and memory (device/device.hpp says what a device provides):
//
//   device::cuda::Place     {device, stream}: a replica's GPU (an index among the visible ones)
//                           and the stream all its work is enqueued on. The strategy owns the
//                           stream; a model placed there (core/model.hpp, replicate) keeps the
//                           Place and enqueues its forward_backward on place.stream.
//   device::cuda::Stream    an owned non-blocking stream on one device; its destructor waits for
//                           the work enqueued on it at most drain_limit (then gives up waiting,
//                           says so on stderr, and lets CUDA release the stream when that work
//                           ends), so that a kernel that never finishes cannot hang teardown
//   device::cuda::Event     an owned event on one device, for waiting on a stream's progress
//   device::cuda::Buffer<T> an owned device array, zeroed on place.stream
//
// device::Cuda's functions make place.device current on the calling thread, enqueue their work
// on place.stream and check every call. Destructors make their own device current (they may run
// on any thread) and never throw.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/cuda/launch.hpp"
#include "cohort/device/device.hpp"
#include "cohort/optimizer/optimizer.hpp"

namespace cohort::device {

namespace cuda {

// The message of a failed CUDA call: the call as written, the code's name, number and text.
inline std::string describe(std::string_view call, cudaError_t code, const char* file, int line) {
  std::string message(call);
  message += " failed: ";
  message += cudaGetErrorName(code);
  message += " (" + std::to_string(static_cast<int>(code)) + "): ";
  message += cudaGetErrorString(code);
  if (file != nullptr) message += " at " + std::string(file) + ":" + std::to_string(line);
  return message;
}

inline void check(cudaError_t code, std::string_view call, const char* file = nullptr,
                  int line = 0) {
  if (code != cudaSuccess) throw DeviceError(describe(call, code, file, line));
}

}  // namespace cuda
}  // namespace cohort::device

#define COHORT_CUDA_CHECK(call) ::cohort::device::cuda::check((call), #call, __FILE__, __LINE__)

namespace cohort::device {
namespace cuda {

// After a kernel launch: a bad configuration is reported by the launch itself; a fault while the
// kernel runs surfaces at the next synchronizing call, which is checked too.
inline void check_launch(std::string_view kernel) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess) {
    throw DeviceError(describe(std::string("launch of ") + std::string(kernel), code, nullptr, 0));
  }
}

// Never throws: a machine without a driver answers an error, which counts as no device.
inline int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clears the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

inline std::string unavailable() {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    return describe("cudaGetDeviceCount", code, nullptr, 0);
  }
  return count == 0 ? "cudaGetDeviceCount found 0 devices" : "";
}

inline std::string visible_devices() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "";
}

inline void use(int device) { COHORT_CUDA_CHECK(cudaSetDevice(device)); }

struct Place {
  int device = 0;
  cudaStream_t stream = nullptr;
};

// A stream of its own on `device`, non-blocking (it never waits for the legacy default stream).
// The destructor waits for the work enqueued on it, at most drain_limit: work that outlives the
// limit (a kernel waiting for a peer that is gone) is left to finish on its own, and CUDA frees
// the stream then (cudaStreamDestroy does not wait).
class Stream {
 public:
  static constexpr std::chrono::milliseconds kDrainLimit{std::chrono::minutes(5)};

  explicit Stream(int device, std::chrono::milliseconds drain_limit = kDrainLimit)
      : device_(device), drain_limit_(drain_limit) {
    use(device_);
    COHORT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  Stream(Stream&& other) noexcept
      : device_(other.device_),
        drain_limit_(other.drain_limit_),
        stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    Stream moved(std::move(other));
    std::swap(device_, moved.device_);
    std::swap(drain_limit_, moved.drain_limit_);
    std::swap(stream_, moved.stream_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ == nullptr) return;
    (void)cudaSetDevice(device_);
    if (!drain()) {
      std::fprintf(stderr,
                   "cohort: the stream of GPU %d still had work after %lld ms; destroyed without "
                   "waiting for it\n",
                   device_, static_cast<long long>(drain_limit_.count()));
    }
    (void)cudaStreamDestroy(stream_);
  }

  int device() const { return device_; }
  std::chrono::milliseconds drain_limit() const { return drain_limit_; }
  cudaStream_t get() const { return stream_; }
  Place place() const { return {device_, stream_}; }

 private:
  // Whether the stream's work ended (or failed) within drain_limit_.
  bool drain() const noexcept {
    const auto deadline = std::chrono::steady_clock::now() + drain_limit_;
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state != cudaErrorNotReady) return true;
      // "Not ready" is also kept as this thread's last error, which the next launch's check would
      // take for its own.
      (void)cudaGetLastError();
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
  }

  int device_ = 0;
  std::chrono::milliseconds drain_limit_ = kDrainLimit;
  cudaStream_t stream_ = nullptr;
};

// An event on `device`, without timing: recorded on a stream, it says when the work enqueued
// before it has finished. Default-constructed: none (a moved-from Event is none too).
class Event {
 public:
  Event() = default;
  explicit Event(int device) : device_(device) {
    use(device_);
    COHORT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  Event(Event&& other) noexcept
      : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    Event moved(std::move(other));
    std::swap(device_, moved.device_);
    std::swap(event_, moved.event_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)cudaEventDestroy(event_);
  }

  int device() const { return device_; }
  cudaEvent_t get() const { return event_; }

 private:
  int device_ = 0;
  cudaEvent_t event_ = nullptr;
};

// n values of T in the memory of place.device, zeroed by a memset enqueued on place.stream (so
// that work on that stream sees the zeros; other streams synchronize with it first).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t n, const Place& place) : device_(place.device) {
    if (n == 0) return;
    use(place.device);
    T* data = nullptr;
    COHORT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T)));
    const cudaError_t zeroed = cudaMemsetAsync(data, 0, n * sizeof(T), place.stream);
    if (zeroed != cudaSuccess) {
      (void)cudaFree(data);
      check(zeroed, "cudaMemsetAsync(data, 0, n * sizeof(T), place.stream)", __FILE__, __LINE__);
    }
    data_ = data;
    size_ = n;
  }
  Buffer(Buffer&& other) noexcept
      : device_(other.device_),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer moved(std::move(other));
    std::swap(device_, moved.device_);
    std::swap(data_, moved.data_);
    std::swap(size_, moved.size_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)cudaFree(data_);  // waits for the device's work: nothing still uses the memory
  }

  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  int device_ = 0;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Page-locked host memory, for data that crosses between a GPU and the host every step (a
// parameter-server worker's gradients and parameters): the copy engines read and write it
// directly, where pageable memory is first copied through a driver buffer. resize() keeps no
// contents; it allocates only when the size grows.
class PinnedBytes {
 public:
  PinnedBytes() = default;
  PinnedBytes(PinnedBytes&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)) {}
  PinnedBytes& operator=(PinnedBytes&& other) noexcept {
    PinnedBytes moved(std::move(other));
    std::swap(data_, moved.data_);
    std::swap(size_, moved.size_);
    std::swap(capacity_, moved.capacity_);
    return *this;
  }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  ~PinnedBytes() {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
  }

  void resize(std::size_t bytes) {
    if (bytes > capacity_) {
      if (data_ != nullptr) COHORT_CUDA_CHECK(cudaFreeHost(data_));
      data_ = nullptr;
      size_ = capacity_ = 0;
      COHORT_CUDA_CHECK(cudaMallocHost(&data_, bytes));
      capacity_ = bytes;
    }
    size_ = bytes;
  }
  std::byte* data() { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

namespace detail {

// Device memory for the length of one call, allocated and freed in stream order.
template <class T>
class StreamScratch {
 public:
  StreamScratch(std::size_t n, cudaStream_t stream) : stream_(stream) {
    COHORT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), n * sizeof(T), stream_));
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() { (void)cudaFreeAsync(data_, stream_); }
  T* data() const { return data_; }

 private:
  cudaStream_t stream_;
  T* data_ = nullptr;
};

template <class T>
void copy_on(const Place& place, const T* from, T* to, std::size_t n) {
  if (n == 0) return;
  use(place.device);
  // cudaMemcpyDefault: the direction follows from the pointers (unified addressing), so a model
  // whose parameters are managed or pinned memory works too.
  COHORT_CUDA_CHECK(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDefault, place.stream));
}

}  // namespace detail
}  // namespace cuda

struct Cuda {
  static constexpr std::string_view kName = "cuda";
  using Place = cuda::Place;
  template <class T>
  using Buffer = cuda::Buffer<T>;

  template <class T>
  static void copy(const Place& place, std::span<const std::type_identity_t<T>> from,
                   std::span<T> to) {
    COHORT_ASSERT(from.size() == to.size());
    cuda::detail::copy_on(place, from.data(), to.data(), to.size());
  }

  template <class T>
  static void add_into(const Place& place, std::span<T> inout,
                       std::span<const std::type_identity_t<T>> in) {
    COHORT_ASSERT(inout.size() == in.size());
    if (inout.empty()) return;
    cuda::use(place.device);
    ::cohort::cuda::combine_into<T>(ReduceOp::kSum, inout.data(), in.data(), inout.size(),
                                    place.stream);
  }

  // Waits for place.stream: the result is needed on the host (the clipping factor).
  template <class T>
  static double sum_of_squares(const Place& place, std::span<const T> x) {
    cuda::use(place.device);
    const std::size_t workspace = ::cohort::cuda::sum_of_squares_workspace(x.size());
    double result = 0.0;
    {
      cuda::detail::StreamScratch<double> scratch(workspace + 1, place.stream);
      double* const sum = scratch.data() + workspace;
      ::cohort::cuda::sum_of_squares<T>(x.data(), x.size(), scratch.data(), sum, place.stream);
      COHORT_CUDA_CHECK(
          cudaMemcpyAsync(&result, sum, sizeof(double), cudaMemcpyDeviceToHost, place.stream));
      COHORT_CUDA_CHECK(cudaStreamSynchronize(place.stream));
    }
    return result;
  }

  template <class O, class T>
  static void step(const Place& place, const O& o, std::span<T> parameters,
                   std::span<const std::type_identity_t<T>> gradients, std::span<T> state,
                   optimizer::StepContext context) {
    COHORT_ASSERT(gradients.size() == parameters.size());
    COHORT_ASSERT(state.size() == O::kStateSlots * parameters.size());
    cuda::use(place.device);
    ::cohort::cuda::step(o, parameters.data(), gradients.data(), state.data(), parameters.size(),
                         context, place.stream);
  }

  // step, with the update kernel's non-finite flag read back (device::cpu::step_finite): waits
  // for place.stream, as the decision is the host's.
  template <class O, class T>
  static bool step_finite(const Place& place, const O& o, std::span<T> parameters,
                          std::span<const std::type_identity_t<T>> gradients, std::span<T> state,
                          optimizer::StepContext context) {
    COHORT_ASSERT(gradients.size() == parameters.size());
    COHORT_ASSERT(state.size() == O::kStateSlots * parameters.size());
    cuda::use(place.device);
    int flag = 0;
    {
      cuda::detail::StreamScratch<int> scratch(1, place.stream);
      COHORT_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, sizeof(int), place.stream));
      ::cohort::cuda::step(o, parameters.data(), gradients.data(), state.data(), parameters.size(),
                           context, place.stream, scratch.data());
      COHORT_CUDA_CHECK(cudaMemcpyAsync(&flag, scratch.data(), sizeof(int), cudaMemcpyDeviceToHost,
                                        place.stream));
      COHORT_CUDA_CHECK(cudaStreamSynchronize(place.stream));
    }
    return flag == 0;
  }

  // Waits for place.stream: the index is needed on the host.
  template <class T>
  static std::size_t first_nonfinite(const Place& place, std::span<const T> x) {
    if (x.empty()) return 0;
    cuda::use(place.device);
    unsigned long long first = 0;
    {
      cuda::detail::StreamScratch<unsigned long long> scratch(1, place.stream);
      COHORT_CUDA_CHECK(
          cudaMemsetAsync(scratch.data(), 0xff, sizeof(unsigned long long), place.stream));
      ::cohort::cuda::first_nonfinite<T>(x.data(), x.size(), scratch.data(), place.stream);
      COHORT_CUDA_CHECK(cudaMemcpyAsync(&first, scratch.data(), sizeof first,
                                        cudaMemcpyDeviceToHost, place.stream));
      COHORT_CUDA_CHECK(cudaStreamSynchronize(place.stream));
    }
    return first < x.size() ? static_cast<std::size_t>(first) : x.size();
  }

  template <class T>
  static void to_host(const Place& place, std::span<const std::type_identity_t<T>> from,
                      std::span<T> host) {
    COHORT_ASSERT(from.size() == host.size());
    cuda::detail::copy_on(place, from.data(), host.data(), host.size());
    synchronize(place);
  }

  template <class T>
  static void from_host(const Place& place, std::span<const std::type_identity_t<T>> host,
                        std::span<T> to) {
    COHORT_ASSERT(host.size() == to.size());
    cuda::detail::copy_on(place, host.data(), to.data(), to.size());
    synchronize(place);  // the host memory may go as soon as this returns
  }

  static void synchronize(const Place& place) {
    cuda::use(place.device);
    COHORT_CUDA_CHECK(cudaStreamSynchronize(place.stream));
  }
};
static_assert(Device<Cuda>);

}  // namespace cohort::device
