// Checkpoints: the complete training state, written atomically and checksummed; in one file, or
// (a parameter-server job) as a manifest plus one shard file per server.
//
// Every file has the same container (little-endian, as written by this host):
//   8 bytes   magic: "COHORTCK" a complete training state, "COHORTMF" a manifest, "COHORTSH" a
//             shard
//   4 bytes   format version (kFormatVersion)
//   4 bytes   bytes per parameter value (4: float, 8: double), checked before anything is decoded
//   8 bytes   payload length in bytes
//   4 bytes   CRC-32 of the payload
//   payload   a Boost.Serialization binary archive of TrainingState<T> or ShardState<T>
//
// A sharded checkpoint (strategy/parameter_server.hpp): every server writes the parameters and
// optimizer state of its element range to a shard file of its own, named by shard_file_name()
// after the manifest, the step and a token of that save, so that a new save never overwrites a
// file an existing manifest names. Once every server has reported its file durable, the chief
// writes the manifest: a TrainingState whose parameters and optimizer state are empty and whose
// `shards` name the files with their ranges and checksums. The manifest is the commit point: a
// crash before it leaves the previous checkpoint whole.
//
// write() goes to a temporary file in the same directory, fsyncs it, renames it over the target and
// fsyncs the directory, so a crash leaves either the old file or the new one, never half of one.
// read() checks magic, version, length and checksum before it decodes anything and, for a
// manifest, reads every shard and checks that its checksum is the one the manifest recorded and
// that the shards tile the parameters; it returns the complete state either way, so a checkpoint
// of any strategy restores under any other. Every refusal is a CheckpointError naming the file
// and what did not match. Binary archives are not portable between architectures of different
// endianness or word size.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/crc.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::checkpoint {

using Magic = std::array<char, 8>;
inline constexpr Magic kMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
inline constexpr Magic kManifestMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'M', 'F'};
inline constexpr Magic kShardMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'S', 'H'};
inline constexpr std::uint32_t kFormatVersion = 2;
inline constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4;

constexpr std::string_view value_type_name(std::uint32_t bytes) {
  return bytes == 4 ? "float" : bytes == 8 ? "double" : "unknown";
}

// Where a manifest finds one shard: the file (in the manifest's directory), the elements it holds
// and the checksum its container carried when the server wrote it.
struct ShardRecord {
  std::string file;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint32_t crc32 = 0;

  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    archive& file& begin& end& crc32;
  }
};

// Everything needed to continue a run bit-identically: the parameters and optimizer state, how
// far the run is, and the settings that define its data schedule.
template <class T>
struct TrainingState {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cohort: checkpoints hold float or double values");
  std::string optimizer;
  std::vector<T> parameters;
  std::vector<T> optimizer_state;  // kStateSlots x parameters values, slot-major
  // Updates applied since the run began. With dataset_size and global_batch it fixes the data
  // position: epoch = step / steps_per_epoch, and the step's place in that epoch's order.
  std::uint64_t step = 0;
  std::uint64_t seed = 0;
  std::uint64_t global_batch = 0;
  std::uint64_t micro_batches = 0;
  std::uint64_t dataset_size = 0;  // 0 until the first fit
  // A manifest: parameters and optimizer_state are in these files, not above.
  std::vector<ShardRecord> shards;

  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    archive& optimizer& parameters& optimizer_state& step& seed& global_batch& micro_batches&
        dataset_size& shards;
  }
};

// One server's part of a sharded checkpoint: elements [begin, end) of `elements`.
template <class T>
struct ShardState {
  std::uint64_t elements = 0;  // of the whole parameter vector
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t step = 0;          // the run's step the chief ordered the save at
  std::vector<T> parameters;       // end - begin values
  std::vector<T> optimizer_state;  // slots x (end - begin) values, slot-major

  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    archive& elements& begin& end& step& parameters& optimizer_state;
  }
};

// The name of shard `shard` of `shards` in the save of `step` identified by `token`, beside the
// manifest `manifest`: every server and the chief compute it alike.
inline std::string shard_file_name(const std::filesystem::path& manifest, std::uint64_t step,
                                   std::uint64_t token, std::size_t shard, std::size_t shards) {
  char suffix[96];
  std::snprintf(suffix, sizeof suffix, ".step-%llu-%016llx.shard-%zu-of-%zu",
                static_cast<unsigned long long>(step), static_cast<unsigned long long>(token),
                shard, shards);
  return manifest.filename().string() + suffix;
}

namespace detail {

inline std::uint32_t crc32(std::string_view bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

[[noreturn]] inline void refuse(const std::filesystem::path& file, const std::string& why) {
  throw CheckpointError("checkpoint " + file.string() + ": " + why);
}

inline void write_all(int fd, const char* data, std::size_t size,
                      const std::filesystem::path& file) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      refuse(file, std::string("write failed: ") + std::strerror(errno));
    }
    data += written;
    size -= static_cast<std::size_t>(written);
  }
}

template <class Integer>
void append(std::string& out, Integer value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

template <class Integer>
Integer extract(std::string_view bytes, std::size_t offset) {
  Integer value;
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

// Writes `payload` in the container with `magic`, atomically; returns the payload's CRC-32.
template <class T, class Payload>
std::uint32_t write_container(const std::filesystem::path& file, const Magic& magic,
                              const Payload& content) {
  std::ostringstream payload_stream(std::ios::binary);
  {
    boost::archive::binary_oarchive archive(payload_stream);
    archive << content;
  }
  const std::string payload = std::move(payload_stream).str();
  const std::uint32_t checksum = crc32(payload);

  std::string header(magic.begin(), magic.end());
  append(header, kFormatVersion);
  append(header, static_cast<std::uint32_t>(sizeof(T)));
  append(header, static_cast<std::uint64_t>(payload.size()));
  append(header, checksum);

  const std::filesystem::path directory =
      file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const std::filesystem::path temporary =
      directory / (file.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) refuse(file, "cannot create " + temporary.string() + ": " + std::strerror(errno));
  try {
    write_all(fd, header.data(), header.size(), file);
    write_all(fd, payload.data(), payload.size(), file);
    if (::fsync(fd) != 0) refuse(file, std::string("fsync failed: ") + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    std::filesystem::remove(temporary);
    throw;
  }
  ::close(fd);
  std::error_code renamed;
  std::filesystem::rename(temporary, file, renamed);
  if (renamed) {
    std::filesystem::remove(temporary);
    refuse(file, "cannot rename " + temporary.string() + ": " + renamed.message());
  }
  // The rename is durable only once the directory entry is.
  if (const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return checksum;
}

// The first 8 bytes of `file`, zeros when it cannot be read.
inline Magic magic_of(const std::filesystem::path& file) {
  Magic magic{};
  std::ifstream(file, std::ios::binary).read(magic.data(), magic.size());
  return magic;
}

template <class Payload>
struct Contents {
  Payload payload;
  std::uint32_t crc32 = 0;
};

// Reads and checks a container with `magic` and decodes its payload.
template <class T, class Payload>
Contents<Payload> read_container(const std::filesystem::path& file, const Magic& magic) {
  std::ifstream in(file, std::ios::binary);
  if (!in) refuse(file, "cannot open it");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const auto has = [&](const Magic& expected) {
    return bytes.size() >= kHeaderBytes &&
           std::equal(expected.begin(), expected.end(), bytes.begin());
  };
  if (!has(magic)) {
    if (has(kShardMagic)) {
      refuse(file, "is one shard of a sharded checkpoint; restore its manifest instead");
    }
    refuse(file, magic == kShardMagic ? "not a cohort checkpoint shard (no COHORTSH header)"
                                      : "not a cohort checkpoint (no COHORTCK header)");
  }
  const auto version = extract<std::uint32_t>(bytes, 8);
  if (version != kFormatVersion) {
    refuse(file, "format version " + std::to_string(version) + ", this build reads " +
                     std::to_string(kFormatVersion));
  }
  const auto value_bytes = extract<std::uint32_t>(bytes, 12);
  if (value_bytes != sizeof(T)) {
    refuse(file, std::string("holds ") + std::string(value_type_name(value_bytes)) +
                     " parameters, the model has " + std::string(value_type_name(sizeof(T))));
  }
  const auto length = extract<std::uint64_t>(bytes, 16);
  if (bytes.size() - kHeaderBytes != length) {
    refuse(file, "truncated or padded: header says " + std::to_string(length) +
                     " payload bytes, file holds " + std::to_string(bytes.size() - kHeaderBytes));
  }
  const std::string_view payload(bytes.data() + kHeaderBytes, length);
  const auto stored = extract<std::uint32_t>(bytes, 24);
  if (const std::uint32_t computed = crc32(payload); computed != stored) {
    std::ostringstream why;
    why << std::hex << "checksum mismatch: stored 0x" << stored << ", computed 0x" << computed
        << " (the file is corrupted)";
    refuse(file, why.str());
  }

  Contents<Payload> contents;
  contents.crc32 = stored;
  try {
    std::istringstream payload_stream(std::string(payload), std::ios::binary);
    boost::archive::binary_iarchive archive(payload_stream);
    archive >> contents.payload;
  } catch (const std::exception& failure) {
    refuse(file, std::string("cannot decode the payload: ") + failure.what());
  }
  return contents;
}

// Fills a manifest's parameters and optimizer state from its shard files.
template <class T>
void assemble(const std::filesystem::path& manifest, TrainingState<T>& state) {
  std::vector<ShardRecord> records = state.shards;
  std::sort(records.begin(), records.end(),
            [](const ShardRecord& a, const ShardRecord& b) { return a.begin < b.begin; });
  const std::filesystem::path directory = manifest.parent_path();
  std::uint64_t elements = 0;
  std::uint64_t slots = 0;
  std::uint64_t next = 0;
  for (const ShardRecord& record : records) {
    const std::filesystem::path file = directory / record.file;
    const auto [shard, checksum] = read_container<T, ShardState<T>>(file, kShardMagic);
    const auto mismatch = [&](std::string_view field, auto in_shard, auto in_manifest) {
      refuse(manifest, "shard " + file.string() + ": " + std::string(field) + " is " +
                           std::to_string(in_shard) + " in the shard but " +
                           std::to_string(in_manifest) + " in the manifest");
    };
    if (checksum != record.crc32) mismatch("checksum", checksum, record.crc32);
    if (shard.begin != record.begin) mismatch("begin", shard.begin, record.begin);
    if (shard.end != record.end) mismatch("end", shard.end, record.end);
    if (shard.step != state.step) mismatch("step", shard.step, state.step);
    if (shard.begin != next) {
      refuse(manifest, "shards do not tile the parameters: " + file.string() + " begins at " +
                           std::to_string(shard.begin) + ", the previous shard ended at " +
                           std::to_string(next));
    }
    const std::uint64_t length = shard.end - shard.begin;
    if (elements == 0) {
      elements = shard.elements;
      slots = length == 0 ? 0 : shard.optimizer_state.size() / length;
      state.parameters.assign(elements, T{});
      state.optimizer_state.assign(slots * elements, T{});
    }
    if (shard.elements != elements) mismatch("elements", shard.elements, elements);
    if (shard.end > elements || shard.parameters.size() != length ||
        shard.optimizer_state.size() != slots * length) {
      refuse(manifest, "shard " + file.string() + " holds " +
                           std::to_string(shard.parameters.size()) + " parameters and " +
                           std::to_string(shard.optimizer_state.size()) +
                           " optimizer state values for elements [" + std::to_string(shard.begin) +
                           ", " + std::to_string(shard.end) + ") of " + std::to_string(elements));
    }
    std::copy(shard.parameters.begin(), shard.parameters.end(),
              state.parameters.begin() + static_cast<std::ptrdiff_t>(shard.begin));
    for (std::uint64_t slot = 0; slot < slots; ++slot) {
      std::copy_n(shard.optimizer_state.begin() + static_cast<std::ptrdiff_t>(slot * length),
                  length,
                  state.optimizer_state.begin() +
                      static_cast<std::ptrdiff_t>(slot * elements + shard.begin));
    }
    next = shard.end;
  }
  if (next != elements) {
    refuse(manifest, "shards do not tile the parameters: they end at element " +
                         std::to_string(next) + " of " + std::to_string(elements));
  }
}

}  // namespace detail

// Writes a complete training state, or a manifest (state.shards not empty), to `file`. When it
// replaces a manifest, the shard files only that manifest named are removed afterwards.
template <class T>
void write(const std::filesystem::path& file, const TrainingState<T>& state);

// Writes one server's shard; returns the checksum the manifest records for it.
template <class T>
std::uint32_t write(const std::filesystem::path& file, const ShardState<T>& shard) {
  return detail::write_container<T>(file, kShardMagic, shard);
}

// The complete state saved in `file`, a checkpoint or a manifest (whose shards it reads).
template <class T>
TrainingState<T> read(const std::filesystem::path& file) {
  if (detail::magic_of(file) != kManifestMagic) {
    return detail::read_container<T, TrainingState<T>>(file, kMagic).payload;
  }
  TrainingState<T> state =
      detail::read_container<T, TrainingState<T>>(file, kManifestMagic).payload;
  detail::assemble(file, state);
  return state;
}

namespace detail {

// The shard files a manifest at `file` names; empty when there is no readable manifest there.
inline std::vector<std::filesystem::path> shard_files(const std::filesystem::path& file) {
  std::vector<std::filesystem::path> files;
  if (magic_of(file) != kManifestMagic) return files;
  // The value type only has to match the file's; a manifest of either type lists its shards.
  const auto list = [&]<class T>() {
    try {
      for (const auto& record :
           read_container<T, TrainingState<T>>(file, kManifestMagic).payload.shards) {
        files.push_back(file.parent_path() / record.file);
      }
      return true;
    } catch (const CheckpointError&) {
      return false;
    }
  };
  if (!list.template operator()<float>()) list.template operator()<double>();
  return files;
}

}  // namespace detail

template <class T>
void write(const std::filesystem::path& file, const TrainingState<T>& state) {
  const auto replaced = detail::shard_files(file);
  detail::write_container<T>(file, state.shards.empty() ? kMagic : kManifestMagic, state);
  for (const auto& old : replaced) {
    const bool kept =
        std::any_of(state.shards.begin(), state.shards.end(),
                    [&](const auto& record) { return old.filename() == record.file; });
    std::error_code ignored;  // a shard left behind costs space, never correctness
    if (!kept) std::filesystem::remove(old, ignored);
  }
}

}  // namespace cohort::checkpoint
