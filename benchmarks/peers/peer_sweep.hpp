// What the peer programs share: cohort-bench's flags (-b -e -f -n -w -c --json), its measurement
// procedure for a float sum all-reduce (tools/cohort-bench/sweep.hpp: nccl-tests' warm-up, one
// untimed call, a barrier, iters timed calls each timed by its rank, the slowest rank's time per
// iteration, then one checked call on the exact pattern), and its table and JSON
// (tools/cohort-bench/report.hpp). So a peer's figures mean exactly what cohort's mean.
//
// A peer provides a PeerOps: rank, size, barrier, an in-place float sum all-reduce of a buffer,
// the element-wise max of doubles and the sum of doubles over ranks. Out-of-place is what it is
// for cohort: copy the input into the output, then the in-place call (MPI has a true out-of-place
// MPI_Allreduce and uses it; see mpi_allreduce.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pattern.hpp"
#include "report.hpp"

namespace cohort::peers {

using bench::Collective;
using bench::Measurement;
using bench::Row;
using bench::RunInfo;

struct Flags {
  std::size_t min_bytes = std::size_t{32} << 20;
  std::size_t max_bytes = std::size_t{32} << 20;
  std::size_t step_factor = 2;
  int iters = 20;
  int warmup_iters = 5;
  bool check = true;
  std::string json;
  std::string label;  // the peer's algorithm or configuration, for the header and the JSON
};

// Parses the flags above; exits with a message on anything else.
inline Flags parse_flags(int argc, char** argv) {
  Flags f;
  const auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", argv[0], why.c_str());
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) fail("flag " + std::string(flag) + " needs a value");
    const std::string value = argv[++i];
    const auto bytes = [&] {
      const auto parsed = bench::parse_bytes(value);
      if (!parsed) fail("'" + value + "' is not a byte count");
      return *parsed;
    };
    if (flag == "-b") {
      f.min_bytes = bytes();
    } else if (flag == "-e") {
      f.max_bytes = bytes();
    } else if (flag == "-f") {
      f.step_factor = static_cast<std::size_t>(std::stoul(value));
    } else if (flag == "-n") {
      f.iters = std::stoi(value);
    } else if (flag == "-w") {
      f.warmup_iters = std::stoi(value);
    } else if (flag == "-c") {
      f.check = std::stoi(value) != 0;
    } else if (flag == "--json") {
      f.json = value;
    } else if (flag == "--label") {
      f.label = value;
    } else {
      fail("unknown flag " + std::string(flag));
    }
  }
  if (f.step_factor < 2 || f.iters < 1 || f.warmup_iters < 0 || f.min_bytes > f.max_bytes) {
    fail("need -f >= 2, -n >= 1, -w >= 0 and -b <= -e");
  }
  return f;
}

struct PeerOps {
  int rank = 0;
  int size = 1;
  std::function<void()> barrier;
  // Prepares the in-place all-reduce of `buffer` (Gloo builds its algorithm object per buffer);
  // the returned function runs it once.
  std::function<std::function<void()>(std::span<float> buffer)> prepare_in_place;
  // Out-of-place all-reduce of `input` into `output`; empty: copy, then the in-place call.
  std::function<std::function<void()>(std::span<const float> input, std::span<float> output)>
      prepare_out_of_place;
  std::function<void(std::span<double>)> max;
  std::function<void(std::span<double>)> sum;
};

inline int run(const Flags& flags, const PeerOps& ops, RunInfo run) {
  using Clock = std::chrono::steady_clock;
  const ReduceOp op = ReduceOp::kSum;
  const std::vector<std::size_t> sizes =
      bench::sweep_sizes(flags.min_bytes, flags.max_bytes, flags.step_factor, 0);
  run.collective = Collective::kAllReduce;
  run.ranks = ops.size;
  run.min_bytes = flags.min_bytes;
  run.max_bytes = flags.max_bytes;
  run.step_factor = flags.step_factor;
  run.iters = flags.iters;
  run.warmup_iters = flags.warmup_iters;
  run.check = flags.check;
  const bool printer = ops.rank == 0;
  if (printer) std::fputs(bench::format_header(run).c_str(), stdout);
  std::fflush(stdout);

  const std::size_t largest = sizes.empty() ? 0 : sizes.back() / sizeof(float);
  std::vector<float> send(std::max<std::size_t>(largest, 1));
  std::vector<float> receive(std::max<std::size_t>(largest, 1));

  // The call for `count` elements in one placement, prepared once per size and placement.
  const auto prepare = [&](std::size_t count, bool in_place) -> std::function<void()> {
    const std::span<float> in(send.data(), count);
    const std::span<float> out(receive.data(), count);
    if (in_place) return ops.prepare_in_place(out);
    if (ops.prepare_out_of_place) return ops.prepare_out_of_place(in, out);
    std::function<void()> reduce = ops.prepare_in_place(out);
    return [in, out, reduce] {
      std::copy(in.begin(), in.end(), out.begin());
      reduce();
    };
  };
  const auto fill_stable = [&](std::size_t count) {
    std::fill_n(send.begin(), count, 0.0f);
    std::fill_n(receive.begin(), count, 0.0f);
  };

  for (const std::size_t bytes : {sizes.back(), sizes.front()}) {
    const std::size_t count = bytes / sizeof(float);
    fill_stable(count);
    const std::function<void()> call = prepare(count, false);
    for (int i = 0; i < flags.warmup_iters; ++i) call();
  }

  std::vector<Row> rows;
  for (const std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    Row row;
    row.bytes = count * sizeof(float);
    row.count = count;
    row.type = "float";
    row.redop = "sum";
    row.root = -1;
    for (const bool in_place : {false, true}) {
      const std::function<void()> call = prepare(count, in_place);
      fill_stable(count);
      call();
      ops.barrier();
      std::vector<double> seconds(static_cast<std::size_t>(flags.iters));
      for (double& s : seconds) {
        const auto start = Clock::now();
        call();
        s = std::chrono::duration<double>(Clock::now() - start).count();
      }
      ops.max(seconds);
      std::vector<double> wrong{-1.0, 0.0};
      if (flags.check) {
        std::fill_n(receive.begin(), count, bench::sentinel<float>());
        float* input = in_place ? receive.data() : send.data();
        for (std::size_t i = 0; i < count; ++i) {
          input[i] = bench::input_value<float>(op, ops.rank, i);
        }
        call();
        double bad = 0;
        for (std::size_t i = 0; i < count; ++i) {
          bad += receive[i] != bench::reduced_value<float>(op, ops.size, i) ? 1 : 0;
        }
        wrong = {bad, bad > 0 ? 1.0 : 0.0};
        ops.sum(wrong);
      }
      Measurement m =
          bench::measure(Collective::kAllReduce, row.bytes, ops.size, seconds,
                         static_cast<std::int64_t>(wrong[0]), static_cast<std::int64_t>(wrong[1]));
      (in_place ? row.in_place : row.out_of_place) = std::move(m);
    }
    if (printer) std::fputs(bench::format_row(row).c_str(), stdout);
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
  const bench::Summary summary = bench::summarize(rows);
  if (printer) {
    std::fputs(bench::format_footer(summary).c_str(), stdout);
    if (!flags.json.empty()) {
      std::ofstream(flags.json) << bench::to_json(run, rows).dump(2) << '\n';
    }
  }
  std::fflush(stdout);
  return summary.out_of_bounds == 0 ? 0 : 1;
}

}  // namespace cohort::peers
