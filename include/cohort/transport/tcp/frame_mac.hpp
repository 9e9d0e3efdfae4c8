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
// OpenSSL computes it (EVP, AES-256-GCM), a piece at a time as the frame is written and read, so
// that each piece is hashed from cache right after the kernel's copy has read it (connection.hpp).
// A faster GHASH (OpenSSL 3.0's is 16 bytes wide; 64 bytes with VPCLMULQDQ measured twice as
// fast) would be code of the project's own in the one place a mistake costs the job's integrity:
// the MAC stays OpenSSL's, and its cost is measured in docs/benchmarks.md.
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

#include <openssl/evp.h>

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

// One direction of one connection: begin() a frame with its encoded header; then, for its
// payload in pieces, update() when authenticating only, seal() on the sending side and open()
// on the receiving side when encrypting; finish() for the sender's tag, verify() for the
// receiver's check. Not thread-safe; one frame at a time.
class FrameMac {
 public:
  enum class Side { kSend, kReceive };

  FrameMac(const SessionKey& key, Side side, bool encrypts)
      : context_(EVP_CIPHER_CTX_new()), side_(side), encrypts_(encrypts) {
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
    if (EVP_CipherInit_ex(context_.get(), nullptr, nullptr, nullptr, nonce.data(), -1) != 1) {
      fail("EVP_CipherInit_ex(nonce)");
    }
    update(header);
  }

  // The next piece of a frame that is authenticated, not encrypted.
  void update(std::span<const std::byte> piece) {
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
