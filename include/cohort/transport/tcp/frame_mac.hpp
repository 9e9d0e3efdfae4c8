// The trailer of a data frame under a secret: a MAC instead of the unkeyed checksum, so that a
// relay on the path can neither change a frame (a gradient) nor inject one, even when it
// recomputes the checksum (frame.hpp has the layout; the trailer keeps its 8 bytes).
//
// The MAC is GMAC: AES-256-GCM over the frame's header and payload as additional data, with no
// ciphertext, its 16-byte tag cut to the trailer's 8. Chosen by measurement on the development
// machine (docs/transport.md, "Integrity under a secret"): with AES-NI and carry-less
// multiplication it runs at the speed of the unkeyed checksum's portable kernel, faster than
// Poly1305 through OpenSSL's EVP_MAC and several times HMAC-SHA256. An 8-byte tag gives a forger
// one chance in 2^64 per frame, and one try: the first frame that fails ends the connection.
//
// GMAC is GHASH over the data, masked with one AES block. OpenSSL 3.0 computes GHASH 16 bytes
// wide; where the processor has AVX-512 and VPCLMULQDQ, detail::Ghash computes it 64 bytes wide
// (32 blocks per reduction) at about twice the speed, and OpenSSL only encrypts the two blocks
// a frame needs (the hash key, the mask). Both compute the same function (tested against
// OpenSSL's GMAC for lengths 0 to 5000, whole and in pieces), so ranks on different processors
// agree.
//
// With encryption (Options::encrypt) the same AES-256-GCM encrypts the payload as well: the
// header stays clear and is authenticated as additional data, the payload travels as
// ciphertext, and the trailer carries the tag as before. The sender encrypts a piece at a time
// into a buffer of its own (the caller's payload is const), the receiver decrypts in place.
//
// Keys: each connection has one key per direction, derived when its handshake completes as
// HMAC-SHA256(secret, label of the direction || both hellos), so that they are fresh for every
// connection (both hellos carry a fresh nonce) and known only to ranks with the secret. The
// nonce of a frame is its index among the frames sent in that direction on that connection,
// which both ends count (TCP keeps the order, and a connection never outlives a lost frame), so
// no nonce repeats under a key.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define COHORT_TCP_GHASH_VPCLMULQDQ
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/frame.hpp"

namespace cohort::transport::tcp {

inline constexpr std::size_t kSessionKeyBytes = 32;
using SessionKey = std::array<std::byte, kSessionKeyBytes>;

// The keys of one connection, as this end uses them.
struct SessionKeys {
  SessionKey send{};
  SessionKey receive{};
};

namespace detail {

#ifdef COHORT_TCP_GHASH_VPCLMULQDQ
// GHASH computed as POLYVAL (RFC 8452, appendix A): every block byte-reversed, the hash key
// multiplied by x, so that the product needs no bit reflection and reduces with two carry-less
// multiplications by the polynomial's constant. 32 blocks are multiplied by the key's powers
// 32 to 1 and summed before one reduction, four blocks to a 512-bit register.
// GCC 12's AVX-512 intrinsics pass an undefined source that it then warns about (GCC bug
// 105593).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
class Ghash {
 public:
  static bool available() {
    static const bool available = [] {
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0 &&
             __builtin_cpu_supports("vpclmulqdq") != 0 && __builtin_cpu_supports("pclmul") != 0;
    }();
    return available;
  }

  // `key`: the hash key, E_K(0^128), as bytes. Call only where available().
  __attribute__((__target__("pclmul,sse4.1,ssse3"))) void set_key(const unsigned char* key) {
    const __m128i reflected = reversed(key);
    auto low = static_cast<std::uint64_t>(_mm_cvtsi128_si64(reflected));
    auto high = static_cast<std::uint64_t>(_mm_extract_epi64(reflected, 1));
    const bool carry = (high >> 63) != 0;  // times x, reduced
    high = (high << 1) | (low >> 63);
    low <<= 1;
    if (carry) {
      high ^= kPolynomialHigh;
      low ^= 1;
    }
    power_[0] = _mm_set_epi64x(static_cast<long long>(high), static_cast<long long>(low));
    for (std::size_t k = 1; k < kPowers; ++k) power_[k] = dot(power_[k - 1], power_[0]);
  }

  Ghash() = default;
  Ghash(const Ghash&) = delete;
  Ghash& operator=(const Ghash&) = delete;
  // The key's powers are as good as the key for forging: not left in freed memory.
  ~Ghash() { OPENSSL_cleanse(power_, sizeof power_); }

  void reset() { state_ = _mm_setzero_si128(); }

  // Folds whole 16-byte blocks in.
  __attribute__((__target__("avx512f,avx512bw,vpclmulqdq,avx2,pclmul,sse4.1,ssse3"))) void blocks(
      const std::byte* data, std::size_t count) {
    if (count >= kPowers) {
      const __m512i mask =
          _mm512_set_epi32(0x00010203, 0x04050607, 0x08090a0b, 0x0c0d0e0f, 0x00010203, 0x04050607,
                           0x08090a0b, 0x0c0d0e0f, 0x00010203, 0x04050607, 0x08090a0b, 0x0c0d0e0f,
                           0x00010203, 0x04050607, 0x08090a0b, 0x0c0d0e0f);
      __m512i keys[kPowers / 4];
      for (std::size_t g = 0; g < kPowers / 4; ++g) {
        const std::size_t top = kPowers - 1 - 4 * g;  // lane 0's power, then down
        keys[g] = _mm512_inserti32x4(
            _mm512_inserti32x4(
                _mm512_inserti32x4(_mm512_castsi128_si512(power_[top]), power_[top - 1], 1),
                power_[top - 2], 2),
            power_[top - 3], 3);
      }
      for (; count >= kPowers; count -= kPowers, data += 16 * kPowers) {
        __m512i low = _mm512_setzero_si512(), middle = low, high = low;
        for (std::size_t g = 0; g < kPowers / 4; ++g) {
          __m512i x = _mm512_shuffle_epi8(_mm512_loadu_si512(data + 64 * g), mask);
          if (g == 0) x = _mm512_xor_si512(x, _mm512_zextsi128_si512(state_));
          low = _mm512_xor_si512(low, _mm512_clmulepi64_epi128(x, keys[g], 0x00));
          high = _mm512_xor_si512(high, _mm512_clmulepi64_epi128(x, keys[g], 0x11));
          middle = _mm512_xor_si512(middle,
                                    _mm512_xor_si512(_mm512_clmulepi64_epi128(x, keys[g], 0x01),
                                                     _mm512_clmulepi64_epi128(x, keys[g], 0x10)));
        }
        const __m128i m = fold(middle);
        state_ = reduce(_mm_xor_si128(fold(low), _mm_slli_si128(m, 8)),
                        _mm_xor_si128(fold(high), _mm_srli_si128(m, 8)));
      }
      _mm256_zeroupper();  // GCC does not insert it in a function of another target
    }
    for (; count > 0; --count, data += 16) {
      state_ = dot(_mm_xor_si128(state_, reversed(reinterpret_cast<const unsigned char*>(data))),
                   power_[0]);
    }
  }

  // GHASH of what was folded in, as bytes.
  __attribute__((__target__("ssse3"))) void value(unsigned char* out) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(state_, reverse_mask()));
  }

 private:
  static constexpr std::size_t kPowers = 32;
  static constexpr std::uint64_t kPolynomialHigh = 0xC200000000000000ull;

  __attribute__((__target__("ssse3"))) static __m128i reverse_mask() {
    return _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  __attribute__((__target__("ssse3"))) static __m128i reversed(const unsigned char* block) {
    return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)),
                            reverse_mask());
  }
  // The 256-bit product high:low, reduced: POLYVAL's a * b * x^-128.
  __attribute__((__target__("pclmul,sse4.1"))) static __m128i reduce(__m128i low, __m128i high) {
    const __m128i polynomial = _mm_set_epi64x(static_cast<long long>(kPolynomialHigh), 1);
    for (int phase = 0; phase < 2; ++phase) {
      low =
          _mm_xor_si128(_mm_shuffle_epi32(low, 0x4e), _mm_clmulepi64_si128(low, polynomial, 0x10));
    }
    return _mm_xor_si128(high, low);
  }
  __attribute__((__target__("pclmul,sse4.1"))) static __m128i dot(__m128i a, __m128i b) {
    const __m128i middle =
        _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x10), _mm_clmulepi64_si128(a, b, 0x01));
    return reduce(_mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x00), _mm_slli_si128(middle, 8)),
                  _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x11), _mm_srli_si128(middle, 8)));
  }
  // The four 128-bit lanes of `v`, added.
  __attribute__((__target__("avx512f"))) static __m128i fold(__m512i v) {
    v = _mm512_xor_si512(v, _mm512_shuffle_i64x2(v, v, 0x4e));
    v = _mm512_xor_si512(v, _mm512_shuffle_i64x2(v, v, 0xb1));
    return _mm512_castsi512_si128(v);
  }

  alignas(64) __m128i power_[kPowers];  // power_[k]: the key to the power k + 1
  __m128i state_ = _mm_setzero_si128();
};
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace detail

// One direction of one connection: begin() a frame with its encoded header; then, for its
// payload in pieces, update() when authenticating only, seal() on the sending side and open()
// on the receiving side when encrypting; finish() for the sender's tag, verify() for the
// receiver's check. Not thread-safe; one frame at a time.
class FrameMac {
 public:
  enum class Side { kSend, kReceive };

  FrameMac(const SessionKey& key, Side side, bool encrypts)
      : context_(EVP_CIPHER_CTX_new()), side_(side), encrypts_(encrypts) {
#ifdef COHORT_TCP_GHASH_VPCLMULQDQ
    if (!encrypts_ && detail::Ghash::available()) {
      if (!context_ ||
          EVP_EncryptInit_ex(context_.get(), EVP_aes_256_ecb(), nullptr,
                             reinterpret_cast<const unsigned char*>(key.data()), nullptr) != 1 ||
          EVP_CIPHER_CTX_set_padding(context_.get(), 0) != 1) {
        fail("EVP_EncryptInit_ex(aes-256-ecb)");
      }
      std::array<unsigned char, 16> hash_key{};
      encrypt_block(hash_key, hash_key);
      ghash_ = std::make_unique<detail::Ghash>();
      ghash_->set_key(hash_key.data());
      return;
    }
#endif
    // The receiving side of an encrypting connection decrypts: GCM then hashes its input, the
    // ciphertext. Authenticating only, both sides compute the tag the same way.
    const int encrypt = encrypts_ && side_ == Side::kReceive ? 0 : 1;
    if (!context_ || EVP_CipherInit_ex(context_.get(), EVP_aes_256_gcm(), nullptr,
                                       reinterpret_cast<const unsigned char*>(key.data()), nullptr,
                                       encrypt) != 1) {
      fail("EVP_CipherInit_ex(aes-256-gcm)");
    }
  }

  bool encrypts() const noexcept { return encrypts_; }

  void begin(std::span<const std::byte, kHeaderBytes> header) {
    std::array<unsigned char, 12> nonce{};
    for (std::size_t i = 0; i < 8; ++i)
      nonce[4 + i] = static_cast<unsigned char>(frames_ >> (8 * i));
    ++frames_;
#ifdef COHORT_TCP_GHASH_VPCLMULQDQ
    if (ghash_) {
      // GCM's first counter block for a 12-byte nonce: the nonce, then 1.
      std::array<unsigned char, 16> counter{};
      std::copy(nonce.begin(), nonce.end(), counter.begin());
      counter[15] = 1;
      encrypt_block(counter, mask_);
      ghash_->reset();
      length_ = 0;
      partial_size_ = 0;
      update(header);
      return;
    }
#endif
    if (EVP_CipherInit_ex(context_.get(), nullptr, nullptr, nullptr, nonce.data(), -1) != 1) {
      fail("EVP_CipherInit_ex(nonce)");
    }
    update(header);
  }

  // The next piece of a frame that is authenticated, not encrypted.
  void update(std::span<const std::byte> piece) {
#ifdef COHORT_TCP_GHASH_VPCLMULQDQ
    if (ghash_) {
      hash(piece);
      return;
    }
#endif
    in_parts(piece.size(), [&](std::size_t at, int part) {
      int ignored = 0;
      if (EVP_CipherUpdate(context_.get(), nullptr, &ignored,
                           reinterpret_cast<const unsigned char*>(piece.data() + at), part) != 1) {
        fail("EVP_CipherUpdate(additional data)");
      }
    });
  }

  // Sending, encrypting: the next piece of the payload, as ciphertext into `out` (as long as
  // `piece`; it may be the same memory).
  void seal(std::span<const std::byte> piece, std::byte* out) {
    cipher(piece.data(), out, piece.size());
  }

  // Receiving, encrypting: decrypts the next piece of the payload in place. The plaintext is
  // not yet authenticated: verify() says whether the frame may be used.
  void open(std::span<std::byte> piece) { cipher(piece.data(), piece.data(), piece.size()); }

  // Sending: the frame's tag, its GCM tag cut to the trailer's 8 bytes.
  std::uint64_t finish() {
#ifdef COHORT_TCP_GHASH_VPCLMULQDQ
    if (ghash_) {
      // The last block zero-padded, then the lengths in bits: the additional data's, the
      // ciphertext's (none), big-endian.
      if (partial_size_ > 0) {
        std::fill(partial_.begin() + static_cast<std::ptrdiff_t>(partial_size_), partial_.end(),
                  std::byte{0});
        ghash_->blocks(partial_.data(), 1);
      }
      std::array<std::byte, 16> lengths{};
      for (std::size_t i = 0; i < 8; ++i) {
        lengths[7 - i] = static_cast<std::byte>((length_ * 8) >> (8 * i));
      }
      ghash_->blocks(lengths.data(), 1);
      std::array<unsigned char, 16> tag{};
      ghash_->value(tag.data());
      for (std::size_t i = 0; i < tag.size(); ++i) tag[i] ^= mask_[i];
      return detail::load_le<std::uint64_t>(reinterpret_cast<const std::byte*>(tag.data()));
    }
#endif
    int ignored = 0;
    std::array<unsigned char, 16> tag{};
    if (EVP_CipherFinal_ex(context_.get(), nullptr, &ignored) != 1 ||
        EVP_CIPHER_CTX_ctrl(context_.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()),
                            tag.data()) != 1) {
      fail("EVP_CipherFinal_ex");
    }
    return detail::load_le<std::uint64_t>(reinterpret_cast<const std::byte*>(tag.data()));
  }

  // Receiving: whether `sent`, the frame's trailer, is its tag.
  bool verify(std::uint64_t sent) {
    if (!(encrypts_ && side_ == Side::kReceive)) return sent == finish();
    // Decrypting, OpenSSL compares the tag itself, in constant time, on as many bytes as given.
    std::array<std::byte, kTrailerBytes> tag{};
    detail::store_le(tag.data(), sent);
    if (EVP_CIPHER_CTX_ctrl(context_.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag.size()),
                            tag.data()) != 1) {
      fail("EVP_CIPHER_CTX_ctrl(set tag)");
    }
    int ignored = 0;
    return EVP_CipherFinal_ex(context_.get(), nullptr, &ignored) == 1;
  }

 private:
#ifdef COHORT_TCP_GHASH_VPCLMULQDQ
  void encrypt_block(const std::array<unsigned char, 16>& in, std::array<unsigned char, 16>& out) {
    int written = 0;
    if (EVP_EncryptUpdate(context_.get(), out.data(), &written, in.data(), 16) != 1 ||
        written != 16) {
      fail("EVP_EncryptUpdate(aes-256-ecb)");
    }
  }
  // Folds bytes into GHASH, keeping an incomplete block for the next piece.
  void hash(std::span<const std::byte> piece) {
    length_ += piece.size();
    if (partial_size_ > 0) {
      const std::size_t take = std::min(partial_.size() - partial_size_, piece.size());
      std::copy_n(piece.begin(), take,
                  partial_.begin() + static_cast<std::ptrdiff_t>(partial_size_));
      partial_size_ += take;
      piece = piece.subspan(take);
      if (partial_size_ < partial_.size()) return;
      ghash_->blocks(partial_.data(), 1);
      partial_size_ = 0;
    }
    const std::size_t whole = piece.size() / 16;
    ghash_->blocks(piece.data(), whole);
    piece = piece.subspan(16 * whole);
    std::copy(piece.begin(), piece.end(), partial_.begin());
    partial_size_ = piece.size();
  }
  std::unique_ptr<detail::Ghash> ghash_;  // authenticating where the processor has VPCLMULQDQ
  std::array<unsigned char, 16> mask_{};  // E_K(the frame's first counter block)
  std::array<std::byte, 16> partial_{};
  std::size_t partial_size_ = 0;
  std::uint64_t length_ = 0;  // bytes folded into this frame's MAC
#endif
  // EVP takes an int length: a long piece goes in parts.
  template <class Part>
  static void in_parts(std::size_t size, Part&& part) {
    constexpr std::size_t kMaxPart = std::size_t{1} << 30;
    for (std::size_t at = 0; at < size; at += kMaxPart) {
      part(at, static_cast<int>(std::min(kMaxPart, size - at)));
    }
  }
  void cipher(const std::byte* in, std::byte* out, std::size_t size) {
    in_parts(size, [&](std::size_t at, int part) {
      int written = 0;
      if (EVP_CipherUpdate(context_.get(), reinterpret_cast<unsigned char*>(out + at), &written,
                           reinterpret_cast<const unsigned char*>(in + at), part) != 1 ||
          written != part) {
        fail("EVP_CipherUpdate(payload)");
      }
    });
  }
  [[noreturn]] static void fail(const char* call) {
    throw CommError(
        {.detail = std::string("cannot compute a frame's MAC (OpenSSL ") + call + " failed)"});
  }
  struct Free {
    void operator()(EVP_CIPHER_CTX* context) const { EVP_CIPHER_CTX_free(context); }
  };
  std::unique_ptr<EVP_CIPHER_CTX, Free> context_;
  Side side_;
  bool encrypts_;
  std::uint64_t frames_ = 0;
};

}  // namespace cohort::transport::tcp
