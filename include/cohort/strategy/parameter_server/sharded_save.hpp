// Trainer::save under ParameterServer: a sharded checkpoint (checkpoint/checkpoint.hpp), written
// after a fit by every process at once.
//
//   chief     save_manifest: sends every server a SaveOrder (the step, and a random token that
//             names this save's shard files), waits for every SaveReport, then writes the
//             manifest `file` last, listing the shard files with their ranges and checksums, and
//             tells every other process the outcome: written, or why not.
//   server    save_shard: waits for the order, writes the shard it holds beside `file`
//             (atomically: checkpoint::write), and reports its checksum, or why it could not
//             (a shard with an infinity or NaN is never written: it reports where the first is);
//             then waits for the outcome.
//   others    await_saved: wait for the outcome.
//
// So every process returns from Trainer::save only once the manifest is written, and a restore
// right after finds the checkpoint whole; or every process fails, with the reason.
//
// Every server is ordered and answers, also one beyond the shard count (it writes nothing), so
// that no server waits for an order that never comes. The manifest is the commit point: a crash
// before it leaves the previous checkpoint whole. A server holds the shard of its last fit or
// restore (HeldShard); shard_of cuts it from a restored state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/parameter_server/protocol.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy::ps {

// The chief's order to every server (frame tag::kSaveOrder).
struct SaveOrder {
  std::uint64_t step = 0;   // the run's step being saved
  std::uint64_t token = 0;  // identifies this save in the shard files' names
};
static_assert(sizeof(SaveOrder) == 16 && std::is_trivially_copyable_v<SaveOrder>);

// A server's answer (frame tag::kSaveReport), and the chief's outcome (tag::kSaveOutcome).
struct SaveReport {
  std::uint32_t status = 0;  // 0: the file is durable; 1: not written, message says why
  std::uint32_t crc32 = 0;   // of the shard's payload, recorded in the manifest
  char message[504] = {};
};
static_assert(sizeof(SaveReport) == 512 && std::is_trivially_copyable_v<SaveReport>);

// What a server keeps for the next save: the shard of its last fit or restore, if any.
using HeldShard =
    std::variant<std::monostate, checkpoint::ShardState<float>, checkpoint::ShardState<double>>;

// The servers that hold a shard of the layout: 0 .. holders - 1 (the layout's rule).
inline int holders(const Layout& layout) {
  int count = 0;
  while (count < layout.servers() && !layout.chunks_of(count).empty()) ++count;
  return count;
}

// Server `server`'s shard of a complete training state: its chunks' parameters, then its
// optimizer state slot-major over the shard's elements (step left for the save to set).
template <class T>
checkpoint::ShardState<T> shard_of(const checkpoint::TrainingState<T>& state, const Layout& layout,
                                   int server) {
  const std::size_t elements = state.parameters.size();
  const auto& chunks = layout.chunks_of(server);
  checkpoint::ShardState<T> shard;
  shard.elements = elements;
  if (!chunks.empty()) {
    shard.begin = chunks.front().begin;
    shard.end = chunks.back().end;
  }
  const std::size_t length = shard.end - shard.begin;
  const auto own = std::span(state.parameters).subspan(shard.begin, length);
  shard.parameters.assign(own.begin(), own.end());
  for (std::size_t slot = 0; elements != 0 && slot < state.optimizer_state.size() / elements;
       ++slot) {
    const auto values =
        std::span(state.optimizer_state).subspan(slot * elements + shard.begin, length);
    shard.optimizer_state.insert(shard.optimizer_state.end(), values.begin(), values.end());
  }
  return shard;
}

// The chief's half: `state` holds the run's settings and step (no values: those are the
// servers'); `layout` is the model's; servers are ranks workers .. workers + servers - 1.
template <class T, transport::Transport Tr>
void save_manifest(Tr& transport, int workers, const Layout& layout,
                   const std::filesystem::path& file, const checkpoint::TrainingState<T>& state) {
  const int servers = layout.servers();
  const int holding = holders(layout);
  std::random_device entropy;
  const SaveOrder order{.step = state.step, .token = std::uint64_t{entropy()} << 32 | entropy()};
  std::vector<SaveReport> reports(static_cast<std::size_t>(servers));
  std::vector<transport::Send> sends;
  std::vector<transport::Receive> receives;
  for (int server = 0; server < servers; ++server) {
    const int peer = workers + server;
    sends.push_back({peer, header(tag::kSaveOrder), std::as_bytes(std::span(&order, 1))});
    receives.push_back(
        {peer, header(tag::kSaveReport),
         std::as_writable_bytes(std::span(&reports[static_cast<std::size_t>(server)], 1))});
  }
  try {
    transport.transfer(sends, receives);
  } catch (const CommError& error) {
    throw checkpoint::save_incomplete(error, file, "the servers' shards were not all written");
  }
  checkpoint::TrainingState<T> manifest = state;
  std::string failure;
  for (int server = 0; server < servers && failure.empty(); ++server) {
    const SaveReport& report = reports[static_cast<std::size_t>(server)];
    if (report.status != 0) {
      failure = "checkpoint " + file.string() + ": parameter server " + std::to_string(server) +
                " could not write its shard: " + quote_peer_text(message_text(report.message));
    } else if (server < holding) {
      const auto& chunks = layout.chunks_of(server);
      manifest.shards.push_back(
          {.file = checkpoint::shard_file_name(file, order.step, order.token,
                                               static_cast<std::size_t>(server),
                                               static_cast<std::size_t>(holding)),
           .begin = chunks.front().begin,
           .end = chunks.back().end,
           .crc32 = report.crc32});
    }
  }
  if (failure.empty()) {
    try {
      checkpoint::write(file, manifest);
    } catch (const CheckpointError& error) {
      failure = error.what();
    }
  }
  SaveReport outcome;
  if (!failure.empty()) {
    outcome.status = 1;
    set_message(outcome.message, failure);
  }
  std::vector<transport::Send> outcomes;
  for (int peer = 1; peer < workers + servers; ++peer) {
    outcomes.push_back({peer, header(tag::kSaveOutcome), std::as_bytes(std::span(&outcome, 1))});
  }
  transport.transfer(outcomes, {});
  if (!failure.empty()) throw CheckpointError(failure);
}

// Every process but the chief, servers included: waits for the chief's outcome of the save of
// `file`, then throws a CheckpointError with `own_failure` when this process failed its part, or
// with the chief's reason when the checkpoint was not written.
template <transport::Transport Tr>
void await_saved(Tr& transport, const std::filesystem::path& file,
                 const std::string& own_failure = "") {
  SaveReport outcome;
  const transport::Receive receive{0, header(tag::kSaveOutcome),
                                   std::as_writable_bytes(std::span(&outcome, 1))};
  transport.transfer({}, std::span(&receive, 1));
  if (!own_failure.empty()) throw CheckpointError(own_failure);
  if (outcome.status != 0)
    throw checkpoint::not_written_by_chief(file, message_text(outcome.message));
}

// Where a shard holds its first infinity or NaN ("a non-finite parameter at element E"), or "".
template <class T>
std::string nonfinite_in(const checkpoint::ShardState<T>& shard) {
  const std::span<const T> parameters(shard.parameters);
  if (const std::size_t first = device::cpu::first_nonfinite(parameters);
      first != parameters.size()) {
    return "a non-finite parameter at element " + std::to_string(shard.begin + first);
  }
  const std::span<const T> state(shard.optimizer_state);
  if (const std::size_t first = device::cpu::first_nonfinite(state); first != state.size()) {
    return "a non-finite optimizer state value at index " + std::to_string(first) + " of its shard";
  }
  return "";
}

// A server's half: `held` is its shard (null: it holds none of this element type), `holding`
// the number of servers holding a shard of that model (holders of its layout). The chief is
// rank 0. Throws CheckpointError after reporting a failure and hearing the outcome.
template <class T, transport::Transport Tr>
void save_shard(Tr& transport, int server, const checkpoint::ShardState<T>* held, int holding,
                const std::filesystem::path& file) {
  SaveOrder order;
  const transport::Receive receive{0, header(tag::kSaveOrder),
                                   std::as_writable_bytes(std::span(&order, 1))};
  transport.transfer({}, std::span(&receive, 1));
  std::string failure;
  SaveReport report;
  if (held == nullptr) {
    failure = "checkpoint " + file.string() + ": parameter server " + std::to_string(server) +
              " holds no shard to save: call Trainer::save after a fit or a restore";
  } else if (const std::string values = nonfinite_in(*held); !values.empty()) {
    // A state with infinities or NaN is never saved (Trainer::save refuses it alike).
    failure = "checkpoint " + file.string() + ": parameter server " + std::to_string(server) +
              " holds " + values + ": not written";
  } else if (held->begin != held->end) {
    checkpoint::ShardState<T> shard = *held;
    shard.step = order.step;
    try {
      report.crc32 = checkpoint::write(
          file.parent_path() / checkpoint::shard_file_name(file, order.step, order.token,
                                                           static_cast<std::size_t>(server),
                                                           static_cast<std::size_t>(holding)),
          shard);
    } catch (const CheckpointError& error) {
      failure = error.what();
    }
  }
  if (!failure.empty()) {
    report.status = 1;
    set_message(report.message, failure);
  }
  const transport::Send send{0, header(tag::kSaveReport), std::as_bytes(std::span(&report, 1))};
  transport.transfer(std::span(&send, 1), {});
  await_saved(transport, file, failure);
}

}  // namespace cohort::strategy::ps
