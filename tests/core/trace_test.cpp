#include "cohort/core/trace.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace {

using cohort::trace::Detail;
using cohort::trace::Phase;
using cohort::trace::Recorder;
using cohort::trace::Span;

nlohmann::json written(const Recorder& recorder) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("cohort-trace-test-" + std::to_string(::getpid()) + ".json");
  recorder.write(file);
  std::ifstream in(file);
  nlohmann::json parsed = nlohmann::json::parse(in);  // throws if the file is not JSON
  std::filesystem::remove(file);
  return parsed;
}

// Spans of three threads, each with a step that holds two micro-batches and an optimizer span.
void record_steps(Recorder& recorder, int thread) {
  recorder.name_thread("replica " + std::to_string(thread));
  for (std::uint64_t step = 0; step < 3; ++step) {
    Span outer(&recorder, Phase::kStep, {.step = step});
    for (std::uint64_t micro = 0; micro < 2; ++micro) {
      Span inner(&recorder, Phase::kForwardBackward, {.step = step, .index = micro});
    }
    Span optimizer(&recorder, Phase::kOptimizer, {.step = step, .bytes = 64});
  }
}

}  // namespace

TEST_CASE("a trace file parses as JSON and its spans nest per thread") {
  Recorder recorder("worker 1", 1);
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 3; ++thread) {
    threads.emplace_back([&recorder, thread] { record_steps(recorder, thread); });
  }
  for (auto& thread : threads) thread.join();

  const nlohmann::json trace = written(recorder);
  std::map<int, std::vector<std::pair<double, double>>> spans_by_thread;
  std::map<int, std::string> thread_names;
  int complete = 0;
  for (const auto& event : trace.at("traceEvents")) {
    CHECK(event.at("pid") == 1);
    if (event.at("ph") == "M" && event.at("name") == "thread_name") {
      thread_names[event.at("tid").get<int>()] = event.at("args").at("name");
      continue;
    }
    if (event.at("ph") != "X") continue;
    ++complete;
    const double start = event.at("ts");
    spans_by_thread[event.at("tid").get<int>()].emplace_back(start,
                                                             start + event.at("dur").get<double>());
  }
  CHECK(complete == 3 * 3 * 4);
  CHECK(thread_names.size() == 3);
  REQUIRE(spans_by_thread.size() == 3);
  for (auto& [thread, spans] : spans_by_thread) {
    CAPTURE(thread);
    // Sorted by start (the longer first on a tie), every span ends before the next one starts,
    // or contains it: a stack.
    std::sort(spans.begin(), spans.end(), [](const auto& left, const auto& right) {
      return left.first != right.first ? left.first < right.first : left.second > right.second;
    });
    // The file holds nanoseconds exactly, but a JSON parser reads doubles: at today's wall-clock
    // microseconds (about 1.8e15) a double resolves a quarter of one, so ends are compared to
    // within a microsecond, the precision every viewer reads them with too.
    constexpr double kParsePrecisionUs = 1.0;
    std::vector<std::pair<double, double>> open;
    for (const auto& span : spans) {
      while (!open.empty() && open.back().second <= span.first + kParsePrecisionUs) {
        open.pop_back();
      }
      if (!open.empty()) CHECK(span.second <= open.back().second + kParsePrecisionUs);
      open.push_back(span);
    }
  }
}

TEST_CASE("a trace names each span's phase and writes only the details given") {
  Recorder recorder("ps 0", 3);
  { Span span(&recorder, Phase::kPush, {.index = 2, .bytes = 4096}); }
  const nlohmann::json trace = written(recorder);
  const auto& events = trace.at("traceEvents");
  const auto push = std::find_if(events.begin(), events.end(),
                                 [](const auto& event) { return event.at("ph") == "X"; });
  REQUIRE(push != events.end());
  CHECK((*push).at("name") == "push");
  CHECK((*push).at("cat") == "communication");
  CHECK((*push).at("args") == nlohmann::json{{"index", 2}, {"bytes", 4096}});
  CHECK(events.at(0).at("args").at("name") == "ps 0");
}

TEST_CASE("a span without a recorder records nothing") {
  Recorder recorder("process", 0);
  { Span span(nullptr, Phase::kOptimizer); }
  CHECK(recorder.events().empty());
}

TEST_CASE("a trace that cannot be written is a ConfigError naming the file") {
  Recorder recorder("process", 0);
  CHECK_THROWS_AS(recorder.write("/proc/cohort-no-such-dir/trace.json"), cohort::ConfigError);
}
