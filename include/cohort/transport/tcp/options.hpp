// tcp::Options: everything the TCP transport can be told, validated once when a Listener (and so
// a Tcp) is constructed; a bad value is a ConfigError naming the field and the value.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/options.hpp"

namespace cohort::transport::tcp {

struct Options {
  // This process's rank in [0, size), and the number of ranks in the job.
  int rank = 0;
  int size = 1;
  // Names the job; a peer with another job id is refused (a stale process from an earlier run,
  // two jobs sharing a port). At most 255 bytes.
  std::string job_id = "cohort";
  // The job's membership epoch: 0 for the ranks that started it, one more at each regroup
  // (Tcp::regroup). A peer of another epoch of the same job is refused without failing the
  // rendezvous: a rank left out of a regroup, or a frame of an earlier membership, cannot cross
  // into this one.
  std::uint32_t epoch = 0;
  // Where rank 0 listens and every other rank connects first. Rank 0 binds bind_address at
  // rendezvous_port; rank 0 may ask for port 0, any free port, and report the one it got through
  // Listener::rendezvous_port() (tests do); the other ranks must be told the real port.
  std::string rendezvous_host = "127.0.0.1";
  std::uint16_t rendezvous_port = 29500;
  // The numeric address every listener of this rank binds (rank 0's rendezvous listener and the
  // mesh listener of the others, on a free port). Loopback unless configured: a job across hosts
  // sets the interface's address, or "0.0.0.0" (then peers reach this rank at the address rank 0
  // saw it connect from).
  std::string bind_address = "127.0.0.1";
  // The ports the other ranks' listeners may take, for a firewall that opens a range: the first
  // free one in [listen_port_first, listen_port_last]. Both 0: any free port the system gives.
  // Rank 0 listens at rendezvous_port whatever this says.
  std::uint16_t listen_port_first = 0;
  std::uint16_t listen_port_last = 0;
  // Whether this rank's listening socket stays bound once the mesh is up, so that the ranks left
  // after a failure can regroup (Tcp::regroup; strategy::Elastic): each finds the others where
  // they listened at the rendezvous. A connection that arrives meanwhile waits in the kernel's
  // queue and is handled, as any stranger's, by the next rendezvous.
  bool keep_listening = false;
  // Whether this process joins a running elastic job through its door (door.hpp) rather than
  // starting it: a worker started again after a loss (COHORT_JOIN). Whatever its rank, rank 0's
  // included, it knocks at rendezvous_host:rendezvous_port as the other ranks do, and never hosts
  // a rendezvous of its own; the door gives it its place. A job that is starting there refuses it.
  bool joins_running_job = false;
  // A process started again for rank `rank` of a running mesh, which takes back that rank's place
  // at these ranks only (a parameter-server worker at the servers): it asks rank 0's door for the
  // mesh's address table (door.hpp), then each of these ranks, which keep listening
  // (keep_listening) and take it in when their owner calls Tcp::readmit. Its Tcp has connections
  // to these ranks alone. Empty: a rank of a mesh that starts, or joins through the door.
  std::vector<int> rejoin_peers{};
  // Where a rank other than the job's first rank 0 looks for rank 0 after rendezvous_host, each at
  // rendezvous_port, in turn: an elastic job's other hosts (cluster::Spec::hosts). Once the first
  // rank 0 is lost, the next opens the job's door on its own host, at that port where it is free,
  // and a process started again finds it there (one that joins, or one that knocks as it did at
  // the start). An attempt at one of several addresses lasts at most 2 s. A rank 0 that starts
  // asks them whether the job runs already, at once and then every second while the others have
  // not all come, and joins it where one's door answers.
  std::vector<std::string> door_hosts{};
  // Shared by every rank of the job. Empty: no authentication. Otherwise every connection proves
  // knowledge of it with HMAC-SHA256 challenge-response, the connecting side first
  // (handshake.hpp), and a connection that cannot is dropped and logged while the rendezvous goes
  // on (docs/transport.md, "What an attacker can do"). The secret never travels, and every data
  // frame carries a MAC under keys of its connection (frame_mac.hpp).
  std::string secret{};
  // Whether data frames' payloads travel encrypted (AES-256-GCM under the connection's keys,
  // frame_mac.hpp); headers stay clear. Requires a secret. It costs CPU time on both ends
  // (docs/benchmarks.md, "Integrity under a secret"). Every rank must agree (the handshake
  // checks). Strategies take it from COHORT_ENCRYPT (0 or 1).
  bool encrypt = false;
  // The rendezvous, start to full mesh, must complete within this; start order does not matter.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // An accepted connection must complete its handshake within this (and within connect_timeout),
  // or it is dropped: a silent or slow stranger holds a descriptor this long at most.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  // How many accepted connections may be in their handshake at once; one more drops the oldest of
  // them, so that a flood of idle connections cannot exhaust this process's descriptors. A real
  // rank that is dropped this way connects again.
  int max_pending_connections = 64;
  // A transfer fails when no byte moves in either direction for this long.
  std::chrono::milliseconds operation_timeout{std::chrono::minutes(5)};
  // After this fraction of operation_timeout without progress, a transfer prints one line naming
  // the ranks and frames it waits for, so that a long timeout never means minutes of silence.
  // 0: no warning. In [0, 1).
  double stall_warning = 0.25;
  // Whether data frames carry and verify a checksum of their payload (XXH3-64, frame.hpp). It
  // costs CPU time near that of the kernel's own copy on loopback (docs/transport.md); off, the
  // checksum field is sent as zero and not checked. Every rank must agree (the handshake checks).
  bool checksum = true;
  // The largest payload a frame may carry, sent or received. An incoming frame that announces
  // more is refused before its payload is read.
  std::size_t max_frame_bytes = std::size_t{1} << 30;
  // How long a transfer busy-polls its sockets after the last progress before it sleeps in
  // poll(): a wake-up from poll costs tens of microseconds, a busy poll a fraction of one. Zero
  // sleeps at once (many more ranks than cores).
  std::chrono::microseconds spin{50};
  // The kernel receive buffer of every connection (SO_RCVBUF). The kernel's own sizing starts
  // small and, between ranks that take turns sending and reading, stays small, so that a sender
  // stops for the reader more often than it must. Where the kernel caps this below the request
  // (net.core.rmem_max), the kernel's sizing is kept, since a capped fixed buffer is smaller
  // still. 0: always the kernel's.
  std::size_t receive_buffer_bytes = std::size_t{4} << 20;
  // A write completes only once at most about this many bytes of its connection wait unsent in
  // the kernel (TCP_NOTSENT_LOWAT). Without a limit, a transfer that ends with megabytes still
  // queued in one connection starts the next on another while they leave, and the two compete
  // for the link: on shaped links that costs drops and retransmissions. Before a send is done the
  // loop reads instead. Measured in docs/benchmarks.md, "Socket tuning and segments". 0: no
  // limit.
  std::size_t unsent_limit_bytes = std::size_t{64} << 10;
};

namespace detail {

inline std::string quoted(const std::string& text) { return "'" + text + "'"; }

// Validates everything that can be checked without the network (the bind address is checked by
// the Listener, which parses it).
inline void validate(const Options& options) {
  options::require_positive("size", options.size);
  options::require_in_range("rank", options.rank, 0, options.size - 1);
  if (options.job_id.empty() || options.job_id.size() > 255) {
    options::reject("job_id", quoted(options.job_id), "must have 1 to 255 bytes");
  }
  if (options.size > 1 && options.rendezvous_host.empty()) {
    options::reject("rendezvous_host", quoted(options.rendezvous_host), "must not be empty");
  }
  if (options.size > 1 && (options.rank != 0 || options.joins_running_job) &&
      options.rendezvous_port == 0) {
    options::reject("rendezvous_port", options.rendezvous_port,
                    "only the rank 0 that starts the job may ask for any free port; the other "
                    "ranks, and a process that joins a running job, must be given the port "
                    "rank 0 listens on");
  }
  if (options.joins_running_job && options.size < 2) {
    options::reject(
        "joins_running_job", "true",
        "needs the size of the job it joins (at least 2), not " + std::to_string(options.size));
  }
  if (!options.rejoin_peers.empty()) {
    if (options.joins_running_job) {
      options::reject("rejoin_peers", options.rejoin_peers.size(),
                      "takes back a rank's place, which joins_running_job (a new place) excludes");
    }
    for (const int peer : options.rejoin_peers) {
      if (peer <= 0 || peer >= options.size || peer == options.rank) {
        options::reject("rejoin_peers", peer,
                        "must name ranks from 1 to " + std::to_string(options.size - 1) +
                            " other than this one (" + std::to_string(options.rank) +
                            "): rank 0's door gives the table and takes in nobody");
      }
    }
  }
  if ((options.listen_port_first == 0) != (options.listen_port_last == 0) ||
      options.listen_port_first > options.listen_port_last) {
    options::reject(
        "listen_port_first, listen_port_last",
        std::to_string(options.listen_port_first) + "-" + std::to_string(options.listen_port_last),
        "must both be 0 (any port) or a range from low to high");
  }
  if (options.connect_timeout.count() <= 0) {
    options::reject("connect_timeout", std::to_string(options.connect_timeout.count()) + " ms",
                    "must be greater than 0");
  }
  if (options.handshake_timeout.count() <= 0) {
    options::reject("handshake_timeout", std::to_string(options.handshake_timeout.count()) + " ms",
                    "must be greater than 0");
  }
  options::require_positive("max_pending_connections", options.max_pending_connections);
  if (options.operation_timeout.count() <= 0) {
    options::reject("operation_timeout", std::to_string(options.operation_timeout.count()) + " ms",
                    "must be greater than 0");
  }
  if (!(options.stall_warning >= 0 && options.stall_warning < 1)) {
    options::reject("stall_warning", std::to_string(options.stall_warning),
                    "must be a fraction of operation_timeout in [0, 1)");
  }
  if (options.encrypt && options.secret.empty()) {
    options::reject(
        "encrypt", "true",
        "requires a secret: set secret (COHORT_SECRET) to the same value on every rank");
  }
  options::require_positive("max_frame_bytes", options.max_frame_bytes);
  for (const auto& [field, bytes] :
       {std::pair{"receive_buffer_bytes", options.receive_buffer_bytes},
        std::pair{"unsent_limit_bytes", options.unsent_limit_bytes}}) {
    if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      options::reject(field, bytes,
                      "must be at most " + std::to_string(std::numeric_limits<int>::max()));
    }
  }
  if (options.spin.count() < 0) {
    options::reject("spin", std::to_string(options.spin.count()) + " us", "must not be negative");
  }
}

}  // namespace detail

}  // namespace cohort::transport::tcp
