// The CRC-32 of a checkpoint's payload, and the stream buffer that writes a payload to its file.
//
// The checksum is zlib's CRC-32: the IEEE 802.3 polynomial, the value every format version has
// stored, computed several bytes at a time (about six times the speed of a table lookup per byte,
// which took half the CPU of a checkpoint's write; docs/benchmarks.md, "The Trainer's loop").
//
// ChecksummedFileBuffer takes a payload as a Boost archive produces it and writes it to a file
// descriptor, checksumming and counting the bytes on the way: a checkpoint is never held in
// memory a second time, and the large blocks (the parameters, the optimizer state) go from the
// training state to the file without a copy. A block its caller checksummed already (a
// ChecksummedBlock: a checkpoint taken during a fit checksums its values as it copies them) has its
// checksum combined (zlib's crc32_combine) instead of computed again, when the archive writes
// exactly that block; any other block is checksummed here. A failed write is recorded (error())
// and every later one refused, so that the caller names the errno once the archive gives up.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <streambuf>
#include <string_view>
#include <vector>

namespace cohort::checkpoint {

// Bytes of a payload and their CRC-32, computed by the caller.
struct ChecksummedBlock {
  std::string_view bytes;
  std::uint32_t crc32 = 0;
};

}  // namespace cohort::checkpoint

namespace cohort::checkpoint::detail {

inline std::uint32_t crc32_update(std::uint32_t crc, std::string_view bytes) {
  return static_cast<std::uint32_t>(
      ::crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

inline std::uint32_t crc32(std::string_view bytes) { return crc32_update(0, bytes); }

// The checksum of `first` followed by `second_bytes` bytes whose own checksum is `second`.
inline std::uint32_t crc32_append(std::uint32_t first, std::uint32_t second,
                                  std::uint64_t second_bytes) {
  static_assert(sizeof(z_off_t) == sizeof(std::uint64_t), "cohort: zlib with 64-bit offsets");
  return static_cast<std::uint32_t>(
      ::crc32_combine(first, second, static_cast<z_off_t>(second_bytes)));
}

class ChecksummedFileBuffer : public std::streambuf {
 public:
  // Writes at the descriptor's current offset; the descriptor stays the caller's.
  explicit ChecksummedFileBuffer(int fd, std::span<const ChecksummedBlock> checksummed = {})
      : fd_(fd), checksummed_(checksummed), buffer_(kBufferBytes) {
    reset_put_area();
  }

  // Writes what is buffered; false once any write has failed.
  bool flush() { return drain(); }

  std::uint32_t crc32() const { return crc32_; }
  std::uint64_t bytes() const { return bytes_; }
  int error() const { return error_; }  // errno of the first failed write, 0 if none

 protected:
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }

  std::streamsize xsputn(const char* data, std::streamsize count) override {
    if (count < epptr() - pptr()) {
      std::memcpy(pptr(), data, static_cast<std::size_t>(count));
      pbump(static_cast<int>(count));
      return count;
    }
    // A block that does not fit goes straight to the file, after what is buffered.
    if (!drain() || !put(std::string_view(data, static_cast<std::size_t>(count)))) return 0;
    return count;
  }

  int sync() override { return drain() ? 0 : -1; }

 private:
  // Large enough that the archive's small fields cost few system calls.
  static constexpr std::size_t kBufferBytes = std::size_t{64} << 10;

  void reset_put_area() { setp(buffer_.data(), buffer_.data() + buffer_.size()); }

  bool drain() {
    const std::string_view held(pbase(), static_cast<std::size_t>(pptr() - pbase()));
    reset_put_area();
    return put(held);
  }

  bool put(std::string_view bytes) {
    if (error_ != 0) return false;
    crc32_ = checksummed(bytes);
    bytes_ += bytes.size();
    while (!bytes.empty()) {
      const ssize_t written = ::write(fd_, bytes.data(), bytes.size());
      if (written < 0) {
        if (errno == EINTR) continue;
        error_ = errno;
        return false;
      }
      bytes.remove_prefix(static_cast<std::size_t>(written));
    }
    return true;
  }

  // The checksum so far with `bytes` appended.
  std::uint32_t checksummed(std::string_view bytes) const {
    for (const ChecksummedBlock& block : checksummed_) {
      if (block.bytes.data() == bytes.data() && block.bytes.size() == bytes.size()) {
        return crc32_append(crc32_, block.crc32, bytes.size());
      }
    }
    return crc32_update(crc32_, bytes);
  }

  int fd_;
  std::span<const ChecksummedBlock> checksummed_;
  std::vector<char> buffer_;
  std::uint32_t crc32_ = 0;
  std::uint64_t bytes_ = 0;
  int error_ = 0;
};

}  // namespace cohort::checkpoint::detail
