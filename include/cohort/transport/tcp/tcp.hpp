// transport::tcp::Tcp: the transport between processes and hosts, over one TCP connection per
// pair of ranks (Boost.Asio; this folder is the only place cohort includes it). Tcp is the loop
// over those connections: it queues a transfer's frames peer by peer, drives every connection
// until all are done, sleeps, keeps the deadline, warns of a stall, and fails, leaves or closes
// the mesh. What happens to one frame on one connection is connection.hpp's.
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
// once; connection.hpp). It busy-polls for up to `spin` after the last progress, then sleeps in
// poll() until a socket is ready. It fails with CommError naming this rank, the peer, the frame's
// type and sequence and what happened when a peer closes ("rank 0: rank 2 closed the connection
// during sequence 17 (...)"), when a frame is malformed, too long or corrupted, or when no byte
// moves for operation_timeout; with HeaderMismatch when a frame's header or length is not the
// expected one. The failure is final: the connections involved are shut down, so their peers fail
// promptly too, and every later transfer fails with the same message. Destroy the transport (its
// destructor closes every connection, so that every peer sees end-of-file) and build another.
//
// Required of the caller, beyond transport.hpp: one thread at a time calls transfer() (close()
// may come from any thread); a payload is at most max_frame_bytes long; peers are ranks other
// than this one.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
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
#include "cohort/transport/tcp/connection.hpp"
#include "cohort/transport/tcp/frame.hpp"
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
    connections_.reserve(links.size());
    queues_.resize(links.size());
    for (int rank = 0; rank < size(); ++rank) {
      detail::Link& link = links[static_cast<std::size_t>(rank)];
      const bool own = rank == this->rank();
      Connection& connection = connections_.emplace_back(std::move(link.socket), rank, options_,
                                                         own ? std::nullopt : link.keys);
      if (own) continue;
      descriptors_.push_back(connection.descriptor());
      boost::system::error_code ec;
      connection.set_non_blocking(ec);
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
        connections_(std::move(other.connections_)),
        queues_(std::move(other.queues_)),
        descriptors_(std::move(other.descriptors_)),
        failure_(std::move(other.failure_)),
        last_failure_(std::move(other.last_failure_)),
        closed_(other.closed_.load()),
        isolate_peer_failures_(other.isolate_peer_failures_) {}
  Tcp& operator=(Tcp&&) = delete;

  // Shuts every connection down (the sockets themselves close with connections_, which is
  // declared after io_, so that they go before their io_context).
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
        if (connections_[static_cast<std::size_t>(peers[at])].next_frame_arrived()) {
          next_any_ = at + 1;
          return peers[at];
        }
      }
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return -1;
      poll_fds_.clear();
      for (const int peer : peers) {
        poll_fds_.push_back({connections_[static_cast<std::size_t>(peer)].descriptor(), POLLIN, 0});
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
      const auto frame = make_frame({setup_type::kAbort},
                                    encode_text(reason.substr(0, Connection::kLeaveReasonBytes)));
      const auto deadline = std::chrono::steady_clock::now() + Connection::kLeaveWait;
      for (Connection& connection : connections_) connection.write_farewell(frame, deadline);
    } catch (...) {
      // Leaving is best effort: the close below still tells every peer that this rank is gone.
    }
    close();
  }

 private:
  struct Failure {
    CommFailure fields;  // the peer set when the failure is one connection's
    std::optional<HeaderMismatch> mismatch{};
  };

  // The frames one peer has in the transfer in progress: indices into its lists, -1 for none.
  // The sends (and the receives) to one peer are chained in list order through next_send_ (and
  // next_receive_); the connection works on the first of each chain.
  struct Queue {
    int send = -1;
    int send_tail = -1;
    int receive = -1;
    int receive_tail = -1;
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
        const Queue& queue = queues_[static_cast<std::size_t>(rank)];
        std::optional<Failure> failure;
        if (queue.send >= 0) failure = pump_sends(rank, sends, moved, pending);
        if (!failure && queue.receive >= 0) failure = pump_receives(rank, receives, moved, pending);
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
      Queue& queue = activate(send.peer);
      const int index = static_cast<int>(i);
      if (queue.send < 0) {
        queue.send = index;
        connections_[static_cast<std::size_t>(send.peer)].start_send(send);
      } else {
        next_send_[static_cast<std::size_t>(queue.send_tail)] = index;
      }
      queue.send_tail = index;
    }
    for (std::size_t i = 0; i < receives.size(); ++i) {
      const Receive& receive = receives[i];
      if (auto failure = check_peer(receive.peer)) return failure;
      if (receive.payload.size() > options_.max_frame_bytes) {
        return failed("the receive from rank " + std::to_string(receive.peer) + " " +
                      describe(receive.expected, receive.payload.size()) +
                      " exceeds max_frame_bytes = " + std::to_string(options_.max_frame_bytes));
      }
      Queue& queue = activate(receive.peer);
      const int index = static_cast<int>(i);
      if (queue.receive < 0) {
        queue.receive = index;
        connections_[static_cast<std::size_t>(receive.peer)].start_receive();
      } else {
        next_receive_[static_cast<std::size_t>(queue.receive_tail)] = index;
      }
      queue.receive_tail = index;
    }
    return std::nullopt;
  }

  std::optional<Failure> check_peer(int peer) const {
    if (peer >= 0 && peer < size() && peer != rank()) return std::nullopt;
    return failed("no peer rank " + std::to_string(peer) + " in a job of " +
                  std::to_string(size()) + " ranks");
  }

  Queue& activate(int rank) {
    Queue& queue = queues_[static_cast<std::size_t>(rank)];
    if (queue.send < 0 && queue.receive < 0) active_.push_back(rank);
    return queue;
  }

  void clear_queues(std::span<const Send> sends = {}) {
    for (const int rank : active_) {
      Queue& queue = queues_[static_cast<std::size_t>(rank)];
      if (queue.send >= 0 && !sends.empty()) {
        connections_[static_cast<std::size_t>(rank)].cut_off(
            sends[static_cast<std::size_t>(queue.send)]);
      }
      queue = Queue{};
    }
    active_.clear();
  }

  // Writes as much of this peer's queued frames as its socket takes.
  std::optional<Failure> pump_sends(int rank, std::span<const Send> sends, bool& moved,
                                    std::size_t& pending) {
    Connection& connection = connections_[static_cast<std::size_t>(rank)];
    Queue& queue = queues_[static_cast<std::size_t>(rank)];
    while (queue.send >= 0) {
      const Send& send = sends[static_cast<std::size_t>(queue.send)];
      auto progress = connection.write_some(send);
      if (progress.broken) return broken(rank, std::move(*progress.broken), send.header.sequence);
      if (!progress.moved) return std::nullopt;
      moved = true;
      if (progress.finished) {
        --pending;
        queue.send = next_send_[static_cast<std::size_t>(queue.send)];
        if (queue.send >= 0) connection.start_send(sends[static_cast<std::size_t>(queue.send)]);
      }
    }
    return std::nullopt;
  }

  // Reads this peer's queued frames as far as the bytes that have arrived allow.
  std::optional<Failure> pump_receives(int rank, std::span<const Receive> receives, bool& moved,
                                       std::size_t& pending) {
    Connection& connection = connections_[static_cast<std::size_t>(rank)];
    Queue& queue = queues_[static_cast<std::size_t>(rank)];
    while (queue.receive >= 0) {
      const Receive& receive = receives[static_cast<std::size_t>(queue.receive)];
      auto progress = connection.read_some(receive);
      if (progress.moved) moved = true;
      if (progress.broken) {
        return broken(rank, std::move(*progress.broken), receive.expected.sequence);
      }
      if (!progress.finished) return std::nullopt;
      --pending;
      queue.receive = next_receive_[static_cast<std::size_t>(queue.receive)];
    }
    return std::nullopt;
  }

  // --- waiting and failing -------------------------------------------------------------------

  // Sleeps until a socket with work can make progress, or for at most `timeout`.
  std::optional<Failure> wait(std::chrono::steady_clock::duration timeout) {
    poll_fds_.clear();
    for (const int rank : active_) {
      const Queue& queue = queues_[static_cast<std::size_t>(rank)];
      short events = 0;
      if (queue.send >= 0) events |= POLLOUT;
      if (queue.receive >= 0) events |= POLLIN;
      if (events != 0) {
        poll_fds_.push_back({connections_[static_cast<std::size_t>(rank)].descriptor(), events, 0});
      }
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
      const Queue& queue = queues_[static_cast<std::size_t>(rank)];
      const Connection& connection = connections_[static_cast<std::size_t>(rank)];
      const auto add = [&](const std::string& what, std::uint64_t at) {
        if (first) {
          waiting.sequence = at;
          waiting.waited = rank;
        }
        waiting.text += (first ? "" : "; ") + what;
        first = false;
      };
      if (queue.receive >= 0) {
        const Receive& receive = receives[static_cast<std::size_t>(queue.receive)];
        add("receive from rank " + std::to_string(rank) + " " + connection.receiving(receive),
            receive.expected.sequence);
      }
      if (queue.send >= 0) {
        const Send& send = sends[static_cast<std::size_t>(queue.send)];
        add("send to rank " + std::to_string(rank) + " " +
                describe(send.header, send.payload.size()) + ", " +
                std::to_string(connection.frame_bytes_written()) + " frame bytes written",
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
      connections_[static_cast<std::size_t>(rank)].shut_down();  // half-done frames: out of step
    }
    return failed("no progress within " + std::to_string(options_.operation_timeout.count()) +
                      " ms during sequence " + std::to_string(waiting.sequence) +
                      ", waiting for: " + waiting.text,
                  waiting.waited, waiting.sequence);
  }

  // The failure paths below build messages only when a transfer fails: compiled for size.
  // A failure that left the stream with `rank` out of step (its connection is shut down).
  [[gnu::cold]] Failure broken(int rank, Connection::Broken broken, std::uint64_t sequence) {
    Failure failure = failed(std::move(broken.detail), rank, sequence);
    failure.mismatch = std::move(broken.mismatch);
    return failure;
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

  std::string prefix() const { return "rank " + std::to_string(rank()) + ": "; }

  std::uint16_t rendezvous_port_ = 0;  // read from the listener before its options move here
  Options options_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::vector<Connection> connections_;  // by rank; this rank's own entry holds a closed socket
  std::vector<Queue> queues_;            // by rank
  std::vector<int> descriptors_;  // of connections_' sockets, fixed at construction, for close()
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
