// The server side of the parameter server: one thread that takes requests in arrival order,
// validates them, applies pushes to its shard and answers pulls, each request at a time, so that
// an answer always carries a whole version of its chunk.
//
//   ps::Server<tcp::Tcp, float, optimizer::Adam, consistency::Sync> server(
//       transport, layout, {.server = s, .workers = W, .worker_timeout = 5min}, adam);
//   ps::ServerCounts counts = server.serve();   // one fit; throws CommError when Sync cannot go on
//
// Consistency (strategy/consistency.hpp) is a template parameter: the Sync bookkeeping below is
// compiled only into Server<..., Sync>.
//
// Settings (protocol.hpp): every worker presents its settings first; the server compares them
// with options.settings (its own) and the chief's, and a difference ends the fit with a
// ConfigError on this server and, in the answers to their requests, on every worker. A worker's
// parameters wait until every live worker has presented.
//
// Each worker's connection has its own receive state: a request is two frames (protocol.hpp),
// the Request then its payload, and the server takes a frame only once it has arrived whole
// (transport::Serving's wait_any), so a worker that stops in the middle of a frame holds back no
// other worker. A worker is silent when no whole frame came from it for worker_timeout while the
// server waits on it: since its last frame or the server's last answer to it, with no pull of it
// waiting here (a worker waiting in its pull waits on the server, not the other way round), and
// another worker shows that the job goes on without it: that one's pull waits here, or it spoke
// after the silent one's last frame and has since ended its fit or spoke within the last
// worker_timeout / 2. Otherwise every worker went quiet together, and the cause is more likely
// theirs in common (another server that stopped, under Sync a collective between workers that
// one of them stalls), which their own transfers name: the server then allows
// kCommonStallFactor x worker_timeout. Async and BoundedStaleness count a silent worker as lost
// and go on without it (the staleness bound counts live workers only). Sync needs the
// W - backup_workers lowest-indexed live workers of each step: a silent worker that leaves too
// few ends the run with a CommError naming it, which every worker waiting on this server receives
// in the answer to its pull. A server that holds no chunk waits on nobody.
//
// Bookkeeping per chunk: the parameters, the optimizer state (slot-major over the chunk), the
// number of updates applied, and per worker the pushes taken (`done`). A pull waits until its
// worker's pushes have settled (protocol.hpp): its worker at most K steps ahead of the slowest
// live worker; with K = 0 (Sync) the pushes of a step are held until the step's aggregate is
// complete, folded in the canonical tree over the step's micro-batches, each push a node of the
// micro-batches its worker was dealt (Request::leaves; device::cpu::reduce_tree), and applied
// once, and the pull waits for that.
//
// Global-norm clipping (the optimizer's max_gradient_norm), Sync: a step's chunks are summed as
// their pushes complete, then the servers exchange the sums of squares of their kNormBlock blocks
// and every server scales the step by the same factor, the one the mirrored strategies compute.
// Async and BoundedStaleness: each push is clipped by the worker, by its own norm.
//
// Backup workers (Sync only): with backup_workers = B, a step's aggregate is the pushes of the
// R = W - B lowest-indexed live workers; it is applied as soon as those R have pushed, scaled by
// inverse_batch x W / R, and every other push of that step is dropped (counted and reported; its
// worker's pull gets the new parameters). With B = 0 every worker is needed: a lost worker ends the
// run with an error naming it. An elastic job (regroups, below) regroups at a loss instead, and
// deals the micro-batches in the shares of the W workers it started with whatever its membership
// (shares_of, sharding::Deal): the R lowest-indexed workers of each membership take the first R
// shares and the others the next ones; a membership of fewer than R workers deals each several
// consecutive shares of the first R, a node of the tree over them, and needs every member's push.
// So every step aggregates the micro-batches, in the same tree and scale, of the job that lost
// none.
//
// Workers taken back (Async and BoundedStaleness, options.readmits; transport::Readmits): the
// process of a worker started again for its place asks this server for it between two frames.
// The server takes it in, losing the worker it replaces first where that one was not counted as
// lost yet (a launcher starts a process again only once the last one ended), and answers its
// kResume with the step after its last push here (protocol.hpp); a push of a step a chunk took
// already is dropped. The bound of BoundedStaleness counts it again from its first push: the
// others wait for it as for any live worker. Below options.min_workers live workers the fit ends
// with an error naming the ones lost, as it does when the chief is lost (it holds the door, and
// the fit's end brings the optimizer state home through it).
//
// Regrouping (Sync, options.regroups: an elastic job): a lost worker ends the membership, not
// the fit. The server tells every peer why as it leaves the mesh (end_membership), so that each
// worker's transfer fails naming the lost one and every process of the job, servers included,
// meets at the regroup's roll call (ParameterServer::regroup). serve() then returns with
// membership_lost, and serve_regrouped goes on over the mesh of the processes left. A step's
// chunks may part there: the ones whose aggregate was complete took the step, the others did not.
// So every chunk keeps its parameters from before its last update, and a pull of the parameters
// after `step` updates (the step the workers retry) gets those where the chunk took one more; the
// retried step's pushes to such a chunk are dropped, as late ones are. The other chunks fold the
// pushes of the workers left, dealt anew: the same tree, so the same bits.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/collective/wire.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/preemption.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/optimizer/schedule.hpp"
#include "cohort/strategy/consistency.hpp"
#include "cohort/strategy/parameter_server/protocol.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy::ps {

// "[a, b, c]": counts per worker, as the servers' lines and errors give them.
template <class Count>
std::string list(const std::vector<Count>& counts) {
  std::string text = "[";
  for (std::size_t i = 0; i < counts.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(counts[i]);
  }
  return text + "]";
}

// The workers' shares of the micro-batches in a synchronous job (sharding::Shares): one per
// worker of its membership, `workers`, each aggregated; with backup workers, one per worker it
// `started` with, whose shares an elastic job that lost some keeps, each step aggregating the first
// shares - backup_workers of them whatever its membership (the rule at the top). Both
// ParameterServer and Server ask it.
inline sharding::Shares shares_of(std::size_t workers, std::size_t started,
                                  std::size_t backup_workers) {
  if (backup_workers == 0) return sharding::Shares::of(workers);
  const std::size_t dealt = std::max(started, workers);
  return {.dealt = dealt, .aggregated = dealt - backup_workers};
}

struct ServerOptions {
  int server = 0;                  // this server's index
  int workers = 1;                 // W; worker w is transport rank w
  std::size_t backup_workers = 0;  // Sync only (ParameterServer checks)
  std::size_t started_workers = 0;  // the job's workers at its start (shares_of)
  // How long a worker may stay silent while this server waits on it (the rule at the top).
  std::chrono::milliseconds worker_timeout{std::chrono::minutes(5)};
  bool log_pushes = false;  // one line per push applied to this server's first chunk
  // This server's own settings, which every worker's must match (core/settings.hpp; the Trainer's
  // settings that a server holds too).
  settings::Fields settings{};
  // The learning-rate schedule, at this server's count of updates (under Sync the run's step).
  optimizer::Schedule schedule{};
  // The format pushes cross in (collective/wire.hpp): under kBfloat16 or kFloat16 a push carries
  // 2 bytes an element, each a node of the canonical tree of rounded sums, which the server widens
  // and merges the same way (ReduceOp::kSumBfloat16, kSumFloat16).
  collective::Wire wire = collective::Wire::kFloat32;
  // Async and BoundedStaleness: a lost worker's process started again takes its place back (the
  // rule at the top); the fit ends below min_workers live workers (0: never).
  bool readmits = false;
  std::size_t min_workers = 0;
  // Sync, elastic: a lost worker ends this membership rather than the fit (the rule at the top),
  // and each chunk keeps its parameters from before its last update.
  bool regroups = false;
};

// What one serve() did, for the end-of-fit summary and the tests.
struct ServerCounts {
  std::vector<std::uint64_t> applied;  // per worker: pushes applied (first chunk)
  std::vector<std::uint64_t>
      dropped;  // per worker: pushes dropped by the backup rule (first chunk)
  std::map<std::uint64_t, std::uint64_t> staleness;  // updates between a worker's pull and push
  std::vector<std::string> lost;                     // workers lost, with why
  std::uint64_t taken_back = 0;                      // workers' processes started again
  // How the workers' fit or segment ended (kDone's flags, protocol.hpp), and the run's step
  // there: the updates applied, which under Sync count the run's steps.
  FitEnd end = FitEnd::kReached;
  std::uint64_t step = 0;
  // Sync, regroups: the membership served lost a worker; the fit goes on in the next one
  // (serve_regrouped).
  bool membership_lost = false;
};

template <transport::Serving Tr, class T, class O, consistency::Consistency C = consistency::Sync>
class Server {
  static constexpr bool kSync = C::kStaleness == 0;

 public:
  Server(Tr& transport, const Layout& layout, ServerOptions options, const O& optimizer)
      : transport_(&transport), layout_(layout), options_(options), optimizer_(optimizer) {
    const auto& mine = layout_.chunks_of(options_.server);
    const auto workers = static_cast<std::size_t>(options_.workers);
    chunks_.resize(mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      State& chunk = chunks_[i];
      chunk.range = mine[i];
      chunk.parameters.assign(mine[i].size(), T{});
      chunk.state.assign(O::kStateSlots * mine[i].size(), T{});
      chunk.done.assign(workers, 0);
      chunk.pulled.assign(workers, 0);
      chunk.next_step.assign(workers, kNone);
      if constexpr (kSync) {
        chunk.contributions.assign(workers, std::vector<T>(mine[i].size()));
        chunk.pushed_step.assign(workers, kNone);
        chunk.pushed_leaves.assign(workers, 1);
      }
      // The longest payload a request may carry: an init's (parameters and optimizer state).
      max_payload_ = std::max(max_payload_, (1 + O::kStateSlots) * mine[i].size() * sizeof(T));
    }
    max_payload_ = std::max(max_payload_, settings::kMaxEncodedBytes);  // a kSettings's
    lost_.assign(workers, false);
    lost_at_.assign(workers, {});
    why_lost_.assign(workers, {});
    connections_.assign(workers, {});
  }

  // Serves one fit: waits for the chief's settings and init, then every worker's requests until
  // each has said it is done or was lost. Throws CommError when synchronous training cannot go
  // on, ConfigError when a worker's settings differ (protocol.hpp).
  ServerCounts serve() {
    const auto workers = static_cast<std::size_t>(options_.workers);
    finished_.assign(workers, false);
    presented_.assign(workers, false);
    reference_ = settings::Reference(options_.settings, me());
    refusals_.assign(workers, {});
    counts_ = {};
    counts_.applied.assign(workers, 0);
    counts_.dropped.assign(workers, 0);
    for (State& chunk : chunks_) {
      std::fill(chunk.done.begin(), chunk.done.end(), 0);
      std::fill(chunk.pulled.begin(), chunk.pulled.end(), chunk.updates);
      std::fill(chunk.pushed_step.begin(), chunk.pushed_step.end(), kNone);
      std::fill(chunk.next_step.begin(), chunk.next_step.end(), kNone);
      chunk.initialized = false;
    }
    return serve_membership();
  }

  // Sync, regroups: after serve() (or this) returned membership_lost, the workers and servers
  // left met as the mesh `next`, whose rank r was rank members[r] of the last one (workers first,
  // as ever). This server goes on with the same fit there: its chunks keep their parameters,
  // optimizer state and updates; what the workers had pushed of the step in progress is dropped
  // (they retry it dealt anew), and so are their settings, which they present again.
  ServerCounts serve_regrouped(Tr& next, std::span<const int> members) {
    adopt(next, members);
    return serve_membership();
  }

  // This server's shard as a checkpoint holds it: its chunks' parameters, then its optimizer
  // state slot-major over the shard's elements (step left for the save to set).
  checkpoint::ShardState<T> shard() const {
    checkpoint::ShardState<T> shard;
    shard.elements = layout_.elements();
    if (chunks_.empty()) return shard;
    shard.begin = chunks_.front().range.begin;
    shard.end = chunks_.back().range.end;
    const std::size_t length = shard.end - shard.begin;
    shard.optimizer_state.resize(O::kStateSlots * length);
    for (const State& chunk : chunks_) {
      shard.parameters.insert(shard.parameters.end(), chunk.parameters.begin(),
                              chunk.parameters.end());
      const std::size_t size = chunk.parameters.size();
      for (std::size_t slot = 0; slot < O::kStateSlots; ++slot) {
        std::copy_n(
            chunk.state.begin() + static_cast<std::ptrdiff_t>(slot * size), size,
            shard.optimizer_state.begin() +
                static_cast<std::ptrdiff_t>(slot * length + chunk.range.begin - shard.begin));
      }
    }
    return shard;
  }

 private:
  // The workers' requests until each has said it is done or was lost, or, where the job regroups,
  // until one is lost.
  ServerCounts serve_membership() {
    const auto start = Clock::now();
    for (Connection& connection : connections_) {
      connection = {.heard = start, .request = std::nullopt};
    }
    std::vector<int> listening;
    bool was_initialized = false;
    while (true) {
      listening.clear();
      // The chief's settings are the reference for the others', its parameters their start.
      const bool initialized =
          presented_[0] && std::all_of(chunks_.begin(), chunks_.end(),
                                       [](const State& chunk) { return chunk.initialized; });
      if (initialized && !was_initialized) {
        // The other workers are heard from now on: their silence counts from here.
        was_initialized = true;
        for (std::size_t w = 1; w < connections_.size(); ++w) connections_[w].heard = Clock::now();
      }
      for (int worker = 0; worker < options_.workers; ++worker) {
        if (lost_[static_cast<std::size_t>(worker)] ||
            finished_[static_cast<std::size_t>(worker)]) {
          continue;
        }
        if (!initialized && worker != 0) continue;  // the chief's parameters come first
        listening.push_back(worker);
      }
      if (listening.empty()) {
        if (!initialized && !all_ended()) {
          fail(
              "the chief (worker 0) was lost before it sent its settings and the initial "
              "parameters");
        }
        break;
      }
      const int worker = transport_->wait_any(listening, kPoll);
      if (worker >= 0) take_frame(worker);
      if (!counts_.membership_lost) lose_silent(listening);
      if (counts_.membership_lost) return counts_;
      if constexpr (!kSync && transport::Readmits<Tr>) {
        if (options_.readmits && initialized) take_back();
      }
    }
    return counts_;
  }

  using Clock = std::chrono::steady_clock;
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  // How long one wait for a whole frame lasts before the server looks for silent workers.
  static constexpr std::chrono::milliseconds kPoll{100};
  // When every worker went quiet together, the server waits this many times worker_timeout:
  // their common cause (another server, a collective between workers) is theirs to name, and
  // their transfers give up after 3/2 x timeout (ParameterServer).
  static constexpr int kCommonStallFactor = 2;

  // One worker's connection: what arrived from it last, and the request whose payload frame is
  // awaited (a request is a Request frame, then its payload frame).
  struct Connection {
    Clock::time_point heard;  // its last whole frame, or this server's last answer to it
    std::optional<Request> request;
  };

  struct State {
    Chunk range{};
    std::vector<T> parameters;
    std::vector<T> state;
    std::vector<T> previous;  // regroups: the parameters before the last update
    std::uint64_t updates = 0;
    bool initialized = false;
    std::vector<std::uint64_t> done;    // per worker: pushes taken in this fit
    std::vector<std::uint64_t> pulled;  // per worker: `updates` when it last got parameters
    // Async and BoundedStaleness: per worker, the step its next push carries (kNone: none yet).
    std::vector<std::uint64_t> next_step;
    // Sync: each worker's push of the step in progress, which step it was (kNone: none), and how
    // many micro-batches it sums.
    std::vector<std::vector<T>> contributions;
    std::vector<std::uint64_t> pushed_step;
    std::vector<std::size_t> pushed_leaves;
    double inverse_batch = 1.0;  // of the step in progress
    // Sync: the step's aggregate, waiting for the global norm when clipping, and its scale.
    std::vector<T> sum;
    bool summed = false;
    double scale = 1.0;
  };

  // A pull waiting for its worker's pushes to settle.
  struct Pending {
    int worker;
    std::size_t chunk;
    Request request;
  };

  bool all_ended() const {
    for (std::size_t w = 0; w < lost_.size(); ++w) {
      if (!lost_[w] && !finished_[w]) return false;
    }
    return true;
  }

  std::string who(int worker) const {
    return "worker " + std::to_string(worker) + " (rank " + std::to_string(worker) + ")";
  }
  std::string me() const { return "parameter server " + std::to_string(options_.server); }

  // Takes the next frame from `worker`, which has arrived whole (wait_any): a Request, kept until
  // its payload frame arrives, or that payload, which completes the request.
  void take_frame(int worker) {
    Connection& connection = connections_[static_cast<std::size_t>(worker)];
    if (!connection.request) {
      Request request;
      if (!receive(worker, tag::kRequest, std::as_writable_bytes(std::span(&request, 1)))) return;
      connection.request = request;
      connection.heard = Clock::now();
      return;
    }
    const Request request = *std::exchange(connection.request, std::nullopt);
    connection.heard = Clock::now();
    take_request(worker, request);
  }

  // One frame from `worker` into `bytes`; false when its connection failed (it is then lost).
  bool receive(int worker, std::uint64_t frame_tag, std::span<std::byte> bytes) {
    try {
      const transport::Receive receive{worker, header(frame_tag), bytes};
      transport_->transfer({}, std::span(&receive, 1));
      return true;
    } catch (const CommError& error) {
      lose(worker, error.what());
      return false;
    }
  }

  // A request whose payload frame has arrived whole: receives the payload and acts on it.
  void take_request(int worker, const Request& request) {
    if (request.payload_bytes > max_payload_) {
      // No buffer is made for it, and the stream cannot be kept in step without reading it.
      lose(worker,
           "it announced a payload of payload_bytes = " + std::to_string(request.payload_bytes) +
               ", more than any request to this "
               "server carries (" +
               std::to_string(max_payload_) + ")");
      return;
    }
    const std::string field = validate(worker, request);
    const auto operation = static_cast<Operation>(request.operation);
    State* chunk = field.empty() && about_chunk(operation) ? &chunks_[request.chunk] : nullptr;
    // The payload is read whatever the verdict, so that the stream stays in step: a Sync push in
    // its own type straight into its worker's contribution, anything else into scratch (a
    // narrow push is widened from there).
    const bool narrow = field.empty() && operation == Operation::kPush &&
                        options_.wire != collective::Wire::kFloat32;
    const bool contribution = kSync && field.empty() && operation == Operation::kPush && !narrow;
    std::span<std::byte> payload;
    if constexpr (kSync) {
      if (contribution) {
        payload = std::as_writable_bytes(
            std::span(chunk->contributions[static_cast<std::size_t>(worker)]));
      }
    }
    if (!contribution) {
      scratch_.resize(request.payload_bytes);
      payload = std::span(scratch_);
    }
    if (!receive(worker, tag::kRequestPayload, payload)) return;
    if (narrow) widen_push(worker, *chunk);
    if (!field.empty()) {
      const std::string message = me() + ": refused " + std::string(name(operation)) + " from " +
                                  who(worker) + ": " + field;
      std::fprintf(stderr, "cohort: %s\n", message.c_str());
      if (answered(request)) {
        reply_error(worker, request, message);
      } else {
        // The worker learns it from the answer to its next pull.
        refusals_[static_cast<std::size_t>(worker)] = message;
        progress();
      }
      return;
    }
    switch (operation) {
      case Operation::kInit: {
        const std::size_t length = chunk->parameters.size();
        const auto values =
            std::span(reinterpret_cast<const T*>(scratch_.data()), (1 + O::kStateSlots) * length);
        std::copy_n(values.begin(), length, chunk->parameters.begin());
        std::copy(values.begin() + static_cast<std::ptrdiff_t>(length), values.end(),
                  chunk->state.begin());
        chunk->updates = request.step;  // updates counted so far: the run's step
        first_step_ = request.step;
        std::fill(chunk->pulled.begin(), chunk->pulled.end(), chunk->updates);
        chunk->initialized = true;
        reply(worker, request, chunk->updates, {});
        return;
      }
      case Operation::kPull:
        // Answered by progress(), in arrival order, once the worker's pushes have settled.
        pending_.push_back({worker, request.chunk, request});
        progress();
        return;
      case Operation::kPullState:
        reply(worker, request, chunk->updates, std::as_bytes(std::span(chunk->state)));
        return;
      case Operation::kDone:
        finished_[static_cast<std::size_t>(worker)] = true;
        if (worker == 0) counts_.step = request.step;  // the chief's: the run's step
        if ((request.flags & kPreempted) != 0) counts_.end = FitEnd::kPreempted;
        if ((request.flags & kCheckpoint) != 0 && counts_.end != FitEnd::kPreempted) {
          counts_.end = FitEnd::kCheckpoint;
        }
        if ((request.flags & kAdmit) != 0) counts_.end = FitEnd::kAdmit;
        reply(worker, request, 0, {});
        progress();
        return;
      case Operation::kSettings:
        take_settings(worker, request);
        return;
      case Operation::kResume:
      case Operation::kWorking: {
        Reply answer;
        answer.operation = request.operation;
        answer.updates = operation == Operation::kResume
                             ? resume_step(static_cast<std::size_t>(worker))
                             : working_besides(worker, std::chrono::milliseconds(request.step));
        send(worker, answer, {});
        return;
      }
      case Operation::kPush: {
        const trace::Span span(trace::current(), trace::Phase::kPush,
                               {.step = request.step,
                                .index = static_cast<std::uint64_t>(worker),
                                .bytes = request.payload_bytes});
        push(worker, request, *chunk);
        progress();  // pulls the push let go
        return;
      }
    }
  }

  static bool about_chunk(Operation operation) {
    return operation != Operation::kDone && operation != Operation::kSettings &&
           operation != Operation::kResume && operation != Operation::kWorking;
  }

  // A worker's settings (protocol.hpp): compared with this server's and the chief's; a
  // difference ends the fit on every process.
  void take_settings(int worker, const Request& request) {
    const auto theirs =
        settings::decode(std::span<const std::byte>(scratch_).first(request.payload_bytes));
    if (!theirs) {
      reply_error(worker, request,
                  me() + ": refused settings from " + who(worker) + ": not a list of settings");
      return;
    }
    const std::string differs = reference_.compare(*theirs, "worker " + std::to_string(worker));
    if (!differs.empty()) {
      reply_error(worker, request, differs, kSettingsDiffer);
      end_fit(differs, kSettingsDiffer);
      throw ConfigError(differs);
    }
    presented_[static_cast<std::size_t>(worker)] = true;
    reply(worker, request, 0, {});
    progress();  // the pulls that waited for this worker's settings
  }

  // Whether every live worker has presented its settings.
  bool all_presented() const {
    for (std::size_t w = 0; w < lost_.size(); ++w) {
      if (!lost_[w] && !finished_[w] && !presented_[w]) return false;
    }
    return true;
  }

  // Whether the sender waits for an answer: to every request but a push, and to any request of
  // another protocol version, so that its sender hears why it is refused.
  static bool answered(const Request& request) {
    return request.version != kProtocolVersion ||
           request.operation != static_cast<std::uint16_t>(Operation::kPush);
  }

  // "" when the request is well formed for this server, else "field = value: why".
  std::string validate(int worker, const Request& request) const {
    const auto is = [](std::string_view field, auto value, const std::string& why) {
      return std::string(field) + " = " + std::to_string(value) + ": " + why;
    };
    if (request.version != kProtocolVersion) {
      return is("version", request.version,
                "this server speaks protocol version " + std::to_string(kProtocolVersion));
    }
    if (request.operation < static_cast<std::uint16_t>(Operation::kInit) ||
        request.operation > static_cast<std::uint16_t>(Operation::kWorking)) {
      return is("operation", request.operation, "not an operation");
    }
    if (request.worker != static_cast<std::uint32_t>(worker)) {
      return is("worker", request.worker,
                "the connection belongs to worker " + std::to_string(worker));
    }
    const auto operation = static_cast<Operation>(request.operation);
    if (!about_chunk(operation)) return {};
    const std::size_t element_bytes =
        operation == Operation::kPush ? push_element_bytes() : sizeof(T);
    if (request.element_bytes != element_bytes) {
      return is("element_bytes", request.element_bytes,
                operation == Operation::kPush
                    ? "a push to this server carries elements of " + std::to_string(element_bytes) +
                          " bytes (wire " + std::string(collective::name(options_.wire)) + ")"
                    : "this server holds elements of " + std::to_string(sizeof(T)) + " bytes");
    }
    if (request.shard != static_cast<std::uint32_t>(options_.server)) {
      return is("shard", request.shard,
                "this is server " + std::to_string(options_.server) + ", which holds shard " +
                    std::to_string(options_.server) + " only");
    }
    if (request.chunk >= chunks_.size()) {
      return is("chunk", request.chunk,
                "shard " + std::to_string(options_.server) + " has " +
                    std::to_string(chunks_.size()) + " chunks");
    }
    const State& chunk = chunks_[request.chunk];
    const std::size_t length = chunk.parameters.size();
    if (request.length != length) {
      return is("length", request.length,
                "chunk " + std::to_string(request.chunk) + " of shard " +
                    std::to_string(options_.server) + " has " + std::to_string(length) +
                    " elements");
    }
    const std::size_t payload = request_elements(operation, length, O::kStateSlots) * element_bytes;
    if (request.payload_bytes != payload) {
      return is("payload_bytes", request.payload_bytes,
                "a " + std::string(name(operation)) + " of this chunk carries " +
                    std::to_string(payload) + " bytes");
    }
    const std::size_t reply = reply_elements(operation, length, O::kStateSlots) * sizeof(T);
    if (request.reply_bytes != reply) {
      return is("reply_bytes", request.reply_bytes,
                "a " + std::string(name(operation)) + " of this chunk returns " +
                    std::to_string(reply) + " bytes");
    }
    if (operation != Operation::kInit && !chunk.initialized) {
      return is("chunk", request.chunk, "not initialized yet (the chief sends init first)");
    }
    if (operation == Operation::kInit && worker != 0) {
      return is("worker", request.worker, "only the chief (worker 0) initializes");
    }
    if (operation == Operation::kPush && request.leaves == 0) {
      return is("leaves", request.leaves, "a push sums at least one micro-batch");
    }
    if constexpr (kSync) {
      if (operation == Operation::kPush && request.step > chunk.updates) {
        return is("step", request.step,
                  "the step in progress is " + std::to_string(chunk.updates) +
                      "; synchronous workers cannot run ahead");
      }
    }
    return {};
  }

  void push(int worker, const Request& request, State& chunk) {
    const auto w = static_cast<std::size_t>(worker);
    if constexpr (kSync) {
      if (request.step < chunk.updates || chunk.summed) {
        // A backup worker's late push: its step was aggregated without it.
        if (chunk.range.index == 0) ++counts_.dropped[w];
        ++chunk.done[w];
        return;
      }
      chunk.pushed_step[w] = request.step;
      chunk.pushed_leaves[w] = request.leaves;
      chunk.inverse_batch = request.inverse_batch;
      ++chunk.done[w];
      try_aggregate(chunk);
      return;
    }
    if (chunk.next_step[w] != kNone && request.step < chunk.next_step[w]) {
      return;  // taken already, from the process lost in the middle of this step's pushes
    }
    chunk.next_step[w] = request.step + 1;
    const std::span<const T> gradient =
        options_.wire != collective::Wire::kFloat32
            ? std::span<const T>(widened_)
            : std::span(reinterpret_cast<const T*>(scratch_.data()), chunk.parameters.size());
    if (chunk.range.index == 0) {
      const std::uint64_t staleness = chunk.updates - chunk.pulled[w];
      ++counts_.staleness[staleness];
      ++counts_.applied[w];
      if (options_.log_pushes) {
        std::fprintf(stderr,
                     "cohort ps %d: applied push %llu of worker %d (the slowest live worker has "
                     "pushed %llu; staleness %llu)\n",
                     options_.server, static_cast<unsigned long long>(chunk.done[w]), worker,
                     static_cast<unsigned long long>(slowest(chunk)),
                     static_cast<unsigned long long>(staleness));
      }
    }
    ++chunk.updates;
    optimizer_.step(std::span(chunk.parameters), gradient, std::span(chunk.state),
                    optimizer::StepContext{
                        .step = chunk.updates,
                        .gradient_scale = request.inverse_batch,
                        .learning_rate_factor = options_.schedule.factor(chunk.updates - 1)});
    ++chunk.done[w];
  }

  // The bytes of an element of a push (ServerOptions::wire).
  std::size_t push_element_bytes() const {
    return collective::element_bytes(options_.wire, sizeof(T));
  }

  // A narrow push of `worker`, as received into scratch, widened where it is taken: under Sync
  // its worker's contribution to the chunk, otherwise the gradient push() applies.
  void widen_push(int worker, State& chunk) {
    std::vector<T>* into = &widened_;
    if constexpr (kSync) into = &chunk.contributions[static_cast<std::size_t>(worker)];
    into->resize(chunk.parameters.size());
    collective::widen(
        options_.wire,
        std::span(reinterpret_cast<const std::uint16_t*>(scratch_.data()), into->size()),
        std::span(*into));
  }

  // Sync: applies the step in progress once its aggregate is complete.
  void try_aggregate(State& chunk) {
    if (chunk.summed) return;  // waiting for the other chunks' sums (clipping)
    const sharding::Shares kept = shares();
    // The pushes of the aggregated shares' lowest-indexed live workers; in an elastic job that
    // lost more workers than its backups, every member's, which together hold those shares.
    const std::size_t needed = std::min(kept.aggregated, lost_.size());
    std::vector<const T*> inputs;
    std::vector<std::size_t> chosen;
    std::vector<std::size_t> leaves;
    for (std::size_t w = 0; w < lost_.size() && chosen.size() < needed; ++w) {
      if (lost_[w]) continue;
      if (chunk.pushed_step[w] != chunk.updates) return;  // one of the R has not pushed yet
      chosen.push_back(w);
      inputs.push_back(chunk.contributions[w].data());
      leaves.push_back(chunk.pushed_leaves[w]);
    }
    if (chosen.size() < needed) return;  // too few live workers: lose() reports it
    // Every worker's push: each a node of its micro-batches (backup workers are dealt equal
    // shares of a power of two, ParameterServer checks, so the pushes of R shares fold as the
    // tree over R leaves, whichever workers hold them).
    const bool whole = kept.aggregated == kept.dealt;
    if (!tree::are_nodes(leaves)) {
      fail("the pushes of step " + std::to_string(chunk.updates) + " sum " + list(leaves) +
           " micro-batches (workers 0 to " + std::to_string(chosen.size() - 1) +
           "), which are not consecutive nodes of the reduction tree: the workers were dealt "
           "different micro-batches");
    }
    if (chunk.range.index == 0) {
      for (std::size_t w = 0; w < lost_.size(); ++w) {
        const bool taken = std::find(chosen.begin(), chosen.end(), w) != chosen.end();
        if (taken) ++counts_.applied[w];
        if (!taken && chunk.pushed_step[w] == chunk.updates) ++counts_.dropped[w];
      }
      if (options_.log_pushes) {
        std::fprintf(stderr, "cohort ps %d: applied step %llu from %zu workers\n", options_.server,
                     static_cast<unsigned long long>(chunk.updates), chosen.size());
      }
    }
    // The canonical tree over the chosen workers' micro-batches, in index order: with every
    // share aggregated, the tree over the step's micro-batches, as the mirrored strategies'
    // all-reduce computes it.
    chunk.sum.resize(chunk.parameters.size());
    device::cpu::reduce_tree<T>(collective::gradient_sum(options_.wire),
                                std::span<const T* const>(inputs), std::span(chunk.sum),
                                std::span<const std::size_t>(leaves));
    chunk.scale = whole ? inverse_batch_of(chunk)
                        : inverse_batch_of(chunk) * static_cast<double>(kept.dealt) /
                              static_cast<double>(kept.aggregated);
    chunk.summed = true;
    const double max_norm = optimizer_.options().max_gradient_norm;
    if (max_norm <= 0.0) {
      apply(chunk, chunk.scale);
      return;
    }
    // Global-norm clipping: the factor needs the norm of the whole aggregate, so the step is
    // applied once every chunk of every shard is summed.
    if (!std::all_of(chunks_.begin(), chunks_.end(), [](const State& c) { return c.summed; })) {
      return;
    }
    const double factor =
        optimizer::clipping_factor(global_sum_of_squares(), chunk.scale, max_norm);
    for (State& each : chunks_) apply(each, each.scale * factor);
  }

  void apply(State& chunk, double scale) {
    const trace::Span span(trace::current(), trace::Phase::kApply,
                           {.step = chunk.updates, .index = chunk.range.index});
    chunk.summed = false;
    ++chunk.updates;
    const optimizer::StepContext context{
        .step = chunk.updates,
        .gradient_scale = scale,
        .learning_rate_factor = options_.schedule.factor(chunk.updates - 1)};
    if (!options_.regroups) {
      optimizer_.step(std::span(chunk.parameters), std::span<const T>(chunk.sum),
                      std::span(chunk.state), context);
      return;
    }
    // The parameters before the update stay, as `previous`; the update writes the other buffer.
    std::swap(chunk.previous, chunk.parameters);
    chunk.parameters.resize(chunk.previous.size());
    device::cpu::step_into(optimizer_, std::span<const T>(chunk.previous),
                           std::span(chunk.parameters), std::span<const T>(chunk.sum),
                           std::span(chunk.state), context);
  }

  // The sum of squares of the step's whole aggregate, as device::cpu::sum_of_squares computes it
  // over the whole vector: every server holding a shard sends the others the sums of its
  // kNormBlock blocks (shards and chunks are block-aligned when clipping: ParameterServer checks),
  // and each combines all blocks in the canonical tree, so every server gets the same bits.
  double global_sum_of_squares() {
    std::vector<std::vector<double>> blocks(static_cast<std::size_t>(layout_.servers()));
    auto& mine = blocks[static_cast<std::size_t>(options_.server)];
    for (const State& chunk : chunks_) {
      const std::span<const T> sum(chunk.sum);
      for (std::size_t block = 0; block * device::cpu::kNormBlock < sum.size(); ++block) {
        mine.push_back(device::cpu::block_sum_of_squares(sum, block));
      }
    }
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    for (int server = 0; server < layout_.servers(); ++server) {
      const auto& chunks = layout_.chunks_of(server);
      if (server == options_.server || chunks.empty()) continue;
      const std::size_t elements = chunks.back().end - chunks.front().begin;
      auto& theirs = blocks[static_cast<std::size_t>(server)];
      theirs.resize((elements + device::cpu::kNormBlock - 1) / device::cpu::kNormBlock);
      const int peer = options_.workers + server;
      sends.push_back({peer, header(tag::kNormBlocks), std::as_bytes(std::span(mine))});
      receives.push_back(
          {peer, header(tag::kNormBlocks), std::as_writable_bytes(std::span(theirs))});
    }
    try {
      transport_->transfer(sends, receives);
    } catch (const CommError& error) {
      fail(std::string("exchanging the gradient norm's block sums with the other servers "
                       "failed: ") +
           error.what());
    }
    std::vector<double> all;
    for (const auto& part : blocks) all.insert(all.end(), part.begin(), part.end());
    return device::cpu::combine_block_sums(all.size(),
                                           [&](std::size_t block) { return all[block]; });
  }

  double inverse_batch_of(const State& chunk) const { return chunk.inverse_batch; }
  sharding::Shares shares() const {
    return shares_of(static_cast<std::size_t>(options_.workers), options_.started_workers,
                     options_.backup_workers);
  }

  // The fewest pushes taken from a live worker that has not finished.
  std::uint64_t slowest(const State& chunk) const {
    std::uint64_t least = kNone;
    for (std::size_t w = 0; w < lost_.size(); ++w) {
      if (!lost_[w] && !finished_[w]) least = std::min(least, chunk.done[w]);
    }
    return least;
  }

  // Whether worker w's pushes to `chunk` have settled, so that its pull may be answered: under
  // Sync every step it pushed is applied (a late push's step was applied without it); otherwise
  // it is at most K pushes ahead of the slowest live worker.
  bool settled(const State& chunk, std::size_t w) const {
    if constexpr (kSync) {
      return chunk.pushed_step[w] == kNone || chunk.updates > chunk.pushed_step[w];
    } else {
      const std::uint64_t least = slowest(chunk);
      return least == kNone || chunk.done[w] - std::min(least, chunk.done[w]) <= C::kStaleness;
    }
  }

  // Answers every pull whose worker's pushes have settled, in arrival order: a worker pulls in the
  // order it pushed, and a later chunk never settles before an earlier one, so its answers leave
  // in the order it asked.
  void progress() {
    if (counts_.membership_lost) return;
    for (std::size_t i = 0; i < pending_.size();) {
      const Pending pending = pending_[i];
      State& chunk = chunks_[pending.chunk];
      const auto w = static_cast<std::size_t>(pending.worker);
      if (lost_[w]) {
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      // A worker that presented its settings gets parameters once every live worker has.
      const bool held = presented_[w] && !all_presented();
      if (refusals_[w].empty() && (held || !settled(chunk, w))) {
        ++i;
        continue;
      }
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      answer_pull(pending, chunk);
      i = 0;  // an answer may have lost a worker, which changes who is settled
    }
  }

  // The answer to a pull: the chunk's parameters, or why a push of its worker was refused.
  void answer_pull(const Pending& pending, State& chunk) {
    const auto w = static_cast<std::size_t>(pending.worker);
    if (!refusals_[w].empty()) {
      reply_error(pending.worker, pending.request, std::exchange(refusals_[w], {}));
      return;
    }
    // A regrouped job's pull of the step it retries, where this chunk took that step already.
    const bool before_last = options_.regroups && pending.request.step + 1 == chunk.updates;
    const std::uint64_t version = before_last ? pending.request.step : chunk.updates;
    const trace::Span span(
        trace::current(), trace::Phase::kPull,
        {.step = version, .index = w, .bytes = chunk.parameters.size() * sizeof(T)});
    chunk.pulled[w] = chunk.updates;
    reply(pending.worker, pending.request, version,
          std::as_bytes(std::span(before_last ? chunk.previous : chunk.parameters)));
  }

  void reply(int worker, const Request& request, std::uint64_t updates,
             std::span<const std::byte> payload) {
    Reply answer;
    answer.operation = request.operation;
    answer.chunk = request.chunk;
    answer.updates = updates;
    send(worker, answer, payload);
    // The worker computes from here on: its silence counts from this answer.
    connections_[static_cast<std::size_t>(worker)].heard = Clock::now();
  }

  void reply_error(int worker, const Request& request, const std::string& message,
                   std::uint16_t status = kRefused) {
    Reply answer;
    answer.status = status;
    answer.operation = request.operation;
    answer.chunk = request.chunk;
    set_message(answer.message, message);
    zeros_.assign(request.reply_bytes, std::byte{0});
    send(worker, answer, zeros_);
  }

  void send(int worker, Reply answer, std::span<const std::byte> payload) {
    // The workers decide when to stop (trainer/vote.hpp); a signalled server only tells
    // them.
    if (counts_.end == FitEnd::kPreempted || preemption::requested() != 0) {
      answer.flags |= kPreempted;
    }
    const transport::Send sends[] = {
        {worker, header(tag::kReply), std::as_bytes(std::span(&answer, 1))},
        {worker, header(tag::kReplyPayload), payload}};
    try {
      transport_->transfer(sends, {});
    } catch (const CommError& error) {
      lose(worker, error.what());
    }
  }

  void lose(int worker, const std::string& why) {
    // Once the membership is lost, every connection fails: that says nothing of the workers.
    if (counts_.membership_lost) return;
    if (mark_lost(worker, why)) after_loss();
  }

  // Records worker `worker` as lost for good, once; false if it already was.
  bool mark_lost(int worker, const std::string& why) {
    const auto w = static_cast<std::size_t>(worker);
    if (lost_[w]) return false;
    lost_[w] = true;
    lost_at_[w] = Clock::now();
    why_lost_[w] = why;
    connections_[w].request.reset();
    const std::string message = me() + ": lost " + who(worker) + ": " + why;
    std::fprintf(stderr, "cohort: %s\n", message.c_str());
    counts_.lost.push_back(message);
    return true;
  }

  // What the losses change: Sync fails when too few live workers remain for a step (naming every
  // lost worker that had not finished) and otherwise aggregates without them; every mode answers
  // the pulls that no longer wait for them.
  void after_loss() {
    if constexpr (kSync) {
      if (options_.regroups) {
        end_membership();
        return;
      }
      std::size_t live = 0;
      std::string lost;
      for (std::size_t w = 0; w < lost_.size(); ++w) {
        live += lost_[w] ? 0 : 1;
        if (lost_[w] && !finished_[w]) {
          lost += who(static_cast<int>(w)) + " was lost (" + why_lost_[w] + "); ";
        }
      }
      const std::size_t needed = shares().aggregated;
      if (live < needed && !lost.empty()) {
        fail(lost + "synchronous training needs " + std::to_string(needed) + " of " +
             std::to_string(options_.workers) +
             " workers (backup_workers = " + std::to_string(options_.backup_workers) + ")");
      }
      for (State& chunk : chunks_) try_aggregate(chunk);
    } else {
      if (options_.readmits && lost_[0] && !finished_[0]) {
        fail(who(0) + " was lost (" + why_lost_[0] +
             "): the chief holds the job's door and brings the optimizer state home, so the "
             "job cannot go on without it; restart it from its last checkpoint");
      }
      const auto live = static_cast<std::size_t>(std::count(lost_.begin(), lost_.end(), false));
      if (live < options_.min_workers) {
        std::string lost;
        for (std::size_t w = 0; w < lost_.size(); ++w) {
          if (lost_[w]) lost += who(static_cast<int>(w)) + " was lost (" + why_lost_[w] + "); ";
        }
        fail(lost +
             "the job goes on with at least min_workers = " + std::to_string(options_.min_workers) +
             " of " + std::to_string(options_.workers) + " workers");
      }
    }
    progress();
  }

  // Sync, regroups: a worker was lost, so every process of the job regroups (the rule at the
  // top). This server tells every peer why, as it leaves this mesh: a worker waiting on it fails
  // with that cause, and its failure tells the other servers.
  [[gnu::cold]] void end_membership() {
    std::string lost;
    for (std::size_t w = 0; w < lost_.size(); ++w) {
      if (lost_[w]) lost += who(static_cast<int>(w)) + " was lost (" + why_lost_[w] + "); ";
    }
    // This thread runs every transfer here, and a failed one did not leave the mesh (the
    // failures are isolated), so it leaves now.
    transport_->leave(me() + ": " + lost + "the job regroups without it");
    counts_.membership_lost = true;
    pending_.clear();
  }

  // The mesh `next` of the membership after a loss (serve_regrouped): per-worker state follows
  // each worker to its new index.
  [[gnu::cold]] void adopt(Tr& next, std::span<const int> members) {
    transport_ = &next;
    std::vector<std::size_t> kept;  // by new worker index: the old one
    for (const int rank : members) {
      if (rank < options_.workers) kept.push_back(static_cast<std::size_t>(rank));
    }
    const auto follow = [&](auto& per_worker) {
      auto old = std::move(per_worker);
      per_worker.clear();
      for (const std::size_t w : kept) per_worker.push_back(std::move(old[w]));
    };
    const std::size_t workers = kept.size();
    options_.workers = static_cast<int>(workers);
    for (State& chunk : chunks_) {
      follow(chunk.done);
      follow(chunk.pulled);
      follow(chunk.next_step);
      if constexpr (kSync) {
        follow(chunk.contributions);
        chunk.pushed_step.assign(workers, kNone);
        chunk.pushed_leaves.assign(workers, 1);
        chunk.summed = false;
      }
    }
    follow(counts_.applied);
    follow(counts_.dropped);
    lost_.assign(workers, false);
    lost_at_.assign(workers, {});
    why_lost_.assign(workers, {});
    connections_.assign(workers, {});
    finished_.assign(workers, false);
    presented_.assign(workers, false);
    // The chief's settings are the reference again: the job's replicas are fewer now.
    reference_ = settings::Reference(options_.settings, me());
    refusals_.assign(workers, {});
    counts_.membership_lost = false;
  }

  // A worker's process started again, waiting to take its place back (the rule at the top of
  // this file): taken in, after the worker it replaces is counted as lost.
  void take_back() {
    const int worker = transport_->readmission_waiting();
    if (worker < 0) return;
    if (worker >= options_.workers) {
      transport_->refuse_readmission(worker, me() + ": rank " + std::to_string(worker) +
                                                 " is a parameter server, which no process takes "
                                                 "back");
      return;
    }
    const auto w = static_cast<std::size_t>(worker);
    if (finished_[w]) {
      transport_->refuse_readmission(worker, me() + ": " + who(worker) + " ended this fit");
      return;
    }
    // What the process it replaces had in flight here is forgotten, its pulls with it.
    mark_lost(worker, "a process started again for it takes its place");
    std::erase_if(pending_, [&](const Pending& pending) { return pending.worker == worker; });
    if (!transport_->readmit(worker)) {
      after_loss();  // it left meanwhile: lost as any other
      return;
    }
    lost_[w] = false;
    why_lost_[w].clear();
    refusals_[w].clear();
    connections_[w] = {.heard = Clock::now(), .request = std::nullopt};
    ++counts_.taken_back;
    std::fprintf(stderr, "cohort: %s: took back %s, started again\n", me().c_str(),
                 who(worker).c_str());
  }

  // The workers other than `asker` that have not ended this fit and are live, or were lost less
  // than `grace` ago (their processes may come back: take_back).
  std::uint64_t working_besides(int asker, std::chrono::milliseconds grace) const {
    const auto now = Clock::now();
    std::uint64_t working = 0;
    for (std::size_t w = 0; w < lost_.size(); ++w) {
      if (static_cast<int>(w) == asker || finished_[w]) continue;
      if (!lost_[w] || now - lost_at_[w] < grace) ++working;
    }
    return working;
  }

  // Async and BoundedStaleness: the step worker w's fit goes on from, as this server knows it:
  // after its last push to each chunk, the earliest (the fit's first where it pushed nothing).
  std::uint64_t resume_step(std::size_t w) const {
    std::uint64_t step = kNone;
    for (const State& chunk : chunks_) {
      step = std::min(step, chunk.next_step[w] == kNone ? first_step_ : chunk.next_step[w]);
    }
    return step;
  }

  // Loses every listened-to worker that has been silent past its deadline (the rule at the top
  // of this file), all at once, so that a Sync failure names every one of them. A worker whose
  // pull waits here waits on this server, not the other way round. Once per frame, so it costs
  // one pass over the pulls and one over the workers, whatever their number.
  void lose_silent(std::span<const int> listening) {
    if (chunks_.empty()) return;  // this server waits on nobody: only the workers' done arrives
    const auto now = Clock::now();
    waiting_.assign(connections_.size(), false);
    for (const Pending& pending : pending_) {
      const auto w = static_cast<std::size_t>(pending.worker);
      waiting_[w] = !lost_[w];
    }
    // What shows that the job goes on without a silent worker: another worker's pull waiting
    // here, or a frame from a live worker that has since ended its fit or spoke within the last
    // worker_timeout / 2, if it came after the silent one's last. A frame that merely came after
    // it does not: under Sync the workers' last frames before a collective between them that one
    // stalls are milliseconds apart.
    const bool a_pull_waits = std::find(waiting_.begin(), waiting_.end(), true) != waiting_.end();
    std::optional<Clock::time_point> going_on;
    for (std::size_t w = 0; w < connections_.size(); ++w) {
      const auto heard = connections_[w].heard;
      if (!lost_[w] && (finished_[w] || now - heard < options_.worker_timeout / 2)) {
        going_on = std::max(going_on.value_or(heard), heard);
      }
    }
    bool any = false;
    for (const int worker : listening) {
      const auto w = static_cast<std::size_t>(worker);
      if (waiting_[w]) continue;
      const auto heard = connections_[w].heard;
      const bool alone = a_pull_waits || (going_on && *going_on > heard);
      const auto deadline =
          alone ? options_.worker_timeout : kCommonStallFactor * options_.worker_timeout;
      if (now - heard >= deadline) any = mark_lost(worker, silence(worker, now, alone)) || any;
    }
    if (any) after_loss();
  }

  // Why a silent worker is lost; `alone`: another worker showed the job going on.
  std::string silence(int worker, Clock::time_point now, bool alone) const {
    const Connection& connection = connections_[static_cast<std::size_t>(worker)];
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - connection.heard).count();
    std::string why = "silent: no whole frame from it for " + std::to_string(silent) +
                      " ms (worker_timeout = " + std::to_string(options_.worker_timeout.count()) +
                      " ms) while this server waited on it";
    if (!alone) {
      why += "; every worker went quiet together, so it was allowed " +
             std::to_string(kCommonStallFactor) + " x worker_timeout";
    }
    if (connection.request) {
      why += "; its " + std::string(name(static_cast<Operation>(connection.request->operation))) +
             " request of chunk " + std::to_string(connection.request->chunk) +
             " came, its payload frame of " + std::to_string(connection.request->payload_bytes) +
             " bytes did not arrive whole";
    }
    return why;
  }

  // Tells every worker waiting on this server why the run cannot go on, then throws. At most once
  // per run: compiled for size.
  [[noreturn, gnu::cold]] void fail(const std::string& why) {
    const std::string message = me() + ": " + why;
    end_fit(message, kRefused);
    throw CommError({.rank = transport_->rank(), .detail = message});
  }

  // Answers every waiting pull, and for a short while every request of a live worker, with
  // `message` and `status`.
  [[gnu::cold]] void end_fit(const std::string& message, std::uint16_t status) {
    std::vector<Pending> waiting;
    waiting.swap(pending_);
    for (const Pending& pending : waiting) {
      if (!lost_[static_cast<std::size_t>(pending.worker)]) {
        reply_error(pending.worker, pending.request, message, status);
      }
    }
    // For a short while, every request of a live worker gets the same answer, so that workers
    // whose requests were still on the way learn the cause rather than only that this server
    // went away.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::vector<int> live;
    while (std::chrono::steady_clock::now() < until) {
      live.clear();
      for (int worker = 0; worker < options_.workers; ++worker) {
        const auto w = static_cast<std::size_t>(worker);
        if (!lost_[w] && !finished_[w]) live.push_back(worker);
      }
      if (live.empty()) break;
      const int worker = transport_->wait_any(live, std::chrono::milliseconds(50));
      if (worker < 0) continue;
      const auto w = static_cast<std::size_t>(worker);
      Connection& connection = connections_[w];
      try {
        if (!connection.request) {
          Request request;
          const transport::Receive receive{worker, header(tag::kRequest),
                                           std::as_writable_bytes(std::span(&request, 1))};
          transport_->transfer({}, std::span(&receive, 1));
          connection.request = request;
          continue;
        }
        const Request request = *std::exchange(connection.request, std::nullopt);
        if (request.payload_bytes > max_payload_) {
          lost_[w] = true;
          continue;
        }
        scratch_.resize(request.payload_bytes);
        const transport::Receive payload{worker, header(tag::kRequestPayload), std::span(scratch_)};
        transport_->transfer({}, std::span(&payload, 1));
        // A push is not answered; the worker's pull that follows it is.
        if (answered(request)) reply_error(worker, request, message, status);
      } catch (const CommError&) {
        lost_[w] = true;
      }
    }
  }

  Tr* transport_;  // the mesh of this membership (serve_regrouped)
  const Layout& layout_;
  ServerOptions options_;
  const O& optimizer_;
  std::vector<State> chunks_;
  std::vector<bool> lost_;             // until its process started again takes its place back
  std::vector<std::string> why_lost_;  // per worker, for the Sync failure that names it
  std::vector<Clock::time_point> lost_at_;  // per worker: when it was lost last
  std::vector<Connection> connections_;
  std::size_t max_payload_ = 0;    // bytes: the longest payload a request to this server carries
  std::vector<T> widened_;         // an Async or BoundedStaleness push widened from its wire
  std::vector<bool> finished_;     // in this fit
  std::vector<bool> presented_;    // in this fit: the worker's settings agreed
  settings::Reference reference_;  // this server's settings, then the chief's
  std::vector<Pending> pending_;   // pulls, in arrival order
  std::vector<bool> waiting_;      // lose_silent's: per worker, a pull of it waits here
  std::vector<std::string> refusals_;  // per worker: why a push was refused, until its next pull
  ServerCounts counts_;
  std::uint64_t first_step_ = 0;  // the fit's, as the chief's init said
  std::vector<std::byte> scratch_;
  std::vector<std::byte> zeros_;
};

}  // namespace cohort::strategy::ps
