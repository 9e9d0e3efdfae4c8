// A complete checkpoint written in place: its values written into the file by their owners, in
// shares, from wherever they hold them, and the rest of the archive around them afterwards. This
// is how a fit takes its checkpoints (trainer/snapshot_write.hpp): each replica thread of the chief
// writes its share of the state from its own memory into the file, checksumming it as it goes, so
// that no copy of the state is kept in a buffer of its size, and what the fit leaves to a
// background thread is the archive's small fields, the header, fsync and the rename.
//
// The file is the one checkpoint::write writes for the same state, byte for byte. The archive is
// first written nowhere (detail::PayloadLayout), TrainingState's own save with the values given as
// spans, so that where the values go is known before anything is written; commit() then writes
// the archive with the values stepped over, and the header with the payload's CRC-32 joined from
// the values' (zlib's crc32_combine), fsyncs the temporary file and renames it over the
// checkpoint. Until commit() the temporary file is removed when this is destroyed: a checkpoint
// abandoned half written leaves nothing.
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/checkpoint/detail/checksummed_file.hpp"
#include "cohort/core/compilation.hpp"

namespace cohort::checkpoint {

// The two blocks of a training state's values.
enum class Values : std::size_t { kParameters = 0, kOptimizerState = 1 };

template <class T>
class InPlaceWrite {
 public:
  // The checkpoint `file` of the state whose settings and step are `fields`' (its own values
  // empty) and whose values have the lengths of `parameters` and `optimizer_state`: spans that
  // identify the values to the archive and are never read here (a device's memory may stand
  // there). Creates the temporary file; a CheckpointError naming `file` where it cannot.
  InPlaceWrite(const std::filesystem::path& file, const TrainingState<T>& fields,
               std::span<const T> parameters, std::span<const T> optimizer_state);
  InPlaceWrite(const InPlaceWrite&) = delete;
  InPlaceWrite& operator=(const InPlaceWrite&) = delete;

  // Writes `values`, elements [first, first + values.size()) of block `which`, at their place; on
  // any thread, beside the others. False once any write has failed (commit() names the error).
  bool write(Values which, std::size_t first, std::span<const T> values) {
    if (error_.load(std::memory_order_relaxed) != 0) return false;
    const char* data = reinterpret_cast<const char*>(values.data());
    std::size_t left = values.size_bytes();
    auto offset = static_cast<off_t>(kHeaderBytes + offsets_[static_cast<std::size_t>(which)] +
                                     first * sizeof(T));
    while (left != 0) {
      const ssize_t written = ::pwrite(temporary_.fd(), data, left, offset);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) {
        int expected = 0;
        error_.compare_exchange_strong(expected, written < 0 ? errno : ENOSPC);
        return false;
      }
      data += written;
      left -= static_cast<std::size_t>(written);
      offset += written;
    }
    return true;
  }

  // Once every value is written, `parameters_crc32` and `optimizer_state_crc32` the CRC-32 of each
  // whole block: the checkpoint complete, durable and renamed over the file; a CheckpointError
  // naming the file where a write failed.
  void commit(std::uint32_t parameters_crc32, std::uint32_t optimizer_state_crc32);

  const std::filesystem::path& file() const { return temporary_.file(); }

 private:
  // The archive's view of the state: its fields, and the values' spans in place of its vectors.
  struct View {
    const TrainingState<T>* fields;
    std::array<std::span<const T>, 2> values;

    template <class Archive>
    void serialize(Archive& archive, unsigned /*version*/) const {
      fields->save_with_values(archive, values[0], values[1]);
    }
  };

  std::array<ChecksummedBlock, 2> blocks(std::uint32_t parameters_crc32,
                                         std::uint32_t optimizer_state_crc32) const {
    const auto bytes = [](std::span<const T> values) {
      return std::string_view(reinterpret_cast<const char*>(values.data()), values.size_bytes());
    };
    return {ChecksummedBlock{.bytes = bytes(view_.values[0]), .crc32 = parameters_crc32},
            ChecksummedBlock{.bytes = bytes(view_.values[1]), .crc32 = optimizer_state_crc32}};
  }

  TrainingState<T> fields_;
  View view_;
  detail::TemporaryFile temporary_;
  std::array<std::uint64_t, 2> offsets_{};  // of each block in the payload
  std::atomic<int> error_ = 0;              // errno of the first failed write
};

template <class T>
InPlaceWrite<T>::InPlaceWrite(const std::filesystem::path& file, const TrainingState<T>& fields,
                              std::span<const T> parameters, std::span<const T> optimizer_state)
    : fields_(fields), view_{&fields_, {parameters, optimizer_state}}, temporary_(file) {
  const auto laid_out = blocks(0, 0);
  detail::PayloadLayout layout(laid_out);
  {
    boost::archive::binary_oarchive archive(layout);
    const View& view = view_;
    archive << view;
  }
  for (std::size_t block = 0; block < offsets_.size(); ++block) {
    offsets_[block] = layout.offsets()[block];  // kNotFound only for a block without values
  }
}

template <class T>
void InPlaceWrite<T>::commit(std::uint32_t parameters_crc32, std::uint32_t optimizer_state_crc32) {
  if (const int error = error_.load(); error != 0) {
    detail::refuse(file(), std::string("write failed: ") + std::strerror(error));
  }
  const auto written = blocks(parameters_crc32, optimizer_state_crc32);
  detail::write_payload<T>(temporary_.fd(), file(), kMagic, view_, written);
  temporary_.commit();
  detail::remove_stale_temporaries(file());
}

}  // namespace cohort::checkpoint

#if defined(COHORT_SEPARATE_COMPILATION)
namespace cohort::checkpoint {
COHORT_INSTANTIATED class InPlaceWrite<float>;
COHORT_INSTANTIATED class InPlaceWrite<double>;
}  // namespace cohort::checkpoint
#endif
