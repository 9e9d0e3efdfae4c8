// The TCP transport's wire format: one frame layout for every message, setup and data alike.
//
//   offset  bytes  field
//        0      4  magic, the bytes 'C' 'H' 'R' 'T'
//        4      2  protocol version (kProtocolVersion)
//        6      2  message type (Header::type for data; kHello ... kAbort during setup)
//        8      8  sequence (Header::sequence)
//       16      8  tag (Header::tag)
//       24      8  payload length n
//       32      n  payload
//     32+n      8  checksum: XXH3-64 of the payload, seeded with XXH3-64 of bytes [0, 32)
//
// Integers are little-endian. The checksum follows the payload rather than sitting in the header
// so that both ends compute it in one streaming pass over data that is already in cache: the
// sender folds each piece just before it hands it to the kernel, the receiver each piece just
// after the kernel wrote it (docs/transport.md, "Checksums"). Seeding it with the header's hash
// makes it cover the header too.
//
// Compatibility promise: the magic and the version keep their place in every version, and a
// hello's payload starts with the sender's rank, so that a peer of another version can always be
// named in the error ("rank 1 speaks protocol version 4, this is version 3").
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "cohort/transport/transport.hpp"

// Header-only use of xxHash: everything static inline, nothing to link (docs/dependencies.md).
//
// A build for baseline x86-64 gets xxHash's SSE2 kernel, about 21 GB/s, no faster than the
// kernel's own copies on loopback. So, as xxHash's own x86 dispatcher does, the header is asked
// for its AVX2 kernel too (XXH_DISPATCH_AVX2), compiled for AVX2 whatever the build's flags, and
// processors with AVX2 use it for long inputs (2.5 to 3 times as fast; docs/transport.md). The
// kernels compute the same function, so ranks on different processors agree. Where the header
// was already expanded in this translation unit, or is a version whose internals differ, the
// portable path is all there is.
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#define COHORT_TCP_DEFINED_XXH_INLINE_ALL
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__AVX2__) && \
    !defined(XXH_DISPATCH_AVX2) && !defined(XXH_IMPLEM_13a8737387)
#include <immintrin.h>  // declares the AVX2 intrinsics whatever the build's flags
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#define COHORT_TCP_DEFINED_XXH_DISPATCH_AVX2
#endif
#include <xxhash.h>
#ifdef COHORT_TCP_DEFINED_XXH_INLINE_ALL
#undef XXH_INLINE_ALL
#undef COHORT_TCP_DEFINED_XXH_INLINE_ALL
#endif
#ifdef COHORT_TCP_DEFINED_XXH_DISPATCH_AVX2
#undef XXH_DISPATCH_AVX2
#undef XXH_TARGET_AVX2
#undef COHORT_TCP_DEFINED_XXH_DISPATCH_AVX2
#if XXH_VERSION_NUMBER >= 800 && XXH_VERSION_NUMBER <= 801  // internals as used below
#define COHORT_TCP_XXH3_AVX2 1
#endif
#endif

namespace cohort::transport::tcp {

inline constexpr std::uint32_t kMagic = 0x54524843;  // "CHRT" read as a little-endian integer
inline constexpr std::uint16_t kProtocolVersion = 5;
inline constexpr std::size_t kHeaderBytes = 32;
inline constexpr std::size_t kTrailerBytes = 8;

// Message types of the setup protocol (rendezvous.hpp). They are only ever read while a
// connection is being set up, so they cannot be confused with data frames of the same type.
namespace setup_type {
inline constexpr std::uint16_t kHello = 0xff01;    // who I am: rank, size, job id, nonce
inline constexpr std::uint16_t kConfirm = 0xff02;  // your hello is accepted (+ HMAC proof)
inline constexpr std::uint16_t kTable = 0xff03;    // rank 0: where every rank listens
inline constexpr std::uint16_t kReady = 0xff04;    // to rank 0: all my connections are up
inline constexpr std::uint16_t kGo = 0xff05;       // rank 0: every rank is ready
inline constexpr std::uint16_t kAbort = 0xff06;    // the rendezvous failed; payload says why
inline constexpr std::uint16_t kWelcome = 0xff07;  // a running job's rank 0: join as rank r of n
inline constexpr std::uint16_t kReadmitted = 0xff08;  // a rank that readmits: your place is yours
}  // namespace setup_type

namespace detail {

template <class T>
void store_le(std::byte* out, T value) {
  if constexpr (std::endian::native == std::endian::big) {
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out[i] = static_cast<std::byte>(value >> (8 * i));
    }
  } else {
    std::memcpy(out, &value, sizeof(T));
  }
}

template <class T>
T load_le(const std::byte* in) {
  if constexpr (std::endian::native == std::endian::big) {
    T value = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      value = static_cast<T>(value | (static_cast<T>(in[i]) << (8 * i)));
    }
    return value;
  } else {
    T value;
    std::memcpy(&value, in, sizeof(T));
    return value;
  }
}

}  // namespace detail

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

// A frame header as read from the wire, before anything about it is trusted.
struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kProtocolVersion;
  Header header;
  std::uint64_t length = 0;
};

inline HeaderBytes encode_header(const Header& header, std::uint64_t length,
                                 std::uint16_t version = kProtocolVersion) {
  HeaderBytes bytes;
  detail::store_le(bytes.data() + 0, kMagic);
  detail::store_le(bytes.data() + 4, version);
  detail::store_le(bytes.data() + 6, header.type);
  detail::store_le(bytes.data() + 8, header.sequence);
  detail::store_le(bytes.data() + 16, header.tag);
  detail::store_le(bytes.data() + 24, length);
  return bytes;
}

inline FrameHeader decode_header(const std::byte* bytes) {
  FrameHeader frame;
  frame.magic = detail::load_le<std::uint32_t>(bytes + 0);
  frame.version = detail::load_le<std::uint16_t>(bytes + 4);
  frame.header.type = detail::load_le<std::uint16_t>(bytes + 6);
  frame.header.sequence = detail::load_le<std::uint64_t>(bytes + 8);
  frame.header.tag = detail::load_le<std::uint64_t>(bytes + 16);
  frame.length = detail::load_le<std::uint64_t>(bytes + 24);
  return frame;
}

namespace detail {

#ifdef COHORT_TCP_XXH3_AVX2
// XXH3 over inputs longer than XXH3_MIDSIZE_MAX with the AVX2 kernel: the same value as
// XXH3_64bits_withSeed, from xxHash's own building blocks. Both end with vzeroupper, which GCC
// does not insert here: SSE code after dirty upper halves of the vector registers runs at a
// quarter of its speed on this EPYC (measured: the SSE2 kernel fell from 21 to 4.7 GB/s).
__attribute__((__target__("avx2"))) inline XXH64_hash_t xxh3_long_avx2(const void* input,
                                                                       std::size_t length,
                                                                       XXH64_hash_t seed) {
  const XXH64_hash_t hash =
      XXH3_hashLong_64b_withSeed_internal(input, length, seed, XXH3_accumulate_512_avx2,
                                          XXH3_scrambleAcc_avx2, XXH3_initCustomSecret_avx2);
  _mm256_zeroupper();
  return hash;
}

__attribute__((__target__("avx2"))) inline void xxh3_update_avx2(XXH3_state_t* state,
                                                                 const void* input,
                                                                 std::size_t length) {
  XXH3_update(state, static_cast<const xxh_u8*>(input), length, XXH3_accumulate_512_avx2,
              XXH3_scrambleAcc_avx2);
  _mm256_zeroupper();
}

inline bool has_avx2() {
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return available;
}
#endif

}  // namespace detail

// The checksum's seed: the hash of the encoded header, so that the checksum covers it.
inline std::uint64_t checksum_seed(const std::byte* header_bytes) {
  return XXH3_64bits(header_bytes, kHeaderBytes);
}

// The checksum of a payload that is in memory as a whole: XXH3-64 seeded with checksum_seed.
inline std::uint64_t checksum(std::uint64_t seed, std::span<const std::byte> payload) {
#ifdef COHORT_TCP_XXH3_AVX2
  if (payload.size() > XXH3_MIDSIZE_MAX && detail::has_avx2()) {
    return detail::xxh3_long_avx2(payload.data(), payload.size(), seed);
  }
#endif
  return XXH3_64bits_withSeed(payload.data(), payload.size(), seed);
}

// The same checksum, computed over a payload that arrives or leaves in pieces. The result equals
// checksum(seed, whole payload) however the payload is cut.
class StreamingChecksum {
 public:
  // A reset with a seed derives the state's secret only where the seed differs from the state's
  // last one, so the state starts with none: memory that held another state of the same seed (a
  // connection of the mesh before a regroup) would otherwise keep a secret the allocator may
  // since have written over.
  StreamingChecksum() { XXH3_INITSTATE(&state_); }
  void reset(std::uint64_t seed) { XXH3_64bits_reset_withSeed(&state_, seed); }
  void update(std::span<const std::byte> piece) {
#ifdef COHORT_TCP_XXH3_AVX2
    if (detail::has_avx2()) {
      detail::xxh3_update_avx2(&state_, piece.data(), piece.size());
      return;
    }
#endif
    XXH3_64bits_update(&state_, piece.data(), piece.size());
  }
  std::uint64_t digest() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

// A whole frame in one buffer: what setup messages and tests use. The hot path never builds one;
// it writes header, payload and trailer from where they are (connection.hpp).
inline std::vector<std::byte> make_frame(const Header& header, std::span<const std::byte> payload,
                                         std::uint16_t version = kProtocolVersion) {
  std::vector<std::byte> frame(kHeaderBytes + payload.size() + kTrailerBytes);
  const HeaderBytes head = encode_header(header, payload.size(), version);
  std::memcpy(frame.data(), head.data(), kHeaderBytes);
  if (!payload.empty()) std::memcpy(frame.data() + kHeaderBytes, payload.data(), payload.size());
  detail::store_le(frame.data() + kHeaderBytes + payload.size(),
                   checksum(checksum_seed(head.data()), payload));
  return frame;
}

}  // namespace cohort::transport::tcp
