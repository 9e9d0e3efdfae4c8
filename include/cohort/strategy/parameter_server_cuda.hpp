// ParameterServer<C, device::Cuda>: parameter-server workers on GPUs, for cohort::cuda users (it
// includes the CUDA runtime's header).
//
//   cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync, cohort::device::Cuda>
//       strategy({});
//
// Each worker process drives the GPU at its local_rank (among those CUDA_VISIBLE_DEVICES leaves
// visible; a ConfigError naming local_rank before the rendezvous when there is none) on a stream
// of its own, with one replica (local_replicas = 1), whose thread makes that GPU current before
// anything else. The Trainer places the model there
// (ModelTraits<M>::replicate, core/model.hpp); a step's gradient fold is copied to the host for
// the push, chunk by chunk as the chunks become final, and the pulled parameters back to the GPU,
// both through page-locked host memory. A model that reports gradient readiness (core/model.hpp)
// has its first chunks copied and pushed while its backward pass goes on; otherwise everything
// waits for the end of its forward_backward. The next step computes with the pulled parameters.
// Servers work on the host: a ps task needs no GPU. Everything else is ParameterServer<C>
// (strategy/parameter_server.hpp): the same protocol, consistency models, faults and checkpoints,
// and under Sync the same bits as Mirrored (given a model whose CUDA forward_backward computes its
// CPU twin's bits).
#pragma once

#include <chrono>
#include <cstdio>

#include "cohort/cluster/cluster.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/strategy/detail/local_gpu_cuda.hpp"
#include "cohort/strategy/parameter_server.hpp"

namespace cohort::strategy {

namespace detail::ps {
template <>
class WorkerPlace<device::Cuda> {
 public:
  using Staging = device::cuda::PinnedBytes;
  WorkerPlace(const cluster::Spec& spec, std::chrono::milliseconds timeout)
      : stream_(detail::local_gpu(spec, "ParameterServer<C, device::Cuda>"), timeout) {
    std::fprintf(stderr, "cohort: worker %d on GPU %d\n", spec.rank, stream_.device());
  }
  device::cuda::Place place() const { return stream_.place(); }
  void make_current() const { device::cuda::use(stream_.device()); }

 private:
  device::cuda::Stream stream_;
};
}  // namespace detail::ps

static_assert(Strategy<ParameterServer<consistency::Sync, device::Cuda>>);
static_assert(Strategy<ParameterServer<consistency::Async, device::Cuda>>);
static_assert(HasPlaces<ParameterServer<consistency::Sync, device::Cuda>>);

}  // namespace cohort::strategy
