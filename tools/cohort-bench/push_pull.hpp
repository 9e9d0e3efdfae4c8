// The ps backend: the parameter server's push_pull (strategy/parameter_server.hpp), measured as a
// collective. W worker processes and S server processes form one TCP mesh, as ParameterServer
// builds it (workers are ranks 0 .. W-1, servers W .. W+S-1); the servers run
// ps::Server with consistency::Sync and SGD, the workers ps::Client.
//
// One call = every worker pushes a gradient of `size` bytes (float) and pulls the updated
// parameters: a push and a pull per chunk, all in one transfer (the pull of a chunk is answered
// once its step is applied), the wire traffic of a training step of ParameterServer whose
// pushes all wait for the end of the backward pass.
//   out-of-place   the gradient and the parameters are separate buffers (what the Trainer does)
//   in-place       one buffer: it is pushed, and the pulled parameters overwrite it
//
// Every (size, placement) is one fit of fresh servers: every worker presents its settings (none:
// protocol.hpp's kSettings, which every fit begins with), the chief (worker 0) initializes the
// parameters to 0, then one untimed call, a barrier of the workers, `iters` timed calls (each
// worker times its own; the table's time is the slowest worker's per iteration, as sweep.hpp),
// and the check; then every worker says done and the servers start the next fit. The layout is
// the strategy's default (alignment device::cpu::kNormBlock, chunk_bytes 1 MiB) except
// min_shard_bytes = 0, so that every server holds a shard from S x 16 KiB up. Warm-up: -w calls
// in a fit of the largest size, then of the smallest, before the sweep.
//
// The check is exact: SGD with learning rate 1 and global batch 1 (inverse_batch = 1, so the
// scaling is a multiplication by 1 for any W), timed calls push zeros (the parameters stay 0),
// and the checked call pushes the small integers of pattern.hpp (worker w's sum pattern), so the
// pulled parameters must be exactly 0 - 1 x (sum over workers) = -reduced_value(sum, W, i) on
// every worker, compared with == element by element.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/core/error.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/sgd.hpp"
#include "cohort/strategy/parameter_server/client.hpp"
#include "cohort/strategy/parameter_server/communicators.hpp"
#include "cohort/strategy/parameter_server/server.hpp"
#include "cohort/transport/tcp/tcp.hpp"
#include "launch.hpp"
#include "machine.hpp"
#include "pattern.hpp"
#include "report.hpp"
#include "settings.hpp"
#include "sweep.hpp"

namespace cohort::bench::ps_bench {

namespace ps = strategy::ps;
using Tcp = transport::tcp::Tcp;
using Workers = collective::Deterministic<ps::WorkerView<Tcp>>;

// One fit of the servers: a size, and whether it is measured (both placements) or warm-up.
struct Fit {
  std::size_t bytes = 0;
  bool warmup = false;
  bool in_place = false;
};

// The fits of a run, the same on every process (each computes it from the same flags).
inline std::vector<Fit> plan(const Settings& s) {
  const std::vector<std::size_t> sizes =
      sweep_sizes(s.min_bytes, s.max_bytes, s.step_factor, s.step_bytes);
  std::vector<Fit> fits;
  if (sizes.empty()) return fits;
  if (s.warmup_iters > 0) {
    fits.push_back({sizes.back(), true, false});
    fits.push_back({sizes.front(), true, false});
  }
  for (const std::size_t size : sizes) {
    fits.push_back({size, false, false});
    fits.push_back({size, false, true});
  }
  return fits;
}

inline ps::Layout layout_of(std::size_t bytes, int servers) {
  return ps::Layout(bytes / sizeof(float), sizeof(float), servers,
                    {.min_shard_bytes = 0,
                     .alignment = device::cpu::kNormBlock,
                     .chunk_bytes = std::size_t{1} << 20});
}

inline const optimizer::Sgd& sgd() {
  static const optimizer::Sgd rule({.learning_rate = 1.0});
  return rule;
}

// A server: serves every fit of the plan, one after the other.
inline int serve(Tcp& tcp, const Settings& s, int server, int workers, int servers) {
  for (const Fit& fit : plan(s)) {
    const ps::Layout layout = layout_of(fit.bytes, servers);
    ps::Server<Tcp, float, optimizer::Sgd> host(tcp, layout, {.server = server, .workers = workers},
                                                sgd());
    host.serve();
  }
  return 0;
}

// A worker's side of the sweep.
class Worker {
 public:
  Worker(Tcp& tcp, Workers& comm, const Settings& s, int workers)
      : tcp_(tcp), comm_(comm), settings_(s), worker_(comm.rank()), workers_(workers) {}

  template <class OnRow>
  std::vector<Row> run(int servers, OnRow&& on_row) {
    std::vector<Row> rows;
    Row row;
    for (const Fit& fit : plan(settings_)) {
      const ps::Layout layout = layout_of(fit.bytes, servers);
      const std::size_t count = layout.elements();
      gradient_.assign(count, 0.0f);
      parameters_.assign(count, 0.0f);
      ps::Client<Tcp> client(tcp_, worker_, workers_);
      chunks_ = layout.chunks();
      step_ = 0;
      client.present({}, servers);
      if (worker_ == 0) {
        for (const ps::Chunk& chunk : chunks_) {
          client.add({.operation = ps::Operation::kInit, .element_bytes = sizeof(float)}, chunk,
                     std::as_bytes(std::span(parameters_).subspan(chunk.begin, chunk.size())));
        }
        client.transfer();
      }
      if (fit.warmup) {
        for (int i = 0; i < settings_.warmup_iters; ++i) push_pull(client, false);
      } else {
        const Measurement m = measure_placement(client, fit.in_place, count);
        row.bytes = count * sizeof(float);
        row.count = count;
        row.type = "float";
        row.redop = "sum";
        row.root = -1;
        (fit.in_place ? row.in_place : row.out_of_place) = m;
        if (fit.in_place) {
          on_row(row);
          rows.push_back(row);
        }
      }
      client.done(servers, cohort::strategy::FitEnd::kReached, step_);
    }
    return rows;
  }

 private:
  using Clock = std::chrono::steady_clock;

  // One push_pull: out-of-place pushes gradient_ and pulls into parameters_; in-place pushes
  // parameters_ and pulls into it.
  void push_pull(ps::Client<Tcp>& client, bool in_place) {
    const std::span<const float> pushed = in_place ? parameters_ : gradient_;
    for (const ps::Chunk& chunk : chunks_) {
      client.add({.operation = ps::Operation::kPush,
                  .step = step_,
                  .inverse_batch = 1.0,
                  .element_bytes = sizeof(float)},
                 chunk, std::as_bytes(pushed.subspan(chunk.begin, chunk.size())));
      client.add({.operation = ps::Operation::kPull, .element_bytes = sizeof(float)}, chunk, {},
                 std::as_writable_bytes(std::span(parameters_).subspan(chunk.begin, chunk.size())));
    }
    client.transfer();
    ++step_;
  }

  Measurement measure_placement(ps::Client<Tcp>& client, bool in_place, std::size_t count) {
    push_pull(client, in_place);  // zeros: the parameters stay 0
    comm_.barrier();
    std::vector<double> seconds(static_cast<std::size_t>(settings_.iters));
    for (double& s : seconds) {
      const auto start = Clock::now();
      push_pull(client, in_place);
      s = std::chrono::duration<double>(Clock::now() - start).count();
    }
    comm_.all_reduce(std::span<double>(seconds), ReduceOp::kMax);
    std::array<std::int64_t, 2> wrong{-1, 0};  // elements, workers with any
    if (settings_.check) wrong = check(client, in_place, count);
    return measure(Collective::kPushPull, count * sizeof(float), workers_, seconds, wrong[0],
                   wrong[1]);
  }

  std::array<std::int64_t, 2> check(ps::Client<Tcp>& client, bool in_place, std::size_t count) {
    std::vector<float>& pushed = in_place ? parameters_ : gradient_;
    std::fill(parameters_.begin(), parameters_.end(), sentinel<float>());
    for (std::size_t i = 0; i < count; ++i)
      pushed[i] = input_value<float>(ReduceOp::kSum, worker_, i);
    push_pull(client, in_place);
    if (settings_.corrupt && worker_ == workers_ - 1 && count > 0) {
      parameters_[count / 2] += 1.0f;  // what the check exists to catch
    }
    const std::size_t wrong = count_wrong<float>(
        std::span<const float>(parameters_),
        [&](std::size_t i) { return -reduced_value<float>(ReduceOp::kSum, workers_, i); });
    std::array<std::int64_t, 2> counts{static_cast<std::int64_t>(wrong), wrong > 0 ? 1 : 0};
    comm_.all_reduce(std::span<std::int64_t>(counts), ReduceOp::kSum);
    return counts;  // the last call of the fit: the next fit's servers start from 0 again
  }

  Tcp& tcp_;
  Workers& comm_;
  const Settings& settings_;
  const int worker_;
  const int workers_;
  std::uint64_t step_ = 0;
  std::vector<ps::Chunk> chunks_;  // of this fit's layout
  std::vector<float> gradient_;
  std::vector<float> parameters_;
};

}  // namespace cohort::bench::ps_bench
