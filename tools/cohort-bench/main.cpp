// cohort-bench: the collective microbenchmark, in nccl-tests' terms, for every cohort path.
//
//   cohort-bench all_reduce --backend tcp --np 4 -b 8 -e 64M -f 4 -c 1
//   cohort-bench broadcast --backend local --np 4 -b 1K -e 16M -f 4 -r 1 --json out.json
//   mpirun -np 4 cohort-bench all_gather --backend tcp -b 1M -e 64M -f 2
//   cohort-bench step --strategy multi_worker_mirrored --np 2 --params 1M,10M,100M
//   cohort-bench all_reduce --backend nccl --np 8 -b 8 -e 256M -f 4 --algorithm nccl
//
//   cohort-bench push_pull --backend ps --np 2 --ps 2 -b 1M -e 64M -f 4 -c 1
//   cohort-bench predict --measured tcp.json,shm.json --params 25M --compute-ms 100
//
// Collectives: all_reduce, broadcast, all_gather, reduce_scatter, and the parameter server's
// push_pull (backends.hpp says which backend
// runs which, sweep.hpp how they are measured, report.hpp what the columns mean). The flags are
// nccl-tests': -b -e -f -i -n -w -c -o -d -r. Exit status: 0 when every checked value was right,
// 1 when any was wrong or a rank failed, 2 for bad settings or a backend that cannot run here
// (nccl in a build without CUDA or on a machine without a GPU), 124 when --timeout-s stopped the
// run. docs/benchmarks.md, "## cohort-bench", is the manual.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends.hpp"
#include "cohort/core/error.hpp"
#include "predict.hpp"
#include "settings.hpp"
#include "step.hpp"

#ifndef COHORT_BENCH_VERSION
#define COHORT_BENCH_VERSION "unknown"
#endif

namespace {

using namespace cohort::bench;

// A byte count flag with nccl-tests' K/M/G suffixes.
void add_bytes(CLI::App& app, const std::string& flags, std::size_t& target,
               const std::string& help) {
  app.add_option_function<std::string>(
         flags,
         [&target, flags](const std::string& text) {
           const std::optional<std::size_t> bytes = parse_bytes(text);
           if (!bytes) {
             throw CLI::ValidationError(flags, "'" + text +
                                                   "' is not a byte count (digits, then "
                                                   "optionally K, M or G)");
           }
           target = *bytes;
         },
         help)
      ->type_name("BYTES");
}

// A comma-separated list flag of counts that `parse` reads (parse_bytes, parse_parameter_count);
// an item it cannot read is refused, saying what it is not.
void add_counts(CLI::App& app, const std::string& flag, std::vector<std::size_t>& target,
                std::optional<std::size_t> (*parse)(std::string_view), const std::string& what,
                const std::string& help) {
  app.add_option_function<std::vector<std::string>>(
         flag,
         [&target, flag, parse, what](const std::vector<std::string>& list) {
           target.clear();
           for (const std::string& text : list) {
             const std::optional<std::size_t> count = parse(text);
             if (!count) throw CLI::ValidationError(flag, "'" + text + "' is not " + what);
             target.push_back(*count);
           }
         },
         help)
      ->delimiter(',');
}

void add_collective_options(CLI::App& app, Settings& s) {
  add_bytes(app, "-b,--minbytes", s.min_bytes, "smallest size, e.g. 8, 64K, 1M (default 32M)");
  add_bytes(app, "-e,--maxbytes", s.max_bytes, "largest size (default 32M)");
  app.add_option("-f,--stepfactor", s.step_factor, "multiply the size by this each step")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  add_bytes(app, "-i,--stepbytes", s.step_bytes, "add this each step when -f is 1 (default 1M)");
  app.add_option("-n,--iters", s.iters, "timed iterations per size and placement")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("-w,--warmup_iters", s.warmup_iters,
                 "untimed iterations at the largest and the smallest size before the sweep")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  app.add_option_function<int>(
         "-c,--check", [&s](int c) { s.check = c != 0; },
         "check every element of every result (1) or not (0); default 1")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option_function<std::string>(
         "-o,--op",
         [&s](const std::string& op) {
           const std::map<std::string, cohort::ReduceOp> ops{
               {"sum", cohort::ReduceOp::kSum},
               {"prod", cohort::ReduceOp::kProduct},
               {"min", cohort::ReduceOp::kMin},
               {"max", cohort::ReduceOp::kMax},
               {"sum_bf16", cohort::ReduceOp::kSumBfloat16},
               {"sum_fp16", cohort::ReduceOp::kSumFloat16}};
           s.op = ops.at(op);
         },
         "reduce op: sum, prod, min, max, sum_bf16 or sum_fp16 (a sum whose every partial sum "
         "is rounded to bfloat16 or float16, on the wire in 2 bytes an element; float only) "
         "(default sum)")
      ->check(CLI::IsMember({"sum", "prod", "min", "max", "sum_bf16", "sum_fp16"}));
  app.add_option_function<std::string>(
         "-d,--datatype",
         [&s](const std::string& type) {
           const std::map<std::string, Element> types{{"float", Element::kFloat},
                                                      {"double", Element::kDouble},
                                                      {"int32", Element::kInt32},
                                                      {"int64", Element::kInt64}};
           s.element = types.at(type);
         },
         "element type: float, double, int32, int64 (default float)")
      ->check(CLI::IsMember({"float", "double", "int32", "int64"}));
  app.add_option("-r,--root", s.root, "root rank of broadcast")->capture_default_str();
  app.add_option("--backend", s.backend, "local, tcp, shm, ps (push_pull only) or nccl")
      ->capture_default_str();
  app.add_option_function<std::string>(
      "--algorithm", [&s](const std::string& a) { s.algorithm = a; },
      "tcp: deterministic (default) or ring; nccl: deterministic (default) or nccl");
  app.add_option_function<int>(
         "--np", [&s](int n) { s.processes = n; },
         "ranks: threads (local) or processes this program starts (tcp, nccl); default 2, or what "
         "a launcher says")
      ->check(CLI::Range(1, 4096));
  app.add_option_function<int>(
         "--ps", [&s](int n) { s.servers = n; },
         "ps backend: parameter-server processes this program starts (default 1; --np are the "
         "workers)")
      ->check(CLI::Range(1, 4096));
  app.add_option_function<std::string>(
         "--bind", [&s](const std::string& bind) { s.bind = bind == "core"; },
         "processes this program starts: core (default) runs rank r on the r-th CPU it may use, "
         "as mpirun binds ranks, where there are no more ranks than CPUs; none leaves them to "
         "the scheduler")
      ->check(CLI::IsMember({"core", "none"}));
  app.add_option("--json", s.json, "also write every figure to this JSON file (rank 0)");
  app.add_option_function<int>(
         "--checksum", [&s](int c) { s.checksum = c != 0; },
         "tcp: frame checksums on (1, the transport's default) or off (0)")
      ->check(CLI::Range(0, 1));
  app.add_flag("--shared-buffer", s.shared_buffer,
               "shm: the receive buffer lies in the shared segment, as MultiWorkerMirrored's "
               "gradient sum (Deterministic::share_buffer): nothing is copied in or out");
  app.add_option("--timeout-s", s.timeout_s,
                 "stop the run after this many seconds (and bound each tcp transfer and nccl "
                 "collective); 0: none")
      ->check(CLI::Range(0.0, 1e6));
  // Test only: makes the check fail on purpose (tests/bench/); hidden from --help.
  app.add_flag("--corrupt-reduction", s.corrupt)->group("");
}

void add_step_options(CLI::App& app, StepSettings& s) {
  app.add_option("--strategy", s.strategy, "mirrored or multi_worker_mirrored")
      ->capture_default_str();
  app.add_option_function<int>(
         "--np", [&s](int n) { s.processes = n; },
         "replicas (mirrored) or worker processes (multi_worker_mirrored); default 2")
      ->check(CLI::Range(1, 4096));
  app.add_option("--local-replicas", s.local_replicas,
                 "multi_worker_mirrored: replica threads per worker (a power of two)")
      ->capture_default_str();
  add_counts(app, "--params", s.parameters, parse_parameter_count,
             "a parameter count (e.g. 1M, 10M, 100M, 250K)",
             "model sizes in parameters, comma-separated: 1M,10M,100M (M = 10^6); default 1M");
  app.add_option("--steps", s.steps, "timed steps per size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--warmup-steps", s.warmup_steps, "untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  add_bytes(
      app, "--bucket-bytes", s.bucket_bytes,
      "multi_worker_mirrored: bytes per cross-worker bucket (default: the strategy's choice)");
  app.add_option("--backward-us", s.backward_us,
                 "a synthetic backward pass of this many microseconds of computation per step, "
                 "which reports the gradient ready layer by layer: the overlap column says how "
                 "much synchronization hides behind it")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e8));
  app.add_option("--layers", s.layers, "the layers of that backward pass, each reported ready")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--json", s.json, "also write every figure to this JSON file (rank 0)");
  app.add_option("--timeout-s", s.timeout_s, "stop the run after this many seconds; 0: none")
      ->check(CLI::Range(0.0, 1e6));
}

void add_predict_options(CLI::App& app, PredictSettings& s) {
  app.add_option("--measured", s.measured,
                 "cohort-bench all_reduce --json reports the costs are fitted to, comma-separated; "
                 "FILE@HxP for one measured over H hosts of P ranks (default: one host); without "
                 "it, 2 ranks over TCP and through shared memory on this host, measured first")
      ->delimiter(',');
  app.add_option("--check", s.check,
                 "reports (FILE[@HxP]) to check the fitted model against, size by size")
      ->delimiter(',');
  app.add_option("--cores", s.cores,
                 "the cores the ranks of each report shared, where fewer than its ranks "
                 "(network-namespace hosts of one machine): a core's costs count ranks / cores "
                 "times there; 0: a core per rank")
      ->capture_default_str();
  add_counts(app, "--params", s.parameters, parse_parameter_count,
             "a parameter count (e.g. 25M, 1.5G)",
             "model sizes in parameters to predict a step of, comma-separated (M = 10^6)");
  app.add_option("--compute-ms", s.compute_ms,
                 "one replica's forward and backward pass of a step, in milliseconds");
  app.add_option("--backward-fraction", s.backward_fraction,
                 "the part of that computation which is the backward pass")
      ->capture_default_str();
  app.add_option("--hosts", s.hosts, "host counts, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--per-host", s.per_host, "ranks per host")->capture_default_str();
  app.add_option("--gbits", s.gbits, "link rates in Gbit/s, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--latency-us", s.latency_us,
                 "what each message adds between hosts, in microseconds")
      ->capture_default_str();
  add_counts(app, "--bucket-bytes", s.bucket_bytes, parse_bytes, "a byte count (e.g. 256K, 4M)",
             "bucket sizes to try, comma-separated (default 256K,4M,32M)");
  app.add_option_function<std::string>(
         "--wire", [&s](const std::string& wire) { s.wire_bytes = wire == "fp32" ? 4 : 2; },
         "the gradient's type on the wire: fp32 (default), bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cohort-bench: collective bandwidth in nccl-tests' terms (size, count, type, redop, root, "
      "time, algbw, busbw, #wrong; out-of-place and in-place), plus p50/p99 and JSON.",
      "cohort-bench"};
  app.require_subcommand(1);
  std::string backends_help = "Backends:\n";
  for (const Backend& b : kBackends) {
    char name[16];
    std::snprintf(name, sizeof name, "  %-7s ", std::string(b.name).c_str());
    backends_help += name + std::string(b.summary) + "\n";
  }
  app.footer(backends_help + "docs/benchmarks.md has the manual.");

  Settings settings;
  std::vector<CLI::App*> collectives;
  for (const CollectiveInfo& c : kCollectives) {
    CLI::App* sub = app.add_subcommand(std::string(c.name), "measure " + std::string(c.name));
    add_collective_options(*sub, settings);
    collectives.push_back(sub);
  }
  StepSettings step;
  CLI::App* step_app = app.add_subcommand(
      "step",
      "time one training step's gradient synchronization per strategy against a plain "
      "all_reduce of the same bytes");
  add_step_options(*step_app, step);
  PredictSettings predict;
  CLI::App* predict_app = app.add_subcommand(
      "predict",
      "fit the cost model to all_reduce reports, check it against others, and predict the "
      "all-reduce and a training step of H hosts of P ranks on faster links");
  add_predict_options(*predict_app, predict);
  CLI11_PARSE(app, argc, argv);

  if (const char* corrupt = std::getenv("COHORT_BENCH_CORRUPT");
      corrupt != nullptr && std::string(corrupt) == "1") {
    settings.corrupt = true;
  }
  const Context context{std::vector<std::string>(argv, argv + argc), COHORT_BENCH_VERSION};
  try {
    if (step_app->parsed()) return run_step(step, context);
    if (predict_app->parsed()) return run_predict(predict, context.arguments.front());
    for (std::size_t i = 0; i < collectives.size(); ++i) {
      if (collectives[i]->parsed()) settings.collective = kCollectives[i].collective;
    }
    if (settings.min_bytes > settings.max_bytes) {
      throw cohort::ConfigError("-b/--minbytes " + std::to_string(settings.min_bytes) +
                                " is larger than -e/--maxbytes " +
                                std::to_string(settings.max_bytes));
    }
    const Backend* backend = find_backend(settings.backend);
    if (backend == nullptr) {
      throw cohort::ConfigError("--backend '" + settings.backend +
                                "' is not one of local, tcp, shm, ps, nccl");
    }
    if (cohort::rounds_nodes(settings.op) && settings.element != Element::kFloat) {
      throw cohort::ConfigError("-o/--op " + std::string(cohort::name(settings.op)) +
                                " reduces float only (-d float)");
    }
    if (settings.servers && settings.backend != "ps") {
      throw cohort::ConfigError("--ps applies to the ps backend only (--backend ps)");
    }
    if (settings.shared_buffer && settings.backend != "shm") {
      throw cohort::ConfigError("--shared-buffer applies to the shm backend only (--backend shm)");
    }
    if (const std::optional<std::string> why = backend->unavailable()) {
      detail::say(*why);
      return kExitUnavailable;
    }
    if (!backend->supports(settings.collective)) {
      throw cohort::ConfigError(
          "the " + settings.backend + " backend does not run " +
          std::string(info(settings.collective).name) +
          (settings.collective == Collective::kPushPull
               ? " (the parameter server's operation): use --backend ps --np W --ps S"
               : " (the ps backend runs push_pull only): use --backend local or tcp"));
    }
    return backend->run(settings, context);
  } catch (const cohort::ConfigError& e) {
    detail::say(e.what());
    return kExitUnavailable;
  } catch (const std::exception& e) {
    detail::say(e.what());
    return kExitWrong;
  }
}
