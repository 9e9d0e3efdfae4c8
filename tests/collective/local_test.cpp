// collective::Local: every operation exact for every world size and length, the summation order
// is the canonical tree, and failures (a missing rank, mismatched calls, abort, bad shapes, bad
// options) reach every rank as errors instead of hangs or wrong data.
#include "cohort/collective/local.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cohort/device/cpu.hpp"

namespace {

using cohort::ReduceOp;
using cohort::collective::Local;
using cohort::collective::LocalCommunicator;
using namespace std::chrono_literals;

static_assert(cohort::collective::Communicator<LocalCommunicator>);

constexpr int kWorldSizes[] = {1, 2, 3, 5, 8};
constexpr std::size_t kLengths[] = {0, 1, 7, 4099, std::size_t{1} << 20};
constexpr std::size_t kShortLengths[] = {0, 1, 7, 4099};

// Runs body(comm) on every rank of `local`, each in its own thread, and returns what each rank
// threw: "" for a rank that returned normally.
template <class Body>
std::vector<std::string> run_ranks(const Local& local, Body body) {
  std::vector<std::string> errors(static_cast<std::size_t>(local.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < local.size(); ++r) {
    threads.emplace_back([&, r] {
      LocalCommunicator comm = local.communicator(r);
      try {
        body(comm);
      } catch (const cohort::CommError& e) {
        errors[r] = e.what();
      } catch (const std::exception& e) {
        errors[r] = std::string("not a CommError: ") + e.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return errors;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// What `f` throws as an E, or "" when it throws nothing.
template <class E, class F>
std::string thrown(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// Small integers: sums, products and extremes of up to 8 ranks are exact in every element type.
template <class T>
T value(int rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11) - 5);
}

// Factors in {-1, 1, 2}: the product over 8 ranks stays within 2^8.
template <class T>
T factor(int rank, std::size_t i) {
  constexpr int kFactors[] = {2, -1, 1};
  return static_cast<T>(kFactors[(i + static_cast<std::size_t>(rank) * 2) % 3]);
}

template <class T>
T input(ReduceOp op, int rank, std::size_t i) {
  return op == ReduceOp::kProduct ? factor<T>(rank, i) : value<T>(rank, i);
}

// The reduction over ranks of input(op, r, i), computed in std::int64_t: exact, so any order.
template <class T>
T expected(ReduceOp op, int ranks, std::size_t i) {
  auto result = static_cast<std::int64_t>(input<T>(op, 0, i));
  for (int r = 1; r < ranks; ++r) {
    result = cohort::combine(op, result, static_cast<std::int64_t>(input<T>(op, r, i)));
  }
  return static_cast<T>(result);
}

// Checks every rank's result, counted per rank in the ranks' own threads.
void check_no_wrong(const std::vector<std::string>& errors, const std::vector<std::size_t>& wrong) {
  for (std::size_t r = 0; r < wrong.size(); ++r) {
    INFO("rank ", r);
    CHECK(errors[r] == "");
    CHECK(wrong[r] == 0);
  }
}

template <class T>
void check_all_reduce(ReduceOp op, int ranks, std::size_t length) {
  INFO(cohort::name(op), " over ", ranks, " ranks, length ", length);
  const Local local({.ranks = ranks});
  std::vector<std::size_t> wrong(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    std::vector<T> buffer(length);
    for (std::size_t i = 0; i < length; ++i) buffer[i] = input<T>(op, comm.rank(), i);
    comm.all_reduce(std::span(buffer), op);
    for (std::size_t i = 0; i < length; ++i)
      wrong[comm.rank()] += buffer[i] != expected<T>(op, ranks, i);
  });
  check_no_wrong(errors, wrong);
}

template <class T>
void check_reduce_scatter(ReduceOp op, int ranks, std::size_t chunk) {
  INFO(cohort::name(op), " over ", ranks, " ranks, chunk ", chunk);
  const Local local({.ranks = ranks});
  std::vector<std::size_t> wrong(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    std::vector<T> in(chunk * static_cast<std::size_t>(ranks));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = input<T>(op, comm.rank(), i);
    std::vector<T> out(chunk, T{99});
    comm.reduce_scatter(std::span<const T>(in), std::span(out), op);
    const std::size_t first = chunk * static_cast<std::size_t>(comm.rank());
    for (std::size_t i = 0; i < chunk; ++i) {
      wrong[comm.rank()] += out[i] != expected<T>(op, ranks, first + i);
    }
  });
  check_no_wrong(errors, wrong);
}

}  // namespace

TEST_CASE_TEMPLATE("local all_reduce sums exactly for every world size and length", T, float,
                   double, std::int32_t, std::int64_t) {
  for (const int ranks : kWorldSizes) {
    for (const std::size_t length : kLengths) check_all_reduce<T>(ReduceOp::kSum, ranks, length);
  }
}

TEST_CASE_TEMPLATE("local all_reduce takes the min, max and product exactly", T, float, double,
                   std::int32_t, std::int64_t) {
  for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    for (const int ranks : kWorldSizes) {
      for (const std::size_t length : kShortLengths) check_all_reduce<T>(op, ranks, length);
    }
  }
}

TEST_CASE_TEMPLATE("local broadcast gives every rank the root's buffer", T, float, double,
                   std::int32_t, std::int64_t) {
  for (const int ranks : kWorldSizes) {
    for (const std::size_t length : kLengths) {
      for (const int root : {0, ranks / 2, ranks - 1}) {
        INFO(ranks, " ranks, length ", length, ", root ", root);
        const Local local({.ranks = ranks});
        std::vector<std::size_t> wrong(static_cast<std::size_t>(ranks));
        const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
          std::vector<T> buffer(length);
          for (std::size_t i = 0; i < length; ++i) buffer[i] = value<T>(comm.rank(), i);
          comm.broadcast(std::span(buffer), root);
          for (std::size_t i = 0; i < length; ++i) {
            wrong[comm.rank()] += buffer[i] != value<T>(root, i);
          }
        });
        check_no_wrong(errors, wrong);
      }
    }
  }
}

TEST_CASE_TEMPLATE("local all_gather concatenates the inputs in rank order", T, float, double,
                   std::int32_t, std::int64_t) {
  for (const int ranks : kWorldSizes) {
    // The output holds ranks x chunk elements: 1<<20 is the output length, the others the chunk.
    for (const std::size_t length : kLengths) {
      const std::size_t chunk = length == kLengths[4] ? length / ranks : length;
      INFO(ranks, " ranks, chunk ", chunk);
      const Local local({.ranks = ranks});
      std::vector<std::size_t> wrong(static_cast<std::size_t>(ranks));
      const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
        std::vector<T> in(chunk);
        for (std::size_t i = 0; i < chunk; ++i) in[i] = value<T>(comm.rank(), i);
        std::vector<T> out(chunk * static_cast<std::size_t>(ranks), T{99});
        comm.all_gather(std::span<const T>(in), std::span(out));
        for (std::size_t i = 0; i < out.size(); ++i) {
          wrong[comm.rank()] += out[i] != value<T>(static_cast<int>(i / chunk), i % chunk);
        }
      });
      check_no_wrong(errors, wrong);
    }
  }
}

TEST_CASE_TEMPLATE("local reduce_scatter gives each rank the reduction of its chunk", T, float,
                   double, std::int32_t, std::int64_t) {
  for (const int ranks : kWorldSizes) {
    for (const std::size_t length : kLengths) {
      const std::size_t chunk = length == kLengths[4] ? length / ranks : length;
      check_reduce_scatter<T>(ReduceOp::kSum, ranks, chunk);
    }
  }
  for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    check_reduce_scatter<T>(op, 5, 4099);
  }
}

TEST_CASE("local all_gather and reduce_scatter work in place") {
  constexpr int kRanks = 3;
  constexpr std::size_t kChunk = 4099;
  const Local local({.ranks = kRanks});
  std::vector<std::size_t> wrong(kRanks);
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    const auto mine = static_cast<std::size_t>(comm.rank()) * kChunk;
    std::vector<float> gathered(kRanks * kChunk, 99.0f);
    for (std::size_t i = 0; i < kChunk; ++i) gathered[mine + i] = value<float>(comm.rank(), i);
    comm.all_gather(std::span<const float>(gathered).subspan(mine, kChunk), std::span(gathered));
    for (std::size_t i = 0; i < gathered.size(); ++i) {
      wrong[comm.rank()] += gathered[i] != value<float>(static_cast<int>(i / kChunk), i % kChunk);
    }

    std::vector<float> in(kRanks * kChunk);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value<float>(comm.rank(), i);
    comm.reduce_scatter(std::span<const float>(in), std::span(in).subspan(mine, kChunk),
                        ReduceOp::kSum);
    for (std::size_t i = 0; i < kChunk; ++i) {
      wrong[comm.rank()] += in[mine + i] != expected<float>(ReduceOp::kSum, kRanks, mine + i);
    }
  });
  check_no_wrong(errors, wrong);
}

TEST_CASE("local barrier holds every rank until all have arrived") {
  constexpr int kRanks = 5;
  const Local local({.ranks = kRanks});
  std::atomic<int> arrived{0};
  std::vector<int> seen(kRanks);
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    for (int round = 1; round <= 50; ++round) {
      arrived.fetch_add(1);
      comm.barrier();
      if (arrived.load() < round * kRanks) seen[comm.rank()] = arrived.load();
      comm.barrier();
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank ", r);
    CHECK(errors[r] == "");
    CHECK(seen[r] == 0);
  }
}

TEST_CASE("local all_reduce adds ranks in the canonical tree, not left to right, in place or not") {
  for (const int ranks : {2, 3, 4, 5, 8}) {
    INFO(ranks, " ranks");
    constexpr std::size_t kLength = 4099;
    // Element 0 holds 1e8, 1, -1e8, 1, 3, ...: the tree over 5 ranks gives 3, left to right 4.
    // The others mix magnitudes so that almost every order rounds differently.
    constexpr float kCancelling[] = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f, -7.0f, 1e7f, 0.5f};
    std::vector<std::vector<float>> inputs(ranks, std::vector<float>(kLength));
    std::mt19937 random(static_cast<unsigned>(ranks));
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-4, 8);
    for (int r = 0; r < ranks; ++r) {
      inputs[r][0] = kCancelling[r];
      for (std::size_t i = 1; i < kLength; ++i) {
        inputs[r][i] = mantissa(random) * std::pow(10.0f, static_cast<float>(exponent(random)));
      }
    }
    std::vector<const float*> pointers;
    for (const auto& in : inputs) pointers.push_back(in.data());
    std::vector<float> tree(kLength);
    cohort::device::cpu::reduce_tree<float>(ReduceOp::kSum, pointers, tree);
    std::size_t differs_from_left_to_right = 0;
    for (std::size_t i = 0; i < kLength; ++i) {
      float sum = inputs[0][i];
      for (int r = 1; r < ranks; ++r) sum += inputs[r][i];
      differs_from_left_to_right +=
          std::bit_cast<std::uint32_t>(sum) != std::bit_cast<std::uint32_t>(tree[i]);
    }
    // Over 2 or 3 ranks the tree is the left-to-right order; from 4 ranks on it is not.
    if (ranks >= 4) CHECK(differs_from_left_to_right > 0);
    if (ranks == 5) CHECK(tree[0] == 3.0f);

    const Local local({.ranks = ranks});
    std::vector<std::size_t> not_tree(ranks);
    std::vector<std::size_t> scattered_not_tree(ranks);
    const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
      std::vector<float> buffer = inputs[comm.rank()];
      comm.all_reduce(std::span(buffer), ReduceOp::kSum);
      std::vector<float> output(kLength);
      comm.all_reduce(std::span<const float>(inputs[comm.rank()]), std::span(output),
                      ReduceOp::kSum);
      for (std::size_t i = 0; i < kLength; ++i) {
        for (const float value : {buffer[i], output[i]}) {
          not_tree[comm.rank()] +=
              std::bit_cast<std::uint32_t>(value) != std::bit_cast<std::uint32_t>(tree[i]);
        }
      }
      // reduce_scatter over chunks of one element per rank: rank r's element r of the tree.
      std::vector<float> out(1);
      std::vector<float> in(inputs[comm.rank()].begin(), inputs[comm.rank()].begin() + ranks);
      comm.reduce_scatter(std::span<const float>(in), std::span(out), ReduceOp::kSum);
      scattered_not_tree[comm.rank()] +=
          std::bit_cast<std::uint32_t>(out[0]) != std::bit_cast<std::uint32_t>(tree[comm.rank()]);
    });
    check_no_wrong(errors, not_tree);
    check_no_wrong(errors, scattered_not_tree);
  }
}

TEST_CASE("local ranks waiting for a rank that never arrives time out naming it") {
  const Local local({.ranks = 3, .timeout = 200ms});
  std::atomic<int> released{0};
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    comm.barrier();  // #1, together
    std::vector<float> buffer(7, 1.0f);
    if (comm.rank() == 2) {
      // Arrives only after the others gave up, and must find the group poisoned.
      const auto give_up = std::chrono::steady_clock::now() + 5s;
      while (released.load() < 2 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(1ms);
      }
      comm.all_reduce(std::span(buffer), ReduceOp::kSum);
      return;
    }
    try {
      comm.all_reduce(std::span(buffer), ReduceOp::kSum);  // #2
    } catch (...) {
      released.fetch_add(1);
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", errors[r]);
    // Timed out itself, or released by the other's time-out: either names the missing rank.
    CHECK(contains(errors[r], "rank " + std::to_string(r) + ": all_reduce #2: "));
    CHECK(contains(errors[r], "waiting for rank 2"));
  }
  INFO("rank 2: ", errors[2]);
  CHECK(contains(errors[2], "rank 2: all_reduce #2: abandoned because"));
  CHECK(contains(errors[2], "waiting for rank 2"));
}

TEST_CASE("local mismatched collectives fail on every rank naming both calls, also as fields") {
  const Local local({.ranks = 3});
  std::vector<std::string> later(3);
  std::vector<std::optional<cohort::CommError>> failed(3);
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    comm.barrier();  // #1
    std::vector<float> buffer(7, 1.0f);
    try {
      if (comm.rank() == 1) {
        comm.broadcast(std::span(buffer), 0);  // #2
      } else {
        comm.all_reduce(std::span(buffer), ReduceOp::kSum);  // #2
      }
    } catch (const cohort::CommError& error) {
      failed[comm.rank()] = error;
      later[comm.rank()] = thrown<cohort::CommError>([&] { comm.barrier(); });
      throw;
    }
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank ", r, ": ", errors[r]);
    CHECK(
        contains(errors[r],
                 "rank 1 called broadcast(float, 7, root 0) #2 but rank 0 called all_reduce(float, "
                 "7, sum) #2"));
    CHECK(contains(later[r], "barrier #3: abandoned because rank 1 called broadcast"));
    REQUIRE(failed[r].has_value());
    CHECK(failed[r]->rank() == r);
    CHECK(failed[r]->peer() == (r == 1 ? 0 : 1));  // the rank whose call differs from its own
    CHECK(failed[r]->operation() == (r == 1 ? "broadcast" : "all_reduce"));
    CHECK(failed[r]->sequence() == 2);
  }
}

TEST_CASE("local collectives that differ in length, type, op or kind all fail everywhere") {
  struct Case {
    const char* name;
    void (*call)(LocalCommunicator&);
    const char* odd_one;
  };
  const Case cases[] = {
      {"length",
       [](LocalCommunicator& comm) {
         std::vector<float> buffer(comm.rank() == 2 ? 8 : 7);
         comm.all_reduce(std::span(buffer), ReduceOp::kSum);
       },
       "rank 2 called all_reduce(float, 8, sum) #1"},
      {"type",
       [](LocalCommunicator& comm) {
         if (comm.rank() == 1) {
           std::vector<double> buffer(7);
           comm.all_reduce(std::span(buffer), ReduceOp::kSum);
         } else {
           std::vector<float> buffer(7);
           comm.all_reduce(std::span(buffer), ReduceOp::kSum);
         }
       },
       "rank 1 called all_reduce(double, 7, sum) #1"},
      {"op",
       [](LocalCommunicator& comm) {
         std::vector<float> buffer(7);
         comm.all_reduce(std::span(buffer), comm.rank() == 1 ? ReduceOp::kMax : ReduceOp::kSum);
       },
       "rank 1 called all_reduce(float, 7, max) #1"},
      {"root",
       [](LocalCommunicator& comm) {
         std::vector<float> buffer(7);
         comm.broadcast(std::span(buffer), comm.rank() == 2 ? 1 : 0);
       },
       "rank 2 called broadcast(float, 7, root 1) #1"},
      {"barrier against a data collective",
       [](LocalCommunicator& comm) {
         if (comm.rank() == 0) {
           comm.barrier();
         } else {
           std::vector<float> buffer(7);
           comm.all_reduce(std::span(buffer), ReduceOp::kSum);
         }
       },
       "rank 1 called all_reduce(float, 7, sum) #1 but rank 0 called barrier() #1"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const Local local({.ranks = 3});
    const auto errors = run_ranks(local, c.call);
    for (int r = 0; r < 3; ++r) {
      INFO("rank ", r, ": ", errors[r]);
      CHECK(contains(errors[r], c.odd_one));
    }
  }
}

TEST_CASE("local abort from one rank releases the others and keeps failing later calls") {
  const Local local({.ranks = 3});
  std::vector<std::string> later(3);
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    try {
      if (comm.rank() == 2) {
        std::this_thread::sleep_for(50ms);
        comm.abort("out of memory");
      } else {
        std::vector<float> buffer(7, 1.0f);
        comm.all_reduce(std::span(buffer), ReduceOp::kSum);
      }
    } catch (const cohort::CommError&) {
      later[comm.rank()] = thrown<cohort::CommError>([&] { comm.barrier(); });
      throw;
    }
    later[comm.rank()] = thrown<cohort::CommError>([&] { comm.barrier(); });
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", errors[r]);
    CHECK(contains(errors[r], "rank " + std::to_string(r) + ": all_reduce #1: abandoned"));
    CHECK(contains(errors[r], "rank 2 aborted: out of memory"));
  }
  CHECK(errors[2] == "");
  for (int r = 0; r < 3; ++r) {
    INFO("rank ", r, " later: ", later[r]);
    CHECK(contains(later[r], "barrier #"));
    CHECK(contains(later[r], "because rank 2 aborted: out of memory"));
  }
}

TEST_CASE("a local rank that stalls is the peer, as a field, of the others' errors") {
  std::vector<std::optional<cohort::CommError>> stalled(2);
  const Local slow({.ranks = 2, .timeout = 200ms});
  run_ranks(slow, [&](LocalCommunicator& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(600ms);
      return;
    }
    try {
      comm.barrier();  // #1
    } catch (const cohort::CommError& error) {
      stalled[0] = error;
    }
    try {
      comm.barrier();  // #2: the group failed
    } catch (const cohort::CommError& error) {
      stalled[1] = error;
    }
  });
  REQUIRE(stalled[0].has_value());
  INFO(stalled[0]->what());
  CHECK(stalled[0]->rank() == 0);
  CHECK(stalled[0]->peer() == 1);  // the one rank missing
  CHECK(stalled[0]->operation() == "barrier");
  CHECK(stalled[0]->sequence() == 1);
  REQUIRE(stalled[1].has_value());
  CHECK(stalled[1]->peer() == 1);
  CHECK(stalled[1]->sequence() == 2);
  CHECK(contains(stalled[1]->what(),
                 "rank 0: barrier #2: abandoned because rank 0: barrier #1: "
                 "timed out after 200 ms waiting for rank 1"));
}

TEST_CASE("local shape errors fail the caller and release the others") {
  const Local local({.ranks = 3});
  const auto errors = run_ranks(local, [&](LocalCommunicator& comm) {
    std::vector<float> in(4);
    std::vector<float> out(comm.rank() == 1 ? 10 : 12);
    comm.all_gather(std::span<const float>(in), std::span(out));
  });
  CHECK(contains(errors[1],
                 "rank 1: all_gather #1: called all_gather with 4 input and 10 output elements; "
                 "the output needs 3 x 4"));
  for (const int r : {0, 2}) {
    INFO("rank ", r, ": ", errors[r]);
    CHECK(contains(errors[r],
                   "all_gather #1: abandoned because rank 1: all_gather #1: called all_gather"));
  }

  const Local scatter({.ranks = 2});
  const auto scatter_errors = run_ranks(scatter, [&](LocalCommunicator& comm) {
    std::vector<float> in(comm.rank() == 0 ? 5 : 6);
    std::vector<float> out(3);
    comm.reduce_scatter(std::span<const float>(in), std::span(out), ReduceOp::kSum);
  });
  CHECK(contains(scatter_errors[0],
                 "rank 0: reduce_scatter #1: called reduce_scatter with 5 input and 3 output"));
  CHECK(contains(scatter_errors[1], "because rank 0: reduce_scatter #1: called reduce_scatter"));

  const Local lengths({.ranks = 2});
  const auto length_errors = run_ranks(lengths, [&](LocalCommunicator& comm) {
    const std::vector<float> in(comm.rank() == 1 ? 5 : 4);
    std::vector<float> out(4);
    comm.all_reduce(std::span(in), std::span(out), ReduceOp::kSum);
  });
  CHECK(contains(length_errors[1], "rank 1: all_reduce #1: input has 5 elements but output 4"));
  CHECK(contains(length_errors[0], "all_reduce #1: abandoned because rank 1: all_reduce #1"));

  const Local overlap({.ranks = 2});
  const auto overlap_errors = run_ranks(overlap, [&](LocalCommunicator& comm) {
    std::vector<float> memory(6);
    const std::span<float> all(memory);
    comm.all_reduce(std::span<const float>(all.first(4)),
                    comm.rank() == 0 ? all.last(4) : all.first(4), ReduceOp::kSum);
  });
  CHECK(contains(overlap_errors[0],
                 "rank 0: all_reduce #1: input and output overlap without being the same buffer"));

  const Local root({.ranks = 2});
  const auto root_errors = run_ranks(root, [&](LocalCommunicator& comm) {
    std::vector<float> buffer(3);
    comm.broadcast(std::span(buffer), 2);
  });
  for (int r = 0; r < 2; ++r) CHECK(contains(root_errors[r], "root 2 in a group of 2 ranks"));
}

TEST_CASE("local options name the field they reject") {
  CHECK(contains(thrown<cohort::ConfigError>([] { Local({.ranks = 0}); }),
                 "ranks = 0: must be greater than 0"));
  CHECK(contains(thrown<cohort::ConfigError>([] { Local({.ranks = 2, .timeout = 0ms}); }),
                 "timeout = 0 ms: must be greater than 0"));
  CHECK(contains(thrown<cohort::ConfigError>([] { Local({.ranks = 2, .timeout = -5ms}); }),
                 "timeout = -5 ms: must be greater than 0"));
  const Local local({.ranks = 2});
  CHECK(contains(thrown<cohort::ConfigError>([&] { (void)local.communicator(2); }),
                 "rank = 2: must lie in [0, 1]"));
  CHECK(local.communicator(1).rank() == 1);
  CHECK(local.communicator(1).size() == 2);
}
