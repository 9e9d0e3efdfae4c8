// A checkpoint's write during a fit (trainer/periodic_checkpoints.hpp), shared out between the
// replica threads of the chief's process. Between two steps every replica holds the whole state,
// so each writes a share of the parameters and of the optimizer state from its own replica
// straight into the checkpoint's file (checkpoint::InPlaceWrite), a chunk at a time, and checks
// and checksums the chunk while it is in its core's cache. The background write then checks the
// shares' findings, writes the archive's small fields around the values, and the header with the
// shares' checksums joined, fsyncs and renames.
//
// Why: with every core training, a checkpoint's CPU delays every replica at the next all-reduce,
// whichever core does it. Shared out in the stall, the values' copy into the page cache, their
// check and their checksum are each done once, split between the replicas; nothing is copied into
// a buffer the size of the state (1.29 GB for a model of 107M parameters with Adam), and the
// background write's CPU is the few system calls of a small write, fsync and rename
// (docs/benchmarks.md, "The Trainer's loop").
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/checkpoint/directory.hpp"
#include "cohort/checkpoint/in_place_write.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/model.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/trainer/checkpoints.hpp"

namespace cohort::trainer {

template <class R>
class SnapshotWrite {
  using T = typename R::value_type;
  using Model = typename R::Model;

 public:
  // On one thread, before the replicas start: room for `shares` shares (and, for a device's
  // replicas, a host chunk each to stage their values in). A checkpoint a failed fit left half
  // written is removed.
  void prepare(std::size_t shares) {
    write_.reset();
    failure_ = nullptr;
    step_ = static_cast<std::uint64_t>(-1);
    remaining_ = 0;
    shares_.assign(shares, Share{});
    if constexpr (!kOnHost) staging_.assign(shares, std::vector<T>(kChunkValues));
  }

  // Share `share` of `shares` (the replica's index in the process, or 0 of 1 for one thread that
  // takes the whole state): writes that share of replica `share`'s state after `step` steps into
  // the checkpoint of that step in `directory`, which the first share to come opens. True for the
  // share that completes it: commit() then finishes it.
  bool write_share(const R& run, std::uint64_t step, std::size_t share, std::size_t shares,
                   const std::filesystem::path& directory) {
    checkpoint::InPlaceWrite<T>* write = open(run, step, shares, directory);
    Share done;
    if (write != nullptr) {
      const auto parameters = ModelTraits<Model>::parameters(const_cast<Model&>(run.models[share]));
      done = {.parameters = write_values(run, *write, checkpoint::Values::kParameters, share,
                                         std::span<const T>(parameters), shares),
              .optimizer_state = write_values(run, *write, checkpoint::Values::kOptimizerState,
                                              share, run.optimizer_states[share].span(), shares)};
    }
    const std::lock_guard lock(mutex_);
    shares_[share] = done;
    return --remaining_ == 0;
  }

  // After write_share returned true, on the thread that writes: the checkpoint committed, or a
  // NumericError where the state holds an infinity or NaN (Trainer::save's refusal, naming the
  // first), or the CheckpointError of a directory, a file or a write that failed.
  void commit() {
    if (failure_) std::rethrow_exception(failure_);
    try {
      refuse(&Share::parameters, NumericError::Where::kParameters);
      refuse(&Share::optimizer_state, NumericError::Where::kOptimizerState);
      write_->commit(joined(&Share::parameters), joined(&Share::optimizer_state));
    } catch (...) {
      write_.reset();  // its temporary file removed
      throw;
    }
  }

 private:
  // What writing one share of one block found: its checksum and first non-finite value.
  struct Written {
    std::uint32_t crc32 = 0;
    std::size_t bytes = 0;
    std::size_t first_nonfinite = kNone;  // an index into the whole block
  };
  struct Share {
    Written parameters;
    Written optimizer_state;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // A CPU replica's values are written from where they lie; a device's pass through a host chunk.
  static constexpr bool kOnHost = std::same_as<typename R::Device, device::Cpu>;
  // Small enough that a chunk just written is still in the core's cache when it is checked and
  // checksummed. A copy from a device's memory waits for the device each time, so its chunks are
  // larger.
  static constexpr std::size_t kChunkBytes =
      kOnHost ? std::size_t{128} << 10 : std::size_t{8} << 20;
  static constexpr std::size_t kChunkValues = kChunkBytes / sizeof(T);

  // The checkpoint after `step` steps, opened by the first share to come; nullptr where it could
  // not be (commit() reports why).
  checkpoint::InPlaceWrite<T>* open(const R& run, std::uint64_t step, std::size_t shares,
                                    const std::filesystem::path& directory) {
    const std::lock_guard lock(mutex_);
    if (step != step_) {
      step_ = step;
      remaining_ = shares;
      shares_.assign(shares, Share{});
      write_.reset();
      failure_ = nullptr;
      checkpoint::TrainingState<T> fields;
      fill_checkpoint_state(run, step, fields, false);
      const auto parameters = ModelTraits<Model>::parameters(const_cast<Model&>(run.models[0]));
      try {
        create_checkpoint_directory(directory);
        write_.emplace(checkpoint::file_for_step(directory, step), fields,
                       std::span<const T>(parameters), run.optimizer_states[0].span());
      } catch (...) {
        failure_ = std::current_exception();
      }
    }
    return write_ ? &*write_ : nullptr;
  }

  // Writes share `local` of `shares` of block `which`, `from` on replica `local`'s device.
  Written write_values(const R& run, checkpoint::InPlaceWrite<T>& write, checkpoint::Values which,
                       std::size_t local, std::span<const T> from, std::size_t shares) {
    const std::size_t begin = from.size() * local / shares;
    const std::size_t end = from.size() * (local + 1) / shares;
    Written written{.bytes = (end - begin) * sizeof(T)};
    for (std::size_t first = begin; first < end; first += kChunkValues) {
      const std::size_t count = std::min(kChunkValues, end - first);
      std::span<const T> chunk = from.subspan(first, count);
      if constexpr (!kOnHost) {
        const std::span<T> staged = std::span<T>(staging_[local]).first(count);
        R::Device::to_host(run.place(local), chunk, staged);
        chunk = staged;
      }
      write.write(which, first, chunk);  // a failure is commit()'s to report
      if (written.first_nonfinite == kNone) {
        const std::size_t bad = device::cpu::first_nonfinite(chunk);
        if (bad != count) written.first_nonfinite = first + bad;
      }
      written.crc32 = checkpoint::detail::crc32_update(
          written.crc32,
          std::string_view(reinterpret_cast<const char*>(chunk.data()), chunk.size_bytes()));
    }
    return written;
  }

  void refuse(Written Share::*member, NumericError::Where where) const {
    for (const Share& share : shares_) {
      if ((share.*member).first_nonfinite != kNone) {
        throw nonfinite_state_error(where, step_, (share.*member).first_nonfinite, write_->file());
      }
    }
  }

  // The checksum of a whole block, joined from the shares'.
  std::uint32_t joined(Written Share::*member) const {
    std::uint32_t crc32 = 0;
    for (const Share& share : shares_) {
      crc32 = checkpoint::detail::crc32_append(crc32, (share.*member).crc32, (share.*member).bytes);
    }
    return crc32;
  }

  std::mutex mutex_;  // guards what follows: the shares' threads report there
  std::uint64_t step_ = static_cast<std::uint64_t>(-1);
  std::size_t remaining_ = 0;
  std::vector<Share> shares_;
  std::optional<checkpoint::InPlaceWrite<T>> write_;
  std::exception_ptr failure_;           // why write_ could not be opened
  std::vector<std::vector<T>> staging_;  // a host chunk per share, for a device's replicas
};

}  // namespace cohort::trainer
