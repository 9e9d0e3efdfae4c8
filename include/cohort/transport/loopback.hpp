// Loopback: the transport between threads of one process, through memory.
//
// Same contract as every transport (transport.hpp), so the process collectives can be tested
// with ranks as threads, quickly and deterministically, before they run over TCP. A send copies
// its payload into the receiver's mailbox and never blocks; a receive waits for the next frame
// from its peer, up to the group's timeout, and fails with a CommError whose peer() names it. A
// frame enters a mailbox whole: wait_any (transport::Serving) never sees a partial one.
//
//   transport::Loopback group({.ranks = 4});
//   auto endpoint = group.endpoint(rank);   // one per thread; satisfies transport::Transport
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/options.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::transport {

class Loopback {
 public:
  struct Options {
    int ranks = 1;
    std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  };

  explicit Loopback(Options options) : options_(options) {
    options::require_positive("ranks", options_.ranks);
    options::require_positive("timeout", options_.timeout.count());
    mailboxes_ = std::vector<Mailbox>(static_cast<std::size_t>(options_.ranks));
    closed_ = std::vector<bool>(static_cast<std::size_t>(options_.ranks), false);
    reasons_ = std::vector<std::string>(static_cast<std::size_t>(options_.ranks));
  }

  class Endpoint {
   public:
    int rank() const { return rank_; }
    int size() const { return group_->options_.ranks; }

    void transfer(std::span<const Send> sends, std::span<const Receive> receives) {
      for (const Send& send : sends) group_->post(rank_, send);
      for (const Receive& receive : receives) group_->take(rank_, receive);
    }

    // transport.hpp (Serving): a peer with a frame waiting in this rank's mailbox (a frame is
    // posted whole, so it has arrived whole), or one that has closed, or -1 after `timeout`.
    int wait_any(std::span<const int> peers, std::chrono::milliseconds timeout) {
      return group_->wait_any(rank_, peers, timeout, next_any_);
    }

    void close() { group_->close(rank_, {}); }
    void leave(std::string_view reason) { group_->close(rank_, reason); }
    void abort(std::string_view reason) { leave(reason); }  // safe from any thread here

   private:
    friend class Loopback;
    Endpoint(Loopback& group, int rank) : group_(&group), rank_(rank) {}
    Loopback* group_;
    int rank_;
    std::size_t next_any_ = 0;  // where the next wait_any starts looking, for fairness
  };

  Endpoint endpoint(int rank) {
    if (rank < 0 || rank >= options_.ranks) {
      options::reject("rank", rank, "must lie in [0, " + std::to_string(options_.ranks) + ")");
    }
    return Endpoint(*this, rank);
  }

 private:
  struct Frame {
    int sender;
    Header header;
    std::vector<std::byte> payload;
  };

  // Frames addressed to one rank, from every sender, each sender's in order.
  struct Mailbox {
    std::deque<Frame> frames;
  };

  void post(int sender, const Send& send) {
    check_peer(sender, send.peer);
    std::lock_guard lock(mutex_);
    if (closed_[static_cast<std::size_t>(sender)]) {
      throw CommError(
          {.rank = sender,
           .peer = send.peer,
           .sequence = send.header.sequence,
           .detail = "transport closed, cannot send to rank " + std::to_string(send.peer)});
    }
    mailboxes_[static_cast<std::size_t>(send.peer)].frames.push_back(
        {sender, send.header, {send.payload.begin(), send.payload.end()}});
    arrived_.notify_all();
  }

  void take(int receiver, const Receive& receive) {
    check_peer(receiver, receive.peer);
    auto& frames = mailboxes_[static_cast<std::size_t>(receiver)].frames;
    const auto from_peer = [&] {
      for (auto frame = frames.begin(); frame != frames.end(); ++frame) {
        if (frame->sender == receive.peer) return frame;
      }
      return frames.end();
    };
    std::unique_lock lock(mutex_);
    if (closed_[static_cast<std::size_t>(receiver)]) {
      throw failure(receiver, receive, -1, "transport closed");
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    auto frame = from_peer();
    while (frame == frames.end()) {
      if (closed_[static_cast<std::size_t>(receive.peer)]) {
        const std::string& reason = reasons_[static_cast<std::size_t>(receive.peer)];
        throw failure(
            receiver, receive, receive.peer,
            "rank " + std::to_string(receive.peer) +
                (reason.empty() ? " closed the connection" : " left: " + quote_peer_text(reason)));
      }
      if (arrived_.wait_until(lock, deadline) == std::cv_status::timeout) {
        frame = from_peer();
        if (frame != frames.end()) break;
        throw failure(receiver, receive, receive.peer,
                      "nothing from rank " + std::to_string(receive.peer) + " within " +
                          std::to_string(options_.timeout.count()) + " ms");
      }
      frame = from_peer();
    }
    if (frame->header != receive.expected || frame->payload.size() != receive.payload.size()) {
      const Header received = frame->header;
      const std::size_t received_length = frame->payload.size();
      frames.erase(frame);
      throw HeaderMismatch(receiver, receive.peer, receive.expected, receive.payload.size(),
                           received, received_length);
    }
    if (!receive.payload.empty()) {
      std::memcpy(receive.payload.data(), frame->payload.data(), receive.payload.size());
    }
    frames.erase(frame);
  }

  int wait_any(int receiver, std::span<const int> peers, std::chrono::milliseconds timeout,
               std::size_t& next) {
    for (const int peer : peers) check_peer(receiver, peer);
    const auto& frames = mailboxes_[static_cast<std::size_t>(receiver)].frames;
    const auto ready = [&]() -> int {
      for (std::size_t i = 0; i < peers.size(); ++i) {
        const int peer = peers[(next + i) % peers.size()];
        const bool has_frame = std::any_of(
            frames.begin(), frames.end(), [&](const Frame& frame) { return frame.sender == peer; });
        if (has_frame || closed_[static_cast<std::size_t>(peer)]) {
          next = (next + i + 1) % peers.size();
          return peer;
        }
      }
      return -1;
    };
    std::unique_lock lock(mutex_);
    if (peers.empty()) return -1;
    int peer = -1;
    arrived_.wait_for(lock, timeout, [&] { return (peer = ready()) >= 0; });
    return peer;
  }

  void close(int rank, std::string_view reason) {
    std::lock_guard lock(mutex_);
    if (closed_[static_cast<std::size_t>(rank)]) return;  // the first reason stands
    closed_[static_cast<std::size_t>(rank)] = true;
    reasons_[static_cast<std::size_t>(rank)] = reason;
    arrived_.notify_all();
  }

  void check_peer(int rank, int peer) const {
    if (peer < 0 || peer >= options_.ranks || peer == rank) {
      throw CommError({.rank = rank,
                       .detail = "no peer rank " + std::to_string(peer) + " in a group of " +
                                 std::to_string(options_.ranks)});
    }
  }

  // A failed receive: `what` happened while it waited for the frame its header describes.
  static CommError failure(int receiver, const Receive& receive, int peer,
                           const std::string& what) {
    return CommError({.rank = receiver,
                      .peer = peer,
                      .sequence = receive.expected.sequence,
                      .detail = what + " during sequence " +
                                std::to_string(receive.expected.sequence) + " (receiving " +
                                describe(receive.expected, receive.payload.size()) + ")"});
  }

  Options options_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<Mailbox> mailboxes_;
  std::vector<bool> closed_;
  std::vector<std::string> reasons_;  // why each closed rank left, when it said
};

static_assert(Transport<Loopback::Endpoint>);
static_assert(Serving<Loopback::Endpoint>);

}  // namespace cohort::transport
