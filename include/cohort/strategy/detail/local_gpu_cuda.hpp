// The GPUs of a worker process of a job across processes (MultiWorkerMirrored<device::Cuda>,
// ParameterServer<C, device::Cuda>): by local_rank, among those CUDA_VISIBLE_DEVICES leaves
// visible. For cohort::cuda users.
#pragma once

#include <string>
#include <string_view>

#include "cohort/cluster/cluster.hpp"
#include "cohort/core/options.hpp"
#include "cohort/device/cuda.hpp"

namespace cohort::strategy::detail {

// The first of the `count` GPUs of this process: indices local_rank * count to
// local_rank * count + count - 1 among the visible ones (count = 1: the GPU at local_rank), or a
// ConfigError naming local_rank (and why there is none) before anything else happens, so that a
// process without its GPUs fails at once rather than in the rendezvous.
inline int local_gpu(const cluster::Spec& spec, std::string_view strategy, int count = 1) {
  const int visible = device::cuda::device_count();
  const int first = spec.local_rank * count;
  if (first + count > visible) {
    const std::string why = visible == 0
                                ? "this process sees none (" + device::cuda::unavailable() + ")"
                                : "this process sees " + std::to_string(visible);
    const std::string which = count == 1 ? "the GPU at index local_rank"
                                         : std::to_string(count) +
                                               " GPUs (local_replicas) from index local_rank * " +
                                               std::to_string(count);
    options::reject("local_rank", spec.local_rank,
                    "has no GPU: " + why + device::cuda::visible_devices() + "; " +
                        std::string(strategy) + " drives " + which + " (" + spec.source + ")");
  }
  return first;
}

}  // namespace cohort::strategy::detail
