// transport::tcp::Tcp: the transport between processes and hosts, over one TCP connection per
// pair of ranks (Boost.Asio; this folder is the only place cohort includes it).
//
//   tcp::Tcp transport({.rank = r, .size = n, .job_id = "run-42",
//                       .rendezvous_host = "10.0.0.1", .rendezvous_port = 29500,
//                       .bind_address = "0.0.0.0", .secret = shared_secret});
//   transport.transfer(sends, receives);   // transport.hpp: the contract
//
// Construction is the rendezvous (rendezvous.hpp): it returns when every rank is connected to
// every other, authenticated when a secret is set, or throws CommError naming the ranks that
// failed or never came, after at most connect_timeout. Every rank constructs its Tcp with the same
// size, job id, rendezvous address and secret; start order does not matter.
//
// transfer() progresses every send and receive of its lists together on non-blocking sockets
// (frame.hpp has the layout): a frame of up to 256 KiB leaves in one gathering write of header,
// caller's payload and checksum, a longer one 256 KiB at a time (encrypted ones from a buffer of
// the connection); a payload is read straight into the caller's buffer, except the bytes that came
// in the same read as their header (a small frame arrives whole in one read, then is copied
// once). It busy-polls for up to `spin` after the last progress, then sleeps in poll() until a
// socket is ready. It fails with CommError naming this rank, the peer, the frame's type and
// sequence and what happened when a peer closes ("rank 0: rank 2 closed the connection during
// sequence 17 (...)"), when a frame is malformed, too long or corrupted, or when no byte moves for
// operation_timeout; with HeaderMismatch when a frame's header or length is not the expected one.
// The failure is final: the connections involved are shut down, so their peers fail promptly
// too, and every later transfer fails with the same message. Destroy the transport (its
// destructor closes every connection, so that every peer sees end-of-file) and build another.
//
// Required of the caller, beyond transport.hpp: one thread at a time calls transfer() (close()
// may come from any thread); a payload is at most max_frame_bytes long; peers are ranks other
// than this one.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/frame_mac.hpp"
#include "cohort/transport/tcp/options.hpp"
#include "cohort/transport/tcp/rendezvous.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::transport::tcp {

class Tcp {
 public:
  // Binds, meets the other ranks and connects to all of them: Tcp(Listener(options)).
  explicit Tcp(Options options) : Tcp(Listener(std::move(options))) {}

  // Meets the other ranks through a listener bound beforehand (to learn its port first). Once per
  // process, so compiled for size, as the rendezvous is (rendezvous.hpp).
  [[gnu::cold]] explicit Tcp(Listener&& listener)
      : rendezvous_port_(listener.rendezvous_port()),
        options_(std::move(listener.options_)),
        io_(std::move(listener.io_)) {
    if (options_.size == 1) return;
    // The acceptor belongs to io_: a local here, destroyed before io_ even when this throws.
    const auto acceptor = std::move(listener.acceptor_);
    detail::Rendezvous rendezvous(options_, *io_, *acceptor, listener.port_, listener.started_);
    auto links = rendezvous.run();
    peers_.reserve(links.size());
    for (int rank = 0; rank < size(); ++rank) {
      detail::Link& link = links[static_cast<std::size_t>(rank)];
      Peer& peer = peers_.emplace_back(std::move(link.socket));
      if (rank == this->rank()) continue;
      if (link.keys) {
        peer.out_mac.emplace(link.keys->send, FrameMac::Side::kSend, options_.encrypt);
        peer.in_mac.emplace(link.keys->receive, FrameMac::Side::kReceive, options_.encrypt);
        if (options_.encrypt) peer.sealed = std::make_unique<std::byte[]>(kChecksumAhead);
      }
      descriptors_.push_back(peer.socket.native_handle());
      boost::system::error_code ec;
      peer.socket.non_blocking(true, ec);
      if (ec) {
        throw CommError(failed("cannot make the connection to rank " + std::to_string(rank) +
                                   " non-blocking: " + ec.message(),
                               rank)
                            .fields);
      }
    }
  }

  // Movable, so that it can live in an optional or a container (not while a transfer runs);
  // not assignable, because an assignment would have to close one mesh while another is live.
  Tcp(Tcp&& other) noexcept
      : rendezvous_port_(other.rendezvous_port_),
        options_(std::move(other.options_)),
        io_(std::move(other.io_)),
        peers_(std::move(other.peers_)),
        descriptors_(std::move(other.descriptors_)),
        failure_(std::move(other.failure_)),
        last_failure_(std::move(other.last_failure_)),
        closed_(other.closed_.load()),
        isolate_peer_failures_(other.isolate_peer_failures_) {}
  Tcp& operator=(Tcp&&) = delete;

  // Shuts every connection down (the sockets themselves close with peers_, which is declared
  // after io_, so that they go before their io_context).
  ~Tcp() { close(); }

  int rank() const noexcept { return options_.rank; }
  int size() const noexcept { return options_.size; }
  const Options& options() const noexcept { return options_; }
  // Where rank 0 listened: the port it bound (the real one when it asked for port 0).
  std::uint16_t rendezvous_port() const noexcept { return rendezvous_port_; }

  void transfer(std::span<const Send> sends, std::span<const Receive> receives) {
    if (auto failure = progress(sends, receives)) {
      if (failure->mismatch) throw *failure->mismatch;
      throw CommError(std::move(failure->fields));
    }
  }

  // The same without exceptions: `error` is Errc::kComm on failure, and last_failure() says
  // what happened.
  void transfer(std::span<const Send> sends, std::span<const Receive> receives,
                std::error_code& error) {
    if (auto failure = progress(sends, receives)) {
      last_failure_ = CommError::sentence(failure->fields);
      error = make_error_code(Errc::kComm);
    } else {
      error.clear();
    }
  }

  // The message of the last transfer that failed through the error_code form.
  const std::string& last_failure() const noexcept { return last_failure_; }

  // transport.hpp (Serving): a peer among `peers` whose next frame is whole in its inbox, or
  // whose next frame cannot be read (a header the receive refuses, an ended connection); -1 when
  // none within `timeout`. Reads what has arrived from each of them into its own inbox, which
  // grows, doubling with the bytes that came, to hold one whole frame (at most max_frame_bytes
  // and a header and trailer), so that a peer stalled in the middle of a frame holds back only
  // itself. Consumes no frame. Starts looking after the peer it returned last, so that every
  // peer is served in turn.
  int wait_any(std::span<const int> peers, std::chrono::milliseconds timeout) {
    if (peers.empty()) return -1;
    for (const int peer : peers) {
      if (auto failure = check_peer(peer)) throw CommError(std::move(failure->fields));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      for (std::size_t i = 0; i < peers.size(); ++i) {
        const std::size_t at = (next_any_ + i) % peers.size();
        if (next_frame_arrived(peers_[static_cast<std::size_t>(peers[at])])) {
          next_any_ = at + 1;
          return peers[at];
        }
      }
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return -1;
      poll_fds_.clear();
      for (const int peer : peers) {
        poll_fds_.push_back(
            {peers_[static_cast<std::size_t>(peer)].socket.native_handle(), POLLIN, 0});
      }
      const int ready = ::poll(poll_fds_.data(), poll_fds_.size(),
                               static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
      if (ready <= 0) return -1;  // timed out or interrupted: the caller looks again
    }
  }

  // After this call a failure of one connection (a peer that closes, a malformed or mismatched
  // frame, a timeout) ends that connection only: the transfer throws as before, but later
  // transfers with the other peers go on. For a server whose every transfer involves a single
  // peer (strategy/parameter_server.hpp); a transfer with several peers that fails may leave
  // the others' streams cut in the middle of a frame.
  void isolate_peer_failures() noexcept { isolate_peer_failures_ = true; }

  // Shuts every connection down: the peers see end-of-file, a transfer in progress on another
  // thread fails at once, and every later one fails. Safe from any thread at any time (abort()
  // of the collectives calls it): it only shuts descriptors down, which stay open, and so cannot
  // be reused under a transfer's feet, until the destructor.
  void close() noexcept {
    closed_.store(true);
    for (const int descriptor : descriptors_) ::shutdown(descriptor, SHUT_RDWR);
  }

  // Tells every peer why this rank leaves, then closes: a peer that reads the message fails with
  // "rank R left: <reason>", so the first cause of a failure reaches every rank, not only the
  // neighbours of the rank that died. A frame that the failed transfer left half-written is
  // finished first. Best effort and bounded (kLeaveWait). Only from the thread that runs
  // transfers, before the failed transfer's buffers are released.
  void leave(std::string_view reason) noexcept {
    try {
      const auto frame =
          make_frame({setup_type::kAbort}, encode_text(reason.substr(0, kLeaveReasonBytes)));
      const auto deadline = std::chrono::steady_clock::now() + kLeaveWait;
      for (int rank = 0; rank < size(); ++rank) {
        Peer& peer = peers_[static_cast<std::size_t>(rank)];
        if (!peer.socket.is_open() || !finish_cut_frame(rank, deadline)) continue;
        std::size_t written = 0;
        while (written < frame.size() && std::chrono::steady_clock::now() < deadline) {
          detail::ErrorCode ec;
          written += peer.socket.write_some(
              boost::asio::buffer(frame.data() + written, frame.size() - written), ec);
          if (ec && ec != boost::asio::error::would_block && ec != boost::asio::error::try_again) {
            break;
          }
        }
      }
    } catch (...) {
      // Leaving is best effort: the close below still tells every peer that this rank is gone.
    }
    close();
  }

 private:
  // A payload of at most this many bytes is checksummed in one call before its first byte
  // leaves; a longer one leaves in writes of at most this many bytes, each checksummed right
  // after the kernel's copy has read it, while it is still in cache (the copy takes the misses
  // of a payload that is not, as it would anyway). Received pieces are checksummed the same way,
  // right after the kernel wrote them.
  static constexpr std::size_t kChecksumAhead = std::size_t{256} << 10;
  // Bytes read beyond the frame being received wait here for the next receive; a whole small
  // frame (header, payload, trailer) arrives in one read.
  static constexpr std::size_t kInboxBytes = std::size_t{64} << 10;
  // A leave message: its reason is cut to this length (a whole one fits the inbox), and sending
  // it to every peer may take this long.
  static constexpr std::size_t kLeaveReasonBytes = 4096;
  static constexpr std::chrono::milliseconds kLeaveWait{1000};

  struct Failure {
    CommFailure fields;  // the peer set when the failure is one connection's
    std::optional<HeaderMismatch> mismatch{};
  };

  enum class Stage { kHeader, kPayload, kTrailer };

  struct Inbox {
    std::unique_ptr<std::byte[]> data;
    std::size_t capacity = 0;  // kInboxBytes, or more while wait_any gathers a whole frame
    std::size_t begin = 0;
    std::size_t end = 0;

    std::size_t size() const { return end - begin; }
    const std::byte* front() const { return data.get() + begin; }
    void consume(std::size_t bytes) {
      begin += bytes;
      if (begin == end) begin = end = 0;
    }
    // Moves what is left to the front, so that the free space is as large as it can be.
    void compact() {
      if (!data) {
        data = std::make_unique<std::byte[]>(kInboxBytes);
        capacity = kInboxBytes;
      }
      if (begin == 0) return;
      std::memmove(data.get(), data.get() + begin, size());
      end -= begin;
      begin = 0;
    }
    // Room for `bytes` from the front (wait_any: one whole frame). The inbox keeps its size, as
    // the next frames of a serving connection are likely as long.
    void reserve(std::size_t bytes) {
      compact();
      if (bytes <= capacity) return;
      auto grown = std::make_unique<std::byte[]>(bytes);
      std::memcpy(grown.get(), data.get(), size());
      data = std::move(grown);
      capacity = bytes;
    }
  };

  // One connection and the frames in flight on it. Indices refer to the lists of the transfer in
  // progress; -1 is none.
  struct Peer {
    explicit Peer(detail::Socket s) : socket(std::move(s)) {}

    detail::Socket socket;
    // Outgoing: the send being written, the last one queued, frame bytes written, payload bytes
    // folded into the checksum.
    int send = -1;
    int send_tail = -1;
    std::size_t sent = 0;
    // The frame a failed transfer left half-written to this peer: leave() finishes it (its
    // payload is still the caller's) so that the leave message after it can be read.
    std::optional<Send> cut;
    std::size_t hashed = 0;
    HeaderBytes out_header{};
    std::array<std::byte, kTrailerBytes> out_trailer{};
    StreamingChecksum out_checksum;
    // Under a secret, the MAC of each direction takes the checksum's place (frame_mac.hpp).
    std::optional<FrameMac> out_mac;
    std::optional<FrameMac> in_mac;
    // Encrypting: the ciphertext of payload bytes [sealed_from, hashed) of the send being
    // written, at most kChecksumAhead of them.
    std::unique_ptr<std::byte[]> sealed;
    std::size_t sealed_from = 0;
    // Incoming: the receive being read, the last one queued, payload bytes arrived.
    int receive = -1;
    int receive_tail = -1;
    Stage stage = Stage::kHeader;
    std::size_t received = 0;
    std::size_t in_length = 0;  // payload bytes of the frame being received
    std::uint64_t in_seed = 0;
    std::uint64_t in_digest = 0;  // when the payload was checksummed in one call
    bool in_streaming = false;    // when it is checksummed in pieces, by in_checksum
    StreamingChecksum in_checksum;
    Inbox inbox;
  };

  // --- one transfer ------------------------------------------------------------------------

  std::optional<Failure> progress(std::span<const Send> sends, std::span<const Receive> receives) {
    if (failure_) {
      return failed("this transport failed earlier and is closed (" + failure_->detail + ")",
                    failure_->peer, failure_->sequence);
    }
    if (closed_.load()) return failed("the transport was closed");
    // A bad list is the caller's mistake, not a broken connection: the transport stays usable.
    if (auto failure = enqueue(sends, receives)) {
      clear_queues();
      return failure;
    }
    std::size_t pending = sends.size() + receives.size();
    auto last_progress = std::chrono::steady_clock::now();
    const auto warn_after = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        options_.operation_timeout * options_.stall_warning);
    bool warned = false;
    while (pending > 0) {
      bool moved = false;
      for (const int rank : active_) {
        Peer& peer = peers_[static_cast<std::size_t>(rank)];
        std::optional<Failure> failure;
        if (peer.send >= 0) failure = pump_sends(rank, sends, moved, pending);
        if (!failure && peer.receive >= 0) failure = pump_receives(rank, receives, moved, pending);
        if (failure) {
          clear_queues(sends);
          return record(std::move(*failure));
        }
      }
      if (pending == 0) break;
      const auto now = std::chrono::steady_clock::now();
      if (moved) {
        last_progress = now;
        continue;
      }
      if (now - last_progress < options_.spin) {
        // Another runnable thread on this core (a peer rank on an oversubscribed machine) gets
        // the core now rather than at the end of this spin; alone, a yield costs a syscall.
        std::this_thread::yield();
        continue;
      }
      const auto deadline = last_progress + options_.operation_timeout;
      const bool warning_due = options_.stall_warning > 0 && !warned;
      if (warning_due && now >= last_progress + warn_after) {
        warn_stalled(sends, receives, now - last_progress);
        warned = true;
      }
      if (now >= deadline) {
        auto failure = timeout(sends, receives);
        clear_queues(sends);
        return record(std::move(failure));
      }
      const auto wake = warning_due ? std::min(deadline, last_progress + warn_after) : deadline;
      if (auto failure = wait(std::max(wake - now, std::chrono::steady_clock::duration::zero()))) {
        clear_queues(sends);
        return record(std::move(*failure));
      }
    }
    clear_queues();
    return std::nullopt;
  }

  // Chains each peer's sends and receives in list order.
  std::optional<Failure> enqueue(std::span<const Send> sends, std::span<const Receive> receives) {
    next_send_.assign(sends.size(), -1);
    next_receive_.assign(receives.size(), -1);
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const Send& send = sends[i];
      if (auto failure = check_peer(send.peer)) return failure;
      if (send.payload.size() > options_.max_frame_bytes) {
        return failed("the send to rank " + std::to_string(send.peer) + " " +
                      describe(send.header, send.payload.size()) +
                      " exceeds max_frame_bytes = " + std::to_string(options_.max_frame_bytes));
      }
      Peer& peer = activate(send.peer);
      const int index = static_cast<int>(i);
      if (peer.send < 0) {
        peer.send = index;
        start_send(peer, send);
      } else {
        next_send_[static_cast<std::size_t>(peer.send_tail)] = index;
      }
      peer.send_tail = index;
    }
    for (std::size_t i = 0; i < receives.size(); ++i) {
      const Receive& receive = receives[i];
      if (auto failure = check_peer(receive.peer)) return failure;
      if (receive.payload.size() > options_.max_frame_bytes) {
        return failed("the receive from rank " + std::to_string(receive.peer) + " " +
                      describe(receive.expected, receive.payload.size()) +
                      " exceeds max_frame_bytes = " + std::to_string(options_.max_frame_bytes));
      }
      Peer& peer = activate(receive.peer);
      const int index = static_cast<int>(i);
      if (peer.receive < 0) {
        peer.receive = index;
        peer.stage = Stage::kHeader;
      } else {
        next_receive_[static_cast<std::size_t>(peer.receive_tail)] = index;
      }
      peer.receive_tail = index;
    }
    return std::nullopt;
  }

  std::optional<Failure> check_peer(int peer) const {
    if (peer >= 0 && peer < size() && peer != rank()) return std::nullopt;
    return failed("no peer rank " + std::to_string(peer) + " in a job of " +
                  std::to_string(size()) + " ranks");
  }

  Peer& activate(int rank) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    if (peer.send < 0 && peer.receive < 0) active_.push_back(rank);
    return peer;
  }

  void clear_queues(std::span<const Send> sends = {}) {
    for (const int rank : active_) {
      Peer& peer = peers_[static_cast<std::size_t>(rank)];
      if (peer.send >= 0 && peer.sent > 0 && !sends.empty()) {
        peer.cut = sends[static_cast<std::size_t>(peer.send)];
      }
      peer.send = peer.send_tail = peer.receive = peer.receive_tail = -1;
    }
    active_.clear();
  }

  // --- sending -------------------------------------------------------------------------------

  // Writes the rest of the frame a failed transfer cut off, if any; false if it cannot.
  bool finish_cut_frame(int rank, std::chrono::steady_clock::time_point deadline) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    if (!peer.cut) return true;
    const std::span<const Send> cut(&*peer.cut, 1);
    next_send_.assign(1, -1);
    peer.send = 0;
    std::size_t pending = 1;
    while (peer.send >= 0 && std::chrono::steady_clock::now() < deadline) {
      bool moved = false;
      if (pump_sends(rank, cut, moved, pending)) break;
      if (moved) continue;
      // The peer may be stuck writing to this rank: read and drop what it sends, so that both
      // ends move.
      detail::ErrorCode ec;
      std::size_t ignored = 0;
      if (read_some(peer, {}, ignored, ec) == Read::kDone) {
        peer.inbox.consume(peer.inbox.size());
      } else {
        std::this_thread::yield();
      }
    }
    const bool finished = peer.send < 0;
    peer.send = -1;
    peer.cut.reset();
    return finished;
  }

  void start_send(Peer& peer, const Send& send) const {
    peer.out_header = encode_header(send.header, send.payload.size());
    peer.sent = 0;
    if (peer.out_mac) {
      peer.out_mac->begin(peer.out_header);
      peer.hashed = 0;
      if (peer.out_mac->encrypts()) {
        seal_next(peer, send.payload);
      } else if (send.payload.size() <= kChecksumAhead) {
        fold_sent(peer, send.payload, send.payload.size());
      }
      return;
    }
    if (!options_.checksum) {
      peer.out_trailer = {};
      peer.hashed = send.payload.size();
      return;
    }
    const std::uint64_t seed = checksum_seed(peer.out_header.data());
    if (send.payload.size() <= kChecksumAhead) {
      detail::store_le(peer.out_trailer.data(), checksum(seed, send.payload));
      peer.hashed = send.payload.size();
    } else {
      peer.out_checksum.reset(seed);
      peer.hashed = 0;
    }
  }

  // Folds the next `piece` of the payload being sent into its checksum or MAC; the trailer is
  // ready when the whole payload is in.
  static void fold_sent(Peer& peer, std::span<const std::byte> payload, std::size_t piece) {
    const auto bytes = payload.subspan(peer.hashed, piece);
    if (peer.out_mac) {
      peer.out_mac->update(bytes);
    } else {
      peer.out_checksum.update(bytes);
    }
    peer.hashed += piece;
    if (peer.hashed == payload.size()) {
      detail::store_le(peer.out_trailer.data(),
                       peer.out_mac ? peer.out_mac->finish() : peer.out_checksum.digest());
    }
  }

  // Encrypting: the next piece of the payload being sent, into `sealed`, once the one before it
  // has left; the trailer is ready when the whole payload is.
  static void seal_next(Peer& peer, std::span<const std::byte> payload) {
    const std::size_t piece = std::min(kChecksumAhead, payload.size() - peer.hashed);
    peer.out_mac->seal(payload.subspan(peer.hashed, piece), peer.sealed.get());
    peer.sealed_from = peer.hashed;
    peer.hashed += piece;
    if (peer.hashed == payload.size()) {
      detail::store_le(peer.out_trailer.data(), peer.out_mac->finish());
    }
  }

  // Writes as much of this peer's queued frames as its socket takes.
  std::optional<Failure> pump_sends(int rank, std::span<const Send> sends, bool& moved,
                                    std::size_t& pending) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    while (peer.send >= 0) {
      const Send& send = sends[static_cast<std::size_t>(peer.send)];
      const std::size_t length = send.payload.size();
      const std::size_t payload_sent =
          std::min(length, peer.sent > kHeaderBytes ? peer.sent - kHeaderBytes : 0);
      // A long payload leaves a piece at a time, each folded into the checksum or MAC right
      // after the kernel's copy has read it (so from cache); the trailer follows the last.
      // Encrypting, each piece is sealed before it leaves, from `sealed`.
      const std::byte* source = send.payload.data() + payload_sent;
      std::size_t payload_end =
          peer.hashed == length ? length : std::min(length, payload_sent + kChecksumAhead);
      if (peer.sealed) {
        if (payload_sent == peer.hashed && peer.hashed < length) seal_next(peer, send.payload);
        source = peer.sealed.get() + (payload_sent - peer.sealed_from);
        payload_end = peer.hashed;
      }
      // Header, payload and trailer from where they are, in one gathering write.
      std::array<boost::asio::const_buffer, 3> pieces;
      if (peer.sent < kHeaderBytes) {
        pieces[0] =
            boost::asio::buffer(peer.out_header.data() + peer.sent, kHeaderBytes - peer.sent);
      }
      pieces[1] = boost::asio::buffer(source, payload_end - payload_sent);
      if (peer.hashed == length) {
        const std::size_t trailer_sent =
            peer.sent > kHeaderBytes + length ? peer.sent - kHeaderBytes - length : 0;
        pieces[2] = boost::asio::buffer(peer.out_trailer.data() + trailer_sent,
                                        kTrailerBytes - trailer_sent);
      }
      detail::ErrorCode ec;
      const std::size_t written = peer.socket.write_some(pieces, ec);
      if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) {
        return std::nullopt;
      }
      if (ec) {
        return connection_failure(
            rank, ec,
            "sending " + describe(send.header, length) + ", " + std::to_string(peer.sent) + " of " +
                std::to_string(kHeaderBytes + length + kTrailerBytes) + " frame bytes written",
            send.header.sequence);
      }
      moved = true;
      peer.sent += written;
      const std::size_t now_sent =
          std::min(length, peer.sent > kHeaderBytes ? peer.sent - kHeaderBytes : 0);
      if (peer.hashed < now_sent) fold_sent(peer, send.payload, now_sent - peer.hashed);
      if (peer.sent == kHeaderBytes + length + kTrailerBytes) {
        --pending;
        peer.send = next_send_[static_cast<std::size_t>(peer.send)];
        if (peer.send >= 0) start_send(peer, sends[static_cast<std::size_t>(peer.send)]);
      }
    }
    return std::nullopt;
  }

  // --- receiving -----------------------------------------------------------------------------

  enum class Read { kDone, kWouldBlock, kFailed };

  // One read: into `direct` (the caller's payload) first, whatever follows into the inbox.
  Read read_some(Peer& peer, std::span<std::byte> direct, std::size_t& into_direct,
                 detail::ErrorCode& ec) {
    peer.inbox.compact();
    const std::array<boost::asio::mutable_buffer, 2> pieces{
        boost::asio::buffer(direct.data(), direct.size()),
        boost::asio::buffer(peer.inbox.data.get() + peer.inbox.end,
                            peer.inbox.capacity - peer.inbox.end)};
    const std::size_t read = peer.socket.read_some(pieces, ec);
    if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) {
      return Read::kWouldBlock;
    }
    if (ec) return Read::kFailed;
    into_direct = std::min(read, direct.size());
    peer.inbox.end += read - into_direct;
    return Read::kDone;
  }

  // wait_any: whether the next frame from `peer` is whole in its inbox, or cannot be read (a
  // header check_header refuses, whatever its receive expects; an ended connection), after
  // reading what has arrived.
  bool next_frame_arrived(Peer& peer) {
    while (true) {
      std::size_t whole = kHeaderBytes;
      if (peer.inbox.size() >= kHeaderBytes) {
        const FrameHeader frame = decode_header(peer.inbox.front());
        if (frame.magic != kMagic || frame.version != kProtocolVersion ||
            frame.length > options_.max_frame_bytes) {
          return true;
        }
        whole = kHeaderBytes + static_cast<std::size_t>(frame.length) + kTrailerBytes;
        if (peer.inbox.size() >= whole) return true;
      }
      peer.inbox.compact();
      if (peer.inbox.size() == peer.inbox.capacity) {
        // Grows with the bytes that came, not with the length a header announces.
        peer.inbox.reserve(std::min(whole, 2 * peer.inbox.capacity));
      }
      detail::ErrorCode ec;
      std::size_t ignored = 0;
      const Read read = read_some(peer, {}, ignored, ec);
      if (read == Read::kWouldBlock) return false;
      if (read == Read::kFailed) return true;
    }
  }

  // Reads this peer's queued frames as far as the bytes that have arrived allow.
  std::optional<Failure> pump_receives(int rank, std::span<const Receive> receives, bool& moved,
                                       std::size_t& pending) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    while (peer.receive >= 0) {
      const Receive& receive = receives[static_cast<std::size_t>(peer.receive)];
      const std::size_t length = receive.payload.size();
      std::optional<Failure> failure;
      // One read, into `direct` first and the inbox after it.
      const auto fetch = [&](std::span<std::byte> direct, std::size_t& into_direct) {
        detail::ErrorCode ec;
        const Read result = read_some(peer, direct, into_direct, ec);
        if (result == Read::kDone) moved = true;
        if (result == Read::kFailed) {
          failure =
              connection_failure(rank, ec, receiving(peer, receive), receive.expected.sequence);
        }
        return result;
      };
      switch (peer.stage) {
        case Stage::kHeader: {
          if (peer.inbox.size() < kHeaderBytes) {
            std::size_t ignored = 0;
            if (fetch({}, ignored) != Read::kDone) return failure;
            continue;
          }
          std::string reason;
          if (const Farewell farewell = read_farewell(peer.inbox, reason);
              farewell != Farewell::kNone) {
            if (farewell == Farewell::kComplete) {
              return broken(rank, left(rank, reason), receive.expected.sequence);
            }
            std::size_t ignored = 0;
            if (fetch({}, ignored) != Read::kDone) return failure;
            continue;
          }
          if (auto failure = check_header(rank, receive, peer.inbox.front())) return failure;
          peer.in_seed = options_.checksum ? checksum_seed(peer.inbox.front()) : 0;
          if (peer.in_mac) {
            peer.in_mac->begin(
                std::span<const std::byte, kHeaderBytes>(peer.inbox.front(), kHeaderBytes));
          }
          peer.inbox.consume(kHeaderBytes);
          peer.received = 0;
          peer.in_length = length;
          peer.in_streaming = false;
          peer.in_digest = length == 0 && options_.checksum ? checksum(peer.in_seed, {}) : 0;
          peer.stage = Stage::kPayload;
          continue;
        }
        case Stage::kPayload: {
          // Folds bytes that just arrived into the checksum: in one call when they are the
          // whole payload, else in pieces.
          const auto arrived = [&](std::size_t bytes) {
            const auto piece = receive.payload.subspan(peer.received, bytes);
            if (peer.in_mac && peer.in_mac->encrypts()) {
              peer.in_mac->open(piece);
            } else if (peer.in_mac) {
              peer.in_mac->update(piece);
            } else if (options_.checksum && peer.received == 0 && bytes == length) {
              peer.in_digest = checksum(peer.in_seed, piece);
            } else if (options_.checksum) {
              if (!peer.in_streaming) peer.in_checksum.reset(peer.in_seed);
              peer.in_streaming = true;
              peer.in_checksum.update(piece);
            }
            peer.received += bytes;
          };
          if (peer.received < length && peer.inbox.size() > 0) {
            const std::size_t bytes = std::min(peer.inbox.size(), length - peer.received);
            std::memcpy(receive.payload.data() + peer.received, peer.inbox.front(), bytes);
            peer.inbox.consume(bytes);
            arrived(bytes);
          }
          if (peer.received == length) {
            peer.stage = Stage::kTrailer;
            continue;
          }
          // At most kChecksumAhead at a time, so that the checksum reads what the kernel just
          // wrote while it is still in cache.
          const std::size_t direct = std::min(length - peer.received, kChecksumAhead);
          std::size_t into_payload = 0;
          if (fetch(receive.payload.subspan(peer.received, direct), into_payload) != Read::kDone) {
            return failure;
          }
          if (into_payload > 0) arrived(into_payload);
          continue;
        }
        case Stage::kTrailer: {
          if (peer.inbox.size() < kTrailerBytes) {
            std::size_t ignored = 0;
            if (fetch({}, ignored) != Read::kDone) return failure;
            continue;
          }
          const auto sent = detail::load_le<std::uint64_t>(peer.inbox.front());
          peer.inbox.consume(kTrailerBytes);
          if (peer.in_mac && !peer.in_mac->verify(sent)) {
            return broken(rank,
                          "the frame from rank " + std::to_string(rank) + " " +
                              describe(receive.expected, length) +
                              " fails its MAC: it was changed on the way, or rank " +
                              std::to_string(rank) + " did not send it",
                          receive.expected.sequence);
          }
          const std::uint64_t computed =
              peer.in_streaming ? peer.in_checksum.digest() : peer.in_digest;
          if (!peer.in_mac && options_.checksum && sent != computed) {
            return broken(rank,
                          "the frame from rank " + std::to_string(rank) + " " +
                              describe(receive.expected, length) +
                              " fails its checksum: the payload was corrupted in transit",
                          receive.expected.sequence);
          }
          --pending;
          moved = true;
          peer.stage = Stage::kHeader;
          peer.receive = next_receive_[static_cast<std::size_t>(peer.receive)];
          continue;
        }
      }
    }
    return std::nullopt;
  }

  // Everything about an incoming header is checked here, before a byte of its payload is
  // taken: the magic, the version, the length against max_frame_bytes, then header and length
  // against the receive's.
  std::optional<Failure> check_header(int rank, const Receive& receive, const std::byte* bytes) {
    const FrameHeader frame = decode_header(bytes);
    // The message's parts, made only for a refused header: this runs for every frame.
    const auto from = [&] { return "rank " + std::to_string(rank); };
    const std::uint64_t sequence = receive.expected.sequence;
    const auto during = [&] { return " during sequence " + std::to_string(sequence); };
    if (frame.magic != kMagic) {
      return broken(rank,
                    from() + " sent bytes that are not a cohort frame" + during() +
                        " (the stream is out of step)",
                    sequence);
    }
    if (frame.version != kProtocolVersion) {
      return broken(rank,
                    from() + " sent a frame of protocol version " + std::to_string(frame.version) +
                        during() + ", this is version " + std::to_string(kProtocolVersion),
                    sequence);
    }
    if (frame.length > options_.max_frame_bytes) {
      return broken(rank,
                    from() + " announced a frame of " + std::to_string(frame.length) + " bytes" +
                        during() + ", more than max_frame_bytes = " +
                        std::to_string(options_.max_frame_bytes) + "; refused before reading it",
                    sequence);
    }
    const std::size_t length = receive.payload.size();
    if (frame.header != receive.expected || frame.length != length) {
      HeaderMismatch mismatch(this->rank(), rank, receive.expected, length, frame.header,
                              static_cast<std::size_t>(frame.length));
      auto failure = broken(rank, std::string(mismatch.detail()), sequence);
      failure.mismatch = std::move(mismatch);
      return failure;
    }
    return std::nullopt;
  }

  // --- waiting and failing -------------------------------------------------------------------

  // Sleeps until a socket with work can make progress, or for at most `timeout`.
  std::optional<Failure> wait(std::chrono::steady_clock::duration timeout) {
    poll_fds_.clear();
    for (const int rank : active_) {
      Peer& peer = peers_[static_cast<std::size_t>(rank)];
      short events = 0;
      if (peer.send >= 0) events |= POLLOUT;
      if (peer.receive >= 0) events |= POLLIN;
      if (events != 0) poll_fds_.push_back({peer.socket.native_handle(), events, 0});
    }
    const auto milliseconds = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
    const int ready = ::poll(poll_fds_.data(), poll_fds_.size(),
                             static_cast<int>(std::min<long long>(milliseconds, 1 << 30)));
    if (ready < 0 && errno != EINTR) {
      return failed(std::string("poll() failed: ") + std::strerror(errno));
    }
    return std::nullopt;  // ready, interrupted or timed out: the caller looks again
  }

  // What the transfer in progress still waits for, peer by peer, and the sequence of the first.
  struct Waiting {
    std::string text;
    std::uint64_t sequence = 0;
    int waited = -1;  // the first peer waited for, which the failure names
  };
  [[gnu::cold]] Waiting waiting_for(std::span<const Send> sends,
                                    std::span<const Receive> receives) const {
    Waiting waiting;
    bool first = true;
    for (const int rank : active_) {
      const Peer& peer = peers_[static_cast<std::size_t>(rank)];
      const auto add = [&](const std::string& what, std::uint64_t at) {
        if (first) {
          waiting.sequence = at;
          waiting.waited = rank;
        }
        waiting.text += (first ? "" : "; ") + what;
        first = false;
      };
      if (peer.receive >= 0) {
        const Receive& receive = receives[static_cast<std::size_t>(peer.receive)];
        add("receive from rank " + std::to_string(rank) + " " + receiving(peer, receive),
            receive.expected.sequence);
      }
      if (peer.send >= 0) {
        const Send& send = sends[static_cast<std::size_t>(peer.send)];
        add("send to rank " + std::to_string(rank) + " " +
                describe(send.header, send.payload.size()) + ", " + std::to_string(peer.sent) +
                " frame bytes written",
            send.header.sequence);
      }
    }
    return waiting;
  }

  // One line on stderr, long before the deadline, so that a stalled peer is named while there is
  // time to look at it.
  [[gnu::cold]] void warn_stalled(std::span<const Send> sends, std::span<const Receive> receives,
                                  std::chrono::steady_clock::duration quiet) const {
    const Waiting waiting = waiting_for(sends, receives);
    const auto quiet_ms = std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count();
    std::fprintf(stderr,
                 "cohort: %sno progress for %lld ms during sequence %llu, waiting for: %s; the "
                 "transfer fails at operation_timeout = %lld ms\n",
                 prefix().c_str(), static_cast<long long>(quiet_ms),
                 static_cast<unsigned long long>(waiting.sequence), waiting.text.c_str(),
                 static_cast<long long>(options_.operation_timeout.count()));
  }

  [[gnu::cold]] Failure timeout(std::span<const Send> sends, std::span<const Receive> receives) {
    const Waiting waiting = waiting_for(sends, receives);
    for (const int rank : active_) {
      shut_down(peers_[static_cast<std::size_t>(rank)]);  // half-done frames: out of step
    }
    return failed("no progress within " + std::to_string(options_.operation_timeout.count()) +
                      " ms during sequence " + std::to_string(waiting.sequence) +
                      ", waiting for: " + waiting.text,
                  waiting.waited, waiting.sequence);
  }

  // A failure of the connection to `rank`, from Asio's error code.
  // Whether the inbox starts with a leave message (leave()), and its reason when it is whole.
  enum class Farewell { kNone, kPartial, kComplete };
  static Farewell read_farewell(const Inbox& inbox, std::string& reason) {
    if (inbox.size() < kHeaderBytes) return Farewell::kNone;
    const FrameHeader frame = decode_header(inbox.front());
    if (frame.magic != kMagic || frame.header.type != setup_type::kAbort ||
        frame.length > kLeaveReasonBytes) {
      return Farewell::kNone;
    }
    if (inbox.size() < kHeaderBytes + frame.length + kTrailerBytes) return Farewell::kPartial;
    reason = decode_text({inbox.front() + kHeaderBytes, static_cast<std::size_t>(frame.length)});
    return Farewell::kComplete;
  }

  static std::string left(int rank, const std::string& reason) {
    return "rank " + std::to_string(rank) + " left: " + quote_peer_text(reason);
  }

  // A peer that closed may have said why first (leave()): its message is already in this
  // socket's receive queue, ahead of the close. The frames before it (the rest of one being
  // received, whole ones not yet asked for) are skipped to reach it: the transfer fails either
  // way. Bounded by kLeaveWait.
  std::optional<std::string> farewell_of(Peer& peer) {
    std::size_t skip = peer.stage == Stage::kHeader ? 0
                       : peer.stage == Stage::kPayload
                           ? peer.in_length - peer.received + kTrailerBytes
                           : kTrailerBytes;
    const auto deadline = std::chrono::steady_clock::now() + kLeaveWait;
    std::string reason;
    while (std::chrono::steady_clock::now() < deadline) {
      const std::size_t skipped = std::min(skip, peer.inbox.size());
      peer.inbox.consume(skipped);
      skip -= skipped;
      if (skip == 0 && peer.inbox.size() >= kHeaderBytes) {
        const Farewell farewell = read_farewell(peer.inbox, reason);
        if (farewell == Farewell::kComplete) return reason;
        if (farewell == Farewell::kNone) {
          // A data frame the peer finished before it left: the farewell may follow it.
          const FrameHeader frame = decode_header(peer.inbox.front());
          if (frame.magic != kMagic || frame.length > options_.max_frame_bytes) return std::nullopt;
          skip = kHeaderBytes + frame.length + kTrailerBytes;
          continue;
        }
      }
      detail::ErrorCode ec;
      std::size_t ignored = 0;
      const Read read = read_some(peer, {}, ignored, ec);
      if (read == Read::kFailed) return std::nullopt;
      if (read == Read::kWouldBlock) std::this_thread::yield();
    }
    return std::nullopt;
  }

  // The failure paths below build messages only when a transfer fails: compiled for size.
  [[gnu::cold]] Failure connection_failure(int rank, const detail::ErrorCode& ec,
                                           const std::string& doing, std::uint64_t sequence) {
    if (auto reason = farewell_of(peers_[static_cast<std::size_t>(rank)])) {
      return broken(rank, left(rank, *reason), sequence);
    }
    const std::string peer = "rank " + std::to_string(rank);
    const std::string during = " during sequence " + std::to_string(sequence);
    if (ec == boost::asio::error::eof) {
      return broken(rank, peer + " closed the connection" + during + " (" + doing + ")", sequence);
    }
    if (detail::is_closed(ec)) {
      return broken(
          rank, peer + " closed the connection" + during + " (" + doing + ": " + ec.message() + ")",
          sequence);
    }
    return broken(
        rank,
        "the connection to " + peer + " failed" + during + " (" + doing + "): " + ec.message(),
        sequence);
  }

  // A failure that leaves the stream with `rank` out of step: that connection is closed.
  [[gnu::cold]] Failure broken(int rank, std::string what, std::uint64_t sequence) {
    shut_down(peers_[static_cast<std::size_t>(rank)]);
    return failed(std::move(what), rank, sequence);
  }

  // A failure of this rank's, with the peer whose connection failed, if one did.
  [[gnu::cold]] Failure failed(std::string what, int peer = -1, std::uint64_t sequence = 0) const {
    return {{.rank = rank(), .peer = peer, .sequence = sequence, .detail = std::move(what)}};
  }

  [[gnu::cold]] Failure record(Failure failure) {
    // After close() from another thread the sockets report a closed connection; say who closed.
    if (closed_.load()) {
      failure =
          failed("the transport was closed during the transfer (" + failure.fields.detail + ")", -1,
                 failure.fields.sequence);
    }
    if (!isolate_peer_failures_ || closed_.load()) failure_ = failure.fields;
    return failure;
  }

  // Ends a connection whose stream is out of step; the descriptor stays open until the
  // destructor (close() may be using it from another thread).
  static void shut_down(Peer& peer) noexcept {
    detail::ErrorCode ignored;
    peer.socket.shutdown(boost::asio::socket_base::shutdown_both, ignored);
  }

  [[gnu::cold]] static std::string receiving(const Peer& peer, const Receive& receive) {
    const std::size_t arrived = peer.stage == Stage::kHeader ? 0 : peer.received;
    return "receiving " + describe(receive.expected, receive.payload.size()) + ", " +
           std::to_string(arrived) + " payload bytes arrived";
  }

  std::string prefix() const { return "rank " + std::to_string(rank()) + ": "; }

  std::uint16_t rendezvous_port_ = 0;  // read from the listener before its options move here
  Options options_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::vector<Peer> peers_;             // by rank; this rank's own entry holds a closed socket
  std::vector<int> descriptors_;        // of peers_' sockets, fixed at construction, for close()
  std::optional<CommFailure> failure_;  // what broke the transport; none while it works
  std::string last_failure_;
  std::atomic<bool> closed_ = false;
  bool isolate_peer_failures_ = false;
  std::size_t next_any_ = 0;  // where wait_any starts looking
  // Scratch of transfer(), kept to avoid allocating on every call.
  std::vector<int> active_;        // ranks with queued sends or receives
  std::vector<int> next_send_;     // per send: the next send to the same peer
  std::vector<int> next_receive_;  // per receive: the next receive from the same peer
  std::vector<pollfd> poll_fds_;
};

static_assert(Transport<Tcp>);
static_assert(Serving<Tcp>);

}  // namespace cohort::transport::tcp
