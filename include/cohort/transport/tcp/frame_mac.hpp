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

// One direction of one connection: begin() a frame with its encoded header, update() with its
// payload in pieces, finish() for the tag. Not thread-safe; one frame at a time.
class FrameMac {
 public:
  explicit FrameMac(const SessionKey& key) : context_(EVP_CIPHER_CTX_new()) {
    if (!context_ ||
        EVP_EncryptInit_ex(context_.get(), EVP_aes_256_gcm(), nullptr,
                           reinterpret_cast<const unsigned char*>(key.data()), nullptr) != 1) {
      fail("EVP_EncryptInit_ex(aes-256-gcm)");
    }
  }

  void begin(std::span<const std::byte, kHeaderBytes> header) {
    std::array<unsigned char, 12> nonce{};
    for (std::size_t i = 0; i < 8; ++i)
      nonce[4 + i] = static_cast<unsigned char>(frames_ >> (8 * i));
    ++frames_;
    if (EVP_EncryptInit_ex(context_.get(), nullptr, nullptr, nullptr, nonce.data()) != 1) {
      fail("EVP_EncryptInit_ex(nonce)");
    }
    update(header);
  }

  void update(std::span<const std::byte> piece) {
    // EVP takes an int length: a long piece goes in parts.
    constexpr std::size_t kMaxPart = std::size_t{1} << 30;
    for (std::size_t at = 0; at < piece.size(); at += kMaxPart) {
      const std::size_t part = std::min(kMaxPart, piece.size() - at);
      int ignored = 0;
      if (EVP_EncryptUpdate(context_.get(), nullptr, &ignored,
                            reinterpret_cast<const unsigned char*>(piece.data() + at),
                            static_cast<int>(part)) != 1) {
        fail("EVP_EncryptUpdate");
      }
    }
  }

  std::uint64_t finish() {
    int ignored = 0;
    std::array<unsigned char, 16> tag{};
    if (EVP_EncryptFinal_ex(context_.get(), nullptr, &ignored) != 1 ||
        EVP_CIPHER_CTX_ctrl(context_.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()),
                            tag.data()) != 1) {
      fail("EVP_EncryptFinal_ex");
    }
    return detail::load_le<std::uint64_t>(reinterpret_cast<const std::byte*>(tag.data()));
  }

 private:
  [[noreturn]] static void fail(const char* call) {
    throw CommError(
        {.detail = std::string("cannot compute a frame's MAC (OpenSSL ") + call + " failed)"});
  }
  struct Free {
    void operator()(EVP_CIPHER_CTX* context) const { EVP_CIPHER_CTX_free(context); }
  };
  std::unique_ptr<EVP_CIPHER_CTX, Free> context_;
  std::uint64_t frames_ = 0;
};

}  // namespace cohort::transport::tcp
