// The CRC-32 of a checkpoint's payload, and the stream buffers that lay out a payload and write it
// to its file.
//
// The checksum is zlib's CRC-32: the IEEE 802.3 polynomial, the value every format version has
// stored, computed several bytes at a time (about six times the speed of a table lookup per byte,
// which took half the CPU of a checkpoint's write; docs/benchmarks.md, "The Trainer's loop").
//
// ChecksummedFileBuffer takes a payload as a Boost archive produces it and writes it to a file
// descriptor, checksumming and counting the bytes on the way: a checkpoint is never held in
// memory a second time. A block that its owners wrote into the file already, at its place, with
// its checksum (a ChecksummedBlock: the values of a checkpoint written in place,
// checkpoint/in_place_write.hpp) is stepped over when the archive comes to it, its checksum
// combined (zlib's crc32_combine) instead of computed. PayloadLayout is the same archive written
// nowhere: it finds where those blocks lie, before anything is written. A failed write is recorded
// (error()) and every later one refused, so that the caller names the errno once the archive gives
// up.
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

// Bytes of a payload and their CRC-32, both the caller's: the archive's view of a block of values
// (its address identifies it; the bytes are not read) and the checksum of what was written there.
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

// The block of `blocks` that the archive writes with `count` bytes at `data`, if any: Boost's
// binary archive writes each array of values in one call.
inline const ChecksummedBlock* find_block(std::span<const ChecksummedBlock> blocks,
                                          const char* data, std::streamsize count) {
  for (const ChecksummedBlock& block : blocks) {
    if (!block.bytes.empty() && block.bytes.data() == data &&
        block.bytes.size() == static_cast<std::size_t>(count)) {
      return &block;
    }
  }
  return nullptr;
}

// Where each of `blocks` lies in the payload an archive writes: offsets[i] for blocks[i], written
// nowhere.
class PayloadLayout : public std::streambuf {
 public:
  explicit PayloadLayout(std::span<const ChecksummedBlock> blocks)
      : blocks_(blocks), offsets_(blocks.size(), kNotFound) {}

  static constexpr std::uint64_t kNotFound = static_cast<std::uint64_t>(-1);
  const std::vector<std::uint64_t>& offsets() const { return offsets_; }

 protected:
  int_type overflow(int_type c) override {
    ++bytes_;
    return traits_type::not_eof(c);
  }

  std::streamsize xsputn(const char* data, std::streamsize count) override {
    if (const ChecksummedBlock* block = find_block(blocks_, data, count)) {
      offsets_[static_cast<std::size_t>(block - blocks_.data())] = bytes_;
    }
    bytes_ += static_cast<std::uint64_t>(count);
    return count;
  }

 private:
  std::span<const ChecksummedBlock> blocks_;
  std::vector<std::uint64_t> offsets_;
  std::uint64_t bytes_ = 0;
};

class ChecksummedFileBuffer : public std::streambuf {
 public:
  // Writes at the descriptor's current offset, stepping over `written`, whose bytes are in the
  // file already; the descriptor stays the caller's.
  explicit ChecksummedFileBuffer(int fd, std::span<const ChecksummedBlock> written = {})
      : fd_(fd), written_(written), buffer_(kBufferBytes) {
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
    if (const ChecksummedBlock* block = find_block(written_, data, count)) {
      return drain() && step_over(*block) ? count : 0;
    }
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
    crc32_ = crc32_update(crc32_, bytes);
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

  bool step_over(const ChecksummedBlock& block) {
    if (error_ != 0) return false;
    if (::lseek(fd_, static_cast<off_t>(block.bytes.size()), SEEK_CUR) < 0) {
      error_ = errno;
      return false;
    }
    crc32_ = crc32_append(crc32_, block.crc32, block.bytes.size());
    bytes_ += block.bytes.size();
    return true;
  }

  int fd_;
  std::span<const ChecksummedBlock> written_;
  std::vector<char> buffer_;
  std::uint32_t crc32_ = 0;
  std::uint64_t bytes_ = 0;
  int error_ = 0;
};

}  // namespace cohort::checkpoint::detail
