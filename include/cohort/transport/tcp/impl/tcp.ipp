// The definitions of tcp.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/tcp.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cohort/transport/tcp/asio.hpp"
#include "cohort/transport/tcp/connection.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/impl/listener.ipp"
#include "cohort/transport/tcp/rendezvous.hpp"

namespace cohort::transport::tcp {

COHORT_DECL Tcp::Tcp(Listener&& listener)
    : rendezvous_port_(listener.rendezvous_port()),
      options_(std::move(listener.options_)),
      io_(std::move(listener.io_)) {
  if (options_.size == 1) {
    // Nobody to meet. An elastic job of one worker, started so or left so by a regroup (its
    // listener handed down), keeps listening where asked, at the address the others knew, so
    // that the job's door opens there and the job grows (door.hpp, regroup.hpp).
    if (options_.keep_listening && listener.acceptor_) {
      acceptor_ = std::move(listener.acceptor_);
      addresses_ = {Address{options_.rendezvous_host, options_.rendezvous_port}};
    }
    return;
  }
  // The acceptor belongs to io_: a local here, destroyed before io_ even when this throws.
  auto acceptor = std::move(listener.acceptor_);
  auto started = listener.started_;
  std::vector<detail::Link> links;
  for (;;) {
    detail::Rendezvous rendezvous(options_, *io_, *acceptor, listener.port_, started);
    links = rendezvous.run();
    if (rendezvous.found_running_job()) {
      // Started again while its job runs on (a pod of rank 0 its controller started with the
      // environment it started with): the job's door is at one of its hosts, where this process
      // joins as with joins_running_job, from a deadline of its own.
      options_.joins_running_job = true;
      started = std::chrono::steady_clock::now();
      std::fprintf(stderr,
                   "cohort: rank 0: its job runs already, its door at one of the job's hosts: "
                   "joins it (as with COHORT_JOIN=1)\n");
      continue;
    }
    if (const auto& welcome = rendezvous.welcomed()) {
      // A running elastic job's door took this process in (door.hpp): the rendezvous of the
      // place it was given, where the door said, with the job's members, from a deadline of its
      // own. It is one of them from now on.
      options_.rank = welcome->rank;
      options_.size = welcome->size;
      options_.epoch = welcome->epoch;
      options_.rendezvous_host = welcome->rendezvous.host;
      options_.rendezvous_port = welcome->rendezvous.port;
      options_.joins_running_job = false;
      options_.door_hosts.clear();
      started = std::chrono::steady_clock::now();
      continue;
    }
    addresses_ = rendezvous.table();
    break;
  }
  if (options_.keep_listening) acceptor_ = std::move(acceptor);
  connections_.reserve(links.size());
  queues_.resize(links.size());
  for (int rank = 0; rank < size(); ++rank) {
    detail::Link& link = links[static_cast<std::size_t>(rank)];
    const bool own = rank == this->rank();
    Connection& connection = connections_.emplace_back(std::move(link.socket), rank, options_,
                                                       own ? std::nullopt : link.keys);
    // A process that took its place back holds connections to the ranks it needs only.
    if (own || connection.descriptor() < 0) continue;
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

COHORT_DECL Tcp::Tcp(Tcp&& other) noexcept
    : rendezvous_port_(other.rendezvous_port_),
      options_(std::move(other.options_)),
      io_(std::move(other.io_)),
      acceptor_(std::move(other.acceptor_)),
      readmissions_(std::move(other.readmissions_)),
      addresses_(std::move(other.addresses_)),
      connections_(std::move(other.connections_)),
      queues_(std::move(other.queues_)),
      descriptors_(std::move(other.descriptors_)),
      failure_(std::move(other.failure_)),
      last_failure_(std::move(other.last_failure_)),
      closed_(other.closed_.load()),
      abort_signal_(std::move(other.abort_signal_)),
      failed_(other.failed_.load()),
      leaving_(other.leaving_.load()),
      isolate_peer_failures_(other.isolate_peer_failures_) {}

// A rank that ends stops listening before its peers see its connections end, so that ranks that
// regroup do not count it in.
COHORT_DECL Tcp::~Tcp() {
  stop_listening();
  close();
}

COHORT_DECL Listener Tcp::listener(Options options) const {
  if (!acceptor_) {
    throw CommError({.rank = rank(),
                     .operation = "listen",
                     .detail = "this rank no longer listens (Options::keep_listening unset, or "
                               "stop_listening called)"});
  }
  return Listener(std::move(options), *acceptor_);
}

COHORT_DECL void Tcp::hand_listener_over() noexcept {
  // Closed, not shut down: the socket lives on in the successor's duplicate of the descriptor.
  if (!acceptor_) return;
  boost::system::error_code ignored;
  acceptor_->close(ignored);
  acceptor_.reset();
}

COHORT_DECL int Tcp::readmission_waiting() {
  if (!acceptor_) return -1;
  if (!readmissions_) {
    readmissions_ = std::make_unique<detail::Readmissions>(
        options_, *io_, *acceptor_, acceptor_->local_endpoint().port(), addresses_);
  }
  return readmissions_->door.rejoiner();
}

COHORT_DECL bool Tcp::readmit(int rank) {
  if (!readmissions_ || rank < 0 || rank >= size() || rank == this->rank()) return false;
  std::optional<detail::Link> link = readmissions_->door.readmit(rank);
  if (!link) return false;
  Connection fresh(std::move(link->socket), rank, options_, link->keys);
  boost::system::error_code ec;
  fresh.set_non_blocking(ec);
  if (ec) return false;
  Connection& connection = connections_[static_cast<std::size_t>(rank)];
  // A rank without a connection here (a process that took its place back holds only some) is not
  // listed.
  const auto listed = std::ranges::find(descriptors_, connection.descriptor());
  if (listed != descriptors_.end()) {
    *listed = fresh.descriptor();
  } else {
    descriptors_.push_back(fresh.descriptor());
  }
  connection = std::move(fresh);
  queues_[static_cast<std::size_t>(rank)] = Queue{};
  return true;
}

COHORT_DECL void Tcp::refuse_readmission(int rank, const std::string& why) {
  if (readmissions_) readmissions_->door.refuse_rejoiner(rank, why);
}

COHORT_DECL void Tcp::stop_listening() noexcept {
  // shutdown, not close: the descriptor stays this acceptor's until the destructor, so that no
  // other thread's socket can take its number meanwhile.
  if (acceptor_) ::shutdown(acceptor_->native_handle(), SHUT_RDWR);
}

COHORT_DECL void Tcp::transfer(std::span<const Send> sends, std::span<const Receive> receives) {
  const Busy busy(*this);
  if (auto failure = progress(sends, receives)) raise(std::move(*failure));
}

COHORT_DECL void Tcp::transfer(std::span<const Send> sends, std::span<const Receive> receives,
                               Meanwhile meanwhile) {
  const Busy busy(*this);
  if (auto failure = progress(sends, receives, meanwhile)) raise(std::move(*failure));
}

COHORT_DECL void Tcp::raise(Failure failure) {
  if (failure.mismatch) throw *failure.mismatch;
  throw CommError(std::move(failure.fields));
}

COHORT_DECL void Tcp::transfer(std::span<const Send> sends, std::span<const Receive> receives,
                               std::error_code& error) {
  const Busy busy(*this);
  if (auto failure = progress(sends, receives)) {
    last_failure_ = CommError::sentence(failure->fields);
    error = make_error_code(Errc::kComm);
  } else {
    error.clear();
  }
}

COHORT_DECL int Tcp::wait_any(std::span<const int> peers, std::chrono::milliseconds timeout) {
  if (peers.empty()) return -1;
  const Busy busy(*this);
  if (abort_signal_.raised()) throw CommError(record(aborted()).fields);
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

COHORT_DECL int Tcp::ended_peer(std::chrono::milliseconds timeout) {
  std::vector<pollfd> watched;
  std::vector<int> ranks;
  // Shut down, this rank's own connections would all read as ended: then, as with no peer, the
  // poll only waits out the timeout, so that a caller in a loop does not spin.
  for (int rank = 0; rank < static_cast<int>(connections_.size()) && !closed_.load(); ++rank) {
    const int descriptor = connections_[static_cast<std::size_t>(rank)].descriptor();
    if (rank == this->rank() || descriptor < 0) continue;
    // POLLRDHUP: the peer's end of the stream; data that arrives meanwhile wakes nothing.
    watched.push_back({.fd = descriptor, .events = POLLRDHUP, .revents = 0});
    ranks.push_back(rank);
  }
  if (::poll(watched.data(), watched.size(), static_cast<int>(timeout.count())) <= 0) return -1;
  if (closed_.load()) return -1;  // this rank shut its own connections meanwhile
  for (std::size_t i = 0; i < watched.size(); ++i) {
    if ((watched[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return ranks[i];
  }
  return -1;
}

COHORT_DECL void Tcp::close() noexcept {
  closed_.store(true);
  for (const int descriptor : descriptors_) ::shutdown(descriptor, SHUT_RDWR);
}

COHORT_DECL void Tcp::abort(std::string_view reason) noexcept {
  abort_signal_.raise(reason);
  // Both orders are sequentially consistent: where this thread sees no operation running, one
  // that starts next sees the signal at once and fails before it touches a socket.
  if (!busy_.load() && !failed_.load()) leave(abort_signal_.reason());
}

COHORT_DECL void Tcp::leave(std::string_view reason) noexcept {
  if (leaving_.exchange(true)) return;  // another thread leaves (abort() and its transfer)
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

COHORT_DECL std::optional<Tcp::Failure> Tcp::progress(std::span<const Send> sends,
                                                      std::span<const Receive> receives,
                                                      std::optional<Meanwhile> meanwhile) {
  if (failure_) {
    return failed("this transport failed earlier and is closed (" + failure_->detail + ")",
                  failure_->peer, failure_->sequence);
  }
  if (closed_.load()) return failed("the transport was closed");
  if (abort_signal_.raised()) return record(aborted());
  // A bad list is the caller's mistake, not a broken connection: the transport stays usable.
  if (auto failure = enqueue(sends, receives)) {
    clear_queues();
    return failure;
  }
  std::size_t pending = sends.size() + receives.size();
  PeerWait peer_wait = begin_peer_wait(receives);
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
      if (!failure && queue.receive >= 0) {
        bool received = false;
        failure = pump_receives(rank, receives, received, pending);
        moved = moved || received;
        if (received && peer_wait.unheard > 0) heard(peer_wait, rank);
      }
      if (failure) {
        clear_queues(sends);
        return record(std::move(*failure));
      }
    }
    spinner_.looked(moved || pending == 0);
    if (pending == 0) break;
    const auto now = std::chrono::steady_clock::now();
    if (moved) {
      last_progress = now;
      continue;
    }
    if (abort_signal_.raised()) {
      clear_queues(sends);
      return record(aborted());
    }
    if (meanwhile) {
      if (!(*meanwhile)()) meanwhile.reset();
      continue;
    }
    // Busy-polls for options_.spin, yielding between polls so that a peer rank that shares this
    // core runs at once, unless yields are slow here (core/spin.hpp).
    if (now - last_progress < options_.spin && spinner_.yield()) continue;
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

COHORT_DECL std::optional<Tcp::Failure> Tcp::enqueue(std::span<const Send> sends,
                                                     std::span<const Receive> receives) {
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

COHORT_DECL std::optional<Tcp::Failure> Tcp::check_peer(int peer) const {
  if (peer >= 0 && peer < size() && peer != rank()) return std::nullopt;
  return failed("no peer rank " + std::to_string(peer) + " in a job of " + std::to_string(size()) +
                " ranks");
}

COHORT_DECL Tcp::Queue& Tcp::activate(int rank) {
  Queue& queue = queues_[static_cast<std::size_t>(rank)];
  if (queue.send < 0 && queue.receive < 0) active_.push_back(rank);
  return queue;
}

COHORT_DECL void Tcp::clear_queues(std::span<const Send> sends) {
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

COHORT_DECL std::optional<Tcp::Failure> Tcp::pump_sends(int rank, std::span<const Send> sends,
                                                        bool& moved, std::size_t& pending) {
  Connection& connection = connections_[static_cast<std::size_t>(rank)];
  Queue& queue = queues_[static_cast<std::size_t>(rank)];
  while (queue.send >= 0) {
    const Send& send = sends[static_cast<std::size_t>(queue.send)];
    auto progress = connection.write_some(send);
    if (progress.broken)
      return broken(rank, std::move(progress.broken->detail), std::move(progress.broken->mismatch),
                    send.header.sequence);
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

COHORT_DECL std::optional<Tcp::Failure> Tcp::pump_receives(int rank,
                                                           std::span<const Receive> receives,
                                                           bool& moved, std::size_t& pending) {
  Connection& connection = connections_[static_cast<std::size_t>(rank)];
  Queue& queue = queues_[static_cast<std::size_t>(rank)];
  while (queue.receive >= 0) {
    const Receive& receive = receives[static_cast<std::size_t>(queue.receive)];
    auto progress = connection.read_some(receive);
    if (progress.moved) moved = true;
    if (progress.broken) {
      return broken(rank, std::move(progress.broken->detail), std::move(progress.broken->mismatch),
                    receive.expected.sequence);
    }
    if (!progress.finished) return std::nullopt;
    --pending;
    queue.receive = next_receive_[static_cast<std::size_t>(queue.receive)];
  }
  return std::nullopt;
}

COHORT_DECL std::optional<Tcp::Failure> Tcp::wait(std::chrono::steady_clock::duration timeout) {
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
  poll_fds_.push_back({abort_signal_.descriptor(), POLLIN, 0});  // abort() from another thread
  const auto milliseconds = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
  const int ready = ::poll(poll_fds_.data(), poll_fds_.size(),
                           static_cast<int>(std::min<long long>(milliseconds, 1 << 30)));
  if (ready < 0 && errno != EINTR) {
    return failed(std::string("poll() failed: ") + std::strerror(errno));
  }
  return std::nullopt;  // ready, interrupted or timed out: the caller looks again
}

COHORT_DECL Tcp::Waiting Tcp::waiting_for(std::span<const Send> sends,
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

COHORT_DECL void Tcp::warn_stalled(std::span<const Send> sends, std::span<const Receive> receives,
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

COHORT_DECL Tcp::Failure Tcp::timeout(std::span<const Send> sends,
                                      std::span<const Receive> receives) {
  const Waiting waiting = waiting_for(sends, receives);
  for (const int rank : active_) {
    connections_[static_cast<std::size_t>(rank)].shut_down();  // half-done frames: out of step
  }
  return failed("no progress within " + std::to_string(options_.operation_timeout.count()) +
                    " ms during sequence " + std::to_string(waiting.sequence) +
                    ", waiting for: " + waiting.text,
                waiting.waited, waiting.sequence);
}

COHORT_DECL Tcp::Failure Tcp::broken(int rank, std::string detail,
                                     std::optional<HeaderMismatch> mismatch,
                                     std::uint64_t sequence) {
  Failure failure = failed(std::move(detail), rank, sequence);
  failure.mismatch = std::move(mismatch);
  return failure;
}

COHORT_DECL Tcp::Failure Tcp::failed(std::string what, int peer, std::uint64_t sequence) const {
  return {{.rank = rank(), .peer = peer, .sequence = sequence, .detail = std::move(what)}};
}

COHORT_DECL Tcp::PeerWait Tcp::begin_peer_wait(std::span<const Receive> receives) {
  PeerWait wait{.recorder = trace::current()};
  if (wait.recorder == nullptr || receives.empty()) return {};
  wait.start = std::chrono::steady_clock::now();
  heard_.assign(static_cast<std::size_t>(size()), 1);
  for (const Receive& receive : receives) {
    char& peer = heard_[static_cast<std::size_t>(receive.peer)];
    if (peer != 0) ++wait.unheard;
    peer = 0;
  }
  return wait;
}

COHORT_DECL void Tcp::heard(PeerWait& wait, int rank) {
  char& peer = heard_[static_cast<std::size_t>(rank)];
  if (peer != 0) return;
  peer = 1;
  if (--wait.unheard > 0) return;
  trace::record_peer_wait(wait.recorder, wait.start, std::chrono::steady_clock::now(), rank);
}

COHORT_DECL Tcp::Failure Tcp::aborted() const {
  return failed("this rank aborted: " + abort_signal_.reason());
}

COHORT_DECL Tcp::Failure Tcp::record(Failure failure) {
  // After close() from another thread the sockets report a closed connection; say who closed.
  if (closed_.load()) {
    failure = failed("the transport was closed during the transfer (" + failure.fields.detail + ")",
                     -1, failure.fields.sequence);
  }
  if (!isolate_peer_failures_ || closed_.load()) failure_ = failure.fields;
  failed_.store(true);
  return failure;
}

}  // namespace cohort::transport::tcp
