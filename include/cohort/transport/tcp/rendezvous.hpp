// How the ranks of a TCP job find each other and connect: the rendezvous that turns every rank's
// Listener (listener.hpp) into one authenticated connection per pair of ranks.
//
//   1. Every rank binds a listener on bind_address (rank 0 at rendezvous_port, the others at a
//      free port) and every rank but 0 connects to rank 0, retrying until connect_timeout, so
//      that start order does not matter, and runs the handshake (handshake.hpp).
//   2. When every rank has joined, rank 0 sends each the table of listening addresses.
//   3. Every rank connects to each lower rank other than 0 and accepts each higher one, with the
//      same handshake; the connection to rank 0 from step 1 is kept as the pair's connection.
//   4. Each rank reports "ready" to rank 0, which answers "go" when all have: a constructed Tcp
//      means the whole mesh is up.
//
// The whole rendezvous runs under one deadline, connect_timeout from the Listener's
// construction. Whatever fails first is the error: the rank sends it to every peer it has
// authenticated (an abort message) before closing them, so that the others fail at once and
// with the reason ("rank 1: rendezvous: aborted by rank 0: 'rank 0: rendezvous: timed out after
// 2000 ms: ranks 2, 3 never joined'") instead of timing out on their own. A rank that has reached
// rank 0 and waits for the table leaves the verdict to rank 0 for a grace period after its own
// deadline, because only rank 0 knows who is missing.
//
// What reaches a listening port is not trusted until it has proved the secret. With a secret, a
// connection that sends anything but a well-formed hello and a valid proof within
// handshake_timeout is dropped and logged (at a bounded rate), and the rendezvous goes on; at most
// max_pending_connections wait in their handshake at once, the oldest dropped first, and each
// holds a bounded buffer. Only an authenticated peer can fail the rendezvous (a wrong job id, a
// duplicate rank) or send it an abort, whose text enters the error quoted and cut. Without a
// secret, whoever speaks the cohort protocol is a peer, and a wrong one fails the rendezvous
// with the reason, on both sides; a connection that does not speak it is dropped.
//
// The setup code is Asio C++20 coroutines on a private io_context driven by this thread: the
// accept loop, every handshake and every connect with retries progress concurrently. Each step
// is a small coroutine that returns what it learned (a hello, a peer, or the Refusal that says
// why not); the phases above decide what a refusal means. redirect_error turns every failure
// into an error code, so that none unwinds through Asio. The io_context serves the setup only;
// transfers use the sockets directly (connection.hpp). The setup runs once per process and waits on
// the network, so its functions are [[gnu::cold]]: compiled for size, which spares every program
// that uses the transport a good part of its -O3 compile time (benchmarks/build/compile_time).
#pragma once

// clang-format off
// First: Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format on

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/asio.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/handshake.hpp"
#include "cohort/transport/tcp/options.hpp"

namespace cohort::transport::tcp::detail {

using Clock = std::chrono::steady_clock;
using ErrorCode = boost::system::error_code;
using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Executor>;

// "rank 2", "ranks 2, 3".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return text;
}

// Whether an error code means that the peer closed or lost the connection.
inline bool is_closed(const ErrorCode& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

// Whether the kernel grants a receive buffer of `bytes` rather than capping it (Linux reports
// twice what it grants, others what they grant), asked on a socket of its own: once a buffer is
// set, the kernel's own sizing is off for good.
inline bool kernel_grants_receive_buffer(const Executor& executor, std::size_t bytes) {
  ErrorCode ec;
  Socket probe(executor);
  probe.open(asio::ip::tcp::v4(), ec);
  if (!ec) probe.set_option(asio::socket_base::receive_buffer_size(static_cast<int>(bytes)), ec);
  asio::socket_base::receive_buffer_size granted;
  if (!ec) probe.get_option(granted, ec);
  return !ec && static_cast<std::size_t>(granted.value()) >= bytes;
}

// Socket options of every connection (options.hpp says why each): no Nagle delay (a frame's
// header, payload and trailer leave in one write, and latency is what small messages care
// about), the receive buffer, and the limit on unsent bytes.
inline void tune(Socket& socket, const Options& options) {
  ErrorCode ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  if (options.receive_buffer_bytes > 0 &&
      kernel_grants_receive_buffer(socket.get_executor(), options.receive_buffer_bytes)) {
    socket.set_option(
        asio::socket_base::receive_buffer_size(static_cast<int>(options.receive_buffer_bytes)),
        ignored);
  }
  if (options.unsent_limit_bytes > 0) {  // Boost.Asio names no TCP_NOTSENT_LOWAT option
    const int limit = static_cast<int>(options.unsent_limit_bytes);
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &limit, sizeof limit);
  }
}

// How long a process that waited at a running job's door knocks again where nobody listens any
// more, before it concludes that the job ended: a job that lost its rank 0 opens the door there
// again once it has regrouped (about 0.3 s on one host: docs/launching.md, "Elastic jobs").
inline constexpr std::chrono::seconds kDoorRegroupGrace{3};

// How long a connection attempt to one of several addresses lasts before the next is tried: a
// host that is lost, or whose link is cut, answers nothing, and the kernel would try it for
// minutes while the door is at another.
inline constexpr std::chrono::seconds kConnectAttemptLimit{2};

// How long a rank 0 that starts an elastic job waits between two rounds of asking the job's hosts
// whether the job runs already (Rendezvous::search_running_job): a job that lost its rank 0
// silently opens its door again only once it has noticed (the step's timeout) and regrouped.
inline constexpr std::chrono::seconds kDoorSearchPause{1};

// How long a process that takes its rank's place back waits before it asks a rank again that closed
// its connection unanswered: that rank's door is shut while it does not serve (a parameter server
// between two fits).
inline constexpr std::chrono::milliseconds kRejoinPause{200};

// A setup message as read: the frame's bytes, kept whole because the handshake's HMAC covers
// the hellos exactly as they travelled.
struct SetupMessage {
  FrameHeader frame;
  std::vector<std::byte> bytes;
  std::span<const std::byte> payload() const {
    return {bytes.data() + kHeaderBytes, static_cast<std::size_t>(frame.length)};
  }
};

// Why a step of the setup did not give what it should; the phase that asked decides what it
// means (a stranger to drop, or the rendezvous's failure).
struct Refusal {
  enum class Kind {
    kClosed,    // the connection ended (closed, reset, dropped, timed out) before a whole message
    kStranger,  // the bytes are no cohort frame: a port scanner, a health check
    kProtocol,  // a cohort frame that is wrong: version, length, checksum, type, contents
    kAborted,   // the peer gave up and said why (its text, quoted, is in the reason)
    kMismatch,  // a well-formed hello that does not fit this job (check_hello's words)
    kStale,     // a hello of this job not for this rendezvous (turned_away)
    kForged,    // a proof that does not verify
  };
  Kind kind;
  std::string reason;
  std::string peer_text{};  // kAborted: the peer's own words, quoted and cut (quote_peer_text)

  // The reason with the peer's words, for a peer that has authenticated (or where none must).
  std::string told() const { return peer_text.empty() ? reason : reason + ": " + peer_text; }
};

// What a setup step returns: the value it was for, or the Refusal that says why not.
template <class T>
class Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}            // NOLINT: implicit, as co_return reads
  Expected(Refusal refusal) : state_(std::move(refusal)) {}  // NOLINT
  explicit operator bool() const noexcept { return state_.index() == 0; }
  T& operator*() { return std::get<0>(state_); }
  T* operator->() { return &std::get<0>(state_); }
  const Refusal& refusal() const { return std::get<1>(state_); }

 private:
  std::variant<T, Refusal> state_;
};

struct Done {};

// Whether numeric address text is a loopback address (127.0.0.0/8, ::1).
inline bool is_loopback(const std::string& text) {
  ErrorCode ec;
  const auto address = asio::ip::make_address(text, ec);
  return !ec && address.is_loopback();
}

// One connection of the rendezvous, accepted or opened. Shared by the coroutine that runs its
// handshake and the timer that drops it when the handshake takes too long.
struct Connection {
  Connection(asio::io_context& io, bool outbound) : socket(io), deadline(io), outbound(outbound) {}
  Socket socket;
  Timer deadline;
  bool outbound;
  bool authenticated = false;  // proved the secret (or, without one, completed the handshake)
  bool timed_out = false;
  std::size_t attempt = 0;     // an outbound one's connection attempts that ended
  std::string remote_address;  // where an accepted connection came from
  std::string local_address;   // and where it arrived: rank 0's address as that peer reaches it
  std::string from = "a peer at an unknown address";
};
using ConnectionPtr = std::shared_ptr<Connection>;

// What a completed handshake gives: the peer's hello and, with a secret, the connection's MAC
// keys.
struct Introduction {
  Hello hello;
  std::optional<SessionKeys> keys;
};

struct Peer {
  ConnectionPtr connection;
  Introduction introduction;
};

// A connection of the finished mesh, as the transport takes it over.
struct Link {
  Socket socket;
  std::optional<SessionKeys> keys;
};

// The connections this rank dropped during its rendezvous: logged in a burst of kBurst lines,
// then at most one a second that counts the ones not logged; the first kKept reasons are kept for
// the timeout's text. Bounded however many strangers call.
class RefusalLog {
 public:
  void add(const std::string& prefix, const std::string& reason) {
    ++count_;
    if (kept_.size() < kKept) kept_.push_back(reason);
    const auto now = Clock::now();
    if (logged_ >= kBurst && now - last_logged_ < std::chrono::seconds(1)) {
      ++unlogged_;
      return;
    }
    std::string line = "cohort: " + prefix + reason;
    if (unlogged_ > 0) {
      line += " (" + std::to_string(unlogged_) + " more refused since the last line)";
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    ++logged_;
    unlogged_ = 0;
    last_logged_ = now;
  }

  // "; refused a peer at ...; refused ... (and 12 more refused)", or nothing.
  std::string summary() const {
    std::string text;
    for (const std::string& reason : kept_) text += "; " + reason;
    if (count_ > kept_.size()) {
      text += " (and " + std::to_string(count_ - kept_.size()) + " more refused)";
    }
    return text;
  }

 private:
  static constexpr std::size_t kBurst = 3;
  static constexpr std::size_t kKept = 3;
  std::size_t count_ = 0;
  std::size_t logged_ = 0;
  std::size_t unlogged_ = 0;
  Clock::time_point last_logged_{};
  std::vector<std::string> kept_;
};

class Rendezvous {
 public:
  Rendezvous(const Options& options, asio::io_context& io, Acceptor& listener,
             std::uint16_t listen_port, Clock::time_point started)
      : Rendezvous(options, io, listener, listen_port,
                   Deadline{started + options.connect_timeout}) {}

  // A running job's door (door.hpp): rank 0's listener, once its mesh is up, where processes
  // started for the job ask to join, and where a process started again for its own rank
  // (Options::rejoin_peers) gets `table`, the mesh's addresses. Or the listener of another rank
  // that readmits (Tcp::readmit), where such a process asks for its place back. It runs as long
  // as it is polled, with no deadline of its own.
  struct DoorMode {};
  Rendezvous(DoorMode, const Options& options, asio::io_context& io, Acceptor& listener,
             std::uint16_t listen_port, std::vector<Address> table)
      : Rendezvous(options, io, listener, listen_port, Deadline{Clock::time_point::max()}) {
    door_ = true;
    table_ = std::move(table);
    spawn(accept_loop(0, 0));
  }

  // A failed mesh's roll call (roll_call.hpp), under the failed mesh's options, on a duplicate of
  // this rank's listening socket.
  struct RollCallMode {};
  Rendezvous(RollCallMode, const Options& options, asio::io_context& io, Acceptor& listener,
             std::uint16_t listen_port)
      : Rendezvous(options, io, listener, listen_port, Deadline{Clock::time_point::max()}) {
    roll_call_ = true;
  }

  // The roll call: by rank of `table` (the failed mesh's addresses), whether that rank's process
  // answered this one's roll-call handshake within `timeout` (this rank's own entry: true).
  // Meanwhile it answers the others' roll calls, and it stays until every rank that answered
  // has had its own answered too (for up to `timeout` more), so that a rank that comes late,
  // within `timeout`, counts this one in as this one counts it. A rank whose connection is
  // refused has ended or left and is counted out at once; a stopped or hung process, whose
  // kernel still accepts, never answers.
  [[gnu::cold]] std::vector<bool> call_roll(const std::vector<Address>& table,
                                            std::chrono::milliseconds timeout) {
    answers_.assign(table.size(), Answer::kAwaited);
    probed_by_.assign(table.size(), false);
    answers_[idx(options_.rank)] = Answer::kAnswered;
    probed_by_[idx(options_.rank)] = true;
    spawn(accept_loop(0, size() - 1));
    for (int rank = 0; rank < size(); ++rank) {
      if (rank != options_.rank) spawn(ask(rank, table[idx(rank)]));
    }
    const auto settled = [&] {
      return std::ranges::find(answers_, Answer::kAwaited) == answers_.end();
    };
    const auto heard_back = [&] {
      for (std::size_t r = 0; r < answers_.size(); ++r) {
        if (answers_[r] == Answer::kAnswered && !probed_by_[r]) return false;
      }
      return true;
    };
    const auto started = Clock::now();
    run_until([&] { return settled() && heard_back(); }, started + timeout);
    run_until(heard_back, started + 2 * timeout);
    finished_ = true;
    close_listener(/*for_good=*/true);  // this roll call's own duplicate of the socket
    for (const ConnectionPtr& connection : connections_) close(connection->socket);
    drain();
    if (!failure_.empty()) throw CommError(failure());
    std::vector<bool> answered(answers_.size());
    for (std::size_t r = 0; r < answers_.size(); ++r) {
      answered[r] = answers_[r] == Answer::kAnswered;
    }
    return answered;
  }

  // The door: runs what is ready without waiting, at most kDoorHandlersPerPoll pieces of it, so
  // that strangers who flood the door take the step that polls it a bounded time; the processes
  // that proved themselves and wait for a place, in the order they came.
  [[gnu::cold]] std::size_t poll_door() {
    constexpr int kDoorHandlersPerPoll = 64;
    if (io_.stopped()) io_.restart();
    for (int handled = 0; handled < kDoorHandlersPerPoll && io_.poll_one() > 0; ++handled) {
    }
    std::erase_if(joiners_,
                  [](const Peer& joiner) { return !joiner.connection->socket.is_open(); });
    return joiners_.size();
  }

  // The door: tells the first `count` joiners their places, ranks first_rank, first_rank + 1, ...
  // of `size` in membership epoch `epoch`, and lets them go to its rendezvous at `rendezvous`.
  // Returns how many were told (fewer where some left since they were counted).
  [[gnu::cold]] std::size_t welcome(std::size_t count, int first_rank, int size,
                                    std::uint32_t epoch, const Address& rendezvous) {
    std::size_t told = 0;
    for (Peer& joiner : joiners_) {
      if (told == count) break;
      Socket& socket = joiner.connection->socket;
      const Welcome place{.rank = first_rank + static_cast<int>(told),
                          .size = size,
                          .epoch = epoch,
                          .rendezvous = rendezvous};
      ErrorCode ec;
      asio::write(socket, asio::buffer(make_frame({setup_type::kWelcome}, encode_welcome(place))),
                  ec);
      close(socket);
      if (!ec) ++told;
    }
    std::erase_if(joiners_,
                  [](const Peer& joiner) { return !joiner.connection->socket.is_open(); });
    return told;
  }

  // A door that readmits: the rank whose process, started again, proved itself and waits to take
  // its place back, the first that came, after what has come meanwhile; -1 for none.
  [[gnu::cold]] int rejoiner() {
    poll_door();
    return joiners_.empty() ? -1 : joiners_.front().introduction.hello.rank;
  }

  // A door that readmits: the first waiting process of `rank` is told that its place is its own,
  // and its connection handed over; none where it left meanwhile.
  [[gnu::cold]] std::optional<Link> readmit(int rank) {
    const auto joiner = std::ranges::find_if(
        joiners_, [&](const Peer& peer) { return peer.introduction.hello.rank == rank; });
    if (joiner == joiners_.end()) return std::nullopt;
    Peer taken = std::move(*joiner);
    joiners_.erase(joiner);
    Socket& socket = taken.connection->socket;
    ErrorCode ec;
    socket.cancel(ec);  // watch_joiner's read: the connection is the mesh's from here on
    asio::write(socket, asio::buffer(make_frame({setup_type::kReadmitted}, {})), ec);
    if (ec) {
      close(socket);
      return std::nullopt;
    }
    return Link{std::move(socket), std::move(taken.introduction.keys)};
  }

  // A door that readmits: the waiting processes of `rank` are told why not, and let go.
  [[gnu::cold]] void refuse_rejoiner(int rank, const std::string& why) {
    for (Peer& joiner : joiners_) {
      if (joiner.introduction.hello.rank != rank) continue;
      tell(joiner.connection->socket, why);
      close(joiner.connection->socket);
    }
    std::erase_if(joiners_,
                  [](const Peer& joiner) { return !joiner.connection->socket.is_open(); });
  }

  // The door: closes every connection it holds and stops accepting.
  [[gnu::cold]] void close_door() {
    finished_ = true;
    accepting_ = false;
    ErrorCode ignored;
    listener_.close(ignored);  // this door's own descriptor of the listening socket
    for (const ConnectionPtr& connection : connections_) close(connection->socket);
    for (const Peer& joiner : joiners_) close(joiner.connection->socket);
    joiners_.clear();
    drain();
  }

  // Where a running job's door admitted this rank instead of a rendezvous's table: its place in
  // the job's next membership epoch, whose rendezvous it joins next (Tcp's construction).
  const std::optional<Welcome>& welcomed() const { return welcome_; }

  // Where a rank 0 that started an elastic job found instead that its job runs already, its door
  // at one of the job's hosts (search_running_job): it comes back to it as one that joins (Tcp's
  // construction).
  bool found_running_job() const { return found_running_job_; }

  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Where every rank listens, once run() has returned.
  const std::vector<Address>& table() const { return table_; }

  // The connection to every other rank, indexed by rank (this rank's own entry is a closed
  // socket). Throws CommError naming this rank, the operation "rendezvous", the peer when one
  // rank is to blame, and what went wrong.
  [[gnu::cold]] std::vector<Link> run() {
    if (!options_.rejoin_peers.empty()) {
      run_rejoin();
    } else if (options_.rank == 0 && !options_.joins_running_job) {
      run_root();
    } else {
      run_member();
    }
    if (!failure_.empty()) {
      abandon();
      throw CommError(failure());
    }
    finished_ = true;
    if (found_running_job_) leave_for_running_job();
    // The listener serves the next rendezvous, as this rank's place there.
    if (welcome_ || found_running_job_) {
      for (const ConnectionPtr& connection : connections_) close(connection->socket);
      drain();
      return {};
    }
    close_listener();
    std::vector<Link> links;
    links.reserve(peers_.size());
    for (std::optional<Peer>& peer : peers_) {
      if (peer) {
        links.push_back({std::move(peer->connection->socket), peer->introduction.keys});
      } else {
        links.push_back({Socket(io_), std::nullopt});
      }
    }
    for (const ConnectionPtr& connection : connections_) close(connection->socket);  // strays
    drain();
    return links;
  }

 private:
  // Every mode's start: its phases end at `deadline`.
  struct Deadline {
    Clock::time_point at;
  };
  Rendezvous(const Options& options, asio::io_context& io, Acceptor& listener,
             std::uint16_t listen_port, Deadline deadline)
      : options_(options),
        io_(io),
        listener_(listener),
        listen_port_(listen_port),
        deadline_(deadline.at),
        peers_(static_cast<std::size_t>(options.size)),
        ready_(static_cast<std::size_t>(options.size), false) {}

  // --- the phases, each driven until its goal, a failure or the deadline -----------------------

  [[gnu::cold]] void run_root() {
    spawn(accept_loop(1, size() - 1));
    // A later epoch's mesh has no door hosts (next_epoch clears them): only a job's start asks.
    if (!options_.door_hosts.empty()) spawn(search_running_job());
    drive([&] { return found_running_job_ || (established_ == size() - 1 && joined_ranks_live()); },
          [&] {
            return missing([&](int r) { return !peers_[idx(r)]; }) + " never joined" +
                   (options_.door_hosts.empty()
                        ? ""
                        : ", nor did a running job's door answer at " + door_hosts_text()) +
                   refusals_.summary();
          });
    if (!failure_.empty() || found_running_job_) return;
    close_listener();
    std::vector<Address> table(static_cast<std::size_t>(size()));
    table[0] = {options_.rendezvous_host, listen_port_};
    // Rank 0's address as the ranks of other hosts reach it: where one of them arrived.
    std::string across_hosts;
    for (int r = 1; r < size() && across_hosts.empty(); ++r) {
      const Connection& connection = *peers_[idx(r)]->connection;
      if (!is_loopback(connection.remote_address)) across_hosts = connection.local_address;
    }
    for (int r = 1; r < size(); ++r) {
      const Peer& peer = *peers_[idx(r)];
      const Hello& hello = peer.introduction.hello;
      ErrorCode ec;
      const auto declared = asio::ip::make_address(hello.listen_address, ec);
      std::string host = hello.listen_address;
      if (ec || declared.is_unspecified()) {
        // A rank bound to every interface is reached where rank 0 saw it come from; one that
        // came over loopback shares rank 0's host (its name there may be 127.0.1.1, as Debian's
        // /etc/hosts has it), which the other hosts reach at rank 0's own address.
        host = peer.connection->remote_address;
        if (is_loopback(host) && !across_hosts.empty()) host = across_hosts;
      }
      table[idx(r)] = {host, hello.listen_port};
    }
    const auto table_payload = encode_table(table);
    table_ = std::move(table);
    for (int r = 1; r < size(); ++r) spawn(send_table_await_ready(r, table_payload));
    drive([&] { return ready_count_ == size() - 1; },
          [&] {
            return missing([&](int r) { return !ready_[idx(r)]; }) +
                   " did not report their connections complete";
          });
    if (!failure_.empty()) return;
    for (int r = 1; r < size(); ++r) spawn(send_go(r));
    drive([&] { return go_sent_ == size() - 1; },
          [&] { return std::string("could not tell every rank that the mesh is complete"); });
  }

  [[gnu::cold]] void run_member() {
    spawn(join_root());
    // Only rank 0 knows who is missing; once connected to it, give it time to say so.
    const auto grace = std::min<Clock::duration>(options_.connect_timeout, std::chrono::seconds(1));
    drive([&] { return !table_.empty() || welcome_; }, [&] { return join_timeout_message(); },
          [&] { return connected_to_root_ ? grace : Clock::duration::zero(); });
    if (!failure_.empty() || welcome_) return;
    spawn(watch_root());
    if (options_.rank < size() - 1) spawn(accept_loop(options_.rank + 1, size() - 1));
    for (int r = 1; r < options_.rank; ++r) spawn(connect_peer(r));
    drive([&] { return established_ == size() - 1; },
          [&] {
            const auto absent = [&](int r) { return r != options_.rank && !peers_[idx(r)]; };
            const auto lower = [&](int r) { return absent(r) && r < options_.rank; };
            const auto higher = [&](int r) { return absent(r) && r > options_.rank; };
            std::string text;
            if (std::ranges::any_of(ranks(), lower)) {
              text = "could not complete the connection to " + missing(lower);
            }
            if (std::ranges::any_of(ranks(), higher)) {
              text += (text.empty() ? "" : "; ") + missing(higher) + " never connected";
            }
            return text + refusals_.summary();
          });
    if (!failure_.empty()) return;
    close_listener();
    spawn(send_ready());
    drive([&] { return go_received_; },
          [&] { return std::string("rank 0 never confirmed that every rank is connected"); });
  }

  // A process started again for its rank of a running mesh (Options::rejoin_peers): the table from
  // rank 0's door, then its place back at each of the ranks it needs, which readmit it.
  [[gnu::cold]] void run_rejoin() {
    spawn(join_root());
    drive([&] { return !table_.empty(); }, [&] { return join_timeout_message(); });
    if (!failure_.empty()) return;
    close(peers_[0]->connection->socket);  // the door's part is done
    peers_[0].reset();
    --established_;
    for (const int peer : options_.rejoin_peers) spawn(rejoin_at(peer));
    const auto unanswered = [&](int r) {
      return std::ranges::find(options_.rejoin_peers, r) != options_.rejoin_peers.end() &&
             !peers_[idx(r)];
    };
    drive([&] { return established_ == static_cast<int>(options_.rejoin_peers.size()); },
          [&] {
            return missing(unanswered) + " did not take this rank back (rank " +
                   std::to_string(options_.rank) + " of the running job)" + refusals_.summary();
          });
  }

  // Asks `peer` for this rank's place back, until it readmits it, tells why not, or the deadline.
  // A peer that closes the connection unanswered (its door is shut while it does not serve) is
  // asked again.
  [[gnu::cold]] Awaitable<void> rejoin_at(int peer) {
    const Address address = table_[idx(peer)];  // named: see add_door_hosts
    auto endpoints = co_await endpoints_of(address);
    if (!endpoints) {
      fail(endpoints.refusal().reason, peer);
      co_return;
    }
    for (;;) {
      Expected<Peer> found = co_await connect_to(*endpoints, peer, endpoints->size());
      if (!found) {
        fail(found.refusal().told(), peer);
        co_return;
      }
      Socket& socket = found->connection->socket;
      Expected<SetupMessage> answer =
          co_await read_expected(socket, rank_name(peer), setup_type::kReadmitted, 0);
      if (answer) {
        establish(peer, std::move(*found));
        co_return;
      }
      if (answer.refusal().kind != Refusal::Kind::kClosed || stopping()) {
        fail(answer.refusal().told(), peer);
        co_return;
      }
      close(socket);
      ErrorCode ec;
      Timer pause(io_, kRejoinPause);
      co_await pause.async_wait(asio::redirect_error(use_awaitable, ec));
      if (stopping()) co_return;
    }
  }

  // Runs the io_context until done() holds, a coroutine failed, nothing is left to run, or
  // `deadline`, which is no failure.
  template <class Done>
  void run_until(Done done, Clock::time_point deadline) {
    while (failure_.empty() && !done()) {
      if (io_.stopped()) io_.restart();
      if (io_.run_one_until(deadline) == 0) return;
    }
  }

  // Runs the io_context until done() holds, a coroutine failed, or the deadline (plus grace())
  // passed, which is a failure described by timeout_text().
  template <class Done, class Text, class Grace>
  void drive(Done done, Text timeout_text, Grace grace) {
    while (failure_.empty() && !done()) {
      // The io_context stops whenever it runs out of work, as between two phases.
      if (io_.stopped()) io_.restart();
      if (io_.run_one_until(deadline_ + grace()) == 0) {
        if (Clock::now() >= deadline_ + grace()) {
          fail("timed out after " + std::to_string(options_.connect_timeout.count()) +
               " ms: " + timeout_text());
          return;
        }
        // Out of work without reaching the goal: every coroutine records why it gave up.
        COHORT_ASSERT(!failure_.empty() || done());
      }
    }
  }
  template <class Done, class Text>
  void drive(Done done, Text timeout_text) {
    drive(done, timeout_text, [] { return Clock::duration::zero(); });
  }

  std::string where_rank_0() const {
    std::string where = options_.rendezvous_host + ":" + std::to_string(options_.rendezvous_port);
    if (!options_.door_hosts.empty()) where += " (and " + door_hosts_text() + ")";
    return where;
  }

  // "port 29500 of node1, node2".
  std::string door_hosts_text() const {
    std::string text = "port " + std::to_string(options_.rendezvous_port) + " of ";
    for (const std::string& host : options_.door_hosts) {
      text += (&host == &options_.door_hosts.front() ? "" : ", ") + host;
    }
    return text;
  }

  std::string join_timeout_message() const {
    const std::string where = where_rank_0();
    if (!connected_to_root_) {
      std::string text = "rank 0 never answered at " + where;
      if (!last_connect_error_.empty()) text += " (last attempt: " + last_connect_error_ + ")";
      if (last_connect_refused_) {
        text += "; to be reached there, rank 0 must bind " + options_.rendezvous_host +
                " (its own address in the cluster description, or COHORT_BIND_ADDRESS)";
      }
      if (options_.joins_running_job || !options_.rejoin_peers.empty()) {
        text +=
            "; a process that joins a running job finds none there once the job's fit has "
            "ended";
      }
      return text;
    }
    if (waited_at_door_) {
      return "the job at " + where +
             " runs already, and took this rank in at no step boundary (it takes a process that "
             "joins up to elastic.max_workers)";
    }
    return "rank 0 at " + where + " accepted this rank but sent no address table";
  }

  // --- accepting ---------------------------------------------------------------------------

  // Accepts connections and admits each; peers must have ranks in [low, high].
  [[gnu::cold]] Awaitable<void> accept_loop(int low, int high) {
    while (!stopping()) {
      auto connection = std::make_shared<Connection>(io_, /*outbound=*/false);
      ErrorCode ec;
      co_await listener_.async_accept(connection->socket, asio::redirect_error(use_awaitable, ec));
      if (stopping() || !accepting_) co_return;
      if (ec == asio::error::connection_aborted) continue;  // gone before it was accepted
      if (ec == asio::error::no_descriptors) {
        // Out of descriptors: free the oldest handshake's and let the kernel queue the rest.
        drop_oldest_pending();
        Timer pause(io_, std::chrono::milliseconds(10));
        co_await pause.async_wait(asio::redirect_error(use_awaitable, ec));
        continue;
      }
      if (ec) {
        if (listener_.is_open()) fail("cannot accept connections: " + ec.message());
        co_return;
      }
      tune(connection->socket, options_);
      const auto remote = connection->socket.remote_endpoint(ec);
      if (!ec) {
        connection->remote_address = remote.address().to_string();
        connection->from = "a peer at " + endpoint_text(remote);
      }
      if (const auto local = connection->socket.local_endpoint(ec); !ec) {
        connection->local_address = local.address().to_string();
      }
      track(connection);
      spawn(admit(connection, low, high));
    }
  }

  // A door's process that takes its rank's place back (Options::rejoin_peers), or anything else
  // that came to a door of a rank other than 0, which only readmits: rank 0's door gives it the
  // table; another rank's holds it until its owner readmits it (Tcp::readmit), where it is a rank
  // of this mesh's epoch and size.
  [[gnu::cold]] void receive_rejoiner(const ConnectionPtr& connection, Introduction introduced) {
    const Hello& hello = introduced.hello;
    std::string refusal;
    if (!hello.rejoins) {
      refusal =
          "this rank takes back only a lost rank's process started again for its place; a "
          "process that joins finds the job's door at rank 0";
    } else if (hello.epoch != options_.epoch || hello.size != options_.size) {
      refusal = rank_name(hello.rank) + " asks for its place back in membership epoch " +
                std::to_string(hello.epoch) + " of " + std::to_string(hello.size) +
                " ranks; the running job is of epoch " + std::to_string(options_.epoch) + " of " +
                std::to_string(options_.size) + " ranks";
    } else if (hello.rank == 0 || hello.rank >= options_.size || hello.rank == options_.rank) {
      refusal = rank_name(hello.rank) + " is no place a process takes back here (ranks 1 to " +
                std::to_string(options_.size - 1) + " but " + std::to_string(options_.rank) + ")";
    } else if (options_.rank == 0) {
      const auto table = make_frame({setup_type::kTable}, encode_table(table_));
      ErrorCode ignored;
      asio::write(connection->socket, asio::buffer(table), ignored);
      close(connection->socket);
      return;
    }
    if (!refusal.empty()) {
      refusals_.add(prefix(), "refused a connection: " + refusal);
      tell(connection->socket, refusal);
      close(connection->socket);
      return;
    }
    joiners_.push_back(Peer{connection, std::move(introduced)});
    spawn(watch_joiner(connection));
  }

  // Keeps an accepted connection in connections_ (in accept order), forgets the ones that
  // ended, and drops the oldest handshakes beyond max_pending_connections.
  void track(const ConnectionPtr& connection) {
    std::erase_if(connections_, [this](const ConnectionPtr& c) {
      return !c->socket.is_open() && (door_ || !c->authenticated);
    });
    connections_.push_back(connection);
    const auto pending = std::ranges::count_if(connections_, [](const ConnectionPtr& c) {
      return !c->outbound && !c->authenticated && c->socket.is_open();
    });
    if (pending > options_.max_pending_connections) drop_oldest_pending();
    // The handshake's own deadline: a connection that neither proves nor leaves is dropped.
    connection->deadline.expires_at(std::min(Clock::now() + options_.handshake_timeout, deadline_));
    connection->deadline.async_wait([connection](const ErrorCode& ec) {
      if (ec || connection->authenticated) return;
      connection->timed_out = true;
      close(connection->socket);
    });
  }

  void drop_oldest_pending() {
    for (const ConnectionPtr& c : connections_) {
      if (!c->outbound && !c->authenticated && c->socket.is_open()) {
        close(c->socket);
        return;
      }
    }
  }

  // One accepted connection: its handshake, and what its outcome means for the rendezvous.
  [[gnu::cold]] Awaitable<void> admit(ConnectionPtr connection, int low, int high) {
    Expected<Introduction> introduced = co_await handshake_as_acceptor(*connection, low, high);
    connection->deadline.cancel();
    if (introduced && roll_call_) {  // answered: the prober counts this rank in
      probed_by_[idx(introduced->hello.rank)] = true;
      close(connection->socket);
      co_return;
    }
    if (introduced && door_ && introduced->hello.asks) {  // a rank 0 that asked: answered
      close(connection->socket);
      co_return;
    }
    if (introduced && door_ && (introduced->hello.rejoins || options_.rank != 0)) {
      receive_rejoiner(connection, std::move(*introduced));
      co_return;
    }
    if (introduced && door_) {
      joiners_.push_back(Peer{connection, std::move(*introduced)});
      spawn(watch_joiner(connection));
      co_return;
    }
    if (introduced) {
      const int rank = introduced->hello.rank;
      establish(rank, Peer{connection, std::move(*introduced)});
      co_return;
    }
    const Refusal& refusal = introduced.refusal();
    using Kind = Refusal::Kind;
    // With a secret only a peer that proved it may fail the rendezvous: it is refused with
    // kMismatch alone, after its proof. Without one, whoever speaks the protocol may. A rank of
    // another membership epoch never does, nor anyone at a door or a roll call, which turn the
    // peer away.
    const bool fatal =
        !door_ && !roll_call_ &&
        (authenticating() ? refusal.kind == Kind::kMismatch
                          : refusal.kind != Kind::kClosed && refusal.kind != Kind::kStranger &&
                                refusal.kind != Kind::kStale);
    if (fatal) {
      fail(refusal.told());  // abandon() tells this connection why, with the others
      co_return;
    }
    if (stopping()) co_return;
    // A rank of another epoch is told why, as a rank that fails the rendezvous would be, so that
    // one left out of a regroup stops with the reason.
    const bool told = refusal.kind == Kind::kStale || (door_ && refusal.kind == Kind::kMismatch);
    if (told) tell(connection->socket, refusal.reason);
    // A stranger's own words are not repeated: it has proved nothing. Without a secret, what is
    // dropped spoke no cohort protocol at all, and goes unlogged; a connection that closes in its
    // handshake (a rank of a regroup probing this one's listener, a health check) too.
    const bool quiet_close = refusal.kind == Kind::kClosed && !connection->timed_out;
    if (told || (authenticating() && !quiet_close)) {
      refusals_.add(prefix(), "refused a connection: " + refusal.reason);
    }
    close(connection->socket);
  }

  // The accepting side of the handshake (handshake.hpp). With a secret, nothing of the peer's
  // hello is believed before its proof has verified.
  [[gnu::cold]] Awaitable<Expected<Introduction>> handshake_as_acceptor(Connection& connection,
                                                                        int low, int high) {
    Socket& socket = connection.socket;
    Expected<SetupMessage> hello =
        co_await read_expected(socket, connection.from, setup_type::kHello, kMaxHelloBytes);
    if (!hello) co_return handshake_refusal(connection, hello.refusal());
    auto theirs = decode_hello(hello->payload());
    if (!theirs)
      co_return Refusal{Refusal::Kind::kProtocol, connection.from + " sent a malformed hello"};
    const std::string who = authenticating()
                                ? connection.from + " claiming to be " + rank_name(theirs->rank)
                                : rank_name(theirs->rank);
    if (comes_too_soon(*theirs)) {
      co_return Refusal{Refusal::Kind::kClosed, who + " is of membership epoch " +
                                                    std::to_string(theirs->epoch) +
                                                    ", not yet served here"};
    }
    std::string mismatch = check_hello(*theirs, expectation(low, high));
    if (mismatch.empty() && !door_ && holds_live(theirs->rank)) mismatch = who + " joined twice";
    const auto kind = turned_away(*theirs, expectation(low, high)) ? Refusal::Kind::kStale
                                                                   : Refusal::Kind::kMismatch;
    if (!mismatch.empty() && !authenticating()) co_return Refusal{kind, mismatch};
    const std::vector<std::byte> mine = make_frame({setup_type::kHello}, encode_hello(my_hello()));
    if (auto sent = co_await write_setup(socket, who, mine); !sent) {
      co_return handshake_refusal(connection, sent.refusal());
    }
    Expected<SetupMessage> confirm =
        co_await read_expected(socket, who, setup_type::kConfirm, kProofBytes);
    if (!confirm) co_return handshake_refusal(connection, confirm.refusal());
    if (!proofs_equal(confirm->payload(), proof_or_empty(Role::kConnector, hello->bytes, mine))) {
      co_return Refusal{Refusal::Kind::kForged, who + ": authentication failed"};
    }
    connection.authenticated = true;
    if (!mismatch.empty()) co_return Refusal{kind, mismatch};
    const auto proof =
        make_frame({setup_type::kConfirm}, proof_or_empty(Role::kAcceptor, hello->bytes, mine));
    if (auto sent = co_await write_setup(socket, who, proof); !sent) co_return sent.refusal();
    co_return Introduction{std::move(*theirs), keys_or_none(Role::kAcceptor, hello->bytes, mine)};
  }

  // A refusal during an accepted connection's handshake, with the handshake's own deadline named
  // when that is what ended it.
  Refusal handshake_refusal(const Connection& connection, Refusal refusal) const {
    if (connection.timed_out) {
      refusal.reason = connection.from + " did not complete its handshake within " +
                       std::to_string(options_.handshake_timeout.count()) + " ms";
    }
    return refusal;
  }

  // --- connecting --------------------------------------------------------------------------

  // The connecting side of the handshake with `peer`, on a connected socket; one that `asks`
  // only whether a door answers (search_running_job).
  [[gnu::cold]] Awaitable<Expected<Introduction>> handshake_as_connector(Socket& socket, int peer,
                                                                         bool asks = false) {
    const std::string who = rank_name(peer);
    const std::vector<std::byte> mine =
        make_frame({setup_type::kHello}, encode_hello(my_hello(asks)));
    if (auto sent = co_await write_setup(socket, who, mine); !sent) co_return sent.refusal();
    Expected<SetupMessage> hello =
        co_await read_expected(socket, who, setup_type::kHello, kMaxHelloBytes);
    if (!hello) co_return hello.refusal();
    auto theirs = decode_hello(hello->payload());
    if (!theirs) co_return Refusal{Refusal::Kind::kProtocol, who + " sent a malformed hello"};
    // A rendezvous of a later epoch closes a joiner's connection unanswered (comes_too_soon), so
    // one that answers without a door is a job that starts.
    if (options_.joins_running_job && !theirs->door && theirs->job_id == options_.job_id) {
      const std::string where = where_rank_0();
      co_return Refusal{
          Refusal::Kind::kMismatch,
          "came to join a running job (joins_running_job, COHORT_JOIN), and found the "
          "job at " +
              where + " starting: only a running job's door takes a process in"};
    }
    const auto proof =
        make_frame({setup_type::kConfirm}, proof_or_empty(Role::kConnector, mine, hello->bytes));
    if (std::string mismatch = check_hello(*theirs, expectation(peer, peer)); !mismatch.empty()) {
      // With a secret the peer believes this rank's hello only once it has this rank's proof:
      // sent, the peer finds the same mismatch and fails at once too, rather than waiting out its
      // deadline for a rank that left (ranks whose roll calls disagreed, a worker lost between
      // them, would otherwise call the roll again apart, and each find itself alone).
      if (authenticating()) co_await write_setup(socket, who, proof);
      co_return Refusal{Refusal::Kind::kMismatch, mismatch};
    }
    if (auto sent = co_await write_setup(socket, who, proof); !sent) co_return sent.refusal();
    Expected<SetupMessage> confirm =
        co_await read_expected(socket, who, setup_type::kConfirm, kProofBytes);
    if (!confirm) {
      Refusal refusal = confirm.refusal();
      // An acceptor drops a connection whose proof does not verify without a word.
      if (refusal.kind == Refusal::Kind::kClosed && authenticating()) {
        refusal = {Refusal::Kind::kForged,
                   "authentication failed with " + who +
                       " (it closed the connection on this rank's proof: the secrets differ)"};
      }
      co_return refusal;
    }
    if (!proofs_equal(confirm->payload(), proof_or_empty(Role::kAcceptor, mine, hello->bytes))) {
      co_return Refusal{
          Refusal::Kind::kForged,
          "authentication failed with " + who + " (its proof does not match this rank's secret)"};
    }
    co_return Introduction{std::move(*theirs), keys_or_none(Role::kConnector, mine, hello->bytes)};
  }

  // Connects to `peer` at the first endpoint that answers and runs the handshake. Connection
  // refused (the peer does not listen yet) and a drop before the peer's hello (its listener was
  // flooded) are retried, backing off, until the deadline ends the rendezvous. Where there are
  // several endpoints, an attempt at one lasts at most kConnectAttemptLimit; the first `given`
  // are the peer's own, and whatever answers at one of the others (Options::door_hosts) without
  // proving to be the peer of this job (another service, another job, another secret) is passed
  // over: the peer is elsewhere.
  [[gnu::cold]] Awaitable<Expected<Peer>> connect_to(std::vector<asio::ip::tcp::endpoint> endpoints,
                                                     int peer, std::size_t given) {
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
      bool every_one_refused = true;
      for (std::size_t index = 0; index < endpoints.size(); ++index) {
        auto connection = std::make_shared<Connection>(io_, /*outbound=*/true);
        connections_.push_back(connection);
        ErrorCode ec;
        if (endpoints.size() > 1) limit_attempt(connection);
        co_await connection->socket.async_connect(endpoints[index],
                                                  asio::redirect_error(use_awaitable, ec));
        ++connection->attempt;
        connection->deadline.cancel();
        if (stopping()) co_return Refusal{Refusal::Kind::kClosed, "stopped"};
        if (ec) {
          last_connect_error_ = ec == asio::error::operation_aborted
                                    ? "no answer from " + endpoint_text(endpoints[index]) +
                                          " within " +
                                          std::to_string(kConnectAttemptLimit.count()) + " s"
                                    : ec.message();
          every_one_refused = every_one_refused && ec == asio::error::connection_refused;
          close(connection->socket);
          continue;
        }
        if (is_own_listener(connection->socket)) {
          close(connection->socket);  // nobody else listens there
          continue;
        }
        every_one_refused = false;
        door_gone_since_ = {};
        tune(connection->socket, options_);
        Expected<Introduction> introduced =
            co_await handshake_as_connector(connection->socket, peer);
        if (introduced) {
          if (peer == 0) connected_to_root_ = true;
          connection->authenticated = true;
          co_return Peer{connection, std::move(*introduced)};
        }
        const Refusal& refusal = introduced.refusal();
        if (stopping() || (refusal.kind != Refusal::Kind::kClosed && index < given)) {
          co_return refusal;
        }
        last_connect_error_ =
            (index < given ? "" : endpoint_text(endpoints[index]) + ": ") + refusal.reason;
        close(connection->socket);
      }
      last_connect_refused_ = every_one_refused;
      if (roll_call_ && every_one_refused) {  // the process ended, or left
        co_return Refusal{Refusal::Kind::kClosed, rank_name(peer) + " refused the connection"};
      }
      if (peer == 0 && waited_at_door_ && every_one_refused) {
        // Where a running job's door was, nobody listens: the job ended, or lost its rank 0, whose
        // successor opens the door there again once the job has regrouped, where it can.
        if (door_gone_since_ == Clock::time_point{}) door_gone_since_ = Clock::now();
        if (Clock::now() - door_gone_since_ > kDoorRegroupGrace) {
          co_return Refusal{Refusal::Kind::kClosed,
                            "the job at " + where_rank_0() +
                                " ended, or lost its rank 0 and opened no door there again, "
                                "before it took this rank in"};
        }
      }
      ErrorCode ec;
      Timer pause(io_, backoff);
      co_await pause.async_wait(asio::redirect_error(use_awaitable, ec));
      if (stopping()) co_return Refusal{Refusal::Kind::kClosed, "stopped"};
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  // Bounds the connection attempt `connection` starts next to kConnectAttemptLimit: closing its
  // socket ends the attempt (operation_aborted), where it is still that attempt.
  void limit_attempt(const ConnectionPtr& connection) {
    const std::size_t attempt = connection->attempt;
    connection->deadline.expires_at(std::min(Clock::now() + kConnectAttemptLimit, deadline_));
    connection->deadline.async_wait([connection, attempt](const ErrorCode& ec) {
      if (!ec && connection->attempt == attempt) close(connection->socket);
    });
  }

  // Where `address` is reached: its numeric address, or every address its name resolves to.
  [[gnu::cold]] Awaitable<Expected<std::vector<asio::ip::tcp::endpoint>>> endpoints_of(
      Address address) {
    std::vector<asio::ip::tcp::endpoint> endpoints;
    ErrorCode ec;
    if (const auto numeric = asio::ip::make_address(address.host, ec); !ec) {
      endpoints.emplace_back(numeric, address.port);
      co_return endpoints;
    }
    asio::ip::basic_resolver<asio::ip::tcp, Executor> resolver(io_);
    const auto results = co_await resolver.async_resolve(address.host, std::to_string(address.port),
                                                         asio::redirect_error(use_awaitable, ec));
    if (ec) {
      co_return Refusal{Refusal::Kind::kClosed,
                        "cannot resolve '" + address.host + "': " + ec.message()};
    }
    for (const auto& entry : results) endpoints.push_back(entry.endpoint());
    co_return endpoints;
  }

  [[gnu::cold]] Awaitable<void> join_root() {
    const Address root{options_.rendezvous_host, options_.rendezvous_port};
    auto endpoints = co_await endpoints_of(root);
    if (!endpoints) {
      fail("rendezvous_host: " + endpoints.refusal().reason);
      co_return;
    }
    const std::size_t own = endpoints->size();
    co_await add_door_hosts(*endpoints);
    for (;;) {
      Expected<Peer> root = co_await connect_to(*endpoints, 0, own);
      if (!root) {
        fail(root.refusal().told(), 0);
        co_return;
      }
      Socket& socket = root->connection->socket;
      const bool door = root->introduction.hello.door;
      waited_at_door_ = waited_at_door_ || door;
      establish(0, std::move(*root));
      // A door welcomes one that joins; one that takes its place back gets the table.
      const bool welcomed = door && options_.rejoin_peers.empty();
      Expected<SetupMessage> answer = co_await read_expected(
          socket, "rank 0", welcomed ? setup_type::kWelcome : setup_type::kTable,
          kMaxSetupPayloadBytes);
      if (!answer && door && answer.refusal().kind == Refusal::Kind::kClosed && !stopping()) {
        // A door closes while the job changes its membership: knock again.
        close(socket);
        peers_[0].reset();
        --established_;
        continue;
      }
      if (!answer) {
        fail(answer.refusal().told(), 0);
        co_return;
      }
      if (welcomed) {
        welcome_ = decode_welcome(answer->payload());
        if (!welcome_) fail("rank 0 sent a malformed welcome", 0);
        co_return;
      }
      auto decoded = decode_table(answer->payload(), size());
      if (!decoded) {
        fail("rank 0 sent a malformed address table", 0);
        co_return;
      }
      table_ = std::move(*decoded);
      co_return;
    }
  }

  // Where a rank that comes to a running job looks for its door after the rendezvous address: each
  // of the job's other hosts at the same port (Options::door_hosts), in order. A host that does
  // not resolve is left out, and said so.
  [[gnu::cold]] Awaitable<void> add_door_hosts(std::vector<asio::ip::tcp::endpoint>& endpoints) {
    for (const std::string& host : options_.door_hosts) {
      const Address address{host, options_.rendezvous_port};  // named: a temporary argument of a
      auto found = co_await endpoints_of(address);            // co_await is freed twice by GCC 12
      if (!found) {
        std::fprintf(stderr, "cohort: rank %d: leaves out %s, one of the job's hosts: %s\n",
                     options_.rank, host.c_str(), found.refusal().reason.c_str());
        continue;
      }
      for (const auto& endpoint : *found) {
        if (std::find(endpoints.begin(), endpoints.end(), endpoint) == endpoints.end()) {
          endpoints.push_back(endpoint);
        }
      }
    }
  }

  // A rank 0 that starts an elastic job whose hosts it knows (Options::door_hosts) asks them
  // whether the job runs already, its door at the job's port of one of them: at once, then after
  // each kDoorSearchPause while the job's other ranks have not all come. It was started again
  // while its job ran on (a pod of rank 0 its controller started with the environment it started
  // with), perhaps before the job noticed its loss, regrouped and opened its door there again.
  [[gnu::cold]] Awaitable<void> search_running_job() {
    std::vector<asio::ip::tcp::endpoint> endpoints;
    co_await add_door_hosts(endpoints);
    if (endpoints.empty()) co_return;
    for (;;) {
      co_await ask_doors(endpoints);
      if (found_running_job_ || stopping() || !accepting_) co_return;
      door_search_.expires_after(kDoorSearchPause);
      ErrorCode ec;
      co_await door_search_.async_wait(asio::redirect_error(use_awaitable, ec));
      if (stopping() || !accepting_) co_return;
    }
  }

  // One round of search_running_job: each of the job's hosts at once, until a door answers or
  // every host has answered or kept silent for kConnectAttemptLimit.
  [[gnu::cold]] Awaitable<void> ask_doors(const std::vector<asio::ip::tcp::endpoint>& endpoints) {
    doors_unanswered_ = endpoints.size();
    for (const auto& endpoint : endpoints) spawn(ask_door(endpoint));
    if (stopping()) co_return;
    door_search_.expires_at(Clock::time_point::max());  // ask_door cancels it
    ErrorCode ec;
    co_await door_search_.async_wait(asio::redirect_error(use_awaitable, ec));
  }

  // Whether a door of this job answers at `endpoint`: the connection and the hellos within
  // kConnectAttemptLimit.
  [[gnu::cold]] Awaitable<void> ask_door(asio::ip::tcp::endpoint endpoint) {
    auto connection = std::make_shared<Connection>(io_, /*outbound=*/true);
    connections_.push_back(connection);
    limit_attempt(connection);
    ErrorCode ec;
    co_await connection->socket.async_connect(endpoint, asio::redirect_error(use_awaitable, ec));
    if (!ec && !stopping() && !is_own_listener(connection->socket)) {
      tune(connection->socket, options_);
      Expected<Introduction> introduced =
          co_await handshake_as_connector(connection->socket, 0, /*asks=*/true);
      found_running_job_ = found_running_job_ || (introduced && introduced->hello.door);
    }
    ++connection->attempt;
    connection->deadline.cancel();
    close(connection->socket);
    if (--doors_unanswered_ == 0 || found_running_job_) door_search_.cancel();
  }

  // A rank 0 that found its job running leaves the job it started: a rank that came to it (one
  // started at the same time as it, for the same job) is told why, and ends; started again, it
  // finds the job's door as this one did.
  void leave_for_running_job() {
    const std::string why =
        prefix() + "its job runs already, its door at " + door_hosts_text() +
        ": this rank 0 joins it instead of starting it again, and every rank that came to it "
        "must join it too (started again, it finds the door there)";
    for (std::optional<Peer>& peer : peers_) {
      if (peer) tell(peer->connection->socket, why);
    }
    ErrorCode ignored;
    accepting_ = false;
    listener_.cancel(ignored);
  }

  // Whether `socket` reached this rank's own listener: a rank 0 that joins holds the job's port on
  // its own host, which the places it looks at include. Bound to every interface, it is reached
  // at each of its host's addresses, a loopback one among them (a host's own name is 127.0.1.1 in
  // Debian's /etc/hosts).
  bool is_own_listener(const Socket& socket) const {
    ErrorCode bound_error;
    ErrorCode local_error;
    ErrorCode remote_error;
    const auto bound = listener_.local_endpoint(bound_error);
    const auto local = socket.local_endpoint(local_error);
    const auto remote = socket.remote_endpoint(remote_error);
    if (bound_error || local_error || remote_error || remote.port() != bound.port()) return false;
    if (!bound.address().is_unspecified()) return remote.address() == bound.address();
    return remote.address() == local.address() || remote.address().is_loopback();
  }

  // The roll call: asks `rank` at `address` whether its process is there, until it answers, its
  // connection is refused, or the roll call ends.
  [[gnu::cold]] Awaitable<void> ask(int rank, Address address) {
    auto endpoints = co_await endpoints_of(address);
    if (!endpoints) {
      answers_[idx(rank)] = Answer::kSilent;
      co_return;
    }
    const std::size_t own = endpoints->size();
    Expected<Peer> answer = co_await connect_to(std::move(*endpoints), rank, own);
    if (stopping()) co_return;
    answers_[idx(rank)] = answer ? Answer::kAnswered : Answer::kSilent;
    if (answer) close(answer->connection->socket);
  }

  // The door: a joiner sends nothing while it waits; whatever comes (its end) lets it go.
  [[gnu::cold]] Awaitable<void> watch_joiner(ConnectionPtr connection) {
    std::array<std::byte, 1> unused{};
    ErrorCode ec;
    co_await connection->socket.async_read_some(asio::buffer(unused),
                                                asio::redirect_error(use_awaitable, ec));
    close(connection->socket);
  }

  [[gnu::cold]] Awaitable<void> connect_peer(int peer) {
    const Address& address = table_[idx(peer)];
    ErrorCode ec;
    const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(address.host, ec), address.port);
    if (ec) {
      fail("rank 0 sent an invalid address for rank " + std::to_string(peer) + ": " +
               quote_peer_text(address.host),
           0);
      co_return;
    }
    std::vector<asio::ip::tcp::endpoint> endpoints{endpoint};  // GCC 12 takes no braced list here
    const std::size_t own = endpoints.size();
    Expected<Peer> connected = co_await connect_to(std::move(endpoints), peer, own);
    if (!connected) {
      fail(connected.refusal().kind == Refusal::Kind::kClosed
               ? "cannot connect to rank " + std::to_string(peer) + " at " +
                     endpoint_text(endpoint) + ": " + connected.refusal().reason
               : connected.refusal().told(),
           peer);
      co_return;
    }
    establish(peer, std::move(*connected));
  }

  // --- after the handshakes ----------------------------------------------------------------

  // Rank 0, for one rank: the table out, that rank's "ready" in.
  [[gnu::cold]] Awaitable<void> send_table_await_ready(int peer, std::vector<std::byte> table) {
    Socket& socket = peers_[idx(peer)]->connection->socket;
    const std::string who = rank_name(peer);
    if (!co_await record(write_setup(socket, who, make_frame({setup_type::kTable}, table)))) {
      co_return;
    }
    if (!co_await record(read_expected(socket, who, setup_type::kReady, 0))) co_return;
    ready_[idx(peer)] = true;
    ++ready_count_;
  }

  [[gnu::cold]] Awaitable<void> send_go(int peer) {
    Socket& socket = peers_[idx(peer)]->connection->socket;
    if (co_await record(write_setup(socket, rank_name(peer), make_frame({setup_type::kGo}, {})))) {
      ++go_sent_;
    }
  }

  [[gnu::cold]] Awaitable<void> send_ready() {
    Socket& socket = peers_[0]->connection->socket;
    co_await record(write_setup(socket, "rank 0", make_frame({setup_type::kReady}, {})));
  }

  // Waits for rank 0's "go" during the whole mesh phase, so that an abort from rank 0 (another
  // rank failed) ends this rank's rendezvous at once.
  [[gnu::cold]] Awaitable<void> watch_root() {
    Socket& socket = peers_[0]->connection->socket;
    if (co_await record(read_expected(socket, "rank 0", setup_type::kGo, 0))) go_received_ = true;
  }

  // A step's outcome on an authenticated connection: a refusal there is the rendezvous's failure.
  template <class T>
  Awaitable<bool> record(Awaitable<Expected<T>> step) {
    Expected<T> outcome = co_await std::move(step);
    if (!outcome) fail(outcome.refusal().told());
    co_return static_cast<bool>(outcome);
  }

  // --- messages ------------------------------------------------------------------------------

  // Reads one setup message of at most `limit` payload bytes, checking magic, version, size and
  // checksum before anything else of it is used.
  [[gnu::cold]] Awaitable<Expected<SetupMessage>> read_setup(Socket& socket, const std::string& who,
                                                             std::size_t limit) {
    ErrorCode ec;
    SetupMessage message;
    message.bytes.assign(kHeaderBytes, std::byte{0});
    co_await asio::async_read(socket, asio::buffer(message.bytes),
                              asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Refusal{Refusal::Kind::kClosed, io_error(who, ec)};
    message.frame = decode_header(message.bytes.data());
    if (message.frame.magic != kMagic) {
      co_return Refusal{Refusal::Kind::kStranger, who + " is not a cohort rank (no cohort magic)"};
    }
    if (message.frame.version != kProtocolVersion) {
      // The rest of another version's frame cannot be trusted; its hello starts with the rank.
      const std::size_t head = static_cast<std::size_t>(std::min<std::uint64_t>(
          message.frame.length, message.frame.header.type == setup_type::kHello ? 4 : 0));
      message.bytes.resize(kHeaderBytes + head);
      co_await asio::async_read(socket, asio::buffer(message.bytes.data() + kHeaderBytes, head),
                                asio::redirect_error(use_awaitable, ec));
      const auto rank =
          ec ? std::nullopt : rank_of_hello(std::span(message.bytes).subspan(kHeaderBytes));
      const std::string speaker =
          rank ? (authenticating() ? who + " claiming to be " : std::string()) + rank_name(*rank)
               : who;
      co_return Refusal{Refusal::Kind::kProtocol, speaker + " speaks protocol version " +
                                                      std::to_string(message.frame.version) +
                                                      ", this is version " +
                                                      std::to_string(kProtocolVersion)};
    }
    // An abort is read whatever the limit, up to the text it may carry.
    const std::size_t allowed = message.frame.header.type == setup_type::kAbort
                                    ? std::max(limit, kMaxPeerTextBytes * 4)
                                    : limit;
    if (message.frame.length > allowed) {
      co_return Refusal{Refusal::Kind::kProtocol,
                        who + " sent a setup message of " + std::to_string(message.frame.length) +
                            " bytes where at most " + std::to_string(allowed) + " belong"};
    }
    const auto length = static_cast<std::size_t>(message.frame.length);
    message.bytes.resize(kHeaderBytes + length + kTrailerBytes);
    co_await asio::async_read(
        socket, asio::buffer(message.bytes.data() + kHeaderBytes, length + kTrailerBytes),
        asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Refusal{Refusal::Kind::kClosed, io_error(who, ec)};
    const auto sent = load_le<std::uint64_t>(message.bytes.data() + kHeaderBytes + length);
    if (sent != checksum(checksum_seed(message.bytes.data()), message.payload())) {
      co_return Refusal{Refusal::Kind::kProtocol,
                        who + " sent a setup message whose checksum does not match"};
    }
    co_return message;
  }

  // Reads a message of the expected type; an abort is a refusal carrying the sender's reason.
  [[gnu::cold]] Awaitable<Expected<SetupMessage>> read_expected(Socket& socket,
                                                                const std::string& who,
                                                                std::uint16_t type,
                                                                std::size_t limit) {
    Expected<SetupMessage> message = co_await read_setup(socket, who, limit);
    if (!message) co_return message;
    if (message->frame.header.type == setup_type::kAbort) {
      co_return Refusal{Refusal::Kind::kAborted, "aborted by " + who,
                        quote_peer_text(decode_text(message->payload()))};
    }
    if (message->frame.header.type != type) {
      co_return Refusal{Refusal::Kind::kProtocol, who + " sent setup message type " +
                                                      std::to_string(message->frame.header.type) +
                                                      " where type " + std::to_string(type) +
                                                      " belongs"};
    }
    co_return message;
  }

  [[gnu::cold]] Awaitable<Expected<Done>> write_setup(Socket& socket, const std::string& who,
                                                      const std::vector<std::byte>& frame) {
    ErrorCode ec;
    co_await asio::async_write(socket, asio::buffer(frame),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Refusal{Refusal::Kind::kClosed, io_error(who, ec)};
    co_return Done{};
  }

  static std::string io_error(const std::string& who, const ErrorCode& ec) {
    if (is_closed(ec)) return who + " closed the connection during the rendezvous";
    if (ec == asio::error::operation_aborted) return "the connection to " + who + " was dropped";
    return "the connection to " + who + " failed during the rendezvous: " + ec.message();
  }

  // --- handshake helpers -------------------------------------------------------------------

  bool authenticating() const { return !options_.secret.empty(); }

  // A hello that this listener does not serve yet, closed before anything is answered so that
  // its sender connects again: at a rendezvous, one of an earlier membership epoch (a process
  // started again, or one the job regrouped without), which a door admits once the epoch's mesh
  // is up; at a door, one of a later epoch (a rank that regroups before this one has noticed the
  // loss), which this rank's next rendezvous serves; at a roll call, anything but a roll call of
  // its epoch, which the rendezvous or door after it serves; anywhere else, a roll call, whose
  // rank asks again until its own ends.
  bool comes_too_soon(const Hello& theirs) const {
    if (theirs.job_id != options_.job_id || theirs.door) return false;
    if (theirs.roll_call != roll_call_) return true;  // a roll call serves only roll calls
    if (roll_call_) return theirs.epoch != options_.epoch;
    return door_ ? theirs.epoch > options_.epoch : theirs.epoch < options_.epoch;
  }

  Hello my_hello(bool asks = false) const {
    return {.rank = options_.rank,
            .size = options_.size,
            .authenticates = authenticating(),
            .checksums = options_.checksum,
            .encrypts = options_.encrypt,
            .listen_port = listen_port_,
            .listen_address = options_.bind_address,
            .job_id = options_.job_id,
            .epoch = options_.epoch,
            .door = door_,
            .joins = options_.joins_running_job || asks,
            .roll_call = roll_call_,
            .asks = asks,
            .rejoins = !options_.rejoin_peers.empty(),
            .nonce = random_nonce()};
  }

  Expectation expectation(int low, int high) const {
    return {.rank = options_.rank,
            .size = options_.size,
            .job_id = options_.job_id,
            .epoch = options_.epoch,
            .authenticates = authenticating(),
            .checksums = options_.checksum,
            .encrypts = options_.encrypt,
            .lowest_peer = low,
            .highest_peer = high,
            .door = door_};
  }

  std::vector<std::byte> proof_or_empty(Role role, std::span<const std::byte> connector_hello,
                                        std::span<const std::byte> acceptor_hello) const {
    if (!authenticating()) return {};
    const auto mac = proof(options_.secret, role, connector_hello, acceptor_hello);
    return {mac.begin(), mac.end()};
  }

  std::optional<SessionKeys> keys_or_none(Role role, std::span<const std::byte> connector_hello,
                                          std::span<const std::byte> acceptor_hello) const {
    if (!authenticating()) return std::nullopt;
    return session_keys(options_.secret, role, connector_hello, acceptor_hello);
  }

  // Whether this rank holds a connection to `rank` whose peer is still there. A rank restarted
  // with the same address (a launcher that restarts a failed process) finds its earlier
  // connection ended, and the new one takes its place.
  bool holds_live(int rank) {
    if (!peers_[idx(rank)]) return false;
    Socket& socket = peers_[idx(rank)]->connection->socket;
    std::byte next{};
    const ssize_t peeked =
        ::recv(socket.native_handle(), &next, 1, MSG_PEEK | MSG_DONTWAIT | MSG_NOSIGNAL);
    if (peeked > 0 || (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) return true;
    close(socket);  // ended: closed, reset, or closed here before
    peers_[idx(rank)].reset();
    --established_;
    return false;
  }

  // Whether every rank that joined is still there, once all have: one that ended since (its
  // process died, and its launcher starts it again) is forgotten before the table goes out, so
  // that its next life takes its place instead of failing the rendezvous.
  bool joined_ranks_live() {
    bool live = true;
    for (int r = 1; r < size(); ++r) live = holds_live(r) && live;
    return live;
  }

  void establish(int rank, Peer peer) {
    if (holds_live(rank)) {
      fail(rank_name(rank) + " joined twice", rank);
      return;
    }
    peer.connection->authenticated = true;
    peers_[idx(rank)] = std::move(peer);
    ++established_;
  }

  // --- bookkeeping ---------------------------------------------------------------------------

  // The first failure is the rendezvous's; `peer` is the rank to blame, when one is.
  void fail(const std::string& why, int peer = -1) {
    if (!failure_.empty() || finished_) return;
    failure_ = why;
    failed_peer_ = peer;
  }
  CommFailure failure() const {
    return {
        .rank = options_.rank, .peer = failed_peer_, .operation = "rendezvous", .detail = failure_};
  }
  bool stopping() const { return !failure_.empty() || finished_; }

  template <class Awaitable>
  void spawn(Awaitable awaitable) {
    asio::co_spawn(io_, std::move(awaitable), [this](std::exception_ptr error) {
      if (error) fail(what_of(error));
    });
  }

  // Tells every peer that may hear it why this rank gives up (with a secret, the authenticated
  // ones only: a stranger learns nothing of the job), closes everything and lets the coroutines
  // finish on their aborted operations.
  void abandon() {
    const std::string why = CommError::sentence(failure());
    for (const ConnectionPtr& connection : connections_) {
      Socket& socket = connection->socket;
      if (!socket.is_open()) continue;
      if (connection->authenticated || !authenticating()) tell(socket, why);
      close(socket);
    }
    close_listener(/*for_good=*/true);
    drain();
  }

  // Sends an abort message that says why, best effort: never waits for a slow peer.
  static void tell(Socket& socket, const std::string& why) {
    const auto abort = make_frame({setup_type::kAbort}, encode_text(why));
    ErrorCode ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(abort), ignored);
  }

  void drain() {
    for (const ConnectionPtr& connection : connections_) connection->deadline.cancel();
    door_search_.cancel();
    io_.restart();
    io_.run_for(std::chrono::milliseconds(500));
  }

  // Stops accepting. Under Options::keep_listening the socket stays bound for a regroup, unless
  // the rendezvous failed (for_good).
  void close_listener(bool for_good = false) {
    accepting_ = false;
    ErrorCode ignored;
    if (options_.keep_listening && !for_good) {
      listener_.cancel(ignored);
    } else {
      listener_.close(ignored);
    }
  }
  static void close(Socket& socket) {
    ErrorCode ignored;
    socket.close(ignored);
  }

  std::string prefix() const { return rank_name(options_.rank) + ": "; }
  int size() const { return options_.size; }
  static std::size_t idx(int rank) { return static_cast<std::size_t>(rank); }
  std::vector<int> ranks() const {
    std::vector<int> all(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r) all[idx(r)] = r;
    return all;
  }
  template <class Predicate>
  std::string missing(Predicate predicate) const {
    std::vector<int> found;
    for (int r = 0; r < size(); ++r) {
      if (r != options_.rank && predicate(r)) found.push_back(r);
    }
    return rank_list(found);
  }

  const Options& options_;
  asio::io_context& io_;
  Acceptor& listener_;
  std::uint16_t listen_port_;
  Clock::time_point deadline_;

  std::vector<ConnectionPtr> connections_;  // open ones, in the order they were made
  std::vector<std::optional<Peer>> peers_;  // by rank: the peer whose handshake succeeded
  std::vector<Address> table_;              // where every rank listens
  std::vector<bool> ready_;                 // rank 0: who reported its mesh complete
  int established_ = 0;
  int ready_count_ = 0;
  int go_sent_ = 0;
  bool connected_to_root_ = false;
  bool go_received_ = false;
  bool accepting_ = true;
  std::string last_connect_error_;
  bool last_connect_refused_ = false;
  RefusalLog refusals_;
  std::string failure_;
  int failed_peer_ = -1;
  bool finished_ = false;
  bool door_ = false;
  bool waited_at_door_ = false;       // a member that found the job running
  Clock::time_point door_gone_since_{};  // a member that waited: since its door was refused
  std::vector<Peer> joiners_;         // the door: who waits for a place, in the order they came
  std::optional<Welcome> welcome_{};  // a door's answer instead of the table
  std::size_t doors_unanswered_ = 0;  // search_running_job: the hosts of a round still to answer
  Timer door_search_{io_};            // search_running_job: the round's end, then the pause
  bool found_running_job_ = false;
  bool roll_call_ = false;
  enum class Answer : std::uint8_t { kAwaited, kAnswered, kSilent };
  std::vector<Answer> answers_;  // the roll call: by rank, whether its process answered
  std::vector<bool> probed_by_;  // the roll call: by rank, whether its own was answered here
};

// A rank's door for the processes of lost ranks started again for their places (Tcp::readmit),
// on the rank's own listener and io_context: the copy of the mesh's options that the door's
// rendezvous refers to, kept where a move of the Tcp leaves it.
struct Readmissions {
  Readmissions(const Options& mesh, asio::io_context& io, Acceptor& listener,
               std::uint16_t listen_port, std::vector<Address> table)
      : options(mesh),
        door(Rendezvous::DoorMode{}, options, io, listener, listen_port, std::move(table)) {}
  Readmissions(const Readmissions&) = delete;
  Readmissions& operator=(const Readmissions&) = delete;
  ~Readmissions() { door.close_door(); }
  Options options;
  Rendezvous door;
};

}  // namespace cohort::transport::tcp::detail
