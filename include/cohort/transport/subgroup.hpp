// Subgroup: some ranks of a transport, seen as a transport of their own, so that a collective runs
// among them over the connections the job already has (collective::Deterministic's stages by host:
// the ranks of one host, and one rank of each host).
//
//   transport::Subgroup<tcp::Tcp> host(mesh, {4, 5, 6, 7});  // rank 5 of the job is rank 1 here
//
// A member's rank is its index in `members`; job_rank(r) names it in the job, so that errors name
// the ranks a user knows. Transfers, wait_any and the job's options go to the parent; a failure
// the parent throws comes back in the subgroup's ranks (its text names the job's). close, leave
// and abort end the parent: a failure in any group of the job is the job's.
//
// Required: the parent outlives the subgroup and is not moved meanwhile; the members are distinct
// ranks of the parent, this rank among them. Not thread-safe, as the parent's transfers are not.
#pragma once

#include <algorithm>
#include <chrono>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::transport {

template <Transport T>
class Subgroup {
 public:
  Subgroup(T& parent, std::vector<int> members) : parent_(&parent), members_(std::move(members)) {
    const auto me = std::ranges::find(members_, parent.rank());
    COHORT_ASSERT(me != members_.end());
    rank_ = static_cast<int>(me - members_.begin());
  }

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  // The job's rank of member `rank`.
  int job_rank(int rank) const { return members_[static_cast<std::size_t>(rank)]; }

  void transfer(std::span<const Send> sends, std::span<const Receive> receives) {
    translated([&] { parent_->transfer(to_job(sends), to_job(receives)); });
  }

  void transfer(std::span<const Send> sends, std::span<const Receive> receives,
                Meanwhile meanwhile) requires Overlapping<T> {
    translated([&] { parent_->transfer(to_job(sends), to_job(receives), meanwhile); });
  }

  int wait_any(std::span<const int> peers, std::chrono::milliseconds timeout) requires Serving<T> {
    job_peers_.clear();
    for (const int peer : peers) job_peers_.push_back(job_rank(peer));
    int peer = -1;
    translated([&] { peer = parent_->wait_any(job_peers_, timeout); });
    return peer < 0 ? peer : member(peer);
  }

  decltype(auto) options() const requires requires(const T& t) { t.options(); }
  { return parent_->options(); }

  void close() { parent_->close(); }
  void leave(std::string_view reason) { parent_->leave(reason); }
  void abort(std::string_view reason) { parent_->abort(reason); }

 private:
  // The member whose job rank is `job_rank`; -1 for a rank outside the subgroup.
  int member(int job_rank) const {
    const auto found = std::ranges::find(members_, job_rank);
    return found == members_.end() ? -1 : static_cast<int>(found - members_.begin());
  }

  std::span<const Send> to_job(std::span<const Send> sends) {
    job_sends_.assign(sends.begin(), sends.end());
    for (Send& send : job_sends_) send.peer = job_rank(send.peer);
    return job_sends_;
  }

  std::span<const Receive> to_job(std::span<const Receive> receives) {
    job_receives_.assign(receives.begin(), receives.end());
    for (Receive& receive : job_receives_) receive.peer = job_rank(receive.peer);
    return job_receives_;
  }

  // Runs `move` on the parent; what it throws comes back in the subgroup's ranks.
  template <class Move>
  void translated(Move&& move) {
    try {
      move();
    } catch (const HeaderMismatch& mismatch) {
      throw HeaderMismatch(rank_, member(mismatch.peer()), mismatch.expected,
                           mismatch.expected_length, mismatch.received, mismatch.received_length);
    } catch (const CommError& error) {
      throw CommError({.rank = rank_,
                       .peer = error.peer() < 0 ? -1 : member(error.peer()),
                       .operation = std::string(error.operation()),
                       .sequence = error.sequence(),
                       .detail = std::string(error.detail())});
    }
  }

  T* parent_;
  std::vector<int> members_;
  int rank_ = 0;
  // Reused across transfers, so that a steady loop allocates nothing.
  std::vector<Send> job_sends_;
  std::vector<Receive> job_receives_;
  std::vector<int> job_peers_;
};

template <class T>
inline constexpr bool is_subgroup_v = false;
template <class T>
inline constexpr bool is_subgroup_v<Subgroup<T>> = true;

}  // namespace cohort::transport
