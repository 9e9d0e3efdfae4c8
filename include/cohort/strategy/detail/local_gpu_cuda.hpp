// The GPU of a worker process of a job across processes (MultiWorkerMirrored<device::Cuda>,
// ParameterServer<C, device::Cuda>): the one at index local_rank among those CUDA_VISIBLE_DEVICES
// leaves visible. For cohort::cuda users.
#pragma once

#include <string>
#include <string_view>

#include "cohort/cluster/cluster.hpp"
#include "cohort/core/options.hpp"
#include "cohort/device/cuda.hpp"

namespace cohort::strategy::detail {

// local_rank's GPU, or a ConfigError naming local_rank (and why there is none) before anything
// else happens, so that a process without a GPU fails at once rather than in the rendezvous.
inline int local_gpu(const cluster::Spec& spec, std::string_view strategy) {
  const int visible = device::cuda::device_count();
  if (spec.local_rank >= visible) {
    const std::string why = visible == 0
                                ? "this process sees none (" + device::cuda::unavailable() + ")"
                                : "this process sees " + std::to_string(visible);
    options::reject("local_rank", spec.local_rank,
                    "has no GPU: " + why + device::cuda::visible_devices() + "; " +
                        std::string(strategy) + " drives the GPU at index local_rank (" +
                        spec.source + ")");
  }
  return spec.local_rank;
}

}  // namespace cohort::strategy::detail
