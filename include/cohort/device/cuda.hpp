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
//   COHORT_CUDA_CHECK(call)           throws DeviceError "<call> failed: <code name> (<code>):
//                                     <text> at <file>:<line>" when call returns an error
//   device::cuda::check_launch(name)  the check after a kernel launch (cudaGetLastError)
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/device/device.hpp"

namespace cohort::device {

struct Cuda {
  static constexpr std::string_view kName = "cuda";
};
static_assert(Device<Cuda>);

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

}  // namespace cuda
}  // namespace cohort::device

#define COHORT_CUDA_CHECK(call) ::cohort::device::cuda::check((call), #call, __FILE__, __LINE__)
