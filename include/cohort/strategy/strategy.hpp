// Strategies: how replicas are laid out and synchronized.
//
// A strategy decides where the replicas of a model run (threads of this process, processes on
// hosts, devices) and gives each local replica a communicator over all replicas of the job. The
// Trainer runs the same step on every replica; the strategy only changes who the replicas are and
// how their collectives travel, so results are the same bits for every synchronous strategy.
//
//   S::Options             aggregate, validated in the constructor (ConfigError naming the field)
//   S::kName               "mirrored", ...: used in progress lines and checkpoints
//   s.replicas()           replicas in the whole job
//   s.local_replicas()     replicas this process runs
//   s.first_local_replica()  global index of this process's first replica
//   s.is_chief()           whether this process prints progress and writes checkpoints
//   s.run(body)            calls body(replica) once per local replica, concurrently, and returns
//                          when all have returned. If a body throws, the others are released
//                          (their collectives throw) and run rethrows the first exception.
//
// A replica handed to the body provides:
//   replica.index()         the global replica index
//   replica.communicator()  a collective::Communicator over every replica of the job
//   replica.start(parameters, optimizer_state, step)
//                           once per fit, before the first step: brings this replica to the
//                           chief's state (mirrored: a broadcast of the parameters; a parameter
//                           server: the chief initializes the servers, every worker pulls)
//   The synchronization of one step, three calls on the replica's thread, u an Update (below):
//   replica.begin_step(u)   before any part of u.gradient_sum is final
//   replica.gradients_ready(u, begin, end)
//                           u.gradient_sum[begin, end) is final: this replica's fold of its
//                           micro-batches there. The ranges of a step never overlap and together
//                           cover the gradient; they arrive while the backward pass of the last
//                           micro-batch goes on (core/model.hpp, gradient readiness), or as one
//                           range after it. A strategy may start communicating here (the
//                           mirrored strategies' buckets, a parameter server's chunks).
//   replica.finish_step(u)  every range was ready: turns this replica's gradient fold into new
//                           parameters. Mirrored strategies all-reduce (the buckets not already
//                           reduced) and apply the optimizer locally, clipping included, since
//                           the norm needs every bucket; a parameter server pushes what is left
//                           and pulls every chunk.
//                           A strategy that checks the reduced gradient for infinities and NaN
//                           returns a StepResult (below) and follows u.on_nonfinite: under
//                           kSkipStep it applies no update to a non-finite gradient. Every replica
//                           must decide the same way, so the check is of values every replica
//                           holds alike (the mirrored strategies: the all-reduced gradient). A
//                           finish_step that returns nothing checks nothing: the Trainer then
//                           checks the parameters after the step and allows only kRaise.
//   replica.finish(parameters, optimizer_state, end)
//                           once per fit, after the last step (and the Trainer's last
//                           collective), on every replica: leaves the fit's final state in the
//                           spans start() was given (mirrored: nothing to do; a parameter server:
//                           the chief pulls the optimizer state back from the servers, and every
//                           worker tells them it is done). `end` (FitEnd, below) says whether the
//                           fit reached its target or the job stopped for preemption
//                           (core/preemption.hpp). Not called when the fit failed.
//
// Hooks the Trainer calls where a strategy has them (detected, not required):
//   s.serves()              true on a process that serves (a parameter server): fit calls
//   s.serve<T>(parameter_count, optimizer, settings)   instead of running replicas, until the
//                           workers are done; `settings` are the Trainer's that a server holds
//                           too (trainer.hpp, "One job, one set of settings"); it returns whether
//                           the workers' fit stopped for preemption
//   s.settings()            the strategy's own settings::Fields, which every process of the job
//                           must share: the Trainer compares them with its own
//   replica.present_settings(fields)   after the Trainer's own comparison, before start(): a
//                           strategy whose collectives do not reach every process of the job
//                           (a parameter server) has the fields compared where they do
//   replica.gradient_sum_storage<T>(count)   once per fit, after start(), on every replica:
//                           a span of `count` elements where the Trainer keeps this replica's
//                           gradient sum for every step of the fit (u.gradient_sum), or an empty
//                           span for the Trainer's own buffer. A strategy whose communicator
//                           reduces it in place there copies nothing in or out (MultiWorkerMirrored
//                           through shared memory: collective::Deterministic::share_buffer)
//   replica.stop_requested()  whether the replica heard that another process of the job was
//                           signalled to stop (a parameter server's marked answers): the
//                           Trainer's agreement to stop counts it
//   replica.abandon_step(reason)   noexcept; the step ends by an exception (the model's, the
//                           data's, a failed collective) after begin_step: the strategy releases
//                           the other replicas (its communicator's abort) and returns only once no
//                           work it started still uses the step's buffers, which the Trainer frees
//                           next (the mirrored strategies: the buckets a communication thread may
//                           be reducing)
//   s.save(file, state, parameter_count)     Trainer::save, where the strategy writes its own
//                           checkpoint (a parameter server: a shard per server, the manifest last)
//   s.save_outcome(file, chief_failure)   Trainer::save under a strategy of several processes
//                           whose chief writes the checkpoint: on every process after the chief's
//                           write, the chief's failure ("" when `file` is complete) made known to
//                           every process and returned, so that save returns nowhere before the
//                           file exists (the multi-worker strategies: a broadcast)
//   s.restored(state)       after Trainer::restore, for a strategy that keeps part of the state
//                           (a parameter server keeps its shard for the next save)
//
// Replicas on a device other than the host (Mirrored<device::Cuda, collective::Nccl>) say where
// they live; a strategy that says nothing runs on device::Cpu:
//   S::Device               the device::Device of its replicas
//   s.place(local_index)    the S::Device::Place of local replica local_index (its GPU and stream),
//                           valid while the strategy lives: the Trainer places the replica's
//                           model, gradient fold and optimizer state there, and the step's three
//                           calls work there. The communicator's spans are memory at that place.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "cohort/collective/collective.hpp"
#include "cohort/core/error.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/device/device.hpp"
#include "cohort/optimizer/optimizer.hpp"

namespace cohort::strategy {

// One step's synchronization, as the Trainer hands it to the replica's begin_step,
// gradients_ready and finish_step.
template <class T, class O>
struct Update {
  std::span<T> parameters;    // this replica's model
  std::span<T> gradient_sum;  // this replica's fold of its micro-batches; may be overwritten
  const O& optimizer;
  std::span<T> optimizer_state;  // this replica's (kStateSlots x parameters values)
  std::uint64_t step = 0;        // the step's index in the run, from 0
  double inverse_batch = 1.0;    // 1 / global batch
  // Trainer::Options::on_nonfinite: what finish_step does with a non-finite reduced gradient.
  NonFinite on_nonfinite = NonFinite::kRaise;
};

// How a fit ended, for replica.finish.
enum class FitEnd {
  kReached,    // its target (Until)
  kPreempted,  // the job agreed to stop (core/preemption.hpp)
};

// What finish_step found in the step's reduced gradient.
struct StepResult {
  static constexpr std::size_t kFinite = std::numeric_limits<std::size_t>::max();
  // The first infinity or NaN of the reduced gradient, or kFinite.
  std::size_t first_nonfinite = kFinite;
  // Whether the optimizer's update was applied: always for a finite gradient; never under
  // kSkipStep for a non-finite one; under kRaise the check may be fused with the update, which is
  // then applied (the Trainer throws; the replica's state is the step's, non-finite).
  bool applied = true;
};

namespace detail {
// A stand-in body with which the concept checks that run() accepts a callable.
struct AnyReplicaBody {
  template <class Replica>
  void operator()(Replica&) const {}
};
}  // namespace detail

template <class S>
concept Strategy = requires(S& s, const S& cs) {
  typename S::Options;
  { S::kName } -> std::convertible_to<std::string_view>;
  { cs.replicas() } -> std::convertible_to<std::size_t>;
  { cs.local_replicas() } -> std::convertible_to<std::size_t>;
  { cs.first_local_replica() } -> std::convertible_to<std::size_t>;
  { cs.is_chief() } -> std::convertible_to<bool>;
  s.run(detail::AnyReplicaBody{});
};

namespace detail {
template <class S>
struct DeviceOf {
  using type = device::Cpu;
};
template <class S>
requires requires { typename S::Device; }
struct DeviceOf<S> {
  using type = typename S::Device;
};
}  // namespace detail

// The device of S's replicas: S::Device, or device::Cpu for a strategy that names none.
template <class S>
using DeviceOf = typename detail::DeviceOf<S>::type;

// Where local replica local_index of strategy lives: strategy.place(local_index), or the CPU's
// (empty) place for a strategy without places.
template <class S>
typename DeviceOf<S>::Place place_of(const S& strategy, std::size_t local_index) {
  if constexpr (requires { strategy.place(local_index); }) {
    return strategy.place(local_index);
  } else {
    return {};
  }
}

}  // namespace cohort::strategy
