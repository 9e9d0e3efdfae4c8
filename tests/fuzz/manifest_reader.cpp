// A sharded checkpoint built from the input: up to 4 shard files with fuzzed fields (element
// count, range, step, value counts), and two manifests written one over the other whose records
// name those files, or any other name, with true or fuzzed ranges and checksums. Then read(),
// which either assembles a state whose values are the shards' or throws a CheckpointError that
// begins with the manifest's name. Whatever the manifests name, a file outside the checkpoint's
// directory is never read or removed (the sentinel), and only shard files of the replaced manifest
// are removed.
#include <cohort/checkpoint/checkpoint.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_dir.hpp"
#include "fuzz_input.hpp"

namespace {

namespace checkpoint = cohort::checkpoint;
namespace fs = std::filesystem;
using cohort::fuzz::FuzzInput;

// Small numbers mostly, any 64-bit number sometimes.
std::uint64_t take_count(FuzzInput& input) {
  const auto choice = input.take<std::uint8_t>();
  return choice < 0xf0 ? choice % 24 : input.take<std::uint64_t>();
}

struct Directory {
  fs::path root = cohort::fuzz::scratch_directory();
  fs::path work = root / "work";
  fs::path sentinel = root / "sentinel.txt";
  fs::path manifest = work / "run.ckpt";
};

checkpoint::TrainingState<float> take_manifest(FuzzInput& input, const Directory& at,
                                               std::uint64_t step) {
  checkpoint::TrainingState<float> manifest;
  manifest.optimizer = "adam";
  manifest.step = step;
  const std::size_t shards = input.take<std::uint8_t>() % 5;
  for (std::size_t index = 0; index < shards; ++index) {
    checkpoint::ShardState<float> shard;
    shard.elements = take_count(input);
    shard.begin = take_count(input);
    shard.end = take_count(input);
    shard.step = (input.take<std::uint8_t>() & 1) != 0 ? step : take_count(input);
    shard.parameters.assign(std::min<std::uint64_t>(take_count(input), 64), float(index + 1));
    shard.optimizer_state.assign(std::min<std::uint64_t>(take_count(input), 128), -1.0f);
    const std::string name =
        checkpoint::shard_file_name(at.manifest, step, input.take<std::uint16_t>(), index, shards);
    const std::uint32_t crc = checkpoint::write(at.work / name, shard);
    checkpoint::ShardRecord record{
        .file = name, .begin = shard.begin, .end = shard.end, .crc32 = crc};
    switch (input.take<std::uint8_t>() % 8) {
      case 0:
        record.file = input.take_string(48);
        break;  // any name, "../sentinel.txt" included
      case 1:
        record.begin = take_count(input);
        break;
      case 2:
        record.end = take_count(input);
        break;
      case 3:
        record.crc32 = input.take<std::uint32_t>();
        break;
      default:
        break;
    }
    manifest.shards.push_back(record);
  }
  return manifest;
}

// The names of the files in `directory`.
std::vector<std::string> names_in(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

bool names(const checkpoint::TrainingState<float>& manifest, const std::string& file) {
  for (const auto& record : manifest.shards) {
    if (record.file == file) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Directory at;
  fs::remove_all(at.work);
  fs::create_directories(at.work);
  std::ofstream(at.sentinel) << "outside the checkpoint's directory";
  FuzzInput input(data, size);
  const std::uint64_t step = take_count(input);
  const auto replaced = take_manifest(input, at, step);
  checkpoint::write(at.manifest, replaced);
  const auto manifest = take_manifest(input, at, step);
  const auto before = names_in(at.work);
  checkpoint::write(at.manifest, manifest);
  // What the save removed: shard files only the replaced manifest named, nothing outside.
  for (const std::string& name : before) {
    if (fs::exists(at.work / name)) continue;
    if (!checkpoint::detail::is_shard_file_name("run.ckpt", name) || !names(replaced, name) ||
        names(manifest, name)) {
      std::abort();
    }
  }
  if (!fs::exists(at.sentinel)) std::abort();
  try {
    const auto state = checkpoint::read<float>(at.manifest);
    const std::size_t elements = state.parameters.size();
    if (elements > 4 * 64 || (elements == 0 ? !state.optimizer_state.empty()
                                            : state.optimizer_state.size() % elements != 0)) {
      std::abort();
    }
    for (const auto& record : manifest.shards) {
      if (record.file.find('/') != std::string::npos || record.file == ".." || record.file == ".") {
        std::abort();  // read a file outside the manifest's directory
      }
    }
  } catch (const cohort::CheckpointError& error) {
    if (!std::string_view(error.what()).starts_with("checkpoint " + at.manifest.string() + ": ")) {
      std::abort();
    }
  }
  if (!fs::exists(at.sentinel)) std::abort();
  return 0;
}
