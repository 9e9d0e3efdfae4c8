// Transports: point-to-point messages between the ranks of a job.
//
// A transport connects `size()` ranks so that every pair can exchange framed messages. It is what
// the process collectives (collective/ring.hpp, collective/deterministic.hpp) and the parameter
// server are built on. transport::Loopback connects threads of one process through memory (fast
// logic tests); transport::tcp::Tcp connects processes and hosts over TCP (Boost.Asio).
//
// Every message carries a Header chosen by the sender. The receiver states the Header it expects;
// any difference (type, sequence, tag or length) is a HeaderMismatch, a CommError that holds both
// headers as fields so that the layer above can name what each side called. Between one pair of
// ranks, messages arrive in the order they were sent.
//
//   t.rank(), t.size()
//   t.transfer(std::span<const Send> sends, std::span<const Receive> receives)
//       progresses every send and receive together and returns when all are complete, so that a
//       rank may send to its right neighbour while receiving from its left one (a ring) or
//       exchange with every peer at once without deadlock. Sends and receives with the same peer
//       complete in list order. Fails with CommError when a peer closes, sends a malformed or
//       mismatched frame, or nothing completes within the transport's deadline: its rank() is
//       this rank, its peer() the peer when the failure is one connection's, its sequence() the
//       frame's; its operation() is empty, for the layer above names that (a HeaderMismatch for
//       a mismatched frame).
//   t.close()
//       closes every connection now: peers waiting on this rank fail promptly with a CommError
//       naming it; later transfers throw. Safe from any thread, also during a transfer (a
//       collective's abort from another replica thread).
//   t.leave(std::string_view reason)
//       the same, after telling every peer why: a peer that is waiting for this rank fails with
//       "rank R left: '<reason>'" (quoted and cut: quote_peer_text), so the first cause of a
//       failure reaches every rank, not only the neighbours of the rank that died. Only from the
//       thread that runs transfers.
//   t.abort(std::string_view reason)
//       this rank gives up for `reason`, which is its own (a model's exception, a failed check):
//       the transfer in progress fails at once and so does every later one, and the peers fail
//       with "rank R left: '...'" quoting `reason`, not with a closed connection. Safe from any
//       thread, also during a transfer (a collective's abort from a replica thread while the
//       communication thread transfers).
//
// Required of the caller: payload spans stay valid until transfer returns; a receive's payload
// has exactly the length of the matching send's.
//
// A transport that can do the caller's work while it waits for its peers (transport::Overlapping)
// also has:
//   t.transfer(sends, receives, Meanwhile meanwhile)
//       the same, and whenever no frame can move it calls meanwhile() instead of waiting, until
//       a call returns false. Each call is a bounded piece of the caller's work, which touches
//       none of the transfer's payloads: a collective reduces one segment while the next one's
//       frames travel (collective/detail/over_transport.hpp). What the transfer left undone, the
//       caller finishes after it.
//
// A transport that serves requests in arrival order (the parameter server) also needs to know
// which peer to read next. transport::Serving adds:
//   t.wait_any(std::span<const int> peers, std::chrono::milliseconds timeout)
//       returns a peer among `peers` whose next frame has arrived whole, so that a receive of it
//       completes without waiting, or whose next frame cannot be read (its connection ended, its
//       header is malformed: the receive fails and names it); -1 when none within `timeout`. Each
//       peer's partial frame is kept apart until it is whole, so a peer that stops in the middle
//       of a frame holds back nothing but itself. It consumes no frame: a receive of the frame
//       follows (one frame per call; the next frame needs another wait_any). Successive calls
//       rotate where they start looking, so that a busy peer cannot starve the others. Only from
//       the thread that runs transfers.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "cohort/core/error.hpp"

namespace cohort::transport {

// What a message is, in terms the layer above defines: `type` says which protocol it belongs to
// (kCollective, kParameterServer, ...), `sequence` counts that protocol's operations, `tag` is an
// opaque fingerprint of the operation (a collective packs operation, element type, count and
// root or reduce op into it).
struct Header {
  std::uint16_t type = 0;
  std::uint64_t sequence = 0;
  std::uint64_t tag = 0;

  friend bool operator==(const Header&, const Header&) = default;
};

namespace message_type {
inline constexpr std::uint16_t kCollective = 1;
inline constexpr std::uint16_t kParameterServer = 2;
}  // namespace message_type

struct Send {
  int peer;
  Header header;
  std::span<const std::byte> payload;
};

struct Receive {
  int peer;
  Header expected;
  std::span<std::byte> payload;
};

// "(type 1, sequence 7, tag 0x100000007, 28 bytes)": a frame's header and length, for errors.
inline std::string describe(const Header& header, std::uint64_t length) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string tag = "0x";
  bool leading = true;
  for (int shift = 60; shift >= 0; shift -= 4) {
    const auto digit = static_cast<unsigned>((header.tag >> shift) & 0xf);
    if (leading && digit == 0 && shift > 0) continue;
    leading = false;
    tag += kHex[digit];
  }
  return "(type " + std::to_string(header.type) + ", sequence " + std::to_string(header.sequence) +
         ", tag " + tag + ", " + std::to_string(length) + " bytes)";
}

// A frame arrived whose header or length is not the one the receiver expected: a CommError whose
// rank() received it and whose peer() sent it, with both headers as fields, so that the layer
// above can say what each side called.
class HeaderMismatch : public CommError {
 public:
  HeaderMismatch(int receiver, int sender, Header expected, std::size_t expected_length,
                 Header received, std::size_t received_length)
      : CommError({.rank = receiver,
                   .peer = sender,
                   .sequence = expected.sequence,
                   .detail = "header mismatch with rank " + std::to_string(sender) + ": expected " +
                             describe(expected, expected_length) + ", rank " +
                             std::to_string(sender) + " sent " +
                             describe(received, received_length)}),
        expected(expected),
        expected_length(expected_length),
        received(received),
        received_length(received_length) {}

  Header expected;
  std::size_t expected_length;
  Header received;
  std::size_t received_length;
};

// A piece of the caller's work that a transfer may do while it waits (Overlapping): each call
// does one and returns whether more is left. It refers to the work, which outlives the transfer.
class Meanwhile {
 public:
  template <class Work>
  requires std::invocable<Work&> && std::same_as < std::invoke_result_t<Work&>,
  bool > explicit Meanwhile(Work& work)
      : work_(&work),
  piece_([](void* work) { return (*static_cast<Work*>(work))(); }) {}

  bool operator()() const { return piece_(work_); }

 private:
  void* work_;
  bool (*piece_)(void*);
};

template <class T>
concept Transport = requires(T& t, const T& ct, std::span<const Send> sends,
                             std::span<const Receive> receives, std::string_view reason) {
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  t.transfer(sends, receives);
  t.close();
  t.leave(reason);
  t.abort(reason);
};

// A Transport that can also say which peer has a frame ready (see the top of this file).
template <class T>
concept Serving = Transport<T> &&
    requires(T& t, std::span<const int> peers, std::chrono::milliseconds timeout) {
  { t.wait_any(peers, timeout) } -> std::convertible_to<int>;
};

// A Serving transport whose rank takes back the process of a lost peer started again for its
// place (tcp::Tcp::readmit): readmission_waiting() polls for one (its rank, or -1), readmit(rank)
// makes it the connection to that rank, refuse_readmission(rank, why) lets it go.
template <class T>
concept Readmits = Serving<T> && requires(T& t, int rank, const std::string& why) {
  { t.readmission_waiting() } -> std::convertible_to<int>;
  { t.readmit(rank) } -> std::convertible_to<bool>;
  t.refuse_readmission(rank, why);
};

// A Transport that can do the caller's work while it waits (see the top of this file).
template <class T>
concept Overlapping = Transport<T> &&
    requires(T& t, std::span<const Send> sends, std::span<const Receive> receives,
             Meanwhile meanwhile) {
  t.transfer(sends, receives, meanwhile);
};

}  // namespace cohort::transport
