// The backends cohort-bench measures, as one table: a name, what it is, which collectives it runs,
// whether it can run here, and how.
//
//   local   collective::Local: every rank a thread of this process
//   tcp     collective::Deterministic or collective::Ring over transport::tcp::Tcp, one process
//           per rank (started by cohort-bench itself, or by cohort-run, mpirun, torchrun, Slurm or
//           a TFJob: whatever cluster::resolve() finds)
//   shm     collective::Deterministic over transport::tcp::Tcp with its all-reduce through shared
//           memory (share_host_memory), as MultiWorkerMirrored's processes of one host; every
//           rank on this host, launched as tcp's; the other collectives stay on TCP
//   ps      the parameter server's push_pull (push_pull.hpp): --np worker processes and --ps
//           server processes, started by cohort-bench itself, by cohort-run --ps or a TFJob
//   nccl    collective::NcclCommunicator, one process per rank and one GPU each (the GPU at
//           index local_rank), launched as tcp's; the NCCL unique id and the sweep's bookkeeping
//           travel over a Deterministic<Tcp> beside it (sweep.hpp's control communicator), and
//           the buffers live in device memory (device_memory.hpp). Only in CUDA builds
//           (COHORT_BENCH_NCCL); elsewhere, and on a machine without a GPU, asking for it says why
//           and fails, never printing a number
//
// Adding one: a Collective entry in report.hpp with its shape and factors (if it is a new
// operation), then a row here whose supports() accepts it and whose run() drives it. The table,
// footer, JSON and launcher are shared.
//
// The runtime choice is made once, here, at the edge: each run() instantiates the measurement
// (sweep.hpp) for its communicator type, so no timed call goes through a virtual function.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/collective/local.hpp"
#include "cohort/collective/ring.hpp"
#include "cohort/core/error.hpp"
#include "cohort/strategy/detail/tcp_options.hpp"
#include "cohort/transport/tcp/tcp.hpp"
#include "launch.hpp"
#include "machine.hpp"
#include "push_pull.hpp"
#include "report.hpp"
#include "settings.hpp"
#include "sweep.hpp"

#if defined(COHORT_BENCH_NCCL)
#include <nccl.h>

#include "cohort/collective/nccl.hpp"
#include "cohort/device/cuda.hpp"
#include "device_memory.hpp"
#endif

namespace cohort::bench {

// What every backend is given besides the settings.
struct Context {
  std::vector<std::string> arguments;  // this program's argv, to start copies of itself
  std::string version;
};

struct Backend {
  std::string_view name;
  std::string_view summary;
  bool (*supports)(Collective);
  // Why it cannot run on this build or machine; nullopt when it can.
  std::optional<std::string> (*unavailable)();
  int (*run)(const Settings&, const Context&);
};

// Exit statuses of cohort-bench.
inline constexpr int kExitWrong = 1;        // a wrong value, or a rank failed
inline constexpr int kExitUnavailable = 2;  // bad settings, or a backend that cannot run here

namespace detail {

inline void say(const std::string& line) {
  std::fprintf(stderr, "cohort-bench: %s\n", line.c_str());
}

using strategy::detail::environment_or;

// Who started this rank, for the header.
inline std::string launcher_of(const cluster::Spec& spec) {
  const char* ours = std::getenv(std::string(kLaunchedVariable).c_str());
  if (ours != nullptr && spec.source == cluster::source::kCohort) {
    return std::string(ours) + " (COHORT_* variables)";
  }
  return spec.source;
}

inline RunInfo run_info(const Settings& s, const Context& context, std::string backend,
                        std::string algorithm, std::string details, int ranks,
                        std::string launcher) {
  RunInfo run;
  run.version = context.version;
  run.collective = s.collective;
  run.backend = std::move(backend);
  run.algorithm = std::move(algorithm);
  run.details = std::move(details);
  run.ranks = ranks;
  run.launcher = std::move(launcher);
  run.type = std::string(name(s.element));
  run.op = std::string(cohort::name(s.op));
  run.root = s.root;
  run.min_bytes = s.min_bytes;
  run.max_bytes = s.max_bytes;
  run.step_factor = s.step_factor;
  run.step_bytes = s.step_bytes;
  run.iters = s.iters;
  run.warmup_iters = s.warmup_iters;
  run.shared_buffer = s.shared_buffer;
  run.check = s.check;
  run.machine = this_machine();
  return run;
}

inline bool write_json(const std::string& file, const nlohmann::json& json) {
  std::ofstream out(file);
  out << json.dump(2) << '\n';
  out.close();
  if (!out) {
    say("cannot write the JSON report to '" + file + "'");
    return false;
  }
  return true;
}

inline void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

// One measured run on one rank: every rank measures (measure(on_row) returns the rows, calling
// on_row as each is done); rank 0 prints the header, each row as it comes, the footer, and writes
// the JSON. comm is the control communicator (sweep.hpp); device_name is this rank's GPU, "" on
// the CPU. Returns the exit status (kExitWrong when any element was wrong on any rank).
template <class Comm, class Measure>
int report_sweep(Comm& comm, const Settings& s, RunInfo run, const std::string& device_name,
                 Measure&& measure) {
  run.rank_info = gather_rank_info(comm, static_cast<long>(::getpid()), host_name(), device_name,
                                   cpu_list(usable_cpus()));
  const bool printer = comm.rank() == 0;
  if (printer) print(format_header(run));
  const std::vector<Row> rows = measure([&](const Row& row) {
    if (printer) print(format_row(row));
  });
  const Summary summary = summarize(rows);
  bool written = true;
  if (printer) {
    print(format_footer(summary));
    if (!s.json.empty()) written = write_json(s.json, to_json(run, rows));
  }
  return summary.out_of_bounds != 0 || !written ? kExitWrong : 0;
}

// The sweep of a collective on one rank, in host memory (or in its shared buffer:
// --shared-buffer), comm its own control communicator.
template <collective::Communicator C>
int sweep_on_rank(C& comm, const Settings& s, RunInfo run) {
  return report_sweep(comm, s, std::move(run), "", [&](const auto& on_row) {
    return with_element(s.element, [&]<class T>() {
      HostMemory<T> memory;
      if constexpr (requires { comm.template share_buffer<T>(std::size_t{}); }) {
        // A collective: every rank allocates at the same point of the sweep.
        const auto lend = [&comm](std::size_t count) {
          const auto shared = comm.template share_buffer<T>(count);
          if (shared.values.size() != count) {
            throw ConfigError("--shared-buffer: no shared buffer of " + std::to_string(count) +
                              " elements" +
                              (shared.why_not.empty() ? std::string(" (--backend shm only)")
                                                      : ": " + shared.why_not));
          }
          return shared.values;
        };
        if (s.shared_buffer) memory = HostMemory<T>(lend);
      }
      Sweep sweep(comm, comm, std::move(memory), s);
      return sweep.run(on_row);
    });
  });
}

inline void check_root(const Settings& s, int ranks) {
  if (info(s.collective).rooted && (s.root < 0 || s.root >= ranks)) {
    throw ConfigError("-r/--root " + std::to_string(s.root) + " is not a rank of " +
                      std::to_string(ranks));
  }
}

// The TCP transport of rank `rank` of `size` as the flags set it: what the tcp and ps backends
// measure, and what the nccl backend carries its unique id and its bookkeeping over.
inline transport::tcp::Options tcp_options(const Settings& s, const cluster::Spec& spec, int rank,
                                           int size) {
  // What a strategy's options give the transport, with --timeout-s as both deadlines.
  struct Deadlines {
    std::string bind_address{};
    std::string secret{};
    std::string listen_ports{};
    std::chrono::milliseconds connect_timeout, timeout;
  };
  const auto milliseconds = std::chrono::milliseconds(static_cast<long long>(s.timeout_s * 1000));
  transport::tcp::Options options = strategy::detail::tcp_options(
      spec, rank, size,
      Deadlines{.connect_timeout = s.timeout_s > 0 ? milliseconds : std::chrono::seconds(60),
                .timeout = s.timeout_s > 0 ? milliseconds : std::chrono::minutes(5)});
  if (spec.job_id.empty()) options.job_id = "cohort-bench";
  options.checksum = s.checksum;
  return options;
}

// What guards the frames, for the header line: under a secret a MAC takes the checksum's place.
inline std::string frame_protection(const Settings& s, const transport::tcp::Options& options) {
  if (options.encrypt) return "frames encrypted (AES-256-GCM, COHORT_ENCRYPT)";
  if (!options.secret.empty()) return "frame MACs (GMAC, COHORT_SECRET)";
  return std::string("frame checksums ") + (s.checksum ? "on" : "off");
}

// A backend of one process per rank (tcp, nccl): checks --algorithm against `algorithms` (the
// first is the default), then, under no launcher, starts --np copies of this program and returns
// their exit status; in a rank, returns rank(spec, algorithm), run under the watchdog when another
// launcher started it. Checks --np and --root.
template <class Rank>
int run_ranks(const Settings& s, const Context& context,
              std::initializer_list<std::string_view> algorithms, Rank&& rank) {
  const std::string algorithm = s.algorithm.value_or(std::string(*algorithms.begin()));
  if (std::find(algorithms.begin(), algorithms.end(), algorithm) == algorithms.end()) {
    std::string names;
    for (const std::string_view name : algorithms) {
      names += (names.empty() ? "" : ", ") + std::string(name);
    }
    throw ConfigError("--algorithm '" + algorithm + "' is not one of " + names);
  }
  const cluster::Spec spec = cluster::resolve();
  if (spec.source == cluster::source::kNone) {
    const int processes = s.processes.value_or(2);
    check_root(s, processes);
    if (processes > 1) {
      return launch_self(context.arguments,
                         {.processes = processes, .timeout_s = s.timeout_s, .bind = s.bind});
    }
  } else if (s.processes && *s.processes != spec.size) {
    throw ConfigError("--np " + std::to_string(*s.processes) + " but this process was started as " +
                      cluster::describe(spec) + "; leave --np out under a launcher");
  }
  check_root(s, spec.size);
  const Watchdog watchdog(launched_by_self() ? 0 : s.timeout_s);  // under another launcher
  return rank(spec, algorithm);
}

// --- local ---------------------------------------------------------------------------------------

inline int run_local(const Settings& s, const Context& context) {
  const cluster::Spec spec = cluster::resolve();
  if (spec.size > 1) {
    throw ConfigError(
        "the local backend runs every rank as a thread of one process, but this "
        "process was started as " +
        cluster::describe(spec) + "; start cohort-bench once, with --np, or use --backend tcp");
  }
  if (s.algorithm) throw ConfigError("--algorithm applies to the tcp and nccl backends only");
  const int ranks = s.processes.value_or(2);
  check_root(s, ranks);
  const Watchdog watchdog(s.timeout_s);
  collective::Local local({.ranks = ranks});
  RunInfo run = run_info(s, context, "local", "threads", "collective::Local", ranks,
                         std::to_string(ranks) + " threads of one process");

  std::vector<int> status(static_cast<std::size_t>(ranks), 0);
  std::mutex failure_mutex;
  std::string failure;
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        collective::LocalCommunicator comm = local.communicator(r);
        try {
          status[static_cast<std::size_t>(r)] = sweep_on_rank(comm, s, run);
        } catch (const std::exception& e) {
          comm.abort(e.what());
          const std::lock_guard lock(failure_mutex);
          // A CommError names its rank itself; anything else is given the rank here.
          if (failure.empty()) {
            failure = dynamic_cast<const CommError*>(&e) != nullptr
                          ? std::string(e.what())
                          : "rank " + std::to_string(r) + ": " + e.what();
          }
          status[static_cast<std::size_t>(r)] = kExitWrong;
        }
      });
    }
  }
  if (!failure.empty()) say(failure);
  for (const int code : status) {
    if (code != 0) return code;
  }
  return 0;
}

// --- tcp -----------------------------------------------------------------------------------------

// `backend` tcp, or shm: then the all-reduce goes through shared memory, or the run fails saying
// why not.
template <template <class> class Algorithm>
int run_tcp_rank(const Settings& s, const Context& context, const cluster::Spec& spec,
                 std::string_view backend, std::string_view algorithm) {
  Algorithm<transport::tcp::Tcp> comm(
      transport::tcp::Tcp(tcp_options(s, spec, spec.rank, spec.size)));
  std::string medium = frame_protection(s, comm.transport().options());
  if constexpr (requires { comm.share_host_memory(true, {}); }) {
    if (backend == "shm") {
      const auto sharing = comm.share_host_memory(true, comm.transport().options().spin);
      if (!sharing.shared) {
        throw ConfigError("--backend shm: the ranks do not share memory" +
                          (sharing.why_not.empty() ? std::string(" (not all on this host)")
                                                   : ": " + sharing.why_not));
      }
      medium = (sharing.hosts > 1
                    ? "all-reduce by host, through shared memory on each of " +
                          std::to_string(sharing.hosts) + " hosts and over TCP between them"
                    : std::string("all-reduce through shared memory")) +
               (s.shared_buffer ? " in the shared buffer" : "") + ", the rest over TCP with " +
               medium;
    }
  }
  RunInfo run = run_info(s, context, std::string(backend), std::string(algorithm),
                         std::move(medium), spec.size, launcher_of(spec));
  try {
    return sweep_on_rank(comm, s, std::move(run));
  } catch (...) {
    comm.abort("cohort-bench failed");  // closes the connections: the peers fail promptly
    throw;
  }
}

inline int run_tcp(const Settings& s, const Context& context) {
  return run_ranks(s, context, {"deterministic", "ring"},
                   [&](const cluster::Spec& spec, const std::string& algorithm) {
                     if (algorithm == "ring") {
                       return run_tcp_rank<collective::Ring>(s, context, spec, "tcp", algorithm);
                     }
                     return run_tcp_rank<collective::Deterministic>(s, context, spec, "tcp",
                                                                    algorithm);
                   });
}

inline int run_shm(const Settings& s, const Context& context) {
  return run_ranks(
      s, context, {"deterministic"}, [&](const cluster::Spec& spec, const std::string& algorithm) {
        return run_tcp_rank<collective::Deterministic>(s, context, spec, "shm", algorithm);
      });
}

// --- ps ------------------------------------------------------------------------------------------

inline int run_ps(const Settings& s, const Context& context) {
  if (s.algorithm) throw ConfigError("--algorithm applies to the tcp and nccl backends only");
  if (s.element != Element::kFloat) {
    throw ConfigError("push_pull measures float parameters only (-d float)");
  }
  if (s.op != ReduceOp::kSum) {
    throw ConfigError("push_pull sums the workers' gradients: -o sum only");
  }
  if (s.min_bytes < sizeof(float)) {
    throw ConfigError("push_pull needs at least one float: -b/--minbytes 4 or more");
  }
  const cluster::Spec spec = cluster::resolve();
  if (spec.source == cluster::source::kNone) {
    const int workers = s.processes.value_or(2);
    const int servers = s.servers.value_or(1);
    return launch_self(
        context.arguments,
        {.processes = workers, .servers = servers, .timeout_s = s.timeout_s, .bind = s.bind});
  }
  const int workers = cluster::worker_count(spec);
  const int servers = cluster::parameter_server_count(spec);
  if (servers <= 0 || (spec.role == Role::kEvaluator)) {
    throw ConfigError(
        "the ps backend needs a parameter-server job, but this process was started as " +
        cluster::describe(spec) +
        "; run cohort-bench alone (--np W --ps S), under cohort-run --np W --ps S, "
        "or with TF_CONFIG ps tasks");
  }
  if (s.processes && *s.processes != workers) {
    throw ConfigError("--np " + std::to_string(*s.processes) + " but this job has " +
                      std::to_string(workers) + " workers; leave --np out under a launcher");
  }
  if (s.servers && *s.servers != servers) {
    throw ConfigError("--ps " + std::to_string(*s.servers) + " but this job has " +
                      std::to_string(servers) +
                      " parameter servers; leave --ps out under a "
                      "launcher");
  }
  const Watchdog watchdog(launched_by_self() ? 0 : s.timeout_s);
  const bool server = spec.role == Role::kParameterServer;
  transport::tcp::Tcp tcp(
      tcp_options(s, spec, server ? workers + spec.rank : spec.rank, workers + servers));
  if (server) {
    tcp.isolate_peer_failures();  // a lost worker is reported by the server, by name
    return ps_bench::serve(tcp, s, spec.rank, workers, servers);
  }
  ps_bench::Workers comm(strategy::ps::WorkerView<transport::tcp::Tcp>(tcp, workers));
  RunInfo run = run_info(s, context, "ps", "sync",
                         std::to_string(servers) +
                             " parameter server(s), SGD lr 1, frame "
                             "checksums " +
                             (s.checksum ? "on" : "off"),
                         workers, launcher_of(spec));
  try {
    return report_sweep(comm, s, std::move(run), "", [&](const auto& on_row) {
      ps_bench::Worker worker(tcp, comm, s, workers);
      return worker.run(servers, on_row);
    });
  } catch (...) {
    comm.abort("cohort-bench failed");  // closes the connections: the others fail promptly
    throw;
  }
}

// --- nccl ----------------------------------------------------------------------------------------

#if defined(COHORT_BENCH_NCCL)

inline constexpr std::string_view kNcclSummary =
    "collective::NcclCommunicator, one process per rank on the GPU of its local rank: "
    "--algorithm deterministic (default: cohort's fixed-order sum, NCCL as transport) or nccl "
    "(NCCL's own reductions)";

// Where no GPU is visible, why (the CUDA runtime's answer); nullopt where one is.
inline std::optional<std::string> nccl_unavailable() {
  const std::string why = device::cuda::unavailable();
  if (why.empty()) return std::nullopt;
  return "nccl backend: no GPU: CUDA finds none on this machine (" + why +
         device::cuda::visible_devices() + "); the nccl backend needs one NVIDIA GPU per rank";
}

// GPU `gpu` as nccl-tests names it: index, PCI bus and model ("0 [0x1b] NVIDIA H100 80GB HBM3").
inline std::string describe_gpu(int gpu) {
  cudaDeviceProp properties{};
  COHORT_CUDA_CHECK(cudaGetDeviceProperties(&properties, gpu));
  char bus[16];
  std::snprintf(bus, sizeof bus, " [0x%02x] ", properties.pciBusID);
  return std::to_string(gpu) + bus + properties.name;
}

inline std::string nccl_version() {
  int code = 0;
  COHORT_NCCL_CHECK(ncclGetVersion(&code));
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch (since NCCL 2.9).
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

inline int run_nccl_rank(const Settings& s, const Context& context, const cluster::Spec& spec,
                         const std::string& algorithm) {
  const int gpu = spec.local_rank;
  const int gpus = device::cuda::device_count();
  if (gpu >= gpus) {
    throw ConfigError("the nccl backend runs each rank on the GPU of its local rank, but rank " +
                      std::to_string(spec.rank) + " has local rank " + std::to_string(gpu) +
                      " and this process sees " + std::to_string(gpus) + " GPU(s)" +
                      device::cuda::visible_devices() + "; start at most " + std::to_string(gpus) +
                      " ranks per host (--np)");
  }
  device::cuda::use(gpu);  // this thread's device, before anything touches one
  collective::Deterministic<transport::tcp::Tcp> control(
      transport::tcp::Tcp(tcp_options(s, spec, spec.rank, spec.size)));
  try {
    collective::NcclCommunicator::Options options{.device = gpu,
                                                  .deterministic = algorithm == "deterministic"};
    if (s.timeout_s > 0) {
      options.timeout = std::chrono::milliseconds(static_cast<long long>(s.timeout_s * 1000));
    }
    collective::NcclCommunicator comm(collective::nccl_unique_id(control), spec.rank, spec.size,
                                      options);
    const std::string nccl = "NCCL " + nccl_version();
    const std::string details =
        spec.size == 1 ? nccl + ", one rank: nothing crosses between GPUs, nothing is reduced"
        : options.deterministic
            ? nccl + " as transport; floating-point reductions in cohort's fixed order"
            : nccl + "'s own ncclAllReduce and ncclReduceScatter";
    RunInfo run = run_info(s, context, "nccl", algorithm, details, spec.size, launcher_of(spec));
    try {
      return report_sweep(control, s, std::move(run), describe_gpu(gpu), [&](const auto& on_row) {
        // Every Element (settings.hpp) is one NcclCommunicator takes: float, double, int32 and
        // int64. One it did not take would not compile here (nccl::data_type's static_assert).
        return with_element(s.element, [&]<class T>() {
          Sweep sweep(comm, control, DeviceMemory<T>({.device = gpu, .stream = comm.stream()}), s);
          return sweep.run(on_row);
        });
      });
    } catch (...) {
      comm.abort("cohort-bench failed");  // a healthy communicator's destructor waits for peers
      throw;
    }
  } catch (...) {
    control.abort("cohort-bench failed");  // closes the connections: the peers fail promptly
    throw;
  }
}

inline int run_nccl(const Settings& s, const Context& context) {
  return run_ranks(s, context, {"deterministic", "nccl"},
                   [&](const cluster::Spec& spec, const std::string& algorithm) {
                     return run_nccl_rank(s, context, spec, algorithm);
                   });
}

#else

inline constexpr std::string_view kNcclSummary =
    "collective::NcclCommunicator on GPUs: not built (this cohort-bench was built without CUDA; "
    "says so and exits 2)";

inline bool gpu_present() {
  std::error_code ignored;
  const std::filesystem::path gpus = "/proc/driver/nvidia/gpus";
  return std::filesystem::exists("/dev/nvidiactl", ignored) ||
         (std::filesystem::is_directory(gpus, ignored) &&
          !std::filesystem::is_empty(gpus, ignored));
}

// Built without CUDA: asking for the nccl backend says so, on a GPU machine too, and never prints
// a number.
inline std::optional<std::string> nccl_unavailable() {
  return std::string(
             "nccl backend: not built: this cohort-bench was built without CUDA (configure with "
             "-DCOHORT_ENABLE_CUDA=ON, which needs nvcc and NCCL)") +
         (gpu_present() ? "; this machine has an NVIDIA GPU"
                        : ", and this machine has no NVIDIA GPU");
}

inline int run_nccl(const Settings&, const Context&) {
  say(*nccl_unavailable());
  return kExitUnavailable;
}

#endif

// The communicator backends run the collectives; push_pull is the ps backend's alone.
inline bool collectives_only(Collective c) { return c != Collective::kPushPull; }
inline bool push_pull_only(Collective c) { return c == Collective::kPushPull; }
inline std::optional<std::string> always_available() { return std::nullopt; }

}  // namespace detail

inline constexpr std::array<Backend, 5> kBackends = {{
    {"local", "collective::Local: every rank a thread of this process (--np threads)",
     detail::collectives_only, detail::always_available, detail::run_local},
    {"tcp",
     "collective::Deterministic (default) or Ring (--algorithm) over transport::tcp::Tcp, one "
     "process per rank",
     detail::collectives_only, detail::always_available, detail::run_tcp},
    {"shm",
     "collective::Deterministic over transport::tcp::Tcp, its all-reduce through shared memory "
     "(every process on this host), one process per rank",
     detail::collectives_only, detail::always_available, detail::run_shm},
    {"ps",
     "push_pull only: --np worker and --ps parameter-server processes (strategy::ParameterServer's "
     "client and server, Sync, SGD)",
     detail::push_pull_only, detail::always_available, detail::run_ps},
    {"nccl", detail::kNcclSummary, detail::collectives_only, detail::nccl_unavailable,
     detail::run_nccl},
}};

inline const Backend* find_backend(std::string_view name) {
  for (const Backend& b : kBackends) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

}  // namespace cohort::bench
