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
// and abort() may come from any thread); a payload is at most max_frame_bytes long; peers are ranks
// other than this one.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cohort/core/compilation.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/spin.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/transport/tcp/abort_signal.hpp"
#include "cohort/transport/tcp/address.hpp"
#include "cohort/transport/tcp/listener.hpp"
#include "cohort/transport/tcp/options.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::transport::tcp {

class Connection;  // connection.hpp

namespace detail {
struct Readmissions;  // rendezvous.hpp
}  // namespace detail

class Tcp {
 public:
  // Binds, meets the other ranks and connects to all of them: Tcp(Listener(options)).
  explicit Tcp(Options options) : Tcp(Listener(std::move(options))) {}

  // Meets the other ranks through a listener bound beforehand (to learn its port first). Once per
  // process, so compiled for size, as the rendezvous is (rendezvous.hpp).
  [[gnu::cold]] COHORT_DECL explicit Tcp(Listener&& listener);

  // Movable, so that it can live in an optional or a container (not while a transfer runs);
  // not assignable, because an assignment would have to close one mesh while another is live.
  COHORT_DECL Tcp(Tcp&& other) noexcept;
  Tcp& operator=(Tcp&&) = delete;

  // Shuts every connection down (the sockets themselves close with connections_, which is
  // declared after io_, so that they go before their io_context).
  COHORT_DECL ~Tcp();

  int rank() const noexcept { return options_.rank; }
  int size() const noexcept { return options_.size; }
  const Options& options() const noexcept { return options_; }
  // Where rank 0 listened: the port it bound (the real one when it asked for port 0).
  std::uint16_t rendezvous_port() const noexcept { return rendezvous_port_; }
  // Where each rank listened at the rendezvous, by rank.
  const std::vector<Address>& addresses() const noexcept { return addresses_; }

  // Under Options::keep_listening: a Listener with `options` on this rank's listening socket,
  // which this Tcp keeps listening on too: for the rendezvous of the next membership epoch
  // (regroup.hpp), where the ranks that regroup find this rank as before, and should that
  // rendezvous fail, find it again for another; or for a door of the job (door.hpp) to accept on
  // while the mesh runs.
  [[gnu::cold]] COHORT_DECL Listener listener(Options options) const;

  // Once the mesh of the next membership epoch stands on the socket listener() shared: this Tcp
  // lets go of it without shutting it down (its destructor would, as for a rank that ends).
  [[gnu::cold]] COHORT_DECL void hand_listener_over() noexcept;

  // Under Options::keep_listening: stops listening for good, so that ranks that regroup find this
  // one gone (connecting to it is refused). For a rank that leaves the job: before it tells its
  // peers, so that none counts it in. Safe from any thread at any time.
  COHORT_DECL void stop_listening() noexcept;

  // Under Options::keep_listening, at a rank that takes back the process of a lost rank started
  // again for its place (Options::rejoin_peers; a parameter server, whose workers come back): the
  // rank whose process proved itself at this rank's listener and waits, after what has come
  // meanwhile; -1 for none. Polled by the thread that runs transfers, as a door is (door.hpp): it
  // does a bounded amount of the handshakes' work each time, so that strangers who flood the
  // listener take that thread a bounded time. Rank 0 gives such a process the table at its door
  // instead.
  [[gnu::cold]] COHORT_DECL int readmission_waiting();
  // The waiting process of `rank` becomes this rank's connection to `rank`, which starts afresh;
  // the connection before it, ended or not, is closed. False where the process left meanwhile.
  [[gnu::cold]] COHORT_DECL bool readmit(int rank);
  // The waiting processes of `rank` are told `why` and let go.
  [[gnu::cold]] COHORT_DECL void refuse_readmission(int rank, const std::string& why);

  COHORT_DECL void transfer(std::span<const Send> sends, std::span<const Receive> receives);

  // transport.hpp (Overlapping): the same, doing pieces of `meanwhile` where it would spin or
  // sleep for want of a socket that can move.
  COHORT_DECL void transfer(std::span<const Send> sends, std::span<const Receive> receives,
                            Meanwhile meanwhile);

  // The same without exceptions: `error` is Errc::kComm on failure, and last_failure() says
  // what happened.
  COHORT_DECL void transfer(std::span<const Send> sends, std::span<const Receive> receives,
                            std::error_code& error);

  // The message of the last transfer that failed through the error_code form.
  const std::string& last_failure() const noexcept { return last_failure_; }

  // transport.hpp (Serving): a peer among `peers` whose next frame is whole in its inbox, or
  // whose next frame cannot be read (a header the receive refuses, an ended connection); -1 when
  // none within `timeout`. Reads what has arrived from each of them into its own inbox, which
  // grows, doubling with the bytes that came, to hold one whole frame (at most max_frame_bytes
  // and a header and trailer), so that a peer stalled in the middle of a frame holds back only
  // itself. Consumes no frame. Starts looking after the peer it returned last, so that every
  // peer is served in turn.
  COHORT_DECL int wait_any(std::span<const int> peers, std::chrono::milliseconds timeout);

  // A peer whose connection ended (it closed or reset it: its process ended, or it left), waited
  // for at most `timeout` (at once while one has ended); -1 for none, after the whole timeout
  // where there is no peer or this rank's own connections are closed. Reads nothing, so another
  // thread may call it beside transfers, or while the ranks talk over another channel
  // (loss_watch.hpp); not beside readmit().
  COHORT_DECL int ended_peer(std::chrono::milliseconds timeout);

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
  COHORT_DECL void close() noexcept;

  // Tells every peer why this rank leaves, then closes: a peer that reads the message fails with
  // "rank R left: <reason>", so the first cause of a failure reaches every rank, not only the
  // neighbours of the rank that died. A frame that the failed transfer left half-written is
  // finished first. Best effort and bounded (kLeaveWait). Only from the thread that runs
  // transfers, before the failed transfer's buffers are released.
  COHORT_DECL void leave(std::string_view reason) noexcept;

  // transport.hpp: from any thread, also during a transfer. Every peer is told `reason` (the
  // first abort's), as leave() tells it, before anything else reaches it: by this thread where no
  // transfer runs, else by the transfer thread, whose transfer (and every later one, wait_any
  // included) fails at once with "this rank aborted: <reason>". A transport that failed before
  // has told its peers already.
  COHORT_DECL void abort(std::string_view reason) noexcept;

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

  // What the transfer in progress still waits for, peer by peer, and the sequence of the first.
  struct Waiting {
    std::string text;
    std::uint64_t sequence = 0;
    int waited = -1;  // the first peer waited for, which the failure names
  };

  // Marks an operation of the transfer thread (a transfer, wait_any) while it runs, so that
  // abort() leaves the leaving to that thread, which leaves as the operation ends (its sends'
  // payloads still valid) for an abort() that came meanwhile.
  class Busy {
   public:
    explicit Busy(Tcp& tcp) noexcept : tcp_(tcp) { tcp_.busy_.store(true); }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    ~Busy() {
      tcp_.busy_.store(false);
      if (tcp_.abort_signal_.raised()) tcp_.leave(tcp_.abort_signal_.reason());
    }

   private:
    Tcp& tcp_;
  };

  // Under a timeline (core/trace.hpp): how long the transfer waits before every peer it receives
  // from has sent its first byte, recorded as trace::Phase::kPeerWait. Off (no recorder) it
  // costs one test per transfer.
  struct PeerWait {
    trace::Recorder* recorder = nullptr;
    std::chrono::steady_clock::time_point start{};
    std::size_t unheard = 0;  // peers with a receive that have sent nothing yet
  };
  COHORT_DECL PeerWait begin_peer_wait(std::span<const Receive> receives);
  COHORT_DECL void heard(PeerWait& wait, int rank);

  // --- one transfer ------------------------------------------------------------------------
  // A transfer's failure as the exception transfer() throws.
  [[noreturn]] COHORT_DECL static void raise(Failure failure);
  // Moves the frames until all are done; while none can move, does pieces of `meanwhile`, where
  // given, until it has none left.
  COHORT_DECL std::optional<Failure> progress(std::span<const Send> sends,
                                              std::span<const Receive> receives,
                                              std::optional<Meanwhile> meanwhile = std::nullopt);
  // Chains each peer's sends and receives in list order.
  COHORT_DECL std::optional<Failure> enqueue(std::span<const Send> sends,
                                             std::span<const Receive> receives);
  COHORT_DECL std::optional<Failure> check_peer(int peer) const;
  COHORT_DECL Queue& activate(int rank);
  COHORT_DECL void clear_queues(std::span<const Send> sends = {});
  // Writes as much of this peer's queued frames as its socket takes.
  COHORT_DECL std::optional<Failure> pump_sends(int rank, std::span<const Send> sends, bool& moved,
                                                std::size_t& pending);
  // Reads this peer's queued frames as far as the bytes that have arrived allow.
  COHORT_DECL std::optional<Failure> pump_receives(int rank, std::span<const Receive> receives,
                                                   bool& moved, std::size_t& pending);

  // --- waiting and failing -------------------------------------------------------------------
  // Sleeps until a socket with work can make progress, or for at most `timeout`.
  COHORT_DECL std::optional<Failure> wait(std::chrono::steady_clock::duration timeout);
  [[gnu::cold]] COHORT_DECL Waiting waiting_for(std::span<const Send> sends,
                                                std::span<const Receive> receives) const;
  // One line on stderr, long before the deadline, so that a stalled peer is named while there is
  // time to look at it.
  [[gnu::cold]] COHORT_DECL void warn_stalled(std::span<const Send> sends,
                                              std::span<const Receive> receives,
                                              std::chrono::steady_clock::duration quiet) const;
  [[gnu::cold]] COHORT_DECL Failure timeout(std::span<const Send> sends,
                                            std::span<const Receive> receives);
  // The failure paths below build messages only when a transfer fails: compiled for size.
  // A failure that left the stream with `rank` out of step (its connection is shut down): what
  // broke it, and the header mismatch when that was the cause.
  [[gnu::cold]] COHORT_DECL Failure broken(int rank, std::string detail,
                                           std::optional<HeaderMismatch> mismatch,
                                           std::uint64_t sequence);
  // A failure of this rank's, with the peer whose connection failed, if one did.
  [[gnu::cold]] COHORT_DECL Failure failed(std::string what, int peer = -1,
                                           std::uint64_t sequence = 0) const;
  [[gnu::cold]] COHORT_DECL Failure record(Failure failure);
  [[gnu::cold]] COHORT_DECL Failure aborted() const;
  std::string prefix() const { return "rank " + std::to_string(rank()) + ": "; }

  std::uint16_t rendezvous_port_ = 0;  // read from the listener before its options move here
  Options options_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<detail::Acceptor> acceptor_;  // Options::keep_listening; on io_, so after it
  // On acceptor_, once readmission_waiting() is first called; so after it.
  std::unique_ptr<detail::Readmissions> readmissions_;
  std::vector<Address> addresses_;              // where each rank listened, by rank
  std::vector<Connection> connections_;  // by rank; this rank's own entry holds a closed socket
  std::vector<Queue> queues_;            // by rank
  std::vector<int> descriptors_;  // of connections_' sockets, fixed at construction, for close()
  std::optional<CommFailure> failure_;  // what broke the transport; none while it works
  std::string last_failure_;
  std::atomic<bool> closed_ = false;
  AbortSignal abort_signal_;
  std::atomic<bool> busy_ = false;     // an operation of the transfer thread runs (Busy)
  std::atomic<bool> failed_ = false;   // a transfer failed: its collective told the peers why
  std::atomic<bool> leaving_ = false;  // leave() has begun, on one thread only
  bool isolate_peer_failures_ = false;
  std::size_t next_any_ = 0;  // where wait_any starts looking
  // Scratch of transfer(), kept to avoid allocating on every call.
  std::vector<int> active_;        // ranks with queued sends or receives
  std::vector<int> next_send_;     // per send: the next send to the same peer
  std::vector<int> next_receive_;  // per receive: the next receive from the same peer
  std::vector<pollfd> poll_fds_;
  std::vector<char> heard_;  // per rank, under a timeline: sent its first byte (PeerWait)
  waiting::Spinner spinner_{false};  // transfer()'s, between busy polls
};

static_assert(Transport<Tcp>);
static_assert(Serving<Tcp>);
static_assert(Readmits<Tcp>);

}  // namespace cohort::transport::tcp

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/transport/tcp/impl/tcp.ipp"
#endif
