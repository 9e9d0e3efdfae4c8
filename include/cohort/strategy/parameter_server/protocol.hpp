// The parameter server's layout (which server holds which elements) and its wire protocol.
//
// Layout. The flat parameter vector of n elements is cut into blocks of `alignment` elements
// (default device::cpu::kNormBlock, the leaf of sum_of_squares, so that shard boundaries never
// split a norm block). The number of shards is the smallest of: the servers, the blocks, and
// n x element size / min_shard_bytes (at least 1; min_shard_bytes = 0 lifts that limit), so that a
// small model does not spread over many servers. Shard i, held by server i, is blocks
// [i x blocks / shards, (i + 1) x blocks / shards): even byte ranges, up to one block. Servers
// beyond the shard count hold nothing (they still serve: every worker tells them when it is done).
// A shard is cut into chunks of chunk_bytes (the last shorter), the unit of every request, so that
// the pushes, the server's updates and the answers of successive chunks overlap. The chunks tile
// the vector in order (shard 0's first); a worker pushes them from the last, as a backward pass
// makes them final.
//
// Protocol, over transport frames of type message_type::kParameterServer (sequence 0; the tag says
// which frame). A worker sends, per chunk, a Request frame (64 bytes, fixed) and a payload frame
// of request.payload_bytes. The server answers every request but a push with a Reply frame (512
// bytes, fixed) and a payload frame of request.reply_bytes, zeros after an error, so that the
// worker's receive completes whatever happens and the stream stays in step.
//
//   operation   payload (elements of T)          answer's payload
//   kSettings   the worker's settings (bytes)     none          every worker, first in a fit
//   kInit       parameters, then optimizer state  none          chief only, at the start of a fit
//               (kStateSlots x length, slot-major)
//   kPush       the gradient sum of one step       no answer     applied or folded, per consistency
//               (in bfloat16 under wire kBfloat16;
//               `leaves`: the micro-batches it sums)
//   kPull       none (step: the updates the        parameters    once the worker's pushes settled
//               parameters hold)
//   kPullState  none                               optimizer state (slot-major over the chunk)
//   kDone       none                               none          this worker's fit has ended
//   kResume     none                               none          a worker's process started again
//                                                                 for its place (Async and
//                                                                 BoundedStaleness, elastic): the
//                                                                 answer's `updates` is the step
//                                                                 its fit goes on from
//   kWorking    none (step: a grace in ms)          none          the chief, its steps done: the
//                                                                 answer's `updates` counts the
//                                                                 other workers this server still
//                                                                 hears from or waits for
//
// A worker's process started again takes its place back at every server (ParameterServer's
// elastic; transport::Readmits), which forgets what the lost process had in flight. It asks each
// server with kResume for the step after its last push there (the fit's first step where it
// pushed nothing), and goes on from the earliest: a push of a step that a chunk took already, from
// the process that was lost in the middle of that step's pushes, is dropped, so that each of the
// worker's steps reaches every chunk once. The chief of such a job, its own steps done, asks the
// servers with kWorking until none hears from another worker that has not ended its fit, or waits
// for one lost less than the request's step (a grace, in milliseconds) ago: the fit ends with the
// others', and its result holds every push.
//
// Preemption (core/preemption.hpp): a server that was signalled sets kPreempted in every answer
// from then on, so that the workers that pull from it hear of it; a worker whose fit stopped for
// preemption sets kPreempted in its kDone, and a server that receives one sets it in its answers
// too (so that under Async every worker hears of it) and saves like the workers after its fit.
// One job, one set of settings: every worker's first request of a fit is kSettings, its Trainer's
// settings (core/settings.hpp's encoding; trainer/job_settings.hpp lists them), to every server.
// The server compares them with a settings::Reference: its own (the optimizer and its options, the
// parameter count, the value type, the gradient sum, the consistency and the parameter server
// options), and for the rest the chief's, whose kSettings and kInit it takes before any other
// worker's request. A difference is refused with status kSettingsDiffer and the sentence that
// names the field, both values and who holds each; the server then answers the requests that wait
// or arrive within 2 s with it and throws it as a ConfigError, and every worker throws it as a
// ConfigError too. No worker gets parameters (its first pull's answer) before every live worker
// has presented its settings, so a refused job stops before its first step, under every
// consistency.
//
// A pull is answered once every push of its worker has settled: under Sync (K = 0) once the
// steps it pushed are applied, otherwise once the worker is at most K pushes ahead of the slowest
// live worker; at once when the worker has pushed nothing in this fit. A worker pulls its chunks
// in the order it pushed them, and every worker pushes in the same order, so a server's answers
// to one worker leave in the order asked (the client checks). A refused push is reported in the
// answer to its worker's next pull.
//
// No deadlock, whatever the sizes: a server sends to a worker only the answer to a request, and
// the worker sends every answered request in a transfer that also receives its answer (a push
// needs no answer, so a worker may push while the servers still read). A server is never blocked
// writing to a worker that is busy writing to it.
//
// After a fit, Trainer::save: the chief sends every server a SaveOrder frame; the server writes
// its shard file and answers with a SaveReport frame (sharded_save.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cohort/transport/transport.hpp"

namespace cohort::strategy::ps {

// 2: pushes are not answered; 3: every worker presents its settings first (kSettings); 4: flags
// (preemption); 5: a push's elements in the job's wire format (element_bytes 2: bfloat16);
// 6: kResume, kWorking; 7: a push's leaves; 8: a pull's step, kDone's kAdmit
inline constexpr std::uint16_t kProtocolVersion = 8;

// Request::flags and Reply::flags.
inline constexpr std::uint16_t kPreempted = 1;
// In a kDone: the fit goes on after a checkpoint (trainer/periodic_checkpoints.hpp).
inline constexpr std::uint16_t kCheckpoint = 2;
// In a kDone: the fit goes on once the job has taken processes in (ParameterServer::admit, which
// sends every server an AdmitOrder frame: the count, a std::uint64_t).
inline constexpr std::uint16_t kAdmit = 4;

enum class Operation : std::uint16_t {
  kInit = 1,
  kPush,
  kPull,
  kPullState,
  kDone,
  kSettings,
  kResume,
  kWorking
};

inline std::string_view name(Operation operation) {
  switch (operation) {
    case Operation::kInit:
      return "init";
    case Operation::kPush:
      return "push";
    case Operation::kPull:
      return "pull";
    case Operation::kPullState:
      return "pull_state";
    case Operation::kDone:
      return "done";
    case Operation::kSettings:
      return "settings";
    case Operation::kResume:
      return "resume";
    case Operation::kWorking:
      return "working";
  }
  return "unknown";
}

struct Request {
  std::uint16_t version = kProtocolVersion;
  std::uint16_t flags = 0;
  std::uint16_t operation = 0;
  std::uint16_t element_bytes = 0;
  std::uint32_t worker = 0;  // the sender's worker index: must be the connection's
  std::uint32_t shard = 0;   // the server's index
  std::uint32_t chunk = 0;   // within the shard
  // kPush: how many micro-batches the gradient sums, its worker's node of the canonical tree over
  // the step's micro-batches (core/sharding.hpp, Deal), which a Sync server folds it as.
  std::uint32_t leaves = 1;
  // The Trainer's step of a push; of a pull, the updates its parameters hold, which a regrouped
  // Sync job's server may answer with a chunk's parameters before its last update
  // (server.hpp).
  std::uint64_t step = 0;
  std::uint64_t length = 0;  // elements of the chunk, as the worker believes
  std::uint64_t payload_bytes = 0;
  std::uint64_t reply_bytes = 0;
  double inverse_batch = 1.0;
};
static_assert(sizeof(Request) == 64 && std::is_trivially_copyable_v<Request>);

// Copies text into a fixed message field, cut to fit, always terminated.
template <std::size_t N>
void set_message(char (&message)[N], std::string_view text) {
  const std::size_t length = std::min(text.size(), N - 1);
  std::memcpy(message, text.data(), length);
  message[length] = '\0';
}

// The text of a fixed message field that came from another process: up to its terminator, and
// within the field even when the sender left none.
template <std::size_t N>
std::string_view message_text(const char (&message)[N]) {
  return {message, static_cast<std::size_t>(std::find(message, message + N, '\0') - message)};
}
// Reply::status: 0 done; kRefused: message says why; kSettingsDiffer: message is the sentence
// that names the setting that differs (a ConfigError on every process).
inline constexpr std::uint16_t kRefused = 1;
inline constexpr std::uint16_t kSettingsDiffer = 2;

struct Reply {
  std::uint32_t version = kProtocolVersion;
  std::uint16_t status = 0;
  std::uint16_t operation = 0;
  std::uint64_t chunk = 0;
  std::uint64_t updates = 0;  // updates applied to the chunk so far (its version)
  std::uint64_t flags = 0;
  char message[480] = {};
};
static_assert(sizeof(Reply) == 512 && std::is_trivially_copyable_v<Reply>);

namespace tag {
inline constexpr std::uint64_t kRequest = 0x5053'0001;
inline constexpr std::uint64_t kRequestPayload = 0x5053'0002;
inline constexpr std::uint64_t kReply = 0x5053'0003;
inline constexpr std::uint64_t kReplyPayload = 0x5053'0004;
inline constexpr std::uint64_t kSaveOrder = 0x5053'0005;   // sharded_save.hpp
inline constexpr std::uint64_t kSaveReport = 0x5053'0006;  // sharded_save.hpp
inline constexpr std::uint64_t kNormBlocks = 0x5053'0007;  // between servers, Sync clipping
inline constexpr std::uint64_t kSaveOutcome = 0x5053'0008;  // sharded_save.hpp
inline constexpr std::uint64_t kAdmitOrder = 0x5053'0009;   // the chief to every server
}  // namespace tag

inline transport::Header header(std::uint64_t frame_tag) {
  return {transport::message_type::kParameterServer, 0, frame_tag};
}

// The payload elements a request carries and its reply returns, for a chunk of `length`.
inline std::size_t request_elements(Operation operation, std::size_t length, std::size_t slots) {
  if (operation == Operation::kInit) return (1 + slots) * length;
  if (operation == Operation::kPush) return length;
  return 0;
}
inline std::size_t reply_elements(Operation operation, std::size_t length, std::size_t slots) {
  if (operation == Operation::kPull) return length;
  if (operation == Operation::kPullState) return slots * length;
  return 0;
}

struct Chunk {
  int server;
  std::size_t index;  // within its server's shard
  std::size_t begin;  // elements of the flat vector
  std::size_t end;
  std::size_t size() const { return end - begin; }
};

struct LayoutOptions {
  std::size_t min_shard_bytes;
  std::size_t alignment;
  std::size_t chunk_bytes;
};

// Which server holds which chunks (the rule at the top of this file).
class Layout {
 public:
  Layout(std::size_t elements, std::size_t element_bytes, int servers, LayoutOptions options)
      : elements_(elements), by_server_(static_cast<std::size_t>(servers)) {
    if (elements == 0) return;
    const std::size_t alignment = std::max<std::size_t>(1, options.alignment);
    const std::size_t blocks = (elements + alignment - 1) / alignment;
    std::size_t shards = std::min<std::size_t>(static_cast<std::size_t>(servers), blocks);
    if (options.min_shard_bytes > 0) {
      shards = std::min(
          shards, std::max<std::size_t>(1, elements * element_bytes / options.min_shard_bytes));
    }
    const std::size_t chunk_elements =
        std::max<std::size_t>(1, options.chunk_bytes / element_bytes);
    for (std::size_t shard = 0; shard < shards; ++shard) {
      const std::size_t begin = std::min(elements, shard * blocks / shards * alignment);
      const std::size_t end = std::min(elements, (shard + 1) * blocks / shards * alignment);
      auto& chunks = by_server_[shard];
      for (std::size_t at = begin; at < end; at += chunk_elements) {
        chunks.push_back(
            {static_cast<int>(shard), chunks.size(), at, std::min(end, at + chunk_elements)});
        all_.push_back(chunks.back());
      }
    }
  }

  std::size_t elements() const { return elements_; }
  int servers() const { return static_cast<int>(by_server_.size()); }
  const std::vector<Chunk>& chunks() const { return all_; }
  const std::vector<Chunk>& chunks_of(int server) const {
    return by_server_[static_cast<std::size_t>(server)];
  }

 private:
  std::size_t elements_;
  std::vector<std::vector<Chunk>> by_server_;
  std::vector<Chunk> all_;
};

}  // namespace cohort::strategy::ps
