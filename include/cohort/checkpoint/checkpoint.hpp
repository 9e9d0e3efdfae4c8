// Checkpoints: the complete training state, written atomically and checksummed; in one file, or
// (a parameter-server job) as a manifest plus one shard file per server.
//
// Every file has the same container (little-endian, as written by this host):
//   8 bytes   magic: "COHORTCK" a complete training state, "COHORTMF" a manifest, "COHORTSH" a
//             shard
//   4 bytes   format version (kFormatVersion; read() also reads kOldestFormatVersion and up)
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
// crash before it leaves the previous checkpoint whole. A manifest names its shards by plain file
// names in its own directory: a name with a separator, "." or ".." is refused, so that a manifest
// can make read() open, and write() remove, no file outside that directory.
//
// write() goes to a temporary file in the same directory, fsyncs it, renames it over the target and
// fsyncs the directory, so a crash leaves either the old file or the new one, never half of one.
// Writing a complete checkpoint or a manifest then removes what earlier saves of the same file
// left behind: the shard files of the manifest it replaced, and the temporary files of saves that
// died ("<name>.tmp-<pid>", of the checkpoint or of one of its shards). It removes only files whose
// names a save of this checkpoint gives, never a file a manifest merely names.
//
// read() checks magic, version, length and checksum before it decodes anything and, for a
// manifest, reads every shard and checks that its checksum is the one the manifest recorded and
// that the shards tile the parameters; it returns the complete state either way (no shards), so a
// checkpoint of any strategy restores under any other. Decoding costs no more memory than the files
// hold: every length the payload declares is checked against the payload's size, and the parameter
// count a shard declares against the shard files' sizes, before anything is allocated for it.
// Every refusal is a CheckpointError naming the file and what did not match, a file that cannot
// be read included (a directory, a read error, memory exhausted). Binary archives are not portable
// between architectures of different endianness or word size.
//
// saved() tells a program that continues a run when there is one whether there is: it reports
// the shard files of a manifest that is missing rather than let the run start again from step 0.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/array_wrapper.hpp>
#include <boost/serialization/collection_size_type.hpp>
#include <boost/serialization/item_version_type.hpp>
#include <boost/serialization/library_version_type.hpp>
#include <boost/serialization/split_member.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <span>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/checkpoint/detail/checksummed_file.hpp"
#include "cohort/core/compilation.hpp"
#include "cohort/core/error.hpp"

namespace cohort::checkpoint {

using Magic = std::array<char, 8>;
inline constexpr Magic kMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
inline constexpr Magic kManifestMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'M', 'F'};
inline constexpr Magic kShardMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'S', 'H'};
// 4 records the gradient sum; a file of format 3, written before, summed its gradients in float.
inline constexpr std::uint32_t kFormatVersion = 4;
inline constexpr std::uint32_t kOldestFormatVersion = 3;
inline constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4;

constexpr std::string_view value_type_name(std::uint32_t bytes) {
  return bytes == 4 ? "float" : bytes == 8 ? "double" : "unknown";
}

namespace detail {

// The decoders below read what Boost's binary archive writes for a std::string and a std::vector,
// but check each declared length against the payload before they allocate: Boost's own would
// resize to whatever length a damaged or hostile file declares.

// What decode() knows of the payload being decoded, kept in the archive's helper slot: its size
// and the container's format version. An archive opened elsewhere has no bound, as with Boost's
// own decoders, and is of this build's format.
struct Decoding {
  std::uint64_t payload_bytes = std::numeric_limits<std::uint64_t>::max();
  std::uint32_t format_version = kFormatVersion;
};
inline constexpr char kDecodingSlot = 0;  // its address identifies the slot

template <class Archive>
Decoding& decoding(Archive& archive) {
  return archive.template get_helper<Decoding>(const_cast<char*>(&kDecodingSlot));
}

// Refuses a declared length of `count` elements taking at least `element_bytes` each in the
// payload when the payload cannot hold them.
template <class Archive>
void require_fits(Archive& archive, std::string_view field, std::uint64_t count,
                  std::size_t element_bytes) {
  const std::uint64_t bytes = decoding(archive).payload_bytes;
  if (count > bytes / element_bytes) {
    throw std::length_error(std::string(field) + " declares " + std::to_string(count) +
                            " elements of at least " + std::to_string(element_bytes) +
                            " bytes, more than its " + std::to_string(bytes) +
                            " payload bytes hold");
  }
}

template <class Archive>
void load_bounded(Archive& archive, std::string& text, std::string_view field) {
  std::size_t length = 0;  // Boost writes a string's length as a std::size_t
  archive >> length;
  require_fits(archive, field, length, 1);
  text.resize(length);
  if (length > 0) archive >> boost::serialization::make_array(text.data(), length);
}

template <class Archive, class T>
  requires std::is_arithmetic_v<T>
void load_bounded(Archive& archive, std::vector<T>& values, std::string_view field) {
  boost::serialization::collection_size_type count;
  archive >> count;
  require_fits(archive, field, count, sizeof(T));
  if (BOOST_SERIALIZATION_VECTOR_VERSIONED(archive.get_library_version())) {
    boost::serialization::item_version_type item_version;
    archive >> item_version;
  }
  values.resize(count);
  if (count > 0) archive >> boost::serialization::make_array(values.data(), count);
}

// What Boost's binary archive writes for a std::vector of `values`, from a span: the count, then
// the values in one block.
template <class Archive, class T>
requires std::is_arithmetic_v<T>
void save_values(Archive& archive, std::span<const T> values) {
  const boost::serialization::collection_size_type count(values.size());
  archive << count;
  if (!values.empty()) archive << boost::serialization::make_array(values.data(), values.size());
}

// Records of a class type, each taking at least Record::kEncodedBytes in the payload.
template <class Archive, class Record>
  requires std::is_class_v<Record>
void load_bounded(Archive& archive, std::vector<Record>& records, std::string_view field) {
  boost::serialization::collection_size_type count;
  archive >> count;
  if (boost::serialization::library_version_type(3) < archive.get_library_version()) {
    boost::serialization::item_version_type item_version;
    archive >> item_version;
  }
  require_fits(archive, field, count, Record::kEncodedBytes);
  records.resize(count);
  for (Record& record : records) archive >> record;
}

}  // namespace detail

// Where a manifest finds one shard: the file (a plain name, in the manifest's directory), the
// elements it holds and the checksum its container carried when the server wrote it.
struct ShardRecord {
  std::string file;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint32_t crc32 = 0;

  // The fewest payload bytes a record takes: the name's length, begin, end and crc32.
  static constexpr std::size_t kEncodedBytes = sizeof(std::size_t) + 8 + 8 + 4;

  template <class Archive>
  void save(Archive& archive, unsigned /*version*/) const {
    archive << file << begin << end << crc32;
  }
  template <class Archive>
  void load(Archive& archive, unsigned /*version*/) {
    detail::load_bounded(archive, file, "shard file name");
    archive >> begin >> end >> crc32;
  }
  BOOST_SERIALIZATION_SPLIT_MEMBER()
};

// How Boost loads a manifest's records: found by argument-dependent lookup and more specialized
// than Boost's own overload for vectors, so that Boost reads the vector's class information and
// this checks the record count before anything is allocated. Saving is Boost's.
template <class Archive>
void load(Archive& archive, std::vector<ShardRecord>& records, unsigned /*version*/) {
  detail::load_bounded(archive, records, "shards");
}

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
  // The learning-rate schedule's description (optimizer::Schedule::description): a run continues
  // under the schedule it began with.
  std::string schedule;
  // A manifest: parameters and optimizer_state are in these files, not above.
  std::vector<ShardRecord> shards;
  // The gradient's sum (core/reduce_op.hpp's name: sum, or sum_bf16 where the gradient crossed
  // between processes in bfloat16): a run continues with the sum it began with. A file of format
  // 3 has none: sum.
  std::string gradient_sum = "sum";

  template <class Archive>
  void save(Archive& archive, unsigned /*version*/) const {
    save_with_values(archive, parameters, optimizer_state);
  }
  // The archive of this state with `parameters_values` and `optimizer_state_values` in place of
  // its own (a checkpoint written in place: checkpoint/in_place_write.hpp).
  template <class Archive>
  void save_with_values(Archive& archive, std::span<const T> parameters_values,
                        std::span<const T> optimizer_state_values) const {
    archive << optimizer;
    detail::save_values(archive, parameters_values);
    detail::save_values(archive, optimizer_state_values);
    archive << step << seed << global_batch << micro_batches << dataset_size << schedule << shards
            << gradient_sum;
  }
  template <class Archive>
  void load(Archive& archive, unsigned /*version*/) {
    detail::load_bounded(archive, optimizer, "optimizer");
    detail::load_bounded(archive, parameters, "parameters");
    detail::load_bounded(archive, optimizer_state, "optimizer state");
    archive >> step >> seed >> global_batch >> micro_batches >> dataset_size;
    detail::load_bounded(archive, schedule, "schedule");
    archive >> shards;
    if (detail::decoding(archive).format_version >= 4) {
      detail::load_bounded(archive, gradient_sum, "gradient sum");
    }
  }
  BOOST_SERIALIZATION_SPLIT_MEMBER()
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
  void save(Archive& archive, unsigned /*version*/) const {
    archive << elements << begin << end << step << parameters << optimizer_state;
  }
  template <class Archive>
  void load(Archive& archive, unsigned /*version*/) {
    archive >> elements >> begin >> end >> step;
    detail::load_bounded(archive, parameters, "parameters");
    detail::load_bounded(archive, optimizer_state, "optimizer state");
  }
  BOOST_SERIALIZATION_SPLIT_MEMBER()
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

// Whether `name` is one that shard_file_name gives for the manifest named `manifest` (any step,
// token and shard): the shard files a save may remove or report.
inline bool is_shard_file_name(std::string_view manifest, std::string_view name) {
  const auto take = [&](std::string_view text) {
    if (!name.starts_with(text)) return false;
    name.remove_prefix(text.size());
    return true;
  };
  // At least `least` and at most `most` characters of `digits`.
  const auto take_digits = [&](std::string_view digits, std::size_t least, std::size_t most) {
    std::size_t count = 0;
    while (count < name.size() && count < most && digits.find(name[count]) != digits.npos) ++count;
    name.remove_prefix(count);
    return count >= least;
  };
  constexpr std::string_view kDecimal = "0123456789";
  constexpr std::string_view kHex = "0123456789abcdef";
  constexpr std::size_t kAny = std::string_view::npos;
  return !manifest.empty() && take(manifest) && take(".step-") && take_digits(kDecimal, 1, kAny) &&
         take("-") && take_digits(kHex, 16, 16) && take(".shard-") &&
         take_digits(kDecimal, 1, kAny) && take("-of-") && take_digits(kDecimal, 1, kAny) &&
         name.empty();
}

// What a refusal names: "checkpoint <file>" or, for a shard read for its manifest,
// "checkpoint <manifest>: shard <file>".
inline std::string subject_of(const std::filesystem::path& file) {
  return "checkpoint " + file.string();
}

[[noreturn]] inline void refuse_as(const std::string& subject, const std::string& why) {
  throw CheckpointError(subject + ": " + why);
}

[[noreturn]] inline void refuse(const std::filesystem::path& file, const std::string& why) {
  refuse_as(subject_of(file), why);
}

inline std::filesystem::path directory_of(const std::filesystem::path& file) {
  return file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
}

// A checkpoint is a file: refuses a path that names a directory.
inline void refuse_directory(const std::filesystem::path& file, const std::string& subject) {
  std::error_code ignored;  // a path that cannot be examined fails where it is opened
  if (!file.has_filename() || std::filesystem::is_directory(file, ignored)) {
    refuse_as(subject, "is a directory; a checkpoint is a file");
  }
}

// Up to `size` bytes of `fd` into `data`, fewer only at the end of the file; -1 on an error.
inline ssize_t read_some(int fd, char* data, std::size_t size) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::read(fd, data + done, size - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return static_cast<ssize_t>(done);
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

// The payload of `content` streamed to `fd` after the container's header with `magic`, which is
// written last, once the payload's length and checksum are known; returns the checksum. `written`:
// blocks of the payload that are in the file already (ChecksummedFileBuffer).
template <class T, class Payload>
std::uint32_t write_payload(int fd, const std::filesystem::path& file, const Magic& magic,
                            const Payload& content, std::span<const ChecksummedBlock> written) {
  if (::lseek(fd, static_cast<off_t>(kHeaderBytes), SEEK_SET) < 0) {
    refuse(file, std::string("cannot seek: ") + std::strerror(errno));
  }
  ChecksummedFileBuffer payload(fd, written);
  try {
    boost::archive::binary_oarchive archive(payload);
    archive << content;
  } catch (const boost::archive::archive_exception&) {
    if (payload.error() == 0) throw;  // not the file's: the archive's own
  }
  if (!payload.flush()) {
    refuse(file, std::string("write failed: ") + std::strerror(payload.error()));
  }

  std::string header(magic.begin(), magic.end());
  append(header, kFormatVersion);
  append(header, static_cast<std::uint32_t>(sizeof(T)));
  append(header, payload.bytes());
  append(header, payload.crc32());
  if (::pwrite(fd, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
    refuse(file, std::string("write failed: ") + std::strerror(errno));
  }
  return payload.crc32();
}

// A save's temporary file beside `file` ("<name>.tmp-<pid>"): created at once, renamed over `file`
// by commit() once it is durable, and removed when destroyed uncommitted, so that a crash leaves
// either the old file or the new one, never half of one.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::filesystem::path file)
      : file_(std::move(file)),
        temporary_(directory_of(file_) /
                   (file_.filename().string() + ".tmp-" + std::to_string(::getpid()))) {
    refuse_directory(file_, subject_of(file_));
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      refuse(file_, "cannot create " + temporary_.string() + ": " + std::strerror(errno));
    }
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    std::error_code ignored;  // a refusal has said what went wrong
    if (!committed_) std::filesystem::remove(temporary_, ignored);
  }

  int fd() const { return fd_; }
  const std::filesystem::path& file() const { return file_; }

  // Once everything is written: the file durable, renamed over `file`, and the rename durable.
  void commit() {
    if (::fsync(fd_) != 0) refuse(file_, std::string("fsync failed: ") + std::strerror(errno));
    ::close(std::exchange(fd_, -1));
    std::error_code renamed;
    std::filesystem::rename(temporary_, file_, renamed);
    if (renamed) refuse(file_, "cannot rename " + temporary_.string() + ": " + renamed.message());
    committed_ = true;
    // The rename is durable only once the directory entry is.
    const std::filesystem::path directory = directory_of(file_);
    if (const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }

 private:
  std::filesystem::path file_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `content` in the container with `magic`, atomically; returns the payload's CRC-32.
template <class T, class Payload>
std::uint32_t write_container(const std::filesystem::path& file, const Magic& magic,
                              const Payload& content) {
  TemporaryFile temporary(file);
  const std::uint32_t checksum = write_payload<T>(temporary.fd(), file, magic, content, {});
  temporary.commit();
  return checksum;
}

// Closes a descriptor when the scope ends, however it ends.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// The first 8 bytes of `file`, zeros when it cannot be read.
inline Magic magic_of(const std::filesystem::path& file) {
  Magic magic{};
  const Descriptor in{::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (in.fd < 0 || read_some(in.fd, magic.data(), magic.size()) != 8) return Magic{};
  return magic;
}

// The bytes of `file`; a CheckpointError naming `subject` for anything that stops the reading.
inline std::string contents_of(const std::filesystem::path& file, const std::string& subject) {
  refuse_directory(file, subject);
  // Non-blocking: a FIFO in a checkpoint's place is refused below instead of waited on.
  const Descriptor in{::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (in.fd < 0) refuse_as(subject, std::string("cannot open it: ") + std::strerror(errno));
  struct stat status {};
  if (::fstat(in.fd, &status) != 0) {
    refuse_as(subject, std::string("cannot read it: ") + std::strerror(errno));
  }
  if (!S_ISREG(status.st_mode)) refuse_as(subject, "is not a regular file");
  std::string bytes;
  try {
    // The size is a hint: read to the end, in case the file grew since.
    bytes.resize(static_cast<std::size_t>(status.st_size) + 1);
    std::size_t held = 0;
    while (true) {
      const ssize_t got = read_some(in.fd, bytes.data() + held, bytes.size() - held);
      if (got < 0) refuse_as(subject, std::string("cannot read it: ") + std::strerror(errno));
      held += static_cast<std::size_t>(got);
      if (held < bytes.size()) break;
      bytes.resize(bytes.size() * 2);
    }
    bytes.resize(held);
  } catch (const std::bad_alloc&) {
    refuse_as(subject,
              "cannot read it: out of memory for its " + std::to_string(status.st_size) + " bytes");
  }
  return bytes;
}

// The size of `file`, refused as contents_of refuses it when it cannot be read.
inline std::uint64_t size_of(const std::filesystem::path& file, const std::string& subject) {
  refuse_directory(file, subject);
  struct stat status {};
  if (::stat(file.c_str(), &status) != 0) {
    refuse_as(subject, std::string("cannot open it: ") + std::strerror(errno));
  }
  if (!S_ISREG(status.st_mode)) refuse_as(subject, "is not a regular file");
  return static_cast<std::uint64_t>(status.st_size);
}

// A read-only stream over bytes held elsewhere, so that decoding copies nothing.
class ViewBuffer : public std::streambuf {
 public:
  explicit ViewBuffer(std::string_view bytes) {
    char* first = const_cast<char*>(bytes.data());  // never written: no put area, no putback
    setg(first, first, first + bytes.size());
  }
};

template <class Payload>
struct Contents {
  Payload payload;
  std::uint32_t crc32 = 0;
};

inline bool has_magic(std::string_view bytes, const Magic& magic) {
  return bytes.size() >= kHeaderBytes && std::equal(magic.begin(), magic.end(), bytes.begin());
}

// Checks the container with `magic` that `bytes` hold and decodes its payload; refusals name
// `subject`.
template <class T, class Payload>
Contents<Payload> decode(const std::string& subject, std::string_view bytes, const Magic& magic) {
  if (!has_magic(bytes, magic)) {
    if (has_magic(bytes, kShardMagic)) {
      refuse_as(subject, "is one shard of a sharded checkpoint; restore its manifest instead");
    }
    refuse_as(subject, magic == kShardMagic ? "not a cohort checkpoint shard (no COHORTSH header)"
                                            : "not a cohort checkpoint (no COHORTCK header)");
  }
  const auto version = extract<std::uint32_t>(bytes, 8);
  if (version < kOldestFormatVersion || version > kFormatVersion) {
    refuse_as(subject, "format version " + std::to_string(version) + ", this build reads " +
                           std::to_string(kOldestFormatVersion) + " to " +
                           std::to_string(kFormatVersion));
  }
  const auto value_bytes = extract<std::uint32_t>(bytes, 12);
  if (value_bytes != sizeof(T)) {
    refuse_as(subject, std::string("holds ") + std::string(value_type_name(value_bytes)) +
                           " parameters, the model has " + std::string(value_type_name(sizeof(T))));
  }
  const auto length = extract<std::uint64_t>(bytes, 16);
  if (bytes.size() - kHeaderBytes != length) {
    refuse_as(subject, "truncated or padded: header says " + std::to_string(length) +
                           " payload bytes, file holds " +
                           std::to_string(bytes.size() - kHeaderBytes));
  }
  const std::string_view payload = bytes.substr(kHeaderBytes);
  const auto stored = extract<std::uint32_t>(bytes, 24);
  if (const std::uint32_t computed = crc32(payload); computed != stored) {
    std::ostringstream why;
    why << std::hex << "checksum mismatch: stored 0x" << stored << ", computed 0x" << computed
        << " (the file is corrupted)";
    refuse_as(subject, why.str());
  }
  // The archive begins with its signature, a string Boost would allocate for at whatever length
  // the payload declares: checked here, before the archive reads it.
  const std::string_view signature = boost::archive::BOOST_ARCHIVE_SIGNATURE();
  if (payload.size() < sizeof(std::size_t) + signature.size() ||
      extract<std::size_t>(payload, 0) != signature.size() ||
      payload.substr(sizeof(std::size_t), signature.size()) != signature) {
    refuse_as(subject, "cannot decode the payload: it is not a Boost.Serialization binary archive");
  }

  Contents<Payload> contents;
  contents.crc32 = stored;
  try {
    ViewBuffer buffer(payload);
    boost::archive::binary_iarchive archive(buffer);
    decoding(archive) = {.payload_bytes = payload.size(), .format_version = version};
    archive >> contents.payload;
  } catch (const std::exception& failure) {
    refuse_as(subject, std::string("cannot decode the payload: ") + failure.what());
  }
  return contents;
}

// Reads and checks a container with `magic` and decodes its payload.
template <class T, class Payload>
Contents<Payload> read_container(const std::filesystem::path& file, const Magic& magic,
                                 const std::string& subject) {
  return decode<T, Payload>(subject, contents_of(file, subject), magic);
}

template <class T, class Payload>
Contents<Payload> read_container(const std::filesystem::path& file, const Magic& magic) {
  return read_container<T, Payload>(file, magic, subject_of(file));
}

// A manifest names its shards by plain file names in its own directory.
inline void require_plain_name(const std::filesystem::path& manifest, std::string_view name) {
  if (name.empty() || name == "." || name == ".." ||
      name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
    refuse(manifest, "names the shard file \"" + std::string(name) +
                         "\", which is not a plain file name in the manifest's directory");
  }
}

// Fills a manifest's parameters and optimizer state from its shard files.
template <class T>
void assemble(const std::filesystem::path& manifest, TrainingState<T>& state) {
  std::vector<ShardRecord> records = state.shards;
  std::sort(records.begin(), records.end(),
            [](const ShardRecord& a, const ShardRecord& b) { return a.begin < b.begin; });
  const std::filesystem::path directory = manifest.parent_path();
  // What the shard files hold bounds the parameter count a shard may declare.
  std::uint64_t shard_bytes = 0;
  const auto subject = [&](const std::filesystem::path& file) {
    return subject_of(manifest) + ": shard " + file.string();
  };
  for (const ShardRecord& record : records) {
    require_plain_name(manifest, record.file);
    shard_bytes += size_of(directory / record.file, subject(directory / record.file));
  }
  std::uint64_t elements = 0;
  std::uint64_t slots = 0;
  std::uint64_t next = 0;
  bool first = true;
  for (const ShardRecord& record : records) {
    const std::filesystem::path file = directory / record.file;
    const auto [shard, checksum] =
        read_container<T, ShardState<T>>(file, kShardMagic, subject(file));
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
    const std::uint64_t length = shard.end >= shard.begin ? shard.end - shard.begin : 0;
    if (first) {
      first = false;
      elements = shard.elements;
      slots = length == 0 ? 0 : shard.optimizer_state.size() / length;
      if (elements > shard_bytes / sizeof(T) / (1 + slots)) {
        refuse(manifest, "shard " + file.string() + " declares " + std::to_string(elements) +
                             " parameters with " + std::to_string(slots) +
                             " optimizer state slots, more than the shard files' " +
                             std::to_string(shard_bytes) + " bytes hold");
      }
      state.parameters.assign(elements, T{});
      state.optimizer_state.assign(slots * elements, T{});
    }
    if (shard.elements != elements) mismatch("elements", shard.elements, elements);
    if (shard.end < shard.begin || shard.end > elements || shard.parameters.size() != length ||
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

// The files beside `file` (in its directory) whose names `wanted` accepts, sorted; none when the
// directory cannot be listed.
template <class Predicate>
std::vector<std::filesystem::path> files_beside(const std::filesystem::path& file,
                                                Predicate wanted) {
  std::vector<std::filesystem::path> found;
  std::error_code error;
  for (std::filesystem::directory_iterator entry(directory_of(file), error), end;
       !error && entry != end; entry.increment(error)) {
    if (wanted(entry->path().filename().string())) found.push_back(entry->path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Refuses a missing manifest `file` whose shard files exist: a save that stopped before it wrote
// the manifest, or a manifest removed since. Starting again would silently discard them.
inline void refuse_orphaned_shards(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  const auto shards =
      files_beside(file, [&](std::string_view entry) { return is_shard_file_name(name, entry); });
  if (shards.empty()) return;
  std::string names;
  for (const auto& shard : shards) names += (names.empty() ? "" : ", ") + shard.string();
  refuse(file, "does not exist, but " + std::to_string(shards.size()) +
                   " shard files of it do: " + names +
                   " (a save that stopped before writing its manifest, or a manifest removed "
                   "since); remove them to start a new run");
}

// The shard files a manifest at `file` names with the names a save of it gives, the only ones a
// save over it removes; empty when there is no readable manifest there. A template of the value
// type being saved, so that only write() instantiates it: as a plain inline function it made every
// file that includes this header instantiate both decoders, and with them Boost's serializer
// singletons, which a program then constructed at start-up whether it saved or not.
template <class Saved>
std::vector<std::filesystem::path> shard_files(const std::filesystem::path& file) {
  std::vector<std::filesystem::path> files;
  if (magic_of(file) != kManifestMagic) return files;
  const std::string name = file.filename().string();
  // The value type only has to match the file's (decode checks it before anything else); a
  // manifest of either type lists its shards. The saved type first: usually a save over a save of
  // the same run.
  using Other = std::conditional_t<std::is_same_v<Saved, float>, double, float>;
  const auto list = [&]<class T>() {
    try {
      for (const auto& record :
           read_container<T, TrainingState<T>>(file, kManifestMagic).payload.shards) {
        if (is_shard_file_name(name, record.file)) {
          files.push_back(directory_of(file) / record.file);
        }
      }
      return true;
    } catch (const CheckpointError&) {
      return false;
    }
  };
  if (!list.template operator()<Saved>()) list.template operator()<Other>();
  return files;
}

// Whether the process `pid` of this host runs: a temporary of its save is in use.
inline bool process_runs(std::string_view pid) {
  pid_t number = 0;
  const auto [end, error] = std::from_chars(pid.data(), pid.data() + pid.size(), number);
  return error == std::errc() && end == pid.data() + pid.size() &&
         (::kill(number, 0) == 0 || errno == EPERM);
}

// Removes the temporary files that saves of `file`, or of its shards, left when their process
// died before the rename (TemporaryFile's "<name>.tmp-<pid>"); not those of a process of this
// host that runs, which may be writing the same file (the processes of an elastic job that fell
// below its minimum: trainer/periodic_checkpoints.hpp, save_alone).
inline void remove_stale_temporaries(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  const auto stale = files_beside(file, [&](std::string_view entry) {
    const std::size_t mark = entry.rfind(".tmp-");
    if (mark == std::string_view::npos) return false;
    const std::string_view pid = entry.substr(mark + 5);
    const std::string_view target = entry.substr(0, mark);
    return !pid.empty() && pid.find_first_not_of("0123456789") == std::string_view::npos &&
           (target == name || is_shard_file_name(name, target)) && !process_runs(pid);
  });
  std::error_code ignored;  // one left behind costs space, never correctness
  for (const auto& temporary : stale) std::filesystem::remove(temporary, ignored);
}

}  // namespace detail

// Writes a complete training state, or a manifest (state.shards not empty), to `file`; then removes
// the shard files only the manifest it replaced named, and the temporary files of saves of `file`
// that died. Each removed file has a name a save of `file` gives (shard_file_name).
template <class T>
void write(const std::filesystem::path& file, const TrainingState<T>& state);

// Writes one server's shard; returns the checksum the manifest records for it.
template <class T>
std::uint32_t write(const std::filesystem::path& file, const ShardState<T>& shard) {
  return detail::write_container<T>(file, kShardMagic, shard);
}

// The error of every other process when the chief of a multi-process job could not write `file`
// in a save they all make (Trainer::save): the chief's own reason, quoted.
inline CheckpointError not_written_by_chief(const std::filesystem::path& file,
                                            std::string_view reason) {
  return CheckpointError("checkpoint " + file.string() +
                         " was not written: the chief (rank 0) reports " + quote_peer_text(reason));
}

// The error of a save across processes whose exchange failed (`error`, this rank's): `what` did
// not happen, and why; the most common cause is a process that did not call Trainer::save.
inline CommError save_incomplete(const CommError& error, const std::filesystem::path& file,
                                 std::string_view what) {
  return CommError({.rank = error.rank(),
                    .peer = error.peer(),
                    .operation = "save",
                    .detail = "checkpoint " + file.string() + ": " + std::string(what) +
                              " (every process must call Trainer::save after the same fit): " +
                              std::string(error.detail())});
}

// Whether a checkpoint was saved at `file`, for a program that continues its run when there is
// one and starts a new run when there is none: true when `file` exists (restore it), false when
// neither `file` nor any shard file of it does (start from step 0). A CheckpointError when `file`
// is a directory, or when shard files of a sharded checkpoint exist without their manifest `file`
// (the error names them): starting again would silently discard what they hold.
inline bool saved(const std::filesystem::path& file) {
  std::error_code error;
  if (std::filesystem::exists(file, error)) {
    detail::refuse_directory(file, detail::subject_of(file));
    return true;
  }
  if (!error) detail::refuse_orphaned_shards(file);
  return false;
}

// The complete state saved in `file`, a checkpoint or a manifest (whose shards it reads): its
// values in parameters and optimizer_state, its shards empty.
template <class T>
TrainingState<T> read(const std::filesystem::path& file) {
  if (std::error_code error; !std::filesystem::exists(file, error) && !error) {
    detail::refuse_orphaned_shards(file);
  }
  const std::string subject = detail::subject_of(file);
  const std::string bytes = detail::contents_of(file, subject);
  if (!detail::has_magic(bytes, kManifestMagic)) {
    TrainingState<T> state = detail::decode<T, TrainingState<T>>(subject, bytes, kMagic).payload;
    if (!state.shards.empty()) {
      detail::refuse(file, "a complete checkpoint, but it lists " +
                               std::to_string(state.shards.size()) + " shard files");
    }
    return state;
  }
  TrainingState<T> state =
      detail::decode<T, TrainingState<T>>(subject, bytes, kManifestMagic).payload;
  try {
    detail::assemble(file, state);
  } catch (const std::bad_alloc&) {
    detail::refuse(file, "out of memory for the parameters its shards hold");
  }
  state.shards.clear();  // the values are all in the state now
  return state;
}

template <class T>
void write(const std::filesystem::path& file, const TrainingState<T>& state) {
  const auto replaced = detail::shard_files<T>(file);
  detail::write_container<T>(file, state.shards.empty() ? kMagic : kManifestMagic, state);
  for (const auto& old : replaced) {
    const bool kept =
        std::any_of(state.shards.begin(), state.shards.end(),
                    [&](const auto& record) { return old.filename() == record.file; });
    std::error_code ignored;  // a shard left behind costs space, never correctness
    if (!kept) std::filesystem::remove(old, ignored);
  }
  detail::remove_stale_temporaries(file);
}

}  // namespace cohort::checkpoint

#if defined(COHORT_SEPARATE_COMPILATION)
namespace cohort::checkpoint {
COHORT_INSTANTIATED TrainingState<float> read<float>(const std::filesystem::path&);
COHORT_INSTANTIATED TrainingState<double> read<double>(const std::filesystem::path&);
COHORT_INSTANTIATED void write<float>(const std::filesystem::path&, const TrainingState<float>&);
COHORT_INSTANTIATED void write<double>(const std::filesystem::path&, const TrainingState<double>&);
COHORT_INSTANTIATED std::uint32_t write<float>(const std::filesystem::path&,
                                               const ShardState<float>&);
COHORT_INSTANTIATED std::uint32_t write<double>(const std::filesystem::path&,
                                                const ShardState<double>&);
}  // namespace cohort::checkpoint
#endif
