// How the ranks of a TCP job find each other and connect: the Listener every rank opens first,
// and the rendezvous that turns it into one authenticated connection per pair of ranks.
//
//   1. Every rank binds a listener on bind_address (rank 0 at rendezvous_port, the others at a
//      free port) and every rank but 0 connects to rank 0, retrying until connect_timeout, so
//      that start order does not matter, and sends its hello (handshake.hpp).
//   2. When every rank has joined, rank 0 sends each the table of listening addresses.
//   3. Every rank connects to each lower rank other than 0 and accepts each higher one, with the
//      same handshake; the connection to rank 0 from step 1 is kept as the pair's connection.
//   4. Each rank reports "ready" to rank 0, which answers "go" when all have: a constructed Tcp
//      means the whole mesh is up.
//
// The whole rendezvous runs under one deadline, connect_timeout from the Listener's
// construction. Whatever fails first is the error: the rank sends it to every connection it has
// (an abort message) before closing them, so that the others fail at once and with the reason
// ("rank 1: rendezvous aborted; rank 0: rendezvous timed out after 2000 ms: ranks 2, 3 never
// joined") instead of timing out on their own. A rank that has reached rank 0 and waits for the
// table leaves the verdict to rank 0 for a grace period after its own deadline, because only
// rank 0 knows who is missing.
//
// The setup code is Asio C++20 coroutines on a private io_context driven by this thread: the
// accept loop, every handshake and every connect with retries progress concurrently, each written
// as the straight sequence it is, and redirect_error turns every failure into an error code, so
// that none unwinds through Asio. Synchronous Asio would need a thread per pending connection to
// honour the deadline. The io_context serves the setup only; transfers use the sockets directly
// (tcp.hpp). The setup runs once per process and waits on the network, so its functions are
// [[gnu::cold]]: compiled for size, which spares every program that uses the transport a good
// part of its -O3 compile time (benchmarks/build/compile_time).
#pragma once

// clang-format off
// First: Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format on

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/handshake.hpp"
#include "cohort/transport/tcp/options.hpp"

namespace cohort::transport::tcp {

class Tcp;

namespace detail {

namespace asio = boost::asio;

// The rendezvous runs on one private io_context, so its sockets, timer and coroutines name that
// context's executor rather than the type-erased asio::any_io_executor: the same operations,
// without instantiating the type erasure's machinery in every program that uses the transport.
using Executor = asio::io_context::executor_type;
using Socket = asio::basic_stream_socket<asio::ip::tcp, Executor>;
using Acceptor = asio::basic_socket_acceptor<asio::ip::tcp, Executor>;
template <class T>
using Awaitable = asio::awaitable<T, Executor>;
inline constexpr asio::use_awaitable_t<Executor> use_awaitable;

}  // namespace detail

// The first half of a Tcp: validates the options and binds this rank's listener, without waiting
// for anyone. Tests use it to learn the port rank 0 got when it asked for port 0:
//
//   tcp::Listener listener({.rank = 0, .size = 3, .rendezvous_port = 0});
//   port.set_value(listener.rendezvous_port());   // hand it to the other ranks
//   tcp::Tcp transport(std::move(listener));       // the rendezvous
//
// Throws ConfigError for a bad option and CommError when the address cannot be bound (a busy
// port), naming address and port. connect_timeout counts from here.
class Listener {
 public:
  [[gnu::cold]] explicit Listener(Options options)
      : options_(std::move(options)), started_(std::chrono::steady_clock::now()) {
    detail::validate(options_);
    boost::system::error_code ec;
    const auto address = boost::asio::ip::make_address(options_.bind_address, ec);
    if (ec) {
      options::reject("bind_address", detail::quoted(options_.bind_address),
                      "must be a numeric IPv4 or IPv6 address");
    }
    io_ = std::make_unique<boost::asio::io_context>(1);
    if (options_.size == 1) return;  // nobody to meet
    const std::uint16_t port = options_.rank == 0 ? options_.rendezvous_port : 0;
    const boost::asio::ip::tcp::endpoint endpoint(address, port);
    acceptor_ = std::make_unique<detail::Acceptor>(*io_);
    const auto refuse = [&](const char* step) {
      throw CommError("rank " + std::to_string(options_.rank) + ": cannot listen on " +
                      endpoint_text(endpoint) +
                      (options_.rank == 0 ? " (bind_address, rendezvous_port)" : "") + ": " + step +
                      " failed: " + ec.message());
    };
    if (acceptor_->open(endpoint.protocol(), ec)) refuse("open");
    // Lets a restarted rank 0 bind its port while connections of the previous run linger in
    // TIME_WAIT; a port another process listens on stays refused.
    if (acceptor_->set_option(boost::asio::socket_base::reuse_address(true), ec)) {
      refuse("setsockopt(SO_REUSEADDR)");
    }
    if (acceptor_->bind(endpoint, ec)) refuse("bind");
    if (acceptor_->listen(boost::asio::socket_base::max_listen_connections, ec)) refuse("listen");
    port_ = acceptor_->local_endpoint(ec).port();
    if (ec) refuse("getsockname");
  }

  Listener(Listener&&) noexcept = default;
  Listener& operator=(Listener&&) = delete;
  ~Listener() = default;  // acceptor_ is declared after io_, so it goes first, as it must

  int rank() const noexcept { return options_.rank; }
  const Options& options() const noexcept { return options_; }
  // Where rank 0 listens: the port it bound for rank 0 (the real one when it asked for 0), the
  // configured one for the other ranks.
  std::uint16_t rendezvous_port() const noexcept {
    return options_.rank == 0 && acceptor_ ? port_ : options_.rendezvous_port;
  }
  // This rank's own listening port (rank 0: the rendezvous port).
  std::uint16_t port() const noexcept { return port_; }

  static std::string endpoint_text(const boost::asio::ip::tcp::endpoint& endpoint) {
    const auto address = endpoint.address();
    const std::string host =
        address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
    return host + ":" + std::to_string(endpoint.port());
  }

 private:
  friend class Tcp;
  Options options_;
  std::chrono::steady_clock::time_point started_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<detail::Acceptor> acceptor_;  // null when size == 1
  std::uint16_t port_ = 0;
};

namespace detail {

using Clock = std::chrono::steady_clock;
using ErrorCode = boost::system::error_code;

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

// Socket options of every connection: no Nagle delay (a frame's header, payload and trailer
// leave in one write, and latency is what small messages care about).
inline void tune(Socket& socket) {
  ErrorCode ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
}

// A setup message as read: the frame's bytes, kept whole because the handshake's HMAC covers
// the hellos exactly as they travelled.
struct SetupMessage {
  FrameHeader frame;
  std::vector<std::byte> bytes;
  std::span<const std::byte> payload() const {
    return {bytes.data() + kHeaderBytes, static_cast<std::size_t>(frame.length)};
  }
};

enum class ReadOutcome {
  kOk,
  kUnknownPeer,  // closed or spoke garbage before proving to be a cohort rank
  kFailed,
};

class Rendezvous {
 public:
  Rendezvous(const Options& options, asio::io_context& io, Acceptor& listener,
             std::uint16_t listen_port, Clock::time_point started)
      : options_(options),
        io_(io),
        listener_(listener),
        listen_port_(listen_port),
        deadline_(started + options.connect_timeout),
        retry_timer_(io),
        peers_(static_cast<std::size_t>(options.size), nullptr),
        hellos_(static_cast<std::size_t>(options.size)),
        seen_from_(static_cast<std::size_t>(options.size)),
        ready_(static_cast<std::size_t>(options.size), false) {}

  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // The connection to every other rank, indexed by rank (this rank's own entry is a closed
  // socket). Throws CommError naming this rank and what went wrong.
  [[gnu::cold]] std::vector<Socket> run() {
    if (options_.rank == 0) {
      run_root();
    } else {
      run_member();
    }
    if (!failure_.empty()) {
      abandon();
      throw CommError(prefix() + failure_);
    }
    finished_ = true;
    close_listener();
    std::vector<Socket> sockets;
    sockets.reserve(peers_.size());
    for (std::size_t rank = 0; rank < peers_.size(); ++rank) {
      sockets.push_back(peers_[rank] ? std::move(*peers_[rank]) : Socket(io_));
    }
    for (Socket& socket : connections_) close(socket);  // strays; moved-from ones are closed
    drain();
    return sockets;
  }

 private:
  // --- the phases, each driven until its goal, a failure or the deadline -----------------------

  [[gnu::cold]] void run_root() {
    spawn(accept_loop(1, size() - 1));
    drive([&] { return established_ == size() - 1; },
          [&] {
            return missing([&](int r) { return !peers_[idx(r)]; }) + " never joined" + refused_;
          });
    if (!failure_.empty()) return;
    close_listener();
    std::vector<Address> table(static_cast<std::size_t>(size()));
    table[0] = {options_.rendezvous_host, listen_port_};
    for (int r = 1; r < size(); ++r) {
      const Hello& hello = hellos_[idx(r)];
      ErrorCode ec;
      const auto declared = asio::ip::make_address(hello.listen_address, ec);
      // A rank bound to every interface is reached where rank 0 saw it come from.
      table[idx(r)] = {ec || declared.is_unspecified() ? seen_from_[idx(r)] : hello.listen_address,
                       hello.listen_port};
    }
    const auto table_payload = encode_table(table);
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
    drive([&] { return have_table_; }, [&] { return join_timeout_message(); },
          [&] { return connected_to_root_ ? grace : Clock::duration::zero(); });
    if (!failure_.empty()) return;
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
            return text;
          });
    if (!failure_.empty()) return;
    close_listener();
    spawn(send_ready());
    drive([&] { return go_received_; },
          [&] { return std::string("rank 0 never confirmed that every rank is connected"); });
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
          fail("rendezvous timed out after " + std::to_string(options_.connect_timeout.count()) +
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

  std::string join_timeout_message() const {
    const std::string where =
        options_.rendezvous_host + ":" + std::to_string(options_.rendezvous_port);
    if (!connected_to_root_) {
      return "rank 0 never answered at " + where +
             (last_connect_error_.empty() ? "" : " (last attempt: " + last_connect_error_ + ")");
    }
    return "rank 0 at " + where + " accepted this rank but sent no address table";
  }

  // --- coroutines --------------------------------------------------------------------------

  // Accepts connections and runs a handshake on each; peers must have ranks in [low, high].
  [[gnu::cold]] Awaitable<void> accept_loop(int low, int high) {
    while (!stopping()) {
      Socket& socket = connections_.emplace_back(io_);
      ErrorCode ec;
      co_await listener_.async_accept(socket, asio::redirect_error(use_awaitable, ec));
      if (ec == asio::error::connection_aborted) continue;  // gone before it was accepted
      if (ec) {
        if (!stopping() && listener_.is_open()) fail("cannot accept connections: " + ec.message());
        co_return;
      }
      tune(socket);
      spawn(accept_handshake(socket, low, high));
    }
  }

  [[gnu::cold]] Awaitable<void> accept_handshake(Socket& socket, int low, int high) {
    ErrorCode ec;
    const auto remote = socket.remote_endpoint(ec);
    const bool know_remote = !ec;
    const std::string from = "a peer at " + (know_remote ? Listener::endpoint_text(remote)
                                                         : std::string("an unknown address"));
    std::string who = from;
    SetupMessage hello;
    const Read first = co_await read_message(socket, who, hello);
    if (first.outcome != ReadOutcome::kOk) {
      // A connection that closes or speaks garbage before its hello is not a rank (a port
      // scanner, a health check): drop it and keep waiting. A cohort peer that is wrong fails.
      if (first.outcome == ReadOutcome::kUnknownPeer) {
        close(socket);
      } else {
        fail(first.error);
      }
      co_return;
    }
    if (hello.frame.header.type == setup_type::kAbort) {
      fail("rendezvous aborted; " + decode_text(hello.payload()));
      co_return;
    }
    if (hello.frame.header.type != setup_type::kHello) {
      fail(who + " sent message type " + std::to_string(hello.frame.header.type) +
           " where a hello belongs");
      co_return;
    }
    const auto theirs = decode_hello(hello.payload());
    if (!theirs) {
      fail(who + " sent a malformed hello");
      co_return;
    }
    who = rank_name(theirs->rank);
    std::string refusal = check_hello(*theirs, expectation(low, high));
    if (refusal.empty() && peers_[idx(theirs->rank)]) refusal = who + " joined twice";
    // Without a secret, whoever reaches the port is a peer, and a wrong one fails the rendezvous.
    // With one, a connection counts only once it has proved the secret: one that cannot is
    // refused and dropped, and the rendezvous goes on waiting for the real rank, so that nobody
    // without the secret can stop a job by connecting to it.
    const bool authenticating = !options_.secret.empty();
    if (!refusal.empty() && !authenticating) {
      fail(refusal);  // abandon() sends it the reason
      co_return;
    }
    const std::vector<std::byte> mine = make_frame({setup_type::kHello}, encode_hello(my_hello()));
    std::vector<std::byte> reply = mine;
    const auto my_proof = proof_or_empty(Role::kAcceptor, hello.bytes, mine);
    const auto confirm = make_frame({setup_type::kConfirm}, my_proof);
    reply.insert(reply.end(), confirm.begin(), confirm.end());
    const bool replied = co_await write_message(socket, who, reply);
    if (!replied) co_return;
    SetupMessage answer;
    if (authenticating) {
      const Read confirmed = co_await read_message(socket, who, answer);
      if (confirmed.outcome != ReadOutcome::kOk ||
          answer.frame.header.type != setup_type::kConfirm ||
          !proofs_equal(answer.payload(), proof_or_empty(Role::kConnector, hello.bytes, mine))) {
        const std::string refused =
            "refused " + from + " claiming to be " + who + ": authentication failed";
        std::fprintf(stderr, "cohort: %s%s (its secret does not match)\n", prefix().c_str(),
                     refused.c_str());
        refused_ += "; " + refused;
        close(socket);
        co_return;
      }
      if (!refusal.empty()) {
        fail(refusal);
        co_return;
      }
    } else {
      const bool answered = co_await read_expected(socket, who, setup_type::kConfirm, answer);
      if (!answered || !verify(answer, Role::kConnector, hello.bytes, mine, who)) co_return;
    }
    if (know_remote) seen_from_[idx(theirs->rank)] = remote.address().to_string();
    establish(theirs->rank, socket, *theirs);
  }

  // Connects and runs the handshake as the connecting side; false when it failed (recorded).
  [[gnu::cold]] Awaitable<bool> connect_handshake(Socket& socket, int peer) {
    const std::string who = rank_name(peer);
    const std::vector<std::byte> mine = make_frame({setup_type::kHello}, encode_hello(my_hello()));
    const bool introduced = co_await write_message(socket, who, mine);
    if (!introduced) co_return false;
    SetupMessage hello;
    const bool heard = co_await read_expected(socket, who, setup_type::kHello, hello);
    if (!heard) co_return false;
    const auto theirs = decode_hello(hello.payload());
    if (!theirs) {
      fail(who + " sent a malformed hello");
      co_return false;
    }
    if (std::string refusal = check_hello(*theirs, expectation(peer, peer)); !refusal.empty()) {
      fail(refusal);
      co_return false;
    }
    // The proof goes out before the peer's is checked, so that a wrong secret fails both sides
    // with the same words rather than one of them with "aborted".
    const auto confirm =
        make_frame({setup_type::kConfirm}, proof_or_empty(Role::kConnector, mine, hello.bytes));
    const bool confirmed = co_await write_message(socket, who, confirm);
    if (!confirmed) co_return false;
    SetupMessage answer;
    const bool answered = co_await read_expected(socket, who, setup_type::kConfirm, answer);
    if (!answered || !verify(answer, Role::kAcceptor, mine, hello.bytes, who)) co_return false;
    establish(peer, socket, *theirs);
    co_return true;
  }

  [[gnu::cold]] Awaitable<void> join_root() {
    Socket& socket = connections_.emplace_back(io_);
    std::vector<asio::ip::tcp::endpoint> endpoints;
    ErrorCode ec;
    const auto address = asio::ip::make_address(options_.rendezvous_host, ec);
    if (!ec) {
      endpoints.emplace_back(address, options_.rendezvous_port);
    } else {
      asio::ip::basic_resolver<asio::ip::tcp, Executor> resolver(io_);
      const std::string service = std::to_string(options_.rendezvous_port);
      const auto results = co_await resolver.async_resolve(options_.rendezvous_host, service,
                                                           asio::redirect_error(use_awaitable, ec));
      if (ec) {
        fail("cannot resolve rendezvous_host '" + options_.rendezvous_host + "': " + ec.message());
        co_return;
      }
      for (const auto& entry : results) endpoints.push_back(entry.endpoint());
    }
    // Rank 0 may not listen yet: retry, backing off, until the deadline ends the rendezvous.
    auto backoff = std::chrono::milliseconds(5);
    for (bool connected = false; !connected;) {
      for (const auto& endpoint : endpoints) {
        co_await socket.async_connect(endpoint, asio::redirect_error(use_awaitable, ec));
        if (!ec) {
          connected = true;
          break;
        }
        last_connect_error_ = ec.message();
        close(socket);
        if (stopping()) co_return;
      }
      if (connected) break;
      retry_timer_.expires_after(backoff);
      co_await retry_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
      if (stopping()) co_return;
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
    connected_to_root_ = true;
    tune(socket);
    const bool joined = co_await connect_handshake(socket, 0);
    if (!joined) co_return;
    SetupMessage table;
    const std::string root = "rank 0";
    const bool told = co_await read_expected(socket, root, setup_type::kTable, table);
    if (!told) co_return;
    auto decoded = decode_table(table.payload(), size());
    if (!decoded) {
      fail("rank 0 sent a malformed address table");
      co_return;
    }
    table_ = std::move(*decoded);
    have_table_ = true;
  }

  [[gnu::cold]] Awaitable<void> connect_peer(int peer) {
    Socket& socket = connections_.emplace_back(io_);
    const Address& address = table_[idx(peer)];
    ErrorCode ec;
    const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(address.host, ec), address.port);
    if (ec) {
      fail("rank 0 sent an invalid address for rank " + std::to_string(peer) + ": '" +
           address.host + "'");
      co_return;
    }
    co_await socket.async_connect(endpoint, asio::redirect_error(use_awaitable, ec));
    if (ec) {
      fail("cannot connect to rank " + std::to_string(peer) + " at " +
           Listener::endpoint_text(endpoint) + ": " + ec.message());
      co_return;
    }
    tune(socket);
    co_await connect_handshake(socket, peer);
  }

  // Rank 0, for one rank: the table out, that rank's "ready" in.
  [[gnu::cold]] Awaitable<void> send_table_await_ready(int peer, std::vector<std::byte> table) {
    Socket& socket = *peers_[idx(peer)];
    const std::string who = rank_name(peer);
    const std::vector<std::byte> frame = make_frame({setup_type::kTable}, table);
    const bool told = co_await write_message(socket, who, frame);
    if (!told) co_return;
    SetupMessage ready;
    const bool answered = co_await read_expected(socket, who, setup_type::kReady, ready);
    if (!answered) co_return;
    ready_[idx(peer)] = true;
    ++ready_count_;
  }

  [[gnu::cold]] Awaitable<void> send_go(int peer) {
    const std::string who = rank_name(peer);
    const std::vector<std::byte> frame = make_frame({setup_type::kGo}, {});
    const bool told = co_await write_message(*peers_[idx(peer)], who, frame);
    if (told) ++go_sent_;
  }

  [[gnu::cold]] Awaitable<void> send_ready() {
    const std::string root = "rank 0";
    const std::vector<std::byte> frame = make_frame({setup_type::kReady}, {});
    co_await write_message(*peers_[0], root, frame);
  }

  // Waits for rank 0's "go" during the whole mesh phase, so that an abort from rank 0 (another
  // rank failed) ends this rank's rendezvous at once.
  [[gnu::cold]] Awaitable<void> watch_root() {
    SetupMessage go;
    const std::string root = "rank 0";
    const bool told = co_await read_expected(*peers_[0], root, setup_type::kGo, go);
    if (told) go_received_ = true;
  }

  // --- messages ------------------------------------------------------------------------------

  struct Read {
    ReadOutcome outcome;
    std::string error;
  };

  // Reads one setup message, checking magic, version, size and checksum.
  [[gnu::cold]] Awaitable<Read> read_message(Socket& socket, const std::string& who,
                                             SetupMessage& message) {
    ErrorCode ec;
    message.bytes.assign(kHeaderBytes, std::byte{0});
    co_await asio::async_read(socket, asio::buffer(message.bytes),
                              asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Read{ReadOutcome::kUnknownPeer, io_error(who, ec)};
    message.frame = decode_header(message.bytes.data());
    if (message.frame.magic != kMagic) {
      co_return Read{ReadOutcome::kUnknownPeer, who + " is not a cohort rank (no cohort magic)"};
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
      co_return Read{ReadOutcome::kFailed,
                     (rank ? rank_name(*rank) : who) + " speaks protocol version " +
                         std::to_string(message.frame.version) + ", this is version " +
                         std::to_string(kProtocolVersion)};
    }
    if (message.frame.length > kMaxSetupPayloadBytes) {
      co_return Read{ReadOutcome::kFailed,
                     who + " sent a setup message of " + std::to_string(message.frame.length) +
                         " bytes, more than the " + std::to_string(kMaxSetupPayloadBytes) +
                         " one may have"};
    }
    const auto length = static_cast<std::size_t>(message.frame.length);
    message.bytes.resize(kHeaderBytes + length + kTrailerBytes);
    co_await asio::async_read(
        socket, asio::buffer(message.bytes.data() + kHeaderBytes, length + kTrailerBytes),
        asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Read{ReadOutcome::kFailed, io_error(who, ec)};
    const auto sent = load_le<std::uint64_t>(message.bytes.data() + kHeaderBytes + length);
    if (sent != checksum(checksum_seed(message.bytes.data()), message.payload())) {
      co_return Read{ReadOutcome::kFailed,
                     who + " sent a setup message whose checksum does not match"};
    }
    co_return Read{ReadOutcome::kOk, {}};
  }

  // Reads a message of the expected type; an abort becomes this rank's failure, with the
  // sender's reason. False when anything else arrived (recorded).
  [[gnu::cold]] Awaitable<bool> read_expected(Socket& socket, const std::string& who,
                                              std::uint16_t type, SetupMessage& message) {
    const Read read = co_await read_message(socket, who, message);
    if (read.outcome != ReadOutcome::kOk) {
      fail(read.error);
      co_return false;
    }
    if (message.frame.header.type == setup_type::kAbort) {
      fail("rendezvous aborted; " + decode_text(message.payload()));
      co_return false;
    }
    if (message.frame.header.type != type) {
      fail(who + " sent setup message type " + std::to_string(message.frame.header.type) +
           " where type " + std::to_string(type) + " belongs");
      co_return false;
    }
    co_return true;
  }

  [[gnu::cold]] Awaitable<bool> write_message(Socket& socket, const std::string& who,
                                              const std::vector<std::byte>& frame) {
    ErrorCode ec;
    co_await asio::async_write(socket, asio::buffer(frame),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) {
      fail(io_error(who, ec));
      co_return false;
    }
    co_return true;
  }

  static std::string io_error(const std::string& who, const ErrorCode& ec) {
    if (is_closed(ec)) return who + " closed the connection during the rendezvous";
    return "the connection to " + who + " failed during the rendezvous: " + ec.message();
  }

  // --- handshake helpers -------------------------------------------------------------------

  Hello my_hello() const {
    return {.rank = options_.rank,
            .size = options_.size,
            .authenticates = !options_.secret.empty(),
            .checksums = options_.checksum,
            .listen_port = listen_port_,
            .listen_address = options_.bind_address,
            .job_id = options_.job_id,
            .nonce = random_nonce()};
  }

  Expectation expectation(int low, int high) const {
    return {.rank = options_.rank,
            .size = options_.size,
            .job_id = options_.job_id,
            .authenticates = !options_.secret.empty(),
            .checksums = options_.checksum,
            .lowest_peer = low,
            .highest_peer = high};
  }

  std::vector<std::byte> proof_or_empty(Role role, std::span<const std::byte> connector_hello,
                                        std::span<const std::byte> acceptor_hello) const {
    if (options_.secret.empty()) return {};
    const auto mac = proof(options_.secret, role, connector_hello, acceptor_hello);
    return {mac.begin(), mac.end()};
  }

  // Checks the peer's proof in its confirm message; false (recorded) when it does not verify.
  bool verify(const SetupMessage& confirm, Role role, std::span<const std::byte> connector_hello,
              std::span<const std::byte> acceptor_hello, const std::string& who) {
    const auto expected = proof_or_empty(role, connector_hello, acceptor_hello);
    if (!proofs_equal(confirm.payload(), expected)) {
      fail("authentication failed with " + who + " (its proof does not match this rank's secret)");
      return false;
    }
    return true;
  }

  void establish(int peer, Socket& socket, const Hello& hello) {
    if (peers_[idx(peer)]) {
      fail(rank_name(peer) + " joined twice");
      return;
    }
    peers_[idx(peer)] = &socket;
    hellos_[idx(peer)] = hello;
    ++established_;
  }

  // --- bookkeeping ---------------------------------------------------------------------------

  void fail(const std::string& why) {
    if (failure_.empty() && !finished_) failure_ = why;
  }
  bool stopping() const { return !failure_.empty() || finished_; }

  template <class Awaitable>
  void spawn(Awaitable awaitable) {
    asio::co_spawn(io_, std::move(awaitable), [this](std::exception_ptr error) {
      if (!error) return;
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& exception) {
        fail(exception.what());
      } catch (...) {
        fail("unknown exception in the rendezvous");
      }
    });
  }

  // Tells every open connection why this rank gives up, closes everything and lets the
  // coroutines finish on their aborted operations.
  void abandon() {
    const auto abort = make_frame({setup_type::kAbort}, encode_text(prefix() + failure_));
    for (Socket& socket : connections_) {
      if (!socket.is_open()) continue;
      ErrorCode ignored;
      socket.non_blocking(true, ignored);  // best effort: never wait for a slow peer here
      socket.write_some(asio::buffer(abort), ignored);
      close(socket);
    }
    close_listener();
    drain();
  }

  void drain() {
    retry_timer_.cancel();
    io_.restart();
    io_.run_for(std::chrono::milliseconds(500));
  }

  void close_listener() {
    ErrorCode ignored;
    listener_.close(ignored);
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
  asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Executor> retry_timer_;

  std::list<Socket> connections_;       // every socket opened here; stable addresses
  std::vector<Socket*> peers_;          // by rank: the connection whose handshake succeeded
  std::vector<Hello> hellos_;           // by rank: that peer's hello
  std::vector<std::string> seen_from_;  // rank 0: the address each rank connected from
  std::vector<Address> table_;
  std::vector<bool> ready_;
  int established_ = 0;
  int ready_count_ = 0;
  int go_sent_ = 0;
  bool connected_to_root_ = false;
  bool have_table_ = false;
  bool go_received_ = false;
  std::string last_connect_error_;
  std::string refused_;  // "; refused ..." per unauthenticated connection, for the timeout
  std::string failure_;
  bool finished_ = false;
};

}  // namespace detail
}  // namespace cohort::transport::tcp
