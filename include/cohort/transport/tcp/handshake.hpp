// The payloads of the setup messages and the checks made on them: pure functions over bytes, so
// that they can be tested without sockets and so that the rendezvous (rendezvous.hpp) reads as
// the protocol it is.
//
// Every connection, the one to rank 0 and each one of the mesh, starts with the same exchange,
// the connecting side C first, the accepting side A second:
//
//   C -> A  hello(C)   rank, size, job id, listening address, nonce, whether it authenticates
//   A -> C  hello(A)   A's own, with A's nonce            (or abort: why C is refused)
//   C -> A  confirm    proof of C                         (or abort: why A is refused)
//   A -> C  confirm    proof of A                         (or abort: why C is refused)
//
// Each side checks the other's hello field by field and names both values of the first
// difference. With a secret, a proof is HMAC-SHA256(secret, label || hello of C || hello of A):
// both hellos carry a fresh 32-byte nonce, so a proof cannot be replayed on another connection,
// and the label differs by role, so C's proof is not A's. The connecting side proves first: an
// acceptor answers a stranger's hello with nothing derived from the secret, so that nobody who
// can reach a listening port obtains material for an offline guess of the secret; and it drops a
// connection whose proof does not verify without a word. Without a secret the proof is empty.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/address.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/frame_mac.hpp"

namespace cohort::transport::tcp {

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;
// Setup messages are small; anything bigger is refused before it is read. Until a connection has
// proved the secret it may send only a hello of at most kMaxHelloBytes and a proof, so that an
// attempt costs a bounded amount of memory.
inline constexpr std::size_t kMaxSetupPayloadBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMaxHelloBytes = 1024;

using Nonce = std::array<std::byte, kNonceBytes>;

struct Hello {
  int rank = 0;
  int size = 0;
  bool authenticates = false;
  bool checksums = true;
  bool encrypts = false;
  std::uint16_t listen_port = 0;
  std::string listen_address{};
  std::string job_id{};
  std::uint32_t epoch = 0;
  // The hello of a running job's door (door.hpp), not of a rendezvous: it admits the connecting
  // process into the job's next membership epoch, whatever rank, size and epoch it was given.
  bool door = false;
  // The hello of a process that joins a running job (Options::joins_running_job): only a door
  // takes it in; a rendezvous turns it away without failing.
  bool joins = false;
  // The hello of a failed mesh's roll call (roll_call.hpp): only a roll call answers it, and a
  // roll call answers nothing else.
  bool roll_call = false;
  // The hello of a rank 0 that starts a job and asks whether the job runs already
  // (Rendezvous::search_running_job): a door answers it and lets it go, counting no newcomer;
  // anything else turns it away, as one that joins.
  bool asks = false;
  // The hello of a process started again for its rank of a running mesh (Options::rejoin_peers):
  // rank 0's door answers it with the mesh's address table, a rank that readmits holds it until it
  // takes it back (Tcp::readmit).
  bool rejoins = false;
  Nonce nonce{};
};

namespace detail {

class Writer {
 public:
  template <class T>
  void put(T value) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    store_le(bytes_.data() + at, value);
  }
  void put_string(std::string_view text) {
    put(static_cast<std::uint16_t>(text.size()));
    const auto* begin = reinterpret_cast<const std::byte*>(text.data());
    bytes_.insert(bytes_.end(), begin, begin + text.size());
  }
  void put_bytes(std::span<const std::byte> bytes) {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
  }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads fields in order; any read past the end marks the whole message malformed.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <class T>
  T get() {
    if (!ok_ || bytes_.size() - at_ < sizeof(T)) {
      ok_ = false;
      return T{};
    }
    const T value = load_le<T>(bytes_.data() + at_);
    at_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const std::size_t length = get<std::uint16_t>();
    if (!ok_ || bytes_.size() - at_ < length) {
      ok_ = false;
      return {};
    }
    std::string text(reinterpret_cast<const char*>(bytes_.data() + at_), length);
    at_ += length;
    return text;
  }
  void get_bytes(std::span<std::byte> out) {
    if (!ok_ || bytes_.size() - at_ < out.size()) {
      ok_ = false;
      return;
    }
    std::memcpy(out.data(), bytes_.data() + at_, out.size());
    at_ += out.size();
  }
  // True when every field was there and nothing is left over.
  bool complete() const { return ok_ && at_ == bytes_.size(); }

 private:
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
  bool ok_ = true;
};

}  // namespace detail

// Hello payload, version 1: rank u32 (first in every version, frame.hpp), size u32,
// flags u16 (bit 0: authenticates, bit 1: checksums data frames, bit 2: encrypts data frames,
// bit 3: a door, bit 4: joins a running job, bit 5: a roll call, bit 6: asks whether the job runs,
// bit 7: takes back its rank's place),
// listen port u16, nonce,
// listen address, job id (strings: u16 length, bytes).
inline std::vector<std::byte> encode_hello(const Hello& hello) {
  detail::Writer out;
  out.put(static_cast<std::uint32_t>(hello.rank));
  out.put(static_cast<std::uint32_t>(hello.size));
  out.put(static_cast<std::uint16_t>((hello.authenticates ? 1 : 0) | (hello.checksums ? 2 : 0) |
                                     (hello.encrypts ? 4 : 0) | (hello.door ? 8 : 0) |
                                     (hello.joins ? 16 : 0) | (hello.roll_call ? 32 : 0) |
                                     (hello.asks ? 64 : 0) | (hello.rejoins ? 128 : 0)));
  out.put(hello.listen_port);
  out.put_bytes(hello.nonce);
  out.put_string(hello.listen_address);
  out.put_string(hello.job_id);
  out.put(hello.epoch);
  return out.take();
}

inline std::optional<Hello> decode_hello(std::span<const std::byte> payload) {
  detail::Reader in(payload);
  Hello hello;
  const auto rank = in.get<std::uint32_t>();
  const auto size = in.get<std::uint32_t>();
  const auto flags = in.get<std::uint16_t>();
  hello.listen_port = in.get<std::uint16_t>();
  in.get_bytes(hello.nonce);
  hello.listen_address = in.get_string();
  hello.job_id = in.get_string();
  hello.epoch = in.get<std::uint32_t>();
  if (!in.complete() || rank > 0x7fffffffu || size > 0x7fffffffu || (flags & ~255u) != 0) {
    return std::nullopt;
  }
  hello.rank = static_cast<int>(rank);
  hello.size = static_cast<int>(size);
  hello.authenticates = (flags & 1u) != 0;
  hello.checksums = (flags & 2u) != 0;
  hello.encrypts = (flags & 4u) != 0;
  hello.door = (flags & 8u) != 0;
  hello.joins = (flags & 16u) != 0;
  hello.roll_call = (flags & 32u) != 0;
  hello.asks = (flags & 64u) != 0;
  hello.rejoins = (flags & 128u) != 0;
  return hello;
}

// The rank in the first four bytes of a hello of any version, if there are four bytes.
inline std::optional<int> rank_of_hello(std::span<const std::byte> payload) {
  if (payload.size() < 4) return std::nullopt;
  const auto rank = detail::load_le<std::uint32_t>(payload.data());
  if (rank > 0x7fffffffu) return std::nullopt;
  return static_cast<int>(rank);
}

inline std::vector<std::byte> encode_table(std::span<const Address> table) {
  detail::Writer out;
  out.put(static_cast<std::uint32_t>(table.size()));
  for (const Address& address : table) {
    out.put(address.port);
    out.put_string(address.host);
  }
  return out.take();
}

inline std::optional<std::vector<Address>> decode_table(std::span<const std::byte> payload,
                                                        int size) {
  detail::Reader in(payload);
  const auto count = in.get<std::uint32_t>();
  if (count != static_cast<std::uint32_t>(size)) return std::nullopt;
  std::vector<Address> table(count);
  for (Address& address : table) {
    address.port = in.get<std::uint16_t>();
    address.host = in.get_string();
  }
  if (!in.complete()) return std::nullopt;
  return table;
}

// What a running job's door tells a process it admits (door.hpp): its place in the next
// membership epoch, and where that epoch's rendezvous is (its rank 0's listener, which need not
// be the door's: the door stays at the job's rendezvous address after the first rank 0 is lost).
struct Welcome {
  int rank = 0;
  int size = 0;
  std::uint32_t epoch = 0;
  Address rendezvous{};
  friend bool operator==(const Welcome&, const Welcome&) = default;
};

// Welcome payload: rank u32, size u32, epoch u32, the rendezvous's port u16 and host (a string).
inline std::vector<std::byte> encode_welcome(const Welcome& welcome) {
  detail::Writer out;
  out.put(static_cast<std::uint32_t>(welcome.rank));
  out.put(static_cast<std::uint32_t>(welcome.size));
  out.put(welcome.epoch);
  out.put(welcome.rendezvous.port);
  out.put_string(welcome.rendezvous.host);
  return out.take();
}

inline std::optional<Welcome> decode_welcome(std::span<const std::byte> payload) {
  detail::Reader in(payload);
  const auto rank = in.get<std::uint32_t>();
  const auto size = in.get<std::uint32_t>();
  const auto epoch = in.get<std::uint32_t>();
  Address rendezvous;
  rendezvous.port = in.get<std::uint16_t>();
  rendezvous.host = in.get_string();
  if (!in.complete() || size < 2 || size > 0x7fffffffu || rank >= size || rendezvous.host.empty() ||
      rendezvous.port == 0) {
    return std::nullopt;
  }
  return Welcome{static_cast<int>(rank), static_cast<int>(size), epoch, std::move(rendezvous)};
}

inline std::vector<std::byte> encode_text(std::string_view text) {
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

inline std::string decode_text(std::span<const std::byte> payload) {
  return {reinterpret_cast<const char*>(payload.data()), payload.size()};
}

// What this rank expects of a peer's hello.
struct Expectation {
  int rank = 0;                  // this rank
  int size = 1;                  // the job's size
  std::string_view job_id = {};  // this rank's job id
  std::uint32_t epoch = 0;       // this rank's membership epoch
  bool authenticates = false;    // whether this rank has a secret
  bool checksums = true;         // Options::checksum of this rank
  bool encrypts = false;         // Options::encrypt of this rank
  int lowest_peer = 0;           // the peer's rank must lie in [lowest_peer, highest_peer]
  int highest_peer = 0;
  bool door =
      false;  // this rank is a running job's door (door.hpp), which gives the peer its place
};

inline std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

// Whether a peer's hello is of this job but not for this rendezvous: of another membership epoch
// (Options::epoch), or a process that joins a running job where no door is. Refused as a stranger
// is, not as a rank that fails the rendezvous.
inline bool turned_away(const Hello& peer, const Expectation& mine) {
  if (peer.job_id != mine.job_id || peer.door || mine.door) return false;
  return peer.epoch != mine.epoch || peer.joins;
}

// The first difference between a peer's hello and what this rank expects, in words naming both
// values; empty when there is none. The version was checked on the frame header already.
inline std::string check_hello(const Hello& peer, const Expectation& mine) {
  const std::string who = rank_name(peer.rank);
  if (peer.job_id != mine.job_id) {
    return who + " belongs to another job: job id " + quote_peer_text(peer.job_id) +
           " differs from " + quote_peer_text(mine.job_id);
  }
  // Where a door admits the peer, the door gives it its rank, size and epoch: the peer's own are
  // those it was started with.
  const bool placed_by_door = peer.door || mine.door;
  if (peer.joins && !mine.door) {
    return who +
           " came to join a running job, and found this one starting: only a running "
           "job's door takes a process in";
  }
  if (!placed_by_door && peer.epoch != mine.epoch) {
    return who + " is of membership epoch " + std::to_string(peer.epoch) + " of this job, " +
           rank_name(mine.rank) + " of epoch " + std::to_string(mine.epoch) +
           ": the job regrouped without " + (peer.epoch < mine.epoch ? who : rank_name(mine.rank));
  }
  if (!placed_by_door && peer.size != mine.size) {
    return who + " was told the job has " + std::to_string(peer.size) + " ranks, " +
           rank_name(mine.rank) + " was told " + std::to_string(mine.size);
  }
  if (!placed_by_door && (peer.rank < mine.lowest_peer || peer.rank > mine.highest_peer)) {
    if (mine.lowest_peer == mine.highest_peer) {
      return "expected " + rank_name(mine.lowest_peer) + " but the peer says it is " + who;
    }
    return "a peer says it is " + who + ", expected one of ranks " +
           std::to_string(mine.lowest_peer) + " to " + std::to_string(mine.highest_peer) + " of " +
           std::to_string(mine.size);
  }
  if (peer.checksums != mine.checksums) {
    const auto setting = [](bool on) { return on ? "checksum = true" : "checksum = false"; };
    return who + " has " + setting(peer.checksums) + ", " + rank_name(mine.rank) + " has " +
           setting(mine.checksums) + "; every rank must agree";
  }
  if (peer.authenticates != mine.authenticates) {
    return peer.authenticates ? who + " requires authentication (it has a secret), " +
                                    rank_name(mine.rank) + " has no secret"
                              : who + " has no secret, " + rank_name(mine.rank) +
                                    " requires authentication (it has a secret)";
  }
  if (peer.encrypts != mine.encrypts) {
    const auto setting = [](bool on) { return on ? "encrypt = true" : "encrypt = false"; };
    return who + " has " + setting(peer.encrypts) + ", " + rank_name(mine.rank) + " has " +
           setting(mine.encrypts) + "; every rank must agree";
  }
  return {};
}

inline Nonce random_nonce() {
  Nonce nonce;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) !=
      1) {
    throw CommError({.operation = "handshake",
                     .detail = "cannot draw a random nonce (OpenSSL RAND_bytes failed)"});
  }
  return nonce;
}

enum class Role { kConnector, kAcceptor };

namespace detail {

// HMAC-SHA256(secret, label || hello frame of the connector || hello frame of the acceptor).
inline std::array<std::byte, 32> keyed_digest(std::string_view secret, std::string_view label,
                                              std::span<const std::byte> connector_hello,
                                              std::span<const std::byte> acceptor_hello) {
  std::vector<unsigned char> message;
  message.reserve(label.size() + connector_hello.size() + acceptor_hello.size());
  message.insert(message.end(), label.begin(), label.end());
  for (const auto part : {connector_hello, acceptor_hello}) {
    const auto* begin = reinterpret_cast<const unsigned char*>(part.data());
    message.insert(message.end(), begin, begin + part.size());
  }
  std::array<std::byte, 32> mac{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message.data(),
           message.size(), reinterpret_cast<unsigned char*>(mac.data()), &length) == nullptr ||
      length != mac.size()) {
    throw CommError({.operation = "handshake",
                     .detail = "cannot compute an HMAC-SHA256 (OpenSSL HMAC failed)"});
  }
  return mac;
}

}  // namespace detail

// The proof of `role`: HMAC-SHA256(secret, its label || both hello frames as they travelled).
inline std::array<std::byte, kProofBytes> proof(std::string_view secret, Role role,
                                                std::span<const std::byte> connector_hello,
                                                std::span<const std::byte> acceptor_hello) {
  return detail::keyed_digest(
      secret, role == Role::kConnector ? "cohort-tcp-2 connector" : "cohort-tcp-2 acceptor",
      connector_hello, acceptor_hello);
}

// The connection's MAC keys (frame_mac.hpp) as the side of `role` uses them, one per direction,
// derived like the proofs under labels of their own.
inline SessionKeys session_keys(std::string_view secret, Role role,
                                std::span<const std::byte> connector_hello,
                                std::span<const std::byte> acceptor_hello) {
  const SessionKey outward = detail::keyed_digest(secret, "cohort-tcp-2 frames from connector",
                                                  connector_hello, acceptor_hello);
  const SessionKey inward = detail::keyed_digest(secret, "cohort-tcp-2 frames from acceptor",
                                                 connector_hello, acceptor_hello);
  return role == Role::kConnector ? SessionKeys{outward, inward} : SessionKeys{inward, outward};
}

// Constant time, so that a forger learns nothing from how long a refusal takes.
inline bool proofs_equal(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace cohort::transport::tcp
