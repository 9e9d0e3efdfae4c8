// One worker of the multi-worker tests: trains a small test model with MultiWorkerMirrored and,
// on the chief, writes the final parameters.
//   multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring] [--eigen THREADS] [--micro-batches M]
//                        [--seed S] [--learning-rate LR] [--max-gradient-norm N] [--poison INDEX]
//                        [--on-nonfinite raise|skip_step] [--mirrored]
//                        [--checkpoint FILE] [--preempt-after N] [--fail-in-backward N]
//                        [--save-restore FILE] [--schedule]
//                        [--checkpoint-directory DIR --checkpoint-every N] [--pause-ms N]
//                        [--validate-every N [--chief-stops-after E]] [--elastic MIN]
//                        [--connect-timeout-s N] [--timeout-s N] [--log-every N]
//
// ring             the ring all-reduce across processes instead of the deterministic one
// --eigen THREADS  the examples' Eigen MLP on THREADS threads per replica (eigen_training.hpp)
//                  instead of the plain-loop Mlp
// --micro-batches  micro-batches per global batch (default 8)
// --seed, --learning-rate   the Trainer's seed (default 11) and Adam's learning rate (3e-3)
// --max-gradient-norm N      Adam's global-norm clipping (default 0: none)
// --poison INDEX   example INDEX has a NaN feature (as PoisonedData)
// --on-nonfinite   the Trainer's policy for a non-finite gradient (default raise)
// --mirrored       Mirrored with LOCAL_REPLICAS replicas in this one process instead
// --checkpoint FILE  continue from FILE if it exists; the Trainer saves it on preemption
// --preempt-after N  the chief's micro-batch number N sends SIGTERM to the launcher (PreemptAt)
// --fail-in-backward N  this process's model throws at its readiness report N (FailingBackward)
// --save-restore FILE  after the fit every process saves FILE and at once restores it
// --schedule       the tests' learning-rate schedule (training.hpp, test_schedule)
// --checkpoint-directory DIR, --checkpoint-every N  checkpoints every N steps into DIR, the newest
//                  3 kept, and the run resumes from the newest there (Options::checkpoint)
// --pause-ms N     every micro-batch sleeps N ms, so that a run lasts long enough to be killed
//                  in its middle
// --validate-every N  evaluates the small held-out set every N steps (cohort::validation); every
//                  process prints each evaluation (cohort::testing::describe: its step and each
//                  mean's exact bits), and "stopped early after S steps, E evaluations" when its
//                  fit stopped early
// --chief-stops-after E  the chief's ValidationOptions::stop says stop after E evaluations (the
//                  others' never do)
// --elastic MIN    an elastic job (strategy::Elastic) of at least MIN workers: a process that ends
//                  is gone, and the others go on; each prints "membership W -> W' at step S" per
//                  change (", the state kept at that step rebuilt" where it was:
//                  strategy::KeepsStripes), and the chief at the end writes the parameters
// --max-workers N  the most workers the elastic job grows to (default: those it starts with)
// --connect-timeout-s N  the rendezvous's deadline (default 30 s), a joiner's at a running job's
//                  door
// --timeout-s N    the deadline of a step's communication (default 10 s): a worker stopped or
//                  hung is noticed after it
// --log-every N    a progress line (and a metrics-file line) every N steps (Options::log_every)
// --leaves-after-rendezvous  meets the others as the strategy would (its transport's options) and
//                  ends at once, so that a worker is lost while the others construct their
//                  strategy
// Every process prints "skipped N" (Report::skipped_steps) and "losses N" (the size of
// Report::loss) when its fit returns; a process
// whose fit stopped for preemption exits with cohort::kExitPreempted and writes no parameters. Both
// models report their gradient readiness per layer, and buckets are 64 bytes, so the buckets of a
// step are reduced across processes while its backward pass goes on.
#include <chrono>
#include <cohort/collective/ring.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cstdio>
#include <optional>
#include <span>
#include <string>

#include "eigen_training.hpp"

namespace {

struct Settings {
  std::size_t local_replicas = 1;
  std::uint64_t steps = 0;
  std::string out;
  bool ring = false;
  std::size_t eigen_threads = 0;  // 0: the plain-loop Mlp
  std::size_t micro_batches = 8;
  std::uint64_t seed = 11;
  double learning_rate = 3e-3;
  double max_gradient_norm = 0.0;
  std::optional<std::size_t> poison;
  cohort::NonFinite on_nonfinite = cohort::NonFinite::kRaise;
  bool mirrored = false;
  std::string checkpoint;
  int preempt_after = -1;
  int fail_in_backward = -1;
  std::string save_restore;
  bool schedule = false;
  std::string checkpoint_directory;
  std::uint64_t checkpoint_every = 0;
  int pause_ms = 0;
  std::uint64_t validate_every = 0;
  std::size_t chief_stops_after = 0;
  std::size_t min_workers = 0;
  std::size_t max_workers = 0;
  int connect_timeout_s = 30;
  int timeout_s = 10;
  std::uint64_t log_every = 100;
  bool leaves_after_rendezvous = false;
};

// The data of every fit: small_task_data(), with one example poisoned (--poison), the chief's
// micro-batch N preempting (--preempt-after) and every micro-batch pausing (--pause-ms). One type
// for all, so that each model and strategy compiles two fits, with evaluation and without.
struct Data {
  cohort::testing::PreemptedData preempted;
  std::optional<std::size_t> poisoned;

  std::size_t size() const { return preempted.size(); }
  example::Batch batch(std::span<const std::size_t> indices) const {
    example::Batch batch = preempted.batch(indices);
    if (poisoned) cohort::testing::PoisonedData::poison(batch, indices, *poisoned);
    return batch;
  }
};

template <class Strategy, class Model>
int train(const Settings& settings, Strategy strategy, const Model& model) {
  const bool chief = strategy.is_chief();
  // The rendezvous is done (the strategy's construction): a test may now stop or kill a process.
  std::fprintf(stderr, "multi_worker_trainer: connected\n");
  std::fflush(stderr);
  cohort::Trainer trainer(
      model, std::move(strategy),
      cohort::optimizer::Adam({.learning_rate = settings.learning_rate,
                               .max_gradient_norm = settings.max_gradient_norm}),
      {.global_batch = 64,
       .micro_batches = settings.micro_batches,
       .seed = settings.seed,
       .log_every = settings.log_every,
       .progress = cohort::Progress::kSilent,
       .on_nonfinite = settings.on_nonfinite,
       .preemption = {.checkpoint = settings.checkpoint},
       .schedule = cohort::testing::schedule_if(settings.schedule),
       .checkpoint = cohort::testing::checkpoints_in(settings.checkpoint_directory,
                                                     settings.checkpoint_every)});
  if (!settings.checkpoint.empty() && cohort::checkpoint::saved(settings.checkpoint)) {
    trainer.restore(settings.checkpoint);
  }
  const std::size_t stop_after = chief ? settings.chief_stops_after : 0;
  const Data data{
      .preempted = {.preempt = cohort::testing::PreemptAt(chief ? settings.preempt_after : -1),
                    .pause = std::chrono::milliseconds(settings.pause_ms)},
      .poisoned = settings.poison};
  const cohort::Report report =
      settings.validate_every != 0
          ? trainer.fit(data, {.steps = settings.steps},
                        cohort::validation(cohort::testing::small_held_out_data(),
                                           {.every_steps = settings.validate_every,
                                            .stop =
                                                [stop_after](const cohort::Report& so_far) {
                                                  return stop_after != 0 &&
                                                         so_far.validation.size() >= stop_after;
                                                }}))
          : trainer.fit(data, {.steps = settings.steps});
  std::printf("skipped %llu\n", static_cast<unsigned long long>(report.skipped_steps));
  std::printf("losses %zu\n", report.loss.size());
  for (const cohort::Evaluation& evaluation : report.validation) {
    std::printf("%s\n", cohort::testing::describe(evaluation).c_str());
  }
  if (report.stopped_early) {
    std::printf("stopped early after %llu steps, %zu evaluations\n",
                static_cast<unsigned long long>(report.steps), report.validation.size());
  }
  for (const cohort::strategy::MembershipChange& change : report.membership) {
    std::printf("membership %zu -> %zu at step %llu%s\n", change.workers_before,
                change.workers_after, static_cast<unsigned long long>(change.step),
                change.from_kept_state ? ", the state kept at that step rebuilt" : "");
  }
  if (report.preempted) return cohort::kExitPreempted;
  if (!settings.save_restore.empty()) {
    trainer.save(settings.save_restore);
    trainer.restore(settings.save_restore);
  }
  if (trainer.strategy().is_chief()) {  // a worker that became chief when the chief was lost
    cohort::testing::write_parameters(settings.out,
                                      cohort::testing::parameters_of(trainer.model()));
  }
  return 0;
}

template <class Strategy>
int train(const Settings& settings, Strategy strategy) {
  if (settings.fail_in_backward > 0) {
    return train(settings, std::move(strategy),
                 cohort::testing::FailingBackward{.model = cohort::testing::small_model(),
                                                  .fail_at = settings.fail_in_backward});
  }
  return settings.eigen_threads > 0
             ? train(settings, std::move(strategy),
                     cohort::testing::small_eigen_model(settings.eigen_threads))
             : train(settings, std::move(strategy), cohort::testing::small_model());
}

template <template <class> class Cross>
int train(const Settings& settings) {
  if (settings.mirrored) {
    return train(settings, cohort::strategy::Mirrored<>({.replicas = settings.local_replicas}));
  }
  using Strategy = cohort::strategy::MultiWorkerMirrored<cohort::device::Cpu, Cross>;
  typename Strategy::Options options{
      .local_replicas = settings.local_replicas,
      .connect_timeout = std::chrono::seconds(settings.connect_timeout_s),
      .timeout = std::chrono::seconds(settings.timeout_s),
      .bucket_bytes = 64,
      .elastic = {.min_workers = settings.min_workers, .max_workers = settings.max_workers}};
  if (settings.leaves_after_rendezvous) {
    const cohort::cluster::Spec spec = cohort::cluster::resolve();
    const cohort::transport::tcp::Tcp mesh(
        cohort::strategy::detail::tcp_options(spec, spec.rank, spec.size, options));
    std::fprintf(stderr, "multi_worker_trainer: connected\n");
    return 0;
  }
  return train(settings, Strategy(std::move(options)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring] [--eigen THREADS] "
                 "[--micro-batches M] [--seed S] [--learning-rate LR] [--max-gradient-norm N] "
                 "[--poison INDEX] "
                 "[--on-nonfinite raise|skip_step] [--mirrored] [--checkpoint FILE] "
                 "[--preempt-after N] [--fail-in-backward N] [--save-restore FILE] "
                 "[--schedule] [--checkpoint-directory DIR --checkpoint-every N] "
                 "[--pause-ms N] [--validate-every N [--chief-stops-after E]] "
                 "[--elastic MIN [--max-workers N]] [--connect-timeout-s N] [--timeout-s N] "
                 "[--log-every N] [--leaves-after-rendezvous]\n");
    return 64;
  }
  try {
    Settings settings;
    settings.local_replicas = std::stoul(argv[1]);
    settings.steps = std::stoull(argv[2]);
    settings.out = argv[3];
    for (int i = 4; i < argc; ++i) {
      const std::string flag = argv[i];
      const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
      if (flag == "ring") {
        settings.ring = true;
      } else if (flag == "--eigen") {
        settings.eigen_threads = std::stoul(next());
      } else if (flag == "--micro-batches") {
        settings.micro_batches = std::stoul(next());
      } else if (flag == "--seed") {
        settings.seed = std::stoull(next());
      } else if (flag == "--learning-rate") {
        settings.learning_rate = std::stod(next());
      } else if (flag == "--max-gradient-norm") {
        settings.max_gradient_norm = std::stod(next());
      } else if (flag == "--poison") {
        settings.poison = std::stoul(next());
      } else if (flag == "--mirrored") {
        settings.mirrored = true;
      } else if (flag == "--checkpoint") {
        settings.checkpoint = next();
      } else if (flag == "--preempt-after") {
        settings.preempt_after = std::stoi(next());
      } else if (flag == "--fail-in-backward") {
        settings.fail_in_backward = std::stoi(next());
      } else if (flag == "--save-restore") {
        settings.save_restore = next();
      } else if (flag == "--checkpoint-directory") {
        settings.checkpoint_directory = next();
      } else if (flag == "--checkpoint-every") {
        settings.checkpoint_every = std::stoull(next());
      } else if (flag == "--validate-every") {
        settings.validate_every = std::stoull(next());
      } else if (flag == "--chief-stops-after") {
        settings.chief_stops_after = std::stoul(next());
      } else if (flag == "--elastic") {
        settings.min_workers = std::stoul(next());
      } else if (flag == "--max-workers") {
        settings.max_workers = std::stoul(next());
      } else if (flag == "--connect-timeout-s") {
        settings.connect_timeout_s = std::stoi(next());
      } else if (flag == "--log-every") {
        settings.log_every = std::stoull(next());
      } else if (flag == "--timeout-s") {
        settings.timeout_s = std::stoi(next());
      } else if (flag == "--pause-ms") {
        settings.pause_ms = std::stoi(next());
      } else if (flag == "--leaves-after-rendezvous") {
        settings.leaves_after_rendezvous = true;
      } else if (flag == "--schedule") {
        settings.schedule = true;
      } else if (flag == "--on-nonfinite") {
        settings.on_nonfinite =
            next() == "skip_step" ? cohort::NonFinite::kSkipStep : cohort::NonFinite::kRaise;
      } else {
        std::fprintf(stderr, "multi_worker_trainer: unknown option %s\n", flag.c_str());
        return 64;
      }
    }
    return settings.ring ? train<cohort::collective::Ring>(settings)
                         : train<cohort::collective::Deterministic>(settings);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
