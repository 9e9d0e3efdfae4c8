// Checkpoints: the complete training state in one file, written atomically and checksummed.
//
// File layout (little-endian, as written by this host):
//   8 bytes   magic "COHORTCK"
//   4 bytes   format version (kFormatVersion)
//   4 bytes   bytes per parameter value (4: float, 8: double), checked before anything is decoded
//   8 bytes   payload length in bytes
//   4 bytes   CRC-32 of the payload
//   payload   a Boost.Serialization binary archive of TrainingState<T>
//
// write() goes to a temporary file in the same directory, fsyncs it, renames it over the target and
// fsyncs the directory, so a crash leaves either the old checkpoint or the new one, never half of
// one. read() checks magic, version, length and checksum before it decodes anything, and every
// refusal is a CheckpointError naming the file and what did not match. Binary archives are not
// portable between architectures of different endianness or word size.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/crc.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <cerrno>
#include <cstdint>
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

inline constexpr std::array<char, 8> kMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4;

constexpr std::string_view value_type_name(std::uint32_t bytes) {
  return bytes == 4 ? "float" : bytes == 8 ? "double" : "unknown";
}

// Everything needed to continue a run bit-identically: the parameters and optimizer state, how
// far the run is, and the settings that define its data schedule.
template <class T>
struct TrainingState {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cohort: checkpoints hold float or double values");
  std::string optimizer;
  std::vector<T> parameters;
  std::vector<T> optimizer_state;
  // Updates applied since the run began. With dataset_size and global_batch it fixes the data
  // position: epoch = step / steps_per_epoch, and the step's place in that epoch's order.
  std::uint64_t step = 0;
  std::uint64_t seed = 0;
  std::uint64_t global_batch = 0;
  std::uint64_t micro_batches = 0;
  std::uint64_t dataset_size = 0;  // 0 until the first fit

  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    archive& optimizer& parameters& optimizer_state& step& seed& global_batch& micro_batches&
        dataset_size;
  }
};

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

}  // namespace detail

template <class T>
void write(const std::filesystem::path& file, const TrainingState<T>& state) {
  std::ostringstream payload_stream(std::ios::binary);
  {
    boost::archive::binary_oarchive archive(payload_stream);
    archive << state;
  }
  const std::string payload = std::move(payload_stream).str();

  std::string header(kMagic.begin(), kMagic.end());
  detail::append(header, kFormatVersion);
  detail::append(header, static_cast<std::uint32_t>(sizeof(T)));
  detail::append(header, static_cast<std::uint64_t>(payload.size()));
  detail::append(header, detail::crc32(payload));

  const std::filesystem::path directory =
      file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const std::filesystem::path temporary =
      directory / (file.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    detail::refuse(file, "cannot create " + temporary.string() + ": " + std::strerror(errno));
  try {
    detail::write_all(fd, header.data(), header.size(), file);
    detail::write_all(fd, payload.data(), payload.size(), file);
    if (::fsync(fd) != 0)
      detail::refuse(file, std::string("fsync failed: ") + std::strerror(errno));
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
    detail::refuse(file, "cannot rename " + temporary.string() + ": " + renamed.message());
  }
  // The rename is durable only once the directory entry is.
  if (const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

template <class T>
TrainingState<T> read(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) detail::refuse(file, "cannot open it");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  if (bytes.size() < kHeaderBytes || !std::equal(kMagic.begin(), kMagic.end(), bytes.begin())) {
    detail::refuse(file, "not a cohort checkpoint (no COHORTCK header)");
  }
  const auto version = detail::extract<std::uint32_t>(bytes, 8);
  if (version != kFormatVersion) {
    detail::refuse(file, "format version " + std::to_string(version) + ", this build reads " +
                             std::to_string(kFormatVersion));
  }
  const auto value_bytes = detail::extract<std::uint32_t>(bytes, 12);
  if (value_bytes != sizeof(T)) {
    detail::refuse(file, std::string("holds ") + std::string(value_type_name(value_bytes)) +
                             " parameters, the model has " +
                             std::string(value_type_name(sizeof(T))));
  }
  const auto length = detail::extract<std::uint64_t>(bytes, 16);
  if (bytes.size() - kHeaderBytes != length) {
    detail::refuse(file, "truncated or padded: header says " + std::to_string(length) +
                             " payload bytes, file holds " +
                             std::to_string(bytes.size() - kHeaderBytes));
  }
  const std::string_view payload(bytes.data() + kHeaderBytes, length);
  const auto stored = detail::extract<std::uint32_t>(bytes, 24);
  if (const std::uint32_t computed = detail::crc32(payload); computed != stored) {
    std::ostringstream why;
    why << std::hex << "checksum mismatch: stored 0x" << stored << ", computed 0x" << computed
        << " (the file is corrupted)";
    detail::refuse(file, why.str());
  }

  TrainingState<T> state;
  try {
    std::istringstream payload_stream(std::string(payload), std::ios::binary);
    boost::archive::binary_iarchive archive(payload_stream);
    archive >> state;
  } catch (const std::exception& failure) {
    detail::refuse(file, std::string("cannot decode the training state: ") + failure.what());
  }
  return state;
}

}  // namespace cohort::checkpoint
