// A directory of one run's checkpoints, one per saved step: those a fit takes as it goes and the
// one preemption takes (Trainer::Options::checkpoint, trainer/periodic_checkpoints.hpp).
//
//   <directory>/step-000000001200.ckpt   the state after 1200 steps: a checkpoint, or a sharded
//                                        checkpoint's manifest beside its shard files
//
// A checkpoint appears under its name only once it is complete (write() renames it into place
// after it is durable; a manifest after every shard), so the newest name is the newest complete
// checkpoint: a save that died left only a temporary ("<name>.tmp-<pid>"), which no listing
// returns and the next save of that name removes. Files of other names are left alone.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"

namespace cohort::checkpoint {

struct Saved {
  std::uint64_t step = 0;
  std::filesystem::path file;
};

inline constexpr std::string_view kStepPrefix = "step-";
inline constexpr std::string_view kStepSuffix = ".ckpt";

// The file of the checkpoint after `step` steps.
inline std::filesystem::path file_for_step(const std::filesystem::path& directory,
                                           std::uint64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 12) digits.insert(0, 12 - digits.size(), '0');
  return directory / (std::string(kStepPrefix) + digits + std::string(kStepSuffix));
}

// The step a checkpoint file name stands for, or nothing for any other name (a temporary, a shard,
// a file of the user's).
inline std::optional<std::uint64_t> step_of(std::string_view name) {
  if (!name.starts_with(kStepPrefix) || !name.ends_with(kStepSuffix)) return std::nullopt;
  const std::string_view digits =
      name.substr(kStepPrefix.size(), name.size() - kStepPrefix.size() - kStepSuffix.size());
  std::uint64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) {
    return std::nullopt;
  }
  return step;
}

// The directory's checkpoints, oldest first; none when it does not exist.
inline std::vector<Saved> list(const std::filesystem::path& directory) {
  std::vector<Saved> found;
  std::error_code error;
  for (std::filesystem::directory_iterator entry(directory, error), end; !error && entry != end;
       entry.increment(error)) {
    if (const auto step = step_of(entry->path().filename().string())) {
      found.push_back({*step, entry->path()});
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Saved& a, const Saved& b) { return a.step < b.step; });
  return found;
}

inline std::optional<Saved> newest(const std::filesystem::path& directory) {
  auto all = list(directory);
  if (all.empty()) return std::nullopt;
  return all.back();
}

// Removes all but the newest `keep` checkpoints (a manifest with the shard files it names, of
// either value type). What cannot be removed stays: it costs space, never correctness.
template <class T>
void keep_newest(const std::filesystem::path& directory, std::size_t keep) {
  const auto all = list(directory);
  if (all.size() <= keep) return;
  std::error_code ignored;
  for (std::size_t i = 0; i + keep < all.size(); ++i) {
    for (const auto& shard : detail::shard_files<T>(all[i].file)) {
      std::filesystem::remove(shard, ignored);
    }
    std::filesystem::remove(all[i].file, ignored);
  }
}

}  // namespace cohort::checkpoint
