// One process of the parameter-server tests, a worker or a server (COHORT_ROLE, from cohort-run
// --ps or by hand): trains the small test model with ParameterServer; the chief writes the final
// parameters to OUT.
//
//   ps_trainer sync|async|bounded2 STEPS OUT [--slow-worker W --sleep-ms N]
//              [--every-worker-sleep-ms N] [--log-pushes]
//              [--segment K --checkpoint FILE [--reread]] [--restore FILE] [--bad-requests]
//              [--backup-workers B] [--clip NORM] [--alignment A] [--local-replicas L]
//              [--eigen THREADS] [--poison INDEX] [--on-nonfinite skip_step]
//              [--seed-of W S] [--learning-rate-of-server S LR] [--timeout-ms T]
//              [--stall-mid-frame W --stall-after N] [--stop-worker W --stop-after N]
//              [--preempt-after N] [--schedule] [--die-mid-step W --die-after N]
//              [--checkpoint-directory DIR --checkpoint-every N] [--validate-every N]
//
// --slow-worker W    worker W sleeps N ms in every micro-batch (its data set is slow)
// --every-worker-sleep-ms N  every worker sleeps N ms in every micro-batch (so that a run lasts)
// --segment K        fit K steps at a time; the chief saves FILE after each (and the Trainer on
//                    preemption)
// --reread           every process restores FILE at once after each save
// --restore FILE     every process restores FILE first
// --bad-requests     worker 1 first sends one malformed request per field and checks that each
//                    is refused naming itself and the field, a push's in the answer to its next
//                    pull (exit 3 if not), then trains
// --backup-workers B ParameterServer's backup_workers (Sync only)
// --local-replicas L replica threads in each worker
// --clip NORM        Adam clips by global norm NORM; the model is the wide one, laid out on the
//                    norm's blocks (4096-element alignment, 16 KiB chunks: 2 chunks per server)
// --alignment A      the layout's alignment instead (a wrong one for --clip, say)
// --eigen THREADS    the examples' Eigen MLP on THREADS threads per replica (eigen_training.hpp)
//                    instead of the plain-loop Mlp
// --poison INDEX     example INDEX has a NaN feature (as PoisonedData)
// --on-nonfinite P   the Trainer's on_nonfinite: raise (default) or skip_step
// --seed-of W S      worker W trains with seed S instead of 11 (the settings check)
// --learning-rate-of-server S LR  server S's Adam has learning rate LR instead of 3e-3 (the same)
// --timeout-ms T     ParameterServer's timeout (default 30 s)
// --stall-mid-frame W  worker W, after N micro-batches, writes the first half of its next push's
//                    payload frame and stops there for good, its connections open (it says so on
//                    stderr: "ps_trainer: stalled after B of F bytes of a frame")
// --stop-worker W   worker W, in its micro-batch N (--stop-after), stops its whole process with
//                    SIGSTOP, as a stop from outside would while it computes (it says so first on
//                    stderr: "ps_trainer: stopping itself")
// --die-mid-step W  worker W, in the step of its micro-batch N (--die-after), sends 2 of the
//                    step's pushes, holds its writing thread for 0.5 s (the others push theirs,
//                    and the servers take the step for those chunks), then SIGKILLs its process:
//                    a worker lost in the middle of a step's pushes (it says so first on stderr:
//                    "ps_trainer: dying mid-step")
// --preempt-after N  the chief's micro-batch number N sends SIGTERM to the launcher (PreemptAt);
//                    a process whose fit stopped for preemption exits with kExitPreempted
// --schedule         the tests' learning-rate schedule (training.hpp, test_schedule), which the
//                    servers apply
// --checkpoint-directory DIR, --checkpoint-every N  checkpoints every N steps into DIR, a shard
//                    per server and the manifest, the newest 3 kept, and the run resumes from
//                    the newest there (Options::checkpoint)
// --validate-every N evaluates the small held-out set every N steps (cohort::validation); the
//                    chief prints each evaluation (cohort::testing::describe)
// Otherwise the layout is forced small (16-element alignment, no minimum shard, 256-byte chunks),
// so that the small model spreads over every server in several chunks.
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cohort/strategy/parameter_server.hpp>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "eigen_training.hpp"

namespace {

// --stall-mid-frame: armed by the data after N micro-batches; the next frame written that is at
// least this long (a push's payload frame: the small layout's requests and pulls are shorter) is
// cut in half.
std::atomic<bool> stall_armed{false};
constexpr std::size_t kStallFrameBytes = 200;
// --die-mid-step: armed by the data after N micro-batches with the long frames (pushes) still to
// write before the process dies; -1: never.
std::atomic<int> frames_before_death{-1};

}  // namespace

// The program's own sendmsg, which every socket write of the transport goes through (a gathering
// write of header, payload and trailer): the system call, or, once armed, half of the frame and
// then a stop that never ends (the thread, and with it the worker, stalls mid-frame).
extern "C" ssize_t sendmsg(int descriptor, const msghdr* message, int flags) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < message->msg_iovlen; ++i) bytes += message->msg_iov[i].iov_len;
  if (bytes >= kStallFrameBytes && frames_before_death.load() == 0) {
    std::fprintf(stderr, "ps_trainer: dying mid-step\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(::getpid(), SIGKILL);
  }
  if (bytes >= kStallFrameBytes && frames_before_death.load() > 0) --frames_before_death;
  if (bytes >= kStallFrameBytes && stall_armed.exchange(false)) {
    std::vector<char> frame;
    for (std::size_t i = 0; i < message->msg_iovlen; ++i) {
      const auto* base = static_cast<const char*>(message->msg_iov[i].iov_base);
      frame.insert(frame.end(), base, base + message->msg_iov[i].iov_len);
    }
    std::size_t written = 0;
    while (written < bytes / 2) {
      const ssize_t result = ::syscall(SYS_sendto, descriptor, frame.data() + written,
                                       bytes / 2 - written, flags, nullptr, 0);
      if (result > 0) written += static_cast<std::size_t>(result);
    }
    std::fprintf(stderr, "ps_trainer: stalled after %zu of %zu bytes of a frame\n", written, bytes);
    while (true) ::pause();
  }
  return ::syscall(SYS_sendmsg, descriptor, message, flags);
}

namespace {

using namespace cohort::strategy;
namespace ps = cohort::strategy::ps;

struct Settings {
  std::string consistency;
  std::uint64_t steps = 0;
  std::string out;
  int slow_worker = -1;
  int sleep_ms = 0;
  int every_worker_sleep_ms = 0;
  bool log_pushes = false;
  std::uint64_t segment = 0;
  std::string checkpoint;
  bool reread = false;
  std::string restore;
  bool bad_requests = false;
  std::size_t backup_workers = 0;
  double clip = 0.0;
  std::size_t local_replicas = 1;
  std::size_t alignment = 0;      // 0: the default of the layout above
  std::size_t eigen_threads = 0;  // 0: the plain-loop Mlp
  std::optional<std::size_t> poison;
  cohort::NonFinite on_nonfinite = cohort::NonFinite::kRaise;
  int seed_worker = -1;
  std::uint64_t seed_of_worker = 11;
  int learning_rate_server = -1;
  double learning_rate_of_server = 3e-3;
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  int stall_worker = -1;
  int stall_after = 0;
  int stop_worker = -1;
  int stop_after = 0;
  int die_worker = -1;
  int die_after = 0;
  int preempt_after = -1;
  bool schedule = false;
  std::string checkpoint_directory;
  std::uint64_t checkpoint_every = 0;
  std::uint64_t validate_every = 0;
};

// The test data: slowed down on one worker, with one example poisoned, on the stalling worker
// arming the stall after `stall_after` micro-batches, on the stopping worker stopping the
// process in micro-batch `stop_after`, and on the dying worker arming its death in micro-batch
// `die_after`.
struct Data {
  const example::ClusterData* data;
  int sleep_ms = 0;
  int stall_after = -1;
  int stop_after = -1;
  int die_after = -1;
  std::optional<std::size_t> poison;
  cohort::testing::PreemptAt preempt{-1};
  std::size_t size() const { return data->size(); }
  auto batch(std::span<const std::size_t> indices) const {
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    const int number = batches_.fetch_add(1);
    if (number == stall_after) stall_armed = true;
    if (number == die_after) frames_before_death = 2;
    if (number == stop_after) {
      std::fprintf(stderr, "ps_trainer: stopping itself in micro-batch %d\n", number);
      std::fflush(stderr);
      ::kill(::getpid(), SIGSTOP);
    }
    preempt();
    if (poison) {
      return cohort::testing::PoisonedData{.data = data, .poisoned = *poison}.batch(indices);
    }
    return data->batch(indices);
  }
  mutable std::atomic<int> batches_{0};
};

// One malformed request per field; each must be refused naming worker 1 and the field.
template <class S>
int send_bad_requests(S& strategy, std::size_t parameters) {
  const ps::Layout layout = strategy.layout(parameters, sizeof(float));
  ps::Client<typename S::Transport> client(strategy.transport(), 1, strategy.workers());
  const ps::Chunk& chunk = layout.chunks().front();
  const auto good = [&] {
    ps::Request request;
    request.operation = static_cast<std::uint16_t>(ps::Operation::kPull);
    request.element_bytes = sizeof(float);
    request.worker = 1;
    request.shard = static_cast<std::uint32_t>(chunk.server);
    request.chunk = static_cast<std::uint32_t>(chunk.index);
    request.length = chunk.size();
    request.reply_bytes = chunk.size() * sizeof(float);
    return request;
  };
  std::vector<std::byte> reply(chunk.size() * sizeof(float) * 4);
  int failures = 0;
  // `label` names the case in the output.
  const auto refused = [&](const std::string& label, const char* field, const ps::Reply& answer) {
    const std::string message = answer.message;
    const bool ok = answer.status == 1 &&
                    message.find(std::string(field) + " = ") != std::string::npos &&
                    message.find("worker 1") != std::string::npos;
    std::fprintf(stderr, "bad request (%s): %s: %s\n", label.c_str(),
                 ok ? "refused as expected" : "WRONG", message.c_str());
    failures += ok ? 0 : 1;
  };
  const auto expect = [&](const char* field, const ps::Request& request) {
    refused(
        field, field,
        client.send_raw(chunk.server, request, {}, std::span(reply).first(request.reply_bytes)));
  };
  auto request = good();
  request.shard = 99;
  expect("shard", request);
  request = good();
  request.chunk = 1000;
  expect("chunk", request);
  request = good();
  request.length = chunk.size() + 1;
  request.reply_bytes = request.length * sizeof(float);
  expect("length", request);
  request = good();
  request.version = 0;
  expect("version", request);
  request = good();
  request.worker = 2;
  expect("worker", request);
  // A push is not answered: its refusal comes with the next pull, which it replaces.
  const std::vector<float> gradient(chunk.size());
  client.add({.operation = ps::Operation::kPush, .element_bytes = sizeof(float)},
             ps::Chunk{.server = chunk.server, .index = 1000, .begin = 0, .end = chunk.size()},
             std::as_bytes(std::span(gradient)));
  client.transfer();
  refused("push chunk", "chunk",
          client.send_raw(chunk.server, good(), {},
                          std::span(reply).first(chunk.size() * sizeof(float))));
  client.add({.operation = ps::Operation::kPush, .element_bytes = sizeof(float), .leaves = 0},
             chunk, std::as_bytes(std::span(gradient)));
  client.transfer();
  refused("push leaves", "leaves",
          client.send_raw(chunk.server, good(), {},
                          std::span(reply).first(chunk.size() * sizeof(float))));
  // A well-formed pull still works afterwards.
  const auto answer = client.send_raw(chunk.server, good(), {},
                                      std::span(reply).first(chunk.size() * sizeof(float)));
  if (answer.status != 0) {
    std::fprintf(stderr, "a good pull after the bad ones failed: %s\n", answer.message);
    ++failures;
  }
  return failures;
}

template <class C, class Model>
int train(const Settings& settings, const Model& model) {
  const bool clips = settings.clip > 0.0;
  ParameterServer<C> strategy({.local_replicas = settings.local_replicas,
                               .connect_timeout = std::chrono::seconds(30),
                               .timeout = settings.timeout,
                               .min_shard_bytes = 0,
                               .alignment = settings.alignment != 0 ? settings.alignment
                                            : clips ? cohort::device::cpu::kNormBlock
                                                    : 16,
                               .chunk_bytes = clips ? std::size_t{16} << 10 : 256,
                               .backup_workers = settings.backup_workers,
                               .log_pushes = settings.log_pushes});
  const bool chief = strategy.is_chief();
  const bool serves = strategy.serves();
  const int worker = serves ? -1 : strategy.worker();
  const int server = serves ? strategy.cluster().rank : -1;
  // The rendezvous is done (the strategy's construction): a test may now stop or kill a process.
  std::fprintf(stderr, "ps_trainer: connected\n");
  std::fflush(stderr);
  if (settings.bad_requests && worker == 1) {
    const std::size_t parameters = cohort::testing::parameters_of(model).size();
    if (send_bad_requests(strategy, parameters) != 0) return 3;
  }
  cohort::Trainer trainer(
      model, std::move(strategy),
      cohort::optimizer::Adam({.learning_rate = server == settings.learning_rate_server
                                                    ? settings.learning_rate_of_server
                                                    : 3e-3,
                               .max_gradient_norm = settings.clip}),
      {.global_batch = 64,
       .seed = worker == settings.seed_worker ? settings.seed_of_worker : 11,
       .progress = cohort::Progress::kSilent,
       .on_nonfinite = settings.on_nonfinite,
       .preemption = {.checkpoint = settings.checkpoint},
       .schedule = cohort::testing::schedule_if(settings.schedule),
       .checkpoint = cohort::testing::checkpoints_in(settings.checkpoint_directory,
                                                     settings.checkpoint_every)});
  if (!settings.restore.empty()) trainer.restore(settings.restore);
  const Data data{
      &cohort::testing::small_task_data(),
      worker == settings.slow_worker ? settings.sleep_ms : settings.every_worker_sleep_ms,
      worker == settings.stall_worker ? settings.stall_after : -1,
      worker == settings.stop_worker ? settings.stop_after : -1,
      worker == settings.die_worker ? settings.die_after : -1,
      settings.poison,
      cohort::testing::PreemptAt(chief ? settings.preempt_after : -1)};
  const std::uint64_t segment = settings.segment == 0 ? settings.steps : settings.segment;
  // Every process, servers included, fits the same segments.
  for (std::uint64_t at = trainer.step(); at < settings.steps;) {
    at = std::min(settings.steps, at + segment);
    const cohort::Report report =
        settings.validate_every == 0
            ? trainer.fit(data, {.steps = at})
            : trainer.fit(data, {.steps = at},
                          cohort::validation(cohort::testing::small_held_out_data(),
                                             {.every_steps = settings.validate_every}));
    if (report.preempted) return cohort::kExitPreempted;
    if (chief) {
      for (const cohort::Evaluation& evaluation : report.validation) {
        std::printf("%s\n", cohort::testing::describe(evaluation).c_str());
      }
    }
    if (!settings.checkpoint.empty()) trainer.save(settings.checkpoint);
    if (settings.reread) trainer.restore(settings.checkpoint);
  }
  if (trainer.strategy().is_chief()) {  // under sync, a worker that became chief when it was lost
    cohort::testing::write_parameters(settings.out,
                                      cohort::testing::parameters_of(trainer.model()));
  }
  return 0;
}

template <class C>
int train(const Settings& settings) {
  if (settings.eigen_threads > 0) {
    return train<C>(settings, cohort::testing::small_eigen_model(settings.eigen_threads));
  }
  return train<C>(settings, settings.clip > 0.0 ? cohort::testing::wide_model()
                                                : cohort::testing::small_model());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ps_trainer sync|async|bounded2 STEPS OUT [options]\n");
    return 64;
  }
  Settings settings;
  settings.consistency = argv[1];
  settings.steps = std::stoull(argv[2]);
  settings.out = argv[3];
  for (int i = 4; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (flag == "--slow-worker")
      settings.slow_worker = std::stoi(next());
    else if (flag == "--sleep-ms")
      settings.sleep_ms = std::stoi(next());
    else if (flag == "--log-pushes")
      settings.log_pushes = true;
    else if (flag == "--segment")
      settings.segment = std::stoull(next());
    else if (flag == "--checkpoint")
      settings.checkpoint = next();
    else if (flag == "--checkpoint-directory")
      settings.checkpoint_directory = next();
    else if (flag == "--checkpoint-every")
      settings.checkpoint_every = std::stoull(next());
    else if (flag == "--validate-every")
      settings.validate_every = std::stoull(next());
    else if (flag == "--schedule")
      settings.schedule = true;
    else if (flag == "--reread")
      settings.reread = true;
    else if (flag == "--restore")
      settings.restore = next();
    else if (flag == "--bad-requests")
      settings.bad_requests = true;
    else if (flag == "--backup-workers")
      settings.backup_workers = std::stoul(next());
    else if (flag == "--clip")
      settings.clip = std::stod(next());
    else if (flag == "--alignment")
      settings.alignment = std::stoul(next());
    else if (flag == "--local-replicas")
      settings.local_replicas = std::stoul(next());
    else if (flag == "--eigen")
      settings.eigen_threads = std::stoul(next());
    else if (flag == "--poison")
      settings.poison = std::stoul(next());
    else if (flag == "--on-nonfinite")
      settings.on_nonfinite =
          next() == "skip_step" ? cohort::NonFinite::kSkipStep : cohort::NonFinite::kRaise;
    else if (flag == "--seed-of") {
      settings.seed_worker = std::stoi(next());
      settings.seed_of_worker = std::stoull(next());
    } else if (flag == "--learning-rate-of-server") {
      settings.learning_rate_server = std::stoi(next());
      settings.learning_rate_of_server = std::stod(next());
    } else if (flag == "--every-worker-sleep-ms")
      settings.every_worker_sleep_ms = std::stoi(next());
    else if (flag == "--timeout-ms")
      settings.timeout = std::chrono::milliseconds(std::stoll(next()));
    else if (flag == "--stall-mid-frame")
      settings.stall_worker = std::stoi(next());
    else if (flag == "--stall-after")
      settings.stall_after = std::stoi(next());
    else if (flag == "--stop-worker")
      settings.stop_worker = std::stoi(next());
    else if (flag == "--stop-after")
      settings.stop_after = std::stoi(next());
    else if (flag == "--die-mid-step")
      settings.die_worker = std::stoi(next());
    else if (flag == "--die-after")
      settings.die_after = std::stoi(next());
    else if (flag == "--preempt-after")
      settings.preempt_after = std::stoi(next());
    else {
      std::fprintf(stderr, "ps_trainer: unknown option %s\n", flag.c_str());
      return 64;
    }
  }
  try {
    if (settings.consistency == "sync") return train<consistency::Sync>(settings);
    if (settings.consistency == "async") return train<consistency::Async>(settings);
    if (settings.consistency == "bounded2") {
      return train<consistency::BoundedStaleness<2>>(settings);
    }
    std::fprintf(stderr, "ps_trainer: unknown consistency %s\n", settings.consistency.c_str());
    return 64;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
