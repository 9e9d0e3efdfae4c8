// A checkpoint's copy during a fit (trainer/periodic_checkpoints.hpp), shared out between the
// replica threads of the chief's process. Between two steps every replica holds the whole state,
// so each copies a share of the parameters and of the optimizer state from its own replica into
// the buffer that the background write reads, and checks and checksums that share a chunk at a
// time, while the chunk is in its core's cache. The write then checksums only the archive's small
// fields (checkpoint::ChecksummedBlock) and hands the bytes to the file.
//
// Why: with every core training, the write's CPU delays every replica at the next all-reduce,
// whichever core it takes. Shared out, the check and the checksum are done once, in the stall,
// split between the replicas: the background write's CPU halves (bench_checkpoint, write against
// write/checksummed), while the stall stays about what the whole copy alone took, and a fit's
// examples/s is not measurably changed (docs/benchmarks.md, "The Trainer's loop").
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/model.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/trainer/checkpoints.hpp"

namespace cohort::trainer {

template <class R>
class SnapshotCopy {
  using T = typename R::value_type;

 public:
  // On one thread, before the replicas start: the buffer sized for `run` (its pages touched, so
  // that no checkpoint's stall pays for them) and room for `shares` shares.
  void prepare(const R& run, std::size_t shares) {
    state_.parameters.resize(run.parameter_count);
    state_.optimizer_state.resize(run.optimizer_states.empty() ? 0
                                                               : run.optimizer_states[0].size());
    step_ = static_cast<std::uint64_t>(-1);  // a copy a failed fit left unfinished is void
    remaining_ = 0;
    shares_.assign(shares, Share{});
  }

  // Share `share` of `shares` (the replica's index in the process, or 0 of 1 for one thread that
  // takes the whole state): copies that share of replica `share`'s state after `step` steps into
  // the buffer, checks and checksums it. True for the share that completes the copy: the buffer
  // then holds the state, which state() and checksummed() describe.
  bool copy_share(const R& run, std::uint64_t step, std::size_t share, std::size_t shares) {
    const auto parameters = ModelTraits<typename R::Model>::parameters(
        const_cast<typename R::Model&>(run.models[share]));
    Share done{.parameters = copy(run, share, std::span<const T>(parameters),
                                  std::span<T>(state_.parameters), share, shares),
               .optimizer_state = copy(run, share, run.optimizer_states[share].span(),
                                       std::span<T>(state_.optimizer_state), share, shares)};
    const std::lock_guard lock(mutex_);
    if (step != step_ || shares_.size() != shares) {
      step_ = step;
      remaining_ = shares;
      shares_.assign(shares, Share{});
    }
    shares_[share] = done;
    if (--remaining_ != 0) return false;
    fill_checkpoint_state(run, step, state_, false);
    return true;
  }

  // After copy_share returned true, on the thread that writes: a NumericError where the state
  // holds an infinity or NaN (Trainer::save's refusal, naming the first), then the state.
  const checkpoint::TrainingState<T>& checked_state(const std::filesystem::path& file) const {
    refuse(&Share::parameters, NumericError::Where::kParameters, file);
    refuse(&Share::optimizer_state, NumericError::Where::kOptimizerState, file);
    return state_;
  }

  // The checksums of the state's two blocks of values, joined from the shares'.
  std::array<checkpoint::ChecksummedBlock, 2> checksummed() const {
    return {block(&Share::parameters, state_.parameters),
            block(&Share::optimizer_state, state_.optimizer_state)};
  }

 private:
  // What copying one share of one block found: its checksum and first non-finite value.
  struct Copied {
    std::uint32_t crc32 = 0;
    std::size_t bytes = 0;
    std::size_t first_nonfinite = kNone;  // an index into the whole block
  };
  struct Share {
    Copied parameters;
    Copied optimizer_state;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // Small enough that a chunk just copied is still in the core's cache when it is checked and
  // checksummed. A copy from a device's memory waits for the device each time, so its chunks are
  // larger.
  static constexpr std::size_t kChunkBytes =
      std::same_as<typename R::Device, device::Cpu> ? std::size_t{128} << 10 : std::size_t{8} << 20;
  static constexpr std::size_t kChunkValues = kChunkBytes / sizeof(T);

  // Copies share `share` of `shares` of `from` (on replica `local`'s device) to `to` on the host.
  static Copied copy(const R& run, std::size_t local, std::span<const T> from, std::span<T> to,
                     std::size_t share, std::size_t shares) {
    const std::size_t begin = from.size() * share / shares;
    const std::size_t end = from.size() * (share + 1) / shares;
    Copied copied{.bytes = (end - begin) * sizeof(T)};
    for (std::size_t first = begin; first < end; first += kChunkValues) {
      const std::size_t count = std::min(kChunkValues, end - first);
      const std::span<T> chunk = to.subspan(first, count);
      R::Device::to_host(run.place(local), from.subspan(first, count), chunk);
      if (copied.first_nonfinite == kNone) {
        const std::size_t bad = device::cpu::first_nonfinite(std::span<const T>(chunk));
        if (bad != count) copied.first_nonfinite = first + bad;
      }
      copied.crc32 = checkpoint::detail::crc32_update(
          copied.crc32,
          std::string_view(reinterpret_cast<const char*>(chunk.data()), count * sizeof(T)));
    }
    return copied;
  }

  void refuse(Copied Share::*member, NumericError::Where where,
              const std::filesystem::path& file) const {
    for (const Share& share : shares_) {
      if ((share.*member).first_nonfinite != kNone) {
        throw nonfinite_state_error(where, step_, (share.*member).first_nonfinite, file);
      }
    }
  }

  checkpoint::ChecksummedBlock block(Copied Share::*member, const std::vector<T>& values) const {
    std::uint32_t crc32 = 0;
    for (const Share& share : shares_) {
      crc32 = checkpoint::detail::crc32_append(crc32, (share.*member).crc32, (share.*member).bytes);
    }
    return {.bytes = std::string_view(reinterpret_cast<const char*>(values.data()),
                                      values.size() * sizeof(T)),
            .crc32 = crc32};
  }

  checkpoint::TrainingState<T> state_;
  std::mutex mutex_;  // guards what follows: the shares' threads report there
  std::uint64_t step_ = static_cast<std::uint64_t>(-1);
  std::size_t remaining_ = 0;
  std::vector<Share> shares_;
};

}  // namespace cohort::trainer
