// SharedSegment: POSIX shared memory that the processes of one host map, for the all-reduce of
// collective::Deterministic between them (deterministic.hpp, share_host_memory). It holds, per
// rank, two slots (a piece of the buffer being reduced, alternating between pieces), an arrival
// counter, and optionally a region: a buffer that the rank computes into, such as the gradient
// sum of a training step (share_buffer), which its peers read and write where it lies. A rank
// publishes a piece by writing its slot or its region and counting one more arrival, and reads its
// peers' once they have counted as far.
//
// Between processes of one host a transfer through the kernel's sockets is CPU work of both
// ends: copies into and out of the kernel, checksums, system calls. Through the segment the
// owner of a chunk folds it straight from its peers' slots (docs/benchmarks.md, "Processes of one
// host").
//
// Who may map it: the segment is created mode 0600 under a random name that travels only over
// the job's own transport (authenticated, and encrypted, where a secret says so), its pages are
// reserved at creation (posix_fallocate: a full /dev/shm fails here, not with SIGBUS later), and
// its name is removed as soon as every rank has mapped it, a few messages after its creation, so
// that from then on nothing is left in /dev/shm, whatever way the job ends. The same user's other
// processes could map it while the name exists; they could as well attach a debugger to the job.
//
// Waiting: spin for `spin` (zero: sleep at once; spin.hpp says how), then sleep on the counter (a
// futex between processes), waking at least every kWatchInterval so that the caller can watch for a
// peer that died or left (its sockets) and for the deadline.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/spin.hpp"

namespace cohort::collective::detail {

// What every rank of a job compares to decide whether they share a host in the sense that
// matters here: the same boot of the same kernel, the same network and IPC namespaces, and the
// same /dev/shm. Processes in network namespaces of their own (containers, emulated hosts) stay
// apart even on one machine.
using HostIdentity = std::array<std::int64_t, 6>;

inline HostIdentity host_identity() {
  HostIdentity identity{};
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string text;
  boot >> text;
  std::string hex;
  for (const char c : text) {
    if (c != '-') hex += c;
  }
  if (hex.size() == 32) {
    identity[0] = static_cast<std::int64_t>(std::stoull(hex.substr(0, 16), nullptr, 16));
    identity[1] = static_cast<std::int64_t>(std::stoull(hex.substr(16), nullptr, 16));
  }
  const auto inode = [](const char* path) {
    struct stat status {};
    return ::stat(path, &status) == 0 ? static_cast<std::int64_t>(status.st_ino) : -1;
  };
  identity[2] = inode("/proc/self/ns/net");
  identity[3] = inode("/proc/self/ns/ipc");
  struct stat shm {};
  if (::stat("/dev/shm", &shm) == 0) {
    identity[4] = static_cast<std::int64_t>(shm.st_dev);
    identity[5] = static_cast<std::int64_t>(shm.st_ino);
  }
  return identity;
}

class SharedSegment {
 public:
  // What the creator tells the others, as numbers a collective can broadcast: the name's random
  // part and a token the segment's header repeats, so that an opener knows it mapped this job's.
  using Ticket = std::array<std::int64_t, 4>;

  // What one rank stamped on an arrival: which collective it was in, and where its buffer lies.
  struct Stamp {
    // `where` of a buffer outside the region.
    static constexpr std::uint64_t kOutsideRegion = ~std::uint64_t{0};

    std::uint64_t sequence = 0;
    std::uint64_t tag = 0;
    std::uint64_t where = kOutsideRegion;  // the buffer's offset in the region, in bytes
    friend bool operator==(const Stamp&, const Stamp&) = default;
  };

  // A slot holds this many bytes (a power of two): small enough that a piece's slots stay in
  // cache, large enough that the two meetings per piece cost little beside its copies.
  static std::size_t slot_bytes_for(int ranks) {
    constexpr std::size_t kMost = std::size_t{1} << 20;
    constexpr std::size_t kLeast = std::size_t{64} << 10;
    constexpr std::size_t kSegmentBudget = std::size_t{32} << 20;
    std::size_t bytes = kMost;
    while (bytes > kLeast && bytes * 2 * static_cast<std::size_t>(ranks) > kSegmentBudget) {
      bytes /= 2;
    }
    return bytes;
  }

  // How long a sleeping rank sleeps at most before it looks at its peers' sockets and its
  // deadline again.
  static constexpr std::chrono::milliseconds kWatchInterval{1};

  // A new segment for `ranks` ranks, mapped by `rank`, with a region of `region_bytes` per rank;
  // throws std::system_error naming the call that failed.
  static SharedSegment create(int rank, int ranks, std::size_t region_bytes = 0) {
    SharedSegment segment(rank, ranks, region_bytes);
    std::random_device random;
    for (std::int64_t& word : segment.ticket_) {
      word = static_cast<std::int64_t>((std::uint64_t{random()} << 32) | random());
    }
    const std::string name = segment.name();
    const int descriptor =
        ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, S_IRUSR | S_IWUSR);
    if (descriptor < 0) throw failed("shm_open(" + name + ")");
    segment.linked_ = true;
    const int reserved = ::posix_fallocate(descriptor, 0, static_cast<off_t>(segment.bytes_));
    if (reserved != 0) {
      ::close(descriptor);
      throw std::system_error(
          reserved, std::generic_category(),
          "posix_fallocate(" + name + ", " + std::to_string(segment.bytes_) + " bytes)");
    }
    segment.map(descriptor);
    Header& header = segment.header();
    header.ranks = static_cast<std::uint64_t>(ranks);
    header.slot_bytes = segment.slot_bytes_;
    header.region_bytes = segment.region_bytes_;
    for (std::size_t i = 0; i < segment.ticket_.size(); ++i) {
      header.token[i] = static_cast<std::uint64_t>(segment.ticket_[i]);
    }
    return segment;
  }

  // The segment `ticket` names, mapped by `rank`; throws std::system_error naming the call that
  // failed, or std::runtime_error where what it mapped is not that segment.
  static SharedSegment open(const Ticket& ticket, int rank, int ranks,
                            std::size_t region_bytes = 0) {
    SharedSegment segment(rank, ranks, region_bytes);
    segment.ticket_ = ticket;
    const std::string name = segment.name();
    const int descriptor = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (descriptor < 0) throw failed("shm_open(" + name + ")");
    struct stat status {};
    if (::fstat(descriptor, &status) != 0) {
      ::close(descriptor);
      throw failed("fstat(" + name + ")");
    }
    if (static_cast<std::size_t>(status.st_size) != segment.bytes_ ||
        status.st_uid != ::geteuid()) {
      ::close(descriptor);
      throw std::runtime_error(name + " has " + std::to_string(status.st_size) +
                               " bytes and owner " + std::to_string(status.st_uid) + ", expected " +
                               std::to_string(segment.bytes_) + " and " +
                               std::to_string(::geteuid()));
    }
    segment.map(descriptor);
    const Header& header = segment.header();
    bool same = header.ranks == static_cast<std::uint64_t>(ranks) &&
                header.slot_bytes == segment.slot_bytes_ &&
                header.region_bytes == segment.region_bytes_;
    for (std::size_t i = 0; i < ticket.size(); ++i) {
      same = same && header.token[i] == static_cast<std::uint64_t>(ticket[i]);
    }
    if (!same) throw std::runtime_error(name + " is not this job's segment");
    return segment;
  }

  SharedSegment(SharedSegment&& other) noexcept
      : rank_(other.rank_),
        ranks_(other.ranks_),
        spin_(other.spin_),
        slot_bytes_(other.slot_bytes_),
        region_bytes_(other.region_bytes_),
        bytes_(other.bytes_),
        ticket_(other.ticket_),
        base_(std::exchange(other.base_, nullptr)),
        linked_(std::exchange(other.linked_, false)) {}
  SharedSegment& operator=(SharedSegment&&) = delete;

  ~SharedSegment() {
    unlink();
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }

  const Ticket& ticket() const { return ticket_; }

  // Removes the name, so that nothing more can map the segment and nothing is left behind; the
  // mappings stay. The creator calls it once every rank has mapped the segment (or failed to).
  void unlink() noexcept {
    if (std::exchange(linked_, false)) ::shm_unlink(name().c_str());
  }

  std::size_t slot_bytes() const { return slot_bytes_; }

  // Slot `set` (0 or 1) of `rank`.
  std::byte* slot(int set, int rank) const {
    return base_ + slots_offset(ranks_) +
           (static_cast<std::size_t>(set) * static_cast<std::size_t>(ranks_) +
            static_cast<std::size_t>(rank)) *
               slot_bytes_;
  }

  // The region of `rank`: region_bytes() bytes, page-aligned.
  std::size_t region_bytes() const { return region_bytes_; }
  std::byte* region(int rank) const {
    return base_ + slots_offset(ranks_) + 2 * static_cast<std::size_t>(ranks_) * slot_bytes_ +
           static_cast<std::size_t>(rank) * region_bytes_;
  }

  // This rank has made its `phase`-th arrival, stamped: what it wrote before is visible to a peer
  // that sees the arrival. Wakes the peers that sleep on it.
  void arrive(std::uint32_t phase, Stamp stamp) {
    Arrival& mine = arrival(rank_);
    mine.stamps[phase % 2] = stamp;
    mine.phase.store(phase, std::memory_order_seq_cst);
    if (mine.sleepers.load(std::memory_order_seq_cst) != 0) futex(mine.phase, FUTEX_WAKE, INT_MAX);
  }

  // Whether `peer` has made its `phase`-th arrival. A peer is never more than one arrival ahead
  // of a rank that has not seen it, so the comparison is modulo 2^32.
  bool arrived(int peer, std::uint32_t phase) const {
    const std::uint32_t at = arrival(peer).phase.load(std::memory_order_acquire);
    return static_cast<std::int32_t>(at - phase) >= 0;
  }

  // The stamp of `peer`'s `phase`-th arrival; once arrived(peer, phase).
  Stamp stamp(int peer, std::uint32_t phase) const { return arrival(peer).stamps[phase % 2]; }

  // Spins for up to `spin` until `peer` has made its `phase`-th arrival; true if it has.
  bool spin_for(int peer, std::uint32_t phase, std::chrono::microseconds spin) {
    return spin_.until([&] { return arrived(peer, phase); }, spin);
  }

  // Sleeps until `peer` has made its `phase`-th arrival or kWatchInterval has passed.
  void sleep_for(int peer, std::uint32_t phase) {
    Arrival& theirs = arrival(peer);
    theirs.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t at = theirs.phase.load(std::memory_order_seq_cst);
    if (static_cast<std::int32_t>(at - phase) < 0) {
      constexpr auto kNanoseconds =
          std::chrono::duration_cast<std::chrono::nanoseconds>(kWatchInterval).count();
      const timespec interval{0, kNanoseconds};
      futex(theirs.phase, FUTEX_WAIT, at, &interval);
    }
    theirs.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  struct Header {
    std::uint64_t ranks;
    std::uint64_t slot_bytes;
    std::uint64_t region_bytes;
    std::uint64_t token[4];
  };

  // One rank's arrivals, on cache lines of their own. The stamp of arrival k sits at k % 2: a
  // peer may make its next arrival while this rank still reads the stamp of the last.
  struct alignas(2 * waiting::kCacheLine) Arrival {
    std::atomic<std::uint32_t> phase;
    std::atomic<std::uint32_t> sleepers;
    Stamp stamps[2];
  };
  static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
  static_assert(sizeof(Arrival) == 2 * waiting::kCacheLine);

  static constexpr std::size_t kPage = 4096;
  static constexpr std::size_t kArrivalsOffset = kPage;
  static std::size_t slots_offset(int ranks) {
    const std::size_t arrivals = static_cast<std::size_t>(ranks) * sizeof(Arrival);
    return kArrivalsOffset + (arrivals + kPage - 1) / kPage * kPage;
  }

  SharedSegment(int rank, int ranks, std::size_t region_bytes)
      : rank_(rank),
        ranks_(ranks),
        spin_(static_cast<unsigned>(ranks) <= std::thread::hardware_concurrency()),
        slot_bytes_(slot_bytes_for(ranks)),
        region_bytes_((region_bytes + kPage - 1) / kPage * kPage),
        bytes_(slots_offset(ranks) +
               (2 * slot_bytes_ + region_bytes_) * static_cast<std::size_t>(ranks)) {}

  // "/cohort-" and the ticket's first two words in hex.
  std::string name() const {
    char text[64];
    std::snprintf(text, sizeof text, "/cohort-%016llx%016llx",
                  static_cast<unsigned long long>(ticket_[0]),
                  static_cast<unsigned long long>(ticket_[1]));
    return text;
  }

  void map(int descriptor) {
    void* base = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0);
    const int error = errno;
    ::close(descriptor);
    if (base == MAP_FAILED) throw std::system_error(error, std::generic_category(), "mmap");
    base_ = static_cast<std::byte*>(base);
  }

  Header& header() const { return *std::launder(reinterpret_cast<Header*>(base_)); }

  // The arrivals start zeroed (a new segment's pages are), which is a valid idle state of
  // std::atomic<std::uint32_t>.
  Arrival& arrival(int rank) const {
    return *std::launder(reinterpret_cast<Arrival*>(base_ + kArrivalsOffset) + rank);
  }

  // A futex between processes: the word's physical page, not the address, identifies it, so
  // FUTEX_PRIVATE_FLAG (which std::atomic::wait uses) must not be set.
  static void futex(std::atomic<std::uint32_t>& word, int operation, std::uint32_t value,
                    const timespec* timeout = nullptr) {
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), operation, value, timeout,
              nullptr, 0);
  }

  static std::system_error failed(const std::string& call) {
    return std::system_error(errno, std::generic_category(), call);
  }

  int rank_;
  int ranks_;
  waiting::Spinner spin_;
  std::size_t slot_bytes_;
  std::size_t region_bytes_;
  std::size_t bytes_;
  Ticket ticket_{};
  std::byte* base_ = nullptr;
  bool linked_ = false;  // this process created the name and has not removed it
};

}  // namespace cohort::collective::detail
