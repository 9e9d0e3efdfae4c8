// cohort-bench step: how long one synchronous training step spends synchronizing gradients, per
// strategy, against one plain all-reduce of the same bytes.
//
// The model is synthetic: P float parameters whose gradient is every element 1. Each step, on
// every replica: write the gradient, meet the other replicas at a barrier (so that skew in
// writing 400 MB does not count as synchronization), then synchronize exactly as the Trainer does
// (strategy.hpp: begin_step, gradients_ready, finish_step; the optimizer is plain SGD), twice:
//   without overlap  the whole gradient is ready at once, then finish_step;
//   with overlap     a synthetic backward pass of --backward-us microseconds of computation
//                    reports the gradient ready in --layers ranges, last first, as a model with
//                    gradient readiness does (core/model.hpp); then finish_step. The computation
//                    is a fixed amount of arithmetic, measured alone at the start to last that
//                    long, so that a backward pass that shares its core with the communication
//                    takes longer, as a model's would (a busy loop until a deadline would not).
//
//   sync     finish_step without overlap: all of the synchronization and the optimizer step,
//            what the Trainer reports as "comm" for a model without readiness
//   exposed  finish_step with overlap: what is left of it after the backward pass
//   hidden   1 - exposed / sync: the share of the synchronization hidden behind the backward
//   step     the whole step with overlap (backward + exposed); ideal: max(backward, sync)
//   plain    one all_reduce of the same P floats on a flat group of the same processes:
//            collective::Local over the replicas (mirrored), collective::Deterministic over
//            transport::tcp::Tcp between the workers (multi_worker_mirrored)
// Each is the slowest replica's per step; columns are means over steps, and p50/p99.
// sync / plain below 1 is what the strategy's bucketing saves; above 1 is what it and the
// optimizer cost.
//
// Memory per replica: 2 x P floats (parameters, gradient), 800 MB at 100M; the plain all-reduce
// runs after the strategy has freed them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends.hpp"
#include "cohort/cluster/binding.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/collective/local.hpp"
#include "cohort/optimizer/sgd.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/strategy/mirrored.hpp"
#include "cohort/strategy/multi_worker_mirrored.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/tcp/tcp.hpp"
#include "launch.hpp"
#include "machine.hpp"
#include "report.hpp"
#include "settings.hpp"

namespace cohort::bench {

struct StepRow {
  std::size_t parameters = 0;
  std::size_t bytes = 0;
  Measurement sync;
  Measurement exposed;
  Measurement step;
  Measurement plain;
  double hidden() const { return sync.time_us > 0 ? 1.0 - exposed.time_us / sync.time_us : 0.0; }
};

struct StepRun {
  std::string version;
  std::string strategy;
  std::string plain;  // what the plain all-reduce ran on
  int processes = 1;
  std::size_t local_replicas = 1;
  std::size_t replicas = 1;
  int steps = 0;
  int warmup_steps = 0;
  std::optional<strategy::detail::BucketSize> bucket;  // the strategy's; none for Mirrored
  double backward_us = 0;
  int layers = 1;
  std::string launcher;
  Machine machine;
};

inline std::string format_step_header(const StepRun& run) {
  std::string out;
  out += "# cohort-bench " + run.version + " step: strategy " + run.strategy + ", " +
         std::to_string(run.replicas) + " replicas (" + std::to_string(run.processes) +
         (run.processes == 1 ? " process x " : " processes x ") +
         std::to_string(run.local_replicas) + " local), float parameters, sgd\n";
  out += "# steps: " + std::to_string(run.steps) + " timed after " +
         std::to_string(run.warmup_steps) + " warm-up" +
         (run.bucket ? ", the gradient " + run.bucket->describe() : "") + "; synthetic backward " +
         detail::format("%.0f", run.backward_us) + " us in " + std::to_string(run.layers) +
         " layers; launched by " + run.launcher + "\n";
  out +=
      "# sync: finish_step without overlap (all-reduce + optimizer); exposed: finish_step after "
      "the backward that reports readiness; hidden: 1 - exposed / sync; step: backward + "
      "exposed; plain: one all_reduce of the same bytes on " +
      run.plain + "\n";
  out += "# machine: host " + run.machine.hostname + ", CPU " + run.machine.cpu_model + ", " +
         std::to_string(run.machine.cores) + " cores\n";
  out += "# times: the slowest replica's per step; columns are means over steps\n#\n";
  out +=
      detail::format("# %10s  %12s  %9s  %9s  %9s  %6s  %9s  %6s  %9s  %9s  %9s  %9s  %6s  %10s\n",
                     "params", "size", "sync", "sync p50", "sync p99", "busbw", "exposed", "hidden",
                     "step", "plain", "plain p50", "plain p99", "busbw", "sync/plain");
  out +=
      detail::format("# %10s  %12s  %9s  %9s  %9s  %6s  %9s  %6s  %9s  %9s  %9s  %9s  %6s  %10s\n",
                     "", "(B)", "(us)", "(us)", "(us)", "(GB/s)", "(us)", "(%)", "(us)", "(us)",
                     "(us)", "(us)", "(GB/s)", "");
  return out;
}

inline std::string format_step_row(const StepRow& row) {
  const auto time = [](double us) { return detail::format("%9.0f", us); };
  return detail::format(
      "%12zu  %12zu  %9s  %9s  %9s  %6.2f  %9s  %6.1f  %9s  %9s  %9s  %9s  %6.2f  %10.2f\n",
      row.parameters, row.bytes, time(row.sync.time_us).c_str(), time(row.sync.p50_us).c_str(),
      time(row.sync.p99_us).c_str(), row.sync.busbw, time(row.exposed.time_us).c_str(),
      100.0 * row.hidden(), time(row.step.time_us).c_str(), time(row.plain.time_us).c_str(),
      time(row.plain.p50_us).c_str(), time(row.plain.p99_us).c_str(), row.plain.busbw,
      row.plain.time_us > 0 ? row.sync.time_us / row.plain.time_us : 0.0);
}

inline nlohmann::json to_json(const StepRun& run, const std::vector<StepRow>& rows) {
  nlohmann::json j;
  j["tool"] = "cohort-bench";
  j["mode"] = "step";
  j["version"] = run.version;
  j["strategy"] = run.strategy;
  j["plain"] = run.plain;
  j["processes"] = run.processes;
  j["local_replicas"] = run.local_replicas;
  j["replicas"] = run.replicas;
  j["steps"] = run.steps;
  j["warmup_steps"] = run.warmup_steps;
  j["bucket_bytes"] = run.bucket ? nlohmann::json(run.bucket->bytes) : nlohmann::json(0);
  j["most_buckets"] = run.bucket && run.bucket->most != std::numeric_limits<std::size_t>::max()
                          ? nlohmann::json(run.bucket->most)
                          : nlohmann::json(nullptr);
  j["backward_us"] = run.backward_us;
  j["layers"] = run.layers;
  j["launcher"] = run.launcher;
  j["machine"] = {{"hostname", run.machine.hostname},
                  {"cpu_model", run.machine.cpu_model},
                  {"cores", run.machine.cores}};
  nlohmann::json results = nlohmann::json::array();
  for (const StepRow& row : rows) {
    results.push_back(
        {{"parameters", row.parameters},
         {"size_bytes", row.bytes},
         {"sync", to_json(row.sync)},
         {"exposed", to_json(row.exposed)},
         {"hidden", row.hidden()},
         {"step", to_json(row.step)},
         {"plain", to_json(row.plain)},
         {"sync_over_plain", row.plain.time_us > 0 ? row.sync.time_us / row.plain.time_us : 0.0}});
  }
  j["results"] = results;
  return j;
}

namespace detail {

using StepClock = std::chrono::steady_clock;

inline double since(StepClock::time_point start) {
  return std::chrono::duration<double>(StepClock::now() - start).count();
}

// Per-step times of one replica, and the element-wise max into `slowest`.
inline void keep_max(std::vector<double>& slowest, const std::vector<double>& mine) {
  for (std::size_t i = 0; i < mine.size(); ++i) slowest[i] = std::max(slowest[i], mine[i]);
}

// A synthetic computation of `units` dependent multiply-adds, which no compiler folds.
inline std::uint64_t compute_units(std::uint64_t units) {
  std::uint64_t x = 1;
  for (std::uint64_t i = 0; i < units; ++i) x = x * 6364136223846793005u + 1442695040888963407u;
  return x;
}

// compute_units per second on this core alone: the fastest of 5 runs of 20 ms.
inline double compute_units_per_second() {
  constexpr std::uint64_t kUnits = 1'000'000;
  double best = 0.0;
  volatile std::uint64_t sink = 0;
  for (int run = 0; run < 5; ++run) {
    const auto start = StepClock::now();
    std::uint64_t units = 0;
    while (since(start) < 0.02) {
      sink = sink + compute_units(kUnits);
      units += kUnits;
    }
    best = std::max(best, static_cast<double>(units) / since(start));
  }
  return best;
}

// The computation that lasts `seconds` alone, at `rate` units per second.
inline void compute_for(double seconds, double rate) {
  volatile std::uint64_t sink = compute_units(static_cast<std::uint64_t>(seconds * rate));
  (void)sink;
}

// Per timed step, the slowest replica's times over the whole job (max-reduced through the
// replicas' own communicator, so across processes too).
struct StepTimes {
  std::vector<double> sync;     // finish_step, the whole gradient ready at once
  std::vector<double> exposed;  // finish_step after the backward that reports readiness
  std::vector<double> step;     // that backward and finish_step
};

// Runs the synthetic steps on every local replica of `strategy`, each step without then with
// overlap (the file's opening comment).
template <class Strategy>
StepTimes time_strategy_steps(Strategy& strategy, const StepSettings& s, std::size_t parameters) {
  const optimizer::Sgd sgd({.learning_rate = 1e-6});
  const std::size_t steps = static_cast<std::size_t>(s.steps);
  StepTimes slowest{std::vector<double>(steps), std::vector<double>(steps),
                    std::vector<double>(steps)};
  std::mutex mutex;
  const double inverse_batch = 1.0 / static_cast<double>(strategy.replicas());
  const std::size_t layers = static_cast<std::size_t>(s.layers);
  const double rate = s.backward_us > 0 ? compute_units_per_second() : 0.0;
  strategy.run([&](auto& replica) {
    std::vector<float> model(parameters, 0.0f);
    std::vector<float> gradient(parameters, 0.0f);
    std::vector<double> times(3 * steps, 0.0);  // sync, exposed, step
    const int total = s.warmup_steps + s.steps;
    const auto one_step = [&](int step, bool overlap) {
      std::fill(gradient.begin(), gradient.end(), 1.0f);  // the gradient, as forward_backward
      replica.communicator().barrier();
      strategy::Update<float, optimizer::Sgd> u{.parameters = std::span<float>(model),
                                                .gradient_sum = std::span<float>(gradient),
                                                .optimizer = sgd,
                                                .optimizer_state = std::span<float>(),
                                                .step = static_cast<std::uint64_t>(step),
                                                .inverse_batch = inverse_batch};
      const auto start = StepClock::now();
      replica.begin_step(u);
      if (overlap) {
        for (std::size_t layer = layers; layer-- > 0;) {
          compute_for(s.backward_us * 1e-6 / static_cast<double>(layers), rate);
          replica.gradients_ready(u, layer * parameters / layers,
                                  (layer + 1) * parameters / layers);
        }
      } else {
        replica.gradients_ready(u, 0, parameters);
      }
      const auto finish = StepClock::now();
      replica.finish_step(u);
      return std::pair{since(finish), since(start)};
    };
    for (int step = 0; step < total; ++step) {
      const double sync = one_step(step, false).first;
      const auto [exposed, whole] = one_step(step, true);
      if (step >= s.warmup_steps) {
        const std::size_t i = static_cast<std::size_t>(step - s.warmup_steps);
        times[i] = sync;
        times[steps + i] = exposed;
        times[2 * steps + i] = whole;
      }
    }
    replica.communicator().all_reduce(std::span<double>(times), ReduceOp::kMax);
    const std::lock_guard lock(mutex);
    keep_max(slowest.sync, std::vector<double>(times.begin(), times.begin() + steps));
    keep_max(slowest.exposed,
             std::vector<double>(times.begin() + steps, times.begin() + 2 * steps));
    keep_max(slowest.step, std::vector<double>(times.begin() + 2 * steps, times.end()));
  });
  return slowest;
}

// One plain all_reduce of `parameters` floats per step on `comm`; the slowest rank's times.
template <collective::Communicator C>
std::vector<double> time_plain_all_reduce(C& comm, const StepSettings& s, std::size_t parameters) {
  std::vector<float> buffer(parameters, 0.0f);
  std::vector<double> times(static_cast<std::size_t>(s.steps), 0.0);
  for (int step = 0; step < s.warmup_steps + s.steps; ++step) {
    std::fill(buffer.begin(), buffer.end(), 1.0f);
    comm.barrier();
    const auto start = StepClock::now();
    comm.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
    const double seconds = since(start);
    if (step >= s.warmup_steps) times[static_cast<std::size_t>(step - s.warmup_steps)] = seconds;
  }
  comm.all_reduce(std::span<double>(times), ReduceOp::kMax);
  return times;
}

inline StepRow step_row(std::size_t parameters, std::size_t replicas, int plain_ranks,
                        const StepTimes& times, const std::vector<double>& plain) {
  StepRow row;
  row.parameters = parameters;
  row.bytes = parameters * sizeof(float);
  const int n = static_cast<int>(replicas);
  row.sync = measure(Collective::kAllReduce, row.bytes, n, times.sync, -1, 0);
  row.exposed = measure(Collective::kAllReduce, row.bytes, n, times.exposed, -1, 0);
  row.step = measure(Collective::kAllReduce, row.bytes, n, times.step, -1, 0);
  row.plain = measure(Collective::kAllReduce, row.bytes, plain_ranks, plain, -1, 0);
  return row;
}

inline int finish_step(const StepSettings& s, const StepRun& run,
                       const std::vector<StepRow>& rows) {
  if (!s.json.empty() && !write_json(s.json, to_json(run, rows))) return kExitWrong;
  print("#\n");
  return 0;
}

inline int step_mirrored(const StepSettings& s, const Context& context) {
  const cluster::Spec spec = cluster::resolve();
  if (spec.size > 1) {
    throw ConfigError(
        "the mirrored strategy runs every replica as a thread of one process, but "
        "this process was started as " +
        cluster::describe(spec));
  }
  const int replicas = s.processes.value_or(2);
  const Watchdog watchdog(s.timeout_s);
  StepRun run{.version = context.version,
              .strategy = "mirrored",
              .plain = "collective::Local over the same " + std::to_string(replicas) + " threads",
              .processes = 1,
              .local_replicas = static_cast<std::size_t>(replicas),
              .replicas = static_cast<std::size_t>(replicas),
              .steps = s.steps,
              .warmup_steps = s.warmup_steps,
              .bucket = std::nullopt,
              .backward_us = s.backward_us,
              .layers = s.layers,
              .launcher = "cohort-bench (threads of one process)",
              .machine = this_machine()};
  print(format_step_header(run));
  std::vector<StepRow> rows;
  for (const std::size_t parameters : s.parameters) {
    StepTimes times;
    {
      strategy::Mirrored<> mirrored({.replicas = static_cast<std::size_t>(replicas)});
      times = time_strategy_steps(mirrored, s, parameters);
    }
    std::vector<double> plain(static_cast<std::size_t>(s.steps), 0.0);
    {
      collective::Local local({.ranks = replicas});
      std::vector<std::vector<double>> each(static_cast<std::size_t>(replicas));
      std::vector<std::jthread> threads;
      for (int r = 0; r < replicas; ++r) {
        threads.emplace_back([&, r] {
          collective::LocalCommunicator comm = local.communicator(r);
          each[static_cast<std::size_t>(r)] = time_plain_all_reduce(comm, s, parameters);
        });
      }
      threads.clear();  // joins
      plain = each[0];
    }
    rows.push_back(
        step_row(parameters, static_cast<std::size_t>(replicas), replicas, times, plain));
    print(format_step_row(rows.back()));
  }
  return finish_step(s, run, rows);
}

inline int step_multi_worker(const StepSettings& s, const Context& context) {
  const cluster::Spec spec = cluster::resolve();
  if (spec.source == cluster::source::kNone) {
    const int processes = s.processes.value_or(2);
    if (processes > 1) {
      return launch_self(context.arguments, {.processes = processes, .timeout_s = s.timeout_s});
    }
  } else if (s.processes && *s.processes != spec.size) {
    throw ConfigError("--np " + std::to_string(*s.processes) + " but this process was started as " +
                      cluster::describe(spec) + "; leave --np out under a launcher");
  }
  const Watchdog watchdog(launched_by_self() ? 0 : s.timeout_s);
  const std::string job = spec.job_id.empty() ? "cohort-bench" : spec.job_id;
  const bool printer = spec.rank == 0;
  const std::optional<std::size_t> bucket_bytes =
      s.bucket_bytes != 0 ? std::optional<std::size_t>(s.bucket_bytes) : std::nullopt;
  // The plain all-reduces go where the strategy's do: through shared memory where every worker
  // is on this host, unless COHORT_SHARED_MEMORY=0 (Options::shared_memory).
  const bool shared_memory =
      strategy::detail::with_environment(strategy::MultiWorkerMirrored<>::Options{}).shared_memory;
  StepRun run{.version = context.version,
              .strategy = "multi_worker_mirrored",
              .plain = "collective::Deterministic over transport::tcp::Tcp between the " +
                       std::to_string(spec.size) + " workers",
              .processes = spec.size,
              .local_replicas = s.local_replicas,
              .replicas = static_cast<std::size_t>(spec.size) * s.local_replicas,
              .steps = s.steps,
              .warmup_steps = s.warmup_steps,
              .bucket = std::nullopt,
              .backward_us = s.backward_us,
              .layers = s.layers,
              .launcher = launcher_of(spec),
              .machine = this_machine()};
  const auto timeout = std::chrono::milliseconds(
      s.timeout_s > 0 ? static_cast<long long>(s.timeout_s * 1000) : 5 * 60 * 1000);

  // The plain all-reduces first, on a mesh of their own, closed before the strategy meets.
  std::vector<std::vector<double>> plain;
  {
    collective::Deterministic<transport::tcp::Tcp> comm(transport::tcp::Tcp(transport::tcp::Options{
        .rank = spec.rank,
        .size = spec.size,
        .job_id = job + "-plain",
        .rendezvous_host = spec.master_address,
        .rendezvous_port = spec.master_port,
        .bind_address = cluster::choose_binding(spec, "").address,
        .secret = environment_or("COHORT_SECRET", ""),
        .operation_timeout = timeout,
    }));
    if (comm.share_host_memory(shared_memory, comm.transport().options().spin).shared)
      run.plain += ", through shared memory";
    for (const std::size_t parameters : s.parameters) {
      plain.push_back(time_plain_all_reduce(comm, s, parameters));
    }
  }
  strategy::MultiWorkerMirrored<> strategy({.local_replicas = s.local_replicas,
                                            .cluster = {.job_id = job + "-strategy"},
                                            .timeout = timeout,
                                            .bucket_bytes = bucket_bytes});
  run.bucket = strategy.bucket();
  if (printer) print(format_step_header(run));
  std::vector<StepRow> rows;
  for (std::size_t i = 0; i < s.parameters.size(); ++i) {
    const StepTimes times = time_strategy_steps(strategy, s, s.parameters[i]);
    rows.push_back(step_row(s.parameters[i], run.replicas, spec.size, times, plain[i]));
    if (printer) print(format_step_row(rows.back()));
  }
  return printer ? finish_step(s, run, rows) : 0;
}

}  // namespace detail

inline int run_step(const StepSettings& s, const Context& context) {
  if (s.strategy == "mirrored") return detail::step_mirrored(s, context);
  if (s.strategy == "multi_worker_mirrored") return detail::step_multi_worker(s, context);
  throw ConfigError("--strategy '" + s.strategy +
                    "' is not one of mirrored, multi_worker_mirrored");
}

}  // namespace cohort::bench
