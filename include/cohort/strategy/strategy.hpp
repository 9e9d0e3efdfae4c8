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
//                           fit reached its target, the job stopped for preemption
//                           (core/preemption.hpp), or a segment ended for a checkpoint or for
//                           processes the job takes in. Not called when the fit failed.
//
// Capabilities: hooks a strategy may have. Each is a concept below; a strategy that has one says so
// with a static_assert at its definition, so that a hook whose signature drifts is a compile error
// there, and the Trainer asks the concept, never the hook's expression:
//   SpansProcesses<S>        s.cluster(): the job is processes (cluster/cluster.hpp), so its
//                            settings are compared (trainer/job_settings.hpp) and progress names
//                            workers and ranks
//   ServesFit<S, T, O>       s.serves(): true on a process that serves (a parameter server), where
//                            fit calls s.serve<T>(parameter_count, optimizer, schedule, settings)
//                            instead of running replicas, until the workers are done; the server
//                            applies the updates with the schedule (optimizer/schedule.hpp) at its
//                            own count of updates; `settings` are the Trainer's that a server holds
//                            too; it returns how the workers' fit or segment ended (Served)
//   PresentsSettings<S>      s.settings(): the strategy's own settings::Fields, which every process
//                            must share; replica.present_settings(fields) after the Trainer's own
//                            comparison, before start(), has them compared where the strategy's
//                            collectives do not reach every process (a parameter server's)
//   LendsGradientStorage<S, T>   replica.gradient_sum_storage<T>(count), once per fit after
//                            start(): a span of `count` elements where the Trainer keeps the
//                            replica's gradient sum for every step (u.gradient_sum), or an empty
//                            span for the Trainer's own buffer (the model's own gradient where
//                            the replica folds one micro-batch a step). A communicator that reduces
//                            it in place there copies nothing in or out (MultiWorkerMirrored
//                            through shared memory: collective::Deterministic::share_buffer)
//   ReportsStop<S>           replica.stop_requested(): whether the replica heard that another
//                            process was signalled to stop (a parameter server's marked answers);
//                            the Trainer's agreement to stop counts it
//   AbandonsStep<S>          replica.abandon_step(reason), noexcept: the step ends by an exception
//                            after begin_step; the strategy releases the other replicas (its
//                            communicator's abort) and returns once no work it started still uses
//                            the step's buffers, which the Trainer frees next
//   ChecksGradient<S, T, O>  replica.finish_step(u) returns a StepResult (above)
//   SavesOwnCheckpoint<S, T> s.save(file, state, parameter_count) for Trainer::save (a parameter
//                            server: a shard per server, the manifest last), and s.restored(state)
//                            after Trainer::restore, to keep its part of the state
//   SharesSaveOutcome<S>     s.save_outcome(file, chief_failure): under a strategy of several
//                            processes whose chief writes the checkpoint, on every process after
//                            the chief's write, the chief's failure ("" when `file` is complete)
//                            made known to every process and returned, so that save returns
//                            nowhere before the file exists (the multi-worker strategies)
//   SnapshotsBetweenSteps<S, T>  replica.make_state_whole<T>(optimizer_state): between two steps,
//                            on every replica together, leaves the replica's whole state in its
//                            spans, as finish does, and the fit goes on: every replica of a
//                            mirrored strategy holds the parameters after every step, and a
//                            sharded update gathers the optimizer state's stripes (a collective).
//                            A checkpoint during the fit is then the chief's copy of its first
//                            replica's state, taken between two steps, without the end of a
//                            segment (trainer/periodic_checkpoints.hpp)
//   FoldsAnyDeal<S>          s.use_deal(deal), once, before the first fit: the micro-batches each
//                            replica folds (core/sharding.hpp, Deal), which the strategy's
//                            collectives then fold as nodes of those sizes, so that any replica
//                            count up to micro_batches gives the bits of one replica. A strategy
//                            without it takes equal blocks only (micro_batches / replicas a power
//                            of two)
//   Regroups<S>              s.elastic(), s.regroup(cause), s.withdraw() noexcept: a job that
//                            goes on when a worker is lost (strategy/elastic.hpp). Where
//                            s.elastic().enabled() and a segment fails with a CommError (`cause`),
//                            every process that goes on calls s.regroup(cause), which returns
//                            once the workers left form the job's next membership (or throws
//                            below min_workers), with replicas(), first_local_replica() and
//                            is_chief() theirs; the Trainer then deals the micro-batches anew and
//                            takes the newest state (trainer/elastic.hpp). A process whose own
//                            failure ends its fit calls s.withdraw() before it tells the others,
//                            so that none counts it in
//   KeepsShares<S>           Regroups<S>, and s.shares(): the workers' shares of the
//                            micro-batches (core/sharding.hpp, Shares), dealt over more workers
//                            than the membership's where the job lost some: a job whose steps
//                            aggregate a fixed number of workers' shares (ParameterServer's
//                            backup workers) keeps every share when a worker is lost, leaving
//                            the last ones undealt, or dealing several to a worker where fewer
//                            workers are left than the shares a step aggregates
//   Grows<S>                 Regroups<S>, and s.joiners_waiting(), s.admit(count), s.joined(): a
//                            job that also grows at a step boundary. s.joiners_waiting() (on the
//                            chief, at a vote) counts the processes that ask to join, as many as
//                            the job takes; every process then calls s.admit(count) together, and
//                            each joiner, whose s.joined() is true from its construction, takes
//                            the newest state with them
//   TakesWorkersBack<S>      s.elastic(), s.tend_door(), s.rejoined(), s.resume_step(step): a
//                            job that takes a lost worker's process back when it is started again
//                            for its place (ParameterServer under Async and BoundedStaleness).
//                            s.tend_door(), on the chief at each vote, answers the processes at
//                            its door; on such a process s.rejoined() is true, and its first fit
//                            goes on from s.resume_step(step), the step after its last push
//   KeepsStripes<S, T>       s.stripes_spread(), s.kept_step(), s.rebuild_from_kept_state<T>(
//                            parameters, state, steps) const, s.forget_stripes(): an elastic job
//                            whose workers update only their parts of the state keeps the state
//                            now and then where the others find it after a worker's loss
//                            (strategy/detail/kept_stripes.hpp: every worker's stripes in shared
//                            memory, or over TCP and by host each worker's copy of the whole).
//                            After a regroup, where s.stripes_spread() on any process (its state
//                            was current only on its part when the worker was lost), every
//                            replica rebuilds its parameters and optimizer state after the newest
//                            step any process's s.kept_step() names, rather than receiving them,
//                            and the fit goes on from there; every process then calls
//                            s.forget_stripes()
//   ChoosesGradientSum<S>    s.gradient_sum_op(): the ReduceOp of the gradient's sum, which the
//                            Trainer's fold of a replica's micro-batches follows too, so that
//                            every node of the canonical tree is computed alike wherever it is:
//                            ReduceOp::kSumBfloat16 under MultiWorkerMirrored's and
//                            ParameterServer's wire kBfloat16 (collective/wire.hpp). A
//                            checkpoint records it, and a restore under another refuses the
//                            file. A strategy without it sums in kSum
//   HasPlaces<S>             s.place(local_index): below
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
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "cohort/collective/collective.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/role.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/device/device.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/optimizer/schedule.hpp"
#include "cohort/optimizer/sgd.hpp"  // the optimizer strategies state their capabilities with
#include "cohort/strategy/elastic.hpp"

namespace cohort::checkpoint {
template <class T>
struct TrainingState;
}  // namespace cohort::checkpoint

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
  // The learning-rate schedule's factor at this step (optimizer/schedule.hpp).
  double learning_rate_factor = 1.0;
  // Trainer::Options::on_nonfinite: what finish_step does with a non-finite reduced gradient.
  NonFinite on_nonfinite = NonFinite::kRaise;
};

// How a fit, or a segment of it, ended, for replica.finish.
enum class FitEnd {
  kReached,     // its target (Until), or an early stop
  kPreempted,   // the job agreed to stop (core/preemption.hpp)
  kCheckpoint,  // a segment ended for a checkpoint during the fit, which goes on after it
                // (trainer/periodic_checkpoints.hpp)
  kAdmit,       // a segment ended where the job takes processes in (strategy::Grows), and the fit
                // goes on with them
};

// What a server's serve did (ServesFit): how the workers' fit, or segment, ended, and the run's
// step there.
struct Served {
  FitEnd end = FitEnd::kReached;
  std::uint64_t step = 0;
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
  typename S::Replica;
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

template <class S>
concept SpansProcesses = requires(const S& s) {
  { s.cluster().rank } -> std::convertible_to<int>;
  { s.cluster().role } -> std::convertible_to<Role>;
};

template <class S, class T, class O>
concept ServesFit = requires(S& s, const S& cs, std::size_t count, const O& optimizer,
                             const optimizer::Schedule& schedule, const settings::Fields& fields) {
  { cs.serves() } -> std::same_as<bool>;
  { s.template serve<T>(count, optimizer, schedule, fields) } -> std::same_as<Served>;
};

template <class S>
concept PresentsSettings = requires(const S& s, typename S::Replica& replica,
                                    const settings::Fields& fields) {
  { s.settings() } -> std::same_as<settings::Fields>;
  replica.present_settings(fields);
};

template <class S, class T>
concept LendsGradientStorage = requires(typename S::Replica& replica, std::size_t count) {
  { replica.template gradient_sum_storage<T>(count) } -> std::same_as<std::span<T>>;
};

template <class S>
concept ReportsStop = requires(const typename S::Replica& replica) {
  { replica.stop_requested() } -> std::same_as<bool>;
};

template <class S>
concept AbandonsStep = requires(typename S::Replica& replica, std::string_view reason) {
  { replica.abandon_step(reason) } noexcept;
};

template <class S, class T, class O>
concept ChecksGradient = requires(typename S::Replica& replica, Update<T, O>& update) {
  { replica.finish_step(update) } -> std::same_as<StepResult>;
};

template <class S, class T>
concept SavesOwnCheckpoint = requires(S& s, const S& cs, const std::filesystem::path& file,
                                      const checkpoint::TrainingState<T>& state,
                                      std::size_t parameter_count) {
  cs.save(file, state, parameter_count);
  s.restored(state);
};

template <class S>
concept SharesSaveOutcome = requires(const S& s, const std::filesystem::path& file,
                                     std::string_view chief_failure) {
  { s.save_outcome(file, chief_failure) } -> std::same_as<std::string>;
};

template <class S, class T>
concept SnapshotsBetweenSteps = requires(typename S::Replica& replica, std::span<T> state) {
  replica.template make_state_whole<T>(state);
};

template <class S>
concept FoldsAnyDeal = requires(S& s, const sharding::Deal& deal) {
  s.use_deal(deal);
};

template <class S>
concept Regroups = requires(S& s, const S& cs, const CommError& cause) {
  { cs.elastic() } -> std::same_as<const Elastic&>;
  { s.regroup(cause) } -> std::same_as<MembershipChange>;
  { s.withdraw() }
  noexcept;
};

template <class S>
concept KeepsShares = Regroups<S> && requires(const S& s) {
  { s.shares() } -> std::same_as<sharding::Shares>;
};

template <class S>
concept Grows = Regroups<S> && requires(S& s, const S& cs) {
  { s.joiners_waiting() } -> std::same_as<std::size_t>;
  { s.admit(std::size_t{}) } -> std::same_as<MembershipChange>;
  { cs.joined() } -> std::same_as<bool>;
};

template <class S>
concept TakesWorkersBack = requires(S& s, const S& cs, std::uint64_t step) {
  { cs.elastic() } -> std::same_as<const Elastic&>;
  s.tend_door();
  { cs.rejoined() } -> std::same_as<bool>;
  { s.resume_step(step) } -> std::same_as<std::uint64_t>;
};

template <class S, class T>
concept KeepsStripes = requires(S& s, const S& cs, std::span<T> values, std::uint64_t steps) {
  { cs.stripes_spread() } -> std::same_as<bool>;
  { cs.kept_step() } -> std::same_as<std::int64_t>;
  cs.rebuild_from_kept_state(values, values, steps);
  s.forget_stripes();
};

template <class S>
concept ChoosesGradientSum = requires(const S& s) {
  { s.gradient_sum_op() } -> std::same_as<ReduceOp>;
};

template <class S>
concept HasPlaces = requires(const S& s, std::size_t local_index) {
  { s.place(local_index) } -> std::same_as<typename DeviceOf<S>::Place>;
};

// Whether every worker of S takes every step together with the others: false for a parameter
// server under Async or BoundedStaleness, whose workers go at their own pace (so no step of the
// run is one they all share, for a checkpoint during a fit to be taken at).
template <class S>
inline constexpr bool kLockstep = true;

// The ReduceOp of the strategy's gradient sum (ChoosesGradientSum), else kSum.
template <class S>
ReduceOp gradient_sum_of(const S& s) {
  if constexpr (ChoosesGradientSum<S>) {
    return s.gradient_sum_op();
  } else {
    return ReduceOp::kSum;
  }
}

// Where local replica local_index of strategy lives: strategy.place(local_index), or the CPU's
// (empty) place for a strategy without places.
template <class S>
typename DeviceOf<S>::Place place_of(const S& strategy, std::size_t local_index) {
  if constexpr (HasPlaces<S>) {
    return strategy.place(local_index);
  } else {
    return {};
  }
}

}  // namespace cohort::strategy
