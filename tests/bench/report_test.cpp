// cohort-bench's arithmetic and output (tools/cohort-bench/report.hpp): busbw factors, shapes,
// sizes, statistics, the nccl-tests table against a golden file, and the JSON report's shape.
#include "report.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "settings.hpp"

namespace {

using namespace cohort::bench;

// Compares `actual` with golden/<name>. With COHORT_BENCH_UPDATE_GOLDEN=1 it rewrites the file
// instead (then review the diff: the golden files are the specification of the format).
void check_golden(const std::string& name, const std::string& actual) {
  const std::string path = std::string(COHORT_BENCH_GOLDEN_DIR) + "/" + name;
  if (const char* update = std::getenv("COHORT_BENCH_UPDATE_GOLDEN");
      update != nullptr && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "missing golden file " << path);
  const std::string expected{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  INFO("expected:\n" << expected << "\nactual:\n" << actual);
  CHECK(actual == expected);
}

// A fixed run: 4 ranks of all_reduce over tcp, three sizes, one of them with wrong elements.
RunInfo fixed_run() {
  RunInfo run;
  run.version = "0.1.0";
  run.collective = Collective::kAllReduce;
  run.backend = "tcp";
  run.algorithm = "deterministic";
  run.details = "frame checksums on";
  run.ranks = 4;
  run.launcher = "cohort-bench --np 4 (COHORT_* variables)";
  run.type = "float";
  run.op = "sum";
  run.root = 0;
  run.min_bytes = 8;
  run.max_bytes = 64 << 20;
  run.step_factor = 4;
  run.step_bytes = 1 << 20;
  run.iters = 4;
  run.warmup_iters = 5;
  run.check = true;
  run.machine = {"node7", "Example CPU @ 2.00GHz", 2};
  run.rank_info = {{0, 1001, "node7"}, {1, 1002, "node7"}, {2, 1003, "node7"}, {3, 1004, "node7"}};
  return run;
}

Row fixed_row(Collective collective, std::size_t bytes, std::vector<double> seconds,
              std::int64_t wrong_in_place) {
  const Shape shape = shape_of(collective, bytes, 4, 4);
  Row row;
  row.bytes = shape.bytes;
  row.count = shape.count;
  row.type = "float";
  row.redop = "sum";
  row.root = -1;
  row.out_of_place = measure(collective, shape.bytes, 4, seconds, 0, 0);
  for (double& s : seconds) s *= 0.5;
  row.in_place =
      measure(collective, shape.bytes, 4, seconds, wrong_in_place, wrong_in_place > 0 ? 1 : 0);
  return row;
}

std::vector<Row> fixed_rows() {
  const Collective c = Collective::kAllReduce;
  return {fixed_row(c, 8, {20e-6, 22e-6, 24e-6, 90e-6}, 0),
          fixed_row(c, 1 << 20, {800e-6, 810e-6, 790e-6, 1200e-6}, 0),
          fixed_row(c, 32 << 20, {0.120, 0.110, 0.130, 0.140}, 3)};
}

}  // namespace

TEST_CASE("busbw factors are nccl-tests': 2(n-1)/n, (n-1)/n and 1") {
  CHECK(bus_factor(Collective::kAllReduce, 1) == 0.0);
  CHECK(bus_factor(Collective::kAllReduce, 2) == 1.0);
  CHECK(bus_factor(Collective::kAllReduce, 4) == 1.5);
  CHECK(bus_factor(Collective::kAllReduce, 8) == 1.75);
  CHECK(bus_factor(Collective::kAllGather, 4) == 0.75);
  CHECK(bus_factor(Collective::kReduceScatter, 4) == 0.75);
  CHECK(bus_factor(Collective::kReduceScatter, 5) == doctest::Approx(0.8));
  CHECK(bus_factor(Collective::kBroadcast, 1) == 1.0);
  CHECK(bus_factor(Collective::kBroadcast, 16) == 1.0);
}

TEST_CASE("algbw is size over time in 1e9 bytes per second, and busbw scales it") {
  const Bandwidth all_reduce = bandwidth(Collective::kAllReduce, 1'000'000'000, 4, 2.0);
  CHECK(all_reduce.algbw == 0.5);
  CHECK(all_reduce.busbw == 0.75);
  const Bandwidth gather = bandwidth(Collective::kAllGather, 64 << 20, 4, 0.01);
  CHECK(gather.algbw == doctest::Approx(6.7108864));
  CHECK(gather.busbw == doctest::Approx(6.7108864 * 0.75));
  const Bandwidth none = bandwidth(Collective::kBroadcast, 100, 2, 0.0);
  CHECK(none.algbw == 0.0);
  CHECK(none.busbw == 0.0);
}

TEST_CASE("push_pull counts both directions in algbw, with busbw factor 1") {
  CHECK(bus_factor(Collective::kPushPull, 2) == 1.0);
  CHECK(bus_factor(Collective::kPushPull, 16) == 1.0);
  const Bandwidth push_pull = bandwidth(Collective::kPushPull, 1'000'000'000, 4, 2.0);
  CHECK(push_pull.algbw == 1.0);  // 1e9 pushed + 1e9 pulled in 2 s
  CHECK(push_pull.busbw == 1.0);
  const Shape shape = shape_of(Collective::kPushPull, 1 << 20, 4, 3);
  CHECK(shape.bytes == std::size_t{1} << 20);
  CHECK(shape.count == std::size_t{1} << 18);
  CHECK(shape.send == shape.receive);
}

TEST_CASE("shapes cut sizes into whole elements and whole chunks as nccl-tests does") {
  const Shape reduce = shape_of(Collective::kAllReduce, 64 << 20, 4, 4);
  CHECK(reduce.count == (16u << 20));
  CHECK(reduce.send == reduce.count);
  CHECK(reduce.receive == reduce.count);
  CHECK(reduce.bytes == (64u << 20));

  const Shape gather = shape_of(Collective::kAllGather, 64 << 20, 4, 4);
  CHECK(gather.count == (4u << 20));  // per rank: the input
  CHECK(gather.send == (4u << 20));
  CHECK(gather.receive == (16u << 20));
  CHECK(gather.bytes == (64u << 20));

  const Shape scatter = shape_of(Collective::kReduceScatter, 64 << 20, 8, 4);
  CHECK(scatter.count == (2u << 20));  // per rank: the output
  CHECK(scatter.send == (8u << 20));
  CHECK(scatter.receive == (2u << 20));
  CHECK(scatter.bytes == (64u << 20));

  // 100 bytes of float over 3 ranks: 25 elements, chunks of 8, 96 bytes.
  const Shape odd = shape_of(Collective::kReduceScatter, 100, 4, 3);
  CHECK(odd.chunk == 8);
  CHECK(odd.bytes == 96);
  CHECK(shape_of(Collective::kBroadcast, 7, 8, 2).bytes == 0);
}

TEST_CASE("byte counts take nccl-tests' K, M and G suffixes") {
  CHECK(parse_bytes("8") == std::optional<std::size_t>(8));
  CHECK(parse_bytes("64K") == std::optional<std::size_t>(65536));
  CHECK(parse_bytes("64k") == std::optional<std::size_t>(65536));
  CHECK(parse_bytes("64M") == std::optional<std::size_t>(std::size_t{64} << 20));
  CHECK(parse_bytes("1G") == std::optional<std::size_t>(std::size_t{1} << 30));
  CHECK(parse_bytes("1.5K") == std::optional<std::size_t>(1536));
  for (const char* bad : {"", "K", "-1", "8X", "1.2.3", "0.5", "64MB", " 8"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_bytes(bad).has_value());
  }
}

TEST_CASE("parameter counts are decimal: 1M is 10^6") {
  CHECK(parse_parameter_count("1M") == std::optional<std::size_t>(1'000'000));
  CHECK(parse_parameter_count("100M") == std::optional<std::size_t>(100'000'000));
  CHECK(parse_parameter_count("2.5M") == std::optional<std::size_t>(2'500'000));
  CHECK(parse_parameter_count("4096") == std::optional<std::size_t>(4096));
  for (const char* bad : {"", "M", "0", "1.5", "x", "-1M"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_parameter_count(bad).has_value());
  }
}

TEST_CASE("sweeps walk sizes as nccl-tests: times the factor, or plus the step, up to max") {
  const std::vector<std::size_t> by_four = sweep_sizes(8, 64 << 20, 4, 0);
  REQUIRE(by_four.size() == 12);
  CHECK(by_four.front() == 8);
  CHECK(by_four.back() == (32u << 20));  // 128M would pass 64M
  CHECK(sweep_sizes(1 << 20, 4 << 20, 1, 1 << 20) ==
        std::vector<std::size_t>{1 << 20, 2 << 20, 3 << 20, 4 << 20});
  CHECK(sweep_sizes(32 << 20, 32 << 20, 1, 1 << 20) == std::vector<std::size_t>{32 << 20});
  CHECK(sweep_sizes(9, 8, 2, 0).empty());
  CHECK(sweep_sizes(0, 8, 2, 0) == std::vector<std::size_t>{0});  // 0 x 2 would never grow
}

TEST_CASE("percentiles are nearest-rank, and a measurement averages the slowest rank's times") {
  CHECK(percentile({}, 50) == 0.0);
  CHECK(percentile({5.0}, 99) == 5.0);
  CHECK(percentile({4, 1, 3, 2}, 50) == 2.0);
  CHECK(percentile({4, 1, 3, 2}, 99) == 4.0);
  std::vector<double> twenty;
  for (int i = 1; i <= 20; ++i) twenty.push_back(i);
  CHECK(percentile(twenty, 50) == 10.0);
  CHECK(percentile(twenty, 99) == 20.0);

  const Measurement m =
      measure(Collective::kAllReduce, 4'000'000, 2, {0.001, 0.003, 0.002, 0.002}, 0, 0);
  CHECK(m.time_us == doctest::Approx(2000.0));
  CHECK(m.algbw == doctest::Approx(2.0));
  CHECK(m.busbw == doctest::Approx(2.0));
  CHECK(m.p50_us == doctest::Approx(2000.0));
  CHECK(m.p99_us == doctest::Approx(3000.0));
  CHECK(m.iterations_us.size() == 4);
}

TEST_CASE("times print as nccl-tests prints them: fewer decimals as they grow") {
  CHECK(format_time(5.0) == "   5.00");
  CHECK(format_time(99.994) == "  99.99");
  CHECK(format_time(100.0) == "  100.0");
  CHECK(format_time(9999.9) == " 9999.9");
  CHECK(format_time(10000.0) == "  10000");
  CHECK(format_time(123456.0) == " 123456");
}

TEST_CASE("the footer counts ranks with wrong values and averages busbw over both placements") {
  const Summary summary = summarize(fixed_rows());
  CHECK(summary.out_of_bounds == 1);
  CHECK(summary.checked);
  CHECK(format_footer(summary).find("# Out of bounds values : 1 FAILED\n") == 0);
  CHECK(format_footer(Summary{}) ==
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0\n#\n");
}

TEST_CASE("the table matches the golden output, nccl-tests columns first") {
  check_golden("all_reduce_table.txt", format_table(fixed_run(), fixed_rows()));
}

TEST_CASE("unchecked results print N/A in #wrong, and rooted collectives print their root") {
  RunInfo run = fixed_run();
  run.collective = Collective::kBroadcast;
  run.root = 2;
  run.check = false;
  run.rank_info.clear();
  Row row = fixed_row(Collective::kBroadcast, 1 << 20, {1e-3, 1e-3}, -1);
  row.out_of_place.wrong = -1;
  row.redop = "none";
  row.root = 2;
  check_golden("broadcast_unchecked_table.txt", format_table(run, {row}));
}

TEST_CASE("the JSON report holds every figure of the table") {
  const nlohmann::json j = nlohmann::json::parse(to_json(fixed_run(), fixed_rows()).dump());
  CHECK(j["tool"] == "cohort-bench");
  CHECK(j["collective"] == "all_reduce");
  CHECK(j["backend"] == "tcp");
  CHECK(j["algorithm"] == "deterministic");
  CHECK(j["ranks"] == 4);
  CHECK(j["bus_factor"] == 1.5);
  CHECK(j["machine"]["hostname"] == "node7");
  CHECK(j["machine"]["cores"] == 2);
  CHECK(j["settings"]["min_bytes"] == 8);
  CHECK(j["settings"]["step_factor"] == 4);
  CHECK(j["rank_info"].size() == 4);
  REQUIRE(j["results"].size() == 3);
  const nlohmann::json& last = j["results"][2];
  CHECK(last["size_bytes"] == (32 << 20));
  CHECK(last["count"] == (8 << 20));
  CHECK(last["root"] == -1);
  for (const char* placement : {"out_of_place", "in_place"}) {
    CAPTURE(placement);
    const nlohmann::json& m = last[placement];
    for (const char* key : {"time_us", "algbw_gbps", "busbw_gbps", "p50_us", "p99_us"}) {
      CAPTURE(key);
      CHECK(m[key].is_number());
    }
    CHECK(m["wrong"].is_number_integer());
    CHECK(m["iterations_us"].size() == 4);
  }
  CHECK(last["in_place"]["wrong"] == 3);
  CHECK(last["out_of_place"]["time_us"] == doctest::Approx(125000.0));
  CHECK(j["out_of_bounds"] == 1);
  CHECK(j["ok"] == false);
  CHECK(j["avg_busbw_gbps"] == doctest::Approx(summarize(fixed_rows()).avg_busbw));
}

TEST_CASE("ranks on GPUs name their device in the header and the JSON, as nccl-tests does") {
  RunInfo run = fixed_run();
  CHECK_FALSE(to_json(run, fixed_rows())["rank_info"][0].contains("device"));
  run.rank_info = {{0, 1001, "node7", "0 [0x1b] NVIDIA H100 80GB HBM3"},
                   {1, 1002, "node7", "1 [0x29] NVIDIA H100 80GB HBM3"}};
  const std::string header = format_header(run);
  for (const char* line :
       {"#  Rank  0 Pid   1001 on      node7 device 0 [0x1b] NVIDIA H100 80GB HBM3\n",
        "#  Rank  1 Pid   1002 on      node7 device 1 [0x29] NVIDIA H100 80GB HBM3\n"}) {
    CHECK(header.find(line) != std::string::npos);
  }
  const nlohmann::json j = to_json(run, fixed_rows());
  CHECK(j["rank_info"][1]["device"] == "1 [0x29] NVIDIA H100 80GB HBM3");
}
