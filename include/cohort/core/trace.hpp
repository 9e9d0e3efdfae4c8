// A timeline of training: spans of time per thread, written as a Chrome trace (JSON), which
// Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
//   trace::Recorder recorder("worker 1", 1);      // one per process; the label names its track
//   trace::Span span(&recorder, trace::Phase::kForwardBackward, {.step = 7, .index = 2});
//   ...                                            // the span ends when `span` is destroyed
//   recorder.write("traces/worker-1.json");
//
// A Span given a null recorder does nothing beyond one test of the pointer: tracing that is off
// reads no clock and takes no lock, so it costs nothing measurable (benchmarks/core measures
// it). Spans of one thread nest (a span opened inside another ends before it), which is what the
// viewers draw as a stack; spans of different threads are independent tracks.
//
// Times are the wall clock of the host (system_clock at the recorder's creation, advanced by the
// steady clock), so the files of the processes of one host line up when merged (cohort-run
// merges them: docs/launching.md, "Timeline").
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cohort/core/compilation.hpp"
#include "cohort/core/error.hpp"

namespace cohort::trace {

namespace detail {
// How a timeline file opens and closes: Recorder::write writes them, merge() relies on them.
inline constexpr std::string_view kOpening = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
inline constexpr std::string_view kClosing = "\n]}\n";
}  // namespace detail

// What a span measures; its name in the trace, and the category the viewers filter by.
enum class Phase : std::uint8_t {
  kStep,             // one training step of a replica, around everything below
  kForwardBackward,  // the model's forward_backward on one micro-batch (index: the micro-batch)
  kBucketQueued,     // a gradient bucket waiting for the communication thread (index: bucket)
  kBucketWire,       // a bucket's all-reduce in progress between processes
  kPeerWait,         // inside a transfer: until every peer it receives from has begun to send
                     // (index: the rank heard last), so that a slow peer is not read as a slow
                     // network; drawn where it lasts kPeerWaitShown or more
  kBucketWait,       // a replica waiting for a bucket's result
  kOptimizer,        // clipping and the optimizer step
  kLossAllReduce,    // the all-reduce of a window of losses
  kCheckpoint,       // Trainer::save
  kPush,             // parameter server: chunks pushed by a worker, or one received and folded
  kPull,             // parameter server: a worker's pull of every chunk, or one answered
  kApply,            // parameter server: the optimizer applied to a shard
  kValidation,       // an evaluation on held-out data (trainer/validation.hpp)
  kRegroup,          // an elastic job going on without a lost worker (trainer/elastic.hpp; step:
                     // the one it goes on from, index: the workers left)
  kKeepState,        // an elastic job's copy of the whole state, over TCP and by host
                     // (strategy/detail/keep_schedule.hpp; step: the one it is kept at); the
                     // stripes through shared memory are kept inside the update
};

constexpr std::string_view name(Phase phase) {
  switch (phase) {
    case Phase::kStep:
      return "step";
    case Phase::kForwardBackward:
      return "forward_backward";
    case Phase::kBucketQueued:
      return "bucket queued";
    case Phase::kBucketWire:
      return "bucket on the wire";
    case Phase::kPeerWait:
      return "waiting for a peer";
    case Phase::kBucketWait:
      return "bucket waited for";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kLossAllReduce:
      return "loss all_reduce";
    case Phase::kCheckpoint:
      return "checkpoint";
    case Phase::kPush:
      return "push";
    case Phase::kPull:
      return "pull";
    case Phase::kApply:
      return "apply";
    case Phase::kValidation:
      return "validation";
    case Phase::kRegroup:
      return "regroup";
    case Phase::kKeepState:
      return "state kept";
  }
  return "unknown";
}

constexpr std::string_view category(Phase phase) {
  switch (phase) {
    case Phase::kStep:
    case Phase::kForwardBackward:
    case Phase::kOptimizer:
      return "compute";
    case Phase::kCheckpoint:
      return "io";
    default:
      return "communication";
  }
}

// A wait for a peer shorter than this is not a span: the bytes were already on their way.
inline constexpr std::chrono::microseconds kPeerWaitShown{100};

// What a span is about, written as its args; a field left at its default is not written.
struct Detail {
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint64_t step = kNone;   // the training step
  std::uint64_t index = kNone;  // micro-batch, bucket or worker
  std::uint64_t bytes = kNone;  // bytes moved
};

struct Event {
  Phase phase;
  std::int64_t start_ns;  // since the recorder's origin
  std::int64_t duration_ns;
  std::uint32_t thread;  // index into the recorder's threads, in order of first appearance
  Detail detail;
};

// The spans of one process. Thread-safe: every thread of the process records into it.
class Recorder {
 public:
  using Clock = std::chrono::steady_clock;

  // label: the process's name in the viewer ("worker 1", "ps 0", "process"); process: its pid
  // there, which orders the tracks of a merged file.
  Recorder(std::string label, int process)
      : label_(std::move(label)),
        process_(process),
        origin_(Clock::now()),
        origin_wall_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()) {}

  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Names the calling thread's track ("replica 0", "communication"); optional.
  void name_thread(std::string name) {
    const std::lock_guard lock(mutex_);
    thread_names_[thread_index_locked()] = std::move(name);
  }

  void record(Phase phase, Clock::time_point start, Clock::time_point end, Detail detail = {}) {
    const std::lock_guard lock(mutex_);
    events_.push_back(
        {phase, (start - origin_).count(), (end - start).count(), thread_index_locked(), detail});
  }

  std::vector<Event> events() const {
    const std::lock_guard lock(mutex_);
    return events_;
  }
  const std::string& label() const { return label_; }

  // Writes the Chrome trace, creating the file's directory. A file that cannot be written is a
  // ConfigError naming it: its path came from the options or from COHORT_TRACE.
  COHORT_DECL void write(const std::filesystem::path& file) const;

 private:
  std::uint32_t thread_index_locked() {
    const auto id = std::this_thread::get_id();
    const auto found = std::find(threads_.begin(), threads_.end(), id);
    if (found != threads_.end()) return static_cast<std::uint32_t>(found - threads_.begin());
    threads_.push_back(id);
    return static_cast<std::uint32_t>(threads_.size() - 1);
  }

  // Microseconds with the nanoseconds as a fraction: the format's unit, at full resolution.
  COHORT_DECL static std::string microseconds(std::int64_t base_us, std::int64_t ns);

  // Labels are cohort's own words; escaping keeps the file JSON whatever a caller passes.
  COHORT_DECL static std::string escaped(std::string_view text);

  std::string label_;
  int process_;
  Clock::time_point origin_;
  std::int64_t origin_wall_us_;
  mutable std::mutex mutex_;
  std::vector<std::thread::id> threads_;
  std::map<std::uint32_t, std::string> thread_names_;
  std::vector<Event> events_;
};

// A span from construction to destruction on the calling thread; nothing at all without a
// recorder.
class Span {
 public:
  Span(Recorder* recorder, Phase phase, Detail detail = {})
      : recorder_(recorder), phase_(phase), detail_(detail) {
    if (recorder_ != nullptr) start_ = Recorder::Clock::now();
  }
  ~Span() {
    if (recorder_ == nullptr) return;
    try {
      recorder_->record(phase_, start_, Recorder::Clock::now(), detail_);
    } catch (...) {  // out of memory: the span is lost, the training is not
    }
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Recorder* recorder_;
  Phase phase_;
  Detail detail_;
  Recorder::Clock::time_point start_{};
};

// Merges timelines that Recorder::write wrote (one per process) into one file with a track per
// process, as cohort-run does at the end of a job. Reads only what write() writes: its events
// array, one event a line. A file of another shape is a ConfigError naming it.
COHORT_DECL void merge(const std::vector<std::filesystem::path>& files,
                       const std::filesystem::path& merged);

// The recorder of this process's fit, or null: what parts deep inside a step (the communication
// thread, a parameter server) record into. The Trainer installs its recorder for the duration of
// a fit (Installed); one process, one timeline.
inline std::atomic<Recorder*>& current_recorder() {
  static std::atomic<Recorder*> recorder{nullptr};
  return recorder;
}
inline Recorder* current() { return current_recorder().load(std::memory_order_relaxed); }

class Installed {
 public:
  explicit Installed(Recorder* recorder) : previous_(current_recorder().exchange(recorder)) {}
  ~Installed() { current_recorder().store(previous_); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;

 private:
  Recorder* previous_;
};

// A wait for `peer` from `start` until `end` (Phase::kPeerWait), recorded where it lasted
// kPeerWaitShown or more: the transport's and the shared-memory collective's one rule.
inline void record_peer_wait(Recorder* recorder, Recorder::Clock::time_point start,
                             Recorder::Clock::time_point end, int peer) {
  if (recorder == nullptr || end - start < kPeerWaitShown) return;
  recorder->record(Phase::kPeerWait, start, end, {.index = static_cast<std::uint64_t>(peer)});
}

}  // namespace cohort::trace

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/core/impl/trace.ipp"
#endif
