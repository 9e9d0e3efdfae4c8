// tcp::LossWatch: a thread that watches a mesh's connections while its ranks talk over another
// channel, and tells once, as soon as a peer's connection ends, which rank it was: its process
// ended (killed, crashed, exited) or left the mesh. The GPU workers of an elastic
// MultiWorkerMirrored talk through NCCL, which learns of a lost process only at its timeout; a
// watch over their TCP mesh aborts every other process's NCCL group at once instead
// (strategy/multi_worker_mirrored_cuda.hpp).
//
//   tcp::LossWatch watch(mesh, [&](int rank) { group->raise("rank " + ... + " lost"); });
//   ...            // the ranks talk through NCCL
//   watch.stop();  // or its end: the thread is joined, on_loss not called after
//
// It reads nothing (Tcp::ended_peer), so transfers may go on beside it. A peer whose process is
// stopped, or whose host is cut off, keeps its connections and is not seen here: the other
// channel's timeout names it.
#pragma once

#include <chrono>
#include <functional>
#include <stop_token>
#include <thread>
#include <utility>

#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::transport::tcp {

class LossWatch {
 public:
  // How long the thread waits in one poll before it looks whether it is stopped: the longest
  // stop() waits.
  static constexpr std::chrono::milliseconds kPollInterval{20};

  // Watches `mesh`, which must outlive the watch and not readmit meanwhile; on_loss(rank) runs on
  // the watch's thread, at most once.
  LossWatch(Tcp& mesh, std::function<void(int rank)> on_loss)
      : thread_([&mesh, on_loss = std::move(on_loss)](const std::stop_token& stop) {
          while (!stop.stop_requested()) {
            if (const int rank = mesh.ended_peer(kPollInterval); rank >= 0) {
              on_loss(rank);
              return;
            }
          }
        }) {}

  LossWatch(const LossWatch&) = delete;
  LossWatch& operator=(const LossWatch&) = delete;

  void stop() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::jthread thread_;
};

}  // namespace cohort::transport::tcp
