// ParameterServer across real processes over TCP on 127.0.0.1: servers and workers of the same
// program (ps_trainer.cpp), started by the local launcher (cohort-run --ps) or by hand for the
// fault tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cohort/collective/wire.hpp>
#include <cohort/optimizer/sgd.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cohort/strategy/parameter_server.hpp>
#include <cohort/transport/loopback.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "jobs.hpp"
#include "processes.hpp"
#include "training.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::testing::bytes_of;
using cohort::testing::Process;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;
using cohort::testing::when_logged;
using namespace std::chrono_literals;

// The reference: Mirrored with 4 replicas in this process, as ps_trainer trains (with --clip:
// the wide model, clipped by global norm `clip`), without the gradient readiness the workers'
// model reports.
std::string mirrored_reference(std::uint64_t steps, double clip = 0.0) {
  cohort::Trainer trainer(
      cohort::testing::WithoutReadiness{clip > 0.0 ? cohort::testing::wide_model()
                                                   : cohort::testing::small_model()},
      cohort::strategy::Mirrored<>({.replicas = 4}),
      cohort::optimizer::Adam({.learning_rate = 3e-3, .max_gradient_norm = clip}),
      {.global_batch = 64, .seed = 11, .progress = cohort::Progress::kSilent});
  trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  return bytes_of(cohort::testing::parameters_of(trainer.model()));
}

// MultiWorkerMirrored in this one process, the gradient in `wire`'s format: the canonical tree
// over 4 replicas, as ps_trainer trains.
std::string multi_worker_reference(cohort::collective::Wire wire, std::uint64_t steps) {
  cohort::Trainer trainer(
      cohort::testing::WithoutReadiness{cohort::testing::small_model()},
      cohort::strategy::MultiWorkerMirrored<>({.local_replicas = 4, .wire = wire}),
      cohort::optimizer::Adam({.learning_rate = 3e-3}),
      {.global_batch = 64, .seed = 11, .progress = cohort::Progress::kSilent});
  trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  return bytes_of(cohort::testing::parameters_of(trainer.model()));
}

double accuracy_of(const std::string& parameters) {
  auto model = cohort::testing::small_model();
  auto span = cohort::ModelTraits<example::Mlp>::parameters(model);
  REQUIRE(parameters.size() == span.size() * sizeof(float));
  std::memcpy(span.data(), parameters.data(), parameters.size());
  return example::accuracy(model, cohort::testing::small_task_data());
}

// cohort-run --np WORKERS --ps SERVERS -- ps_trainer ARGS..., to completion within 120 s.
std::pair<cohort::testing::Exit, std::string> launch(
    int workers, int servers, const std::vector<std::string>& arguments, const fs::path& log,
    const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> command = {
      COHORT_RUN, "--np", std::to_string(workers), "--ps", std::to_string(servers), "--timeout-s",
      "100",      "--",   COHORT_PS_TRAINER};
  command.insert(command.end(), arguments.begin(), arguments.end());
  return cohort::testing::completed(command, log, env);
}

// A 2-worker, 2-server sync job that restores `checkpoint` and trains to `steps`; the chief's
// parameters.
std::string continue_from(const fs::path& checkpoint, std::uint64_t steps, const fs::path& out,
                          const fs::path& log) {
  fs::remove(out);
  const auto [exit, output] =
      launch(2, 2, {"sync", std::to_string(steps), out, "--restore", checkpoint}, log);
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  return read_file(out);
}

// Every process of a job started by hand, each with its own log: workers first, then servers.
struct Job {
  std::vector<std::unique_ptr<Process>> workers;
  std::vector<std::unique_ptr<Process>> servers;
  fs::path directory;

  // The environments join the workers' and the servers' own.
  Job(int worker_count, int server_count, const std::vector<std::string>& arguments,
      const fs::path& where, const std::map<std::string, std::string>& worker_environment = {},
      const std::map<std::string, std::string>& server_environment = {})
      : directory(where),
        worker_count_(worker_count),
        server_count_(server_count),
        port_(std::to_string(cohort::testing::free_port())),
        worker_environment_(worker_environment),
        server_environment_(server_environment) {
    command_.insert(command_.end(), arguments.begin(), arguments.end());
    for (int i = 0; i < worker_count; ++i) workers.push_back(start(false, i, log(false, i)));
    for (int i = 0; i < server_count; ++i) servers.push_back(start(true, i, log(true, i)));
  }

  fs::path log(bool server, int index) const {
    return directory / ((server ? "ps" : "worker") + std::to_string(index) + ".log");
  }

  // Worker `index`'s process started again with COHORT_JOIN=1, as a pod's restart policy would,
  // in its place of `workers`; its log is log_again(index).
  void start_again(int index) {
    workers[static_cast<std::size_t>(index)] =
        start(false, index, log_again(index), {{"COHORT_JOIN", "1"}});
  }
  fs::path log_again(int index) const {
    return directory / ("worker" + std::to_string(index) + ".again.log");
  }

  // Waits until every process has met the others (its rendezvous is done), so that a process
  // stopped or killed next is lost during training, not during the rendezvous.
  void require_connected() const {
    for (int server = 0; server < 2; ++server) {
      const auto& processes = server ? servers : workers;
      for (std::size_t index = 0; index < processes.size(); ++index) {
        const fs::path file = log(server, static_cast<int>(index));
        REQUIRE_MESSAGE(when_logged(file, "ps_trainer: connected", 60s).has_value(),
                        read_file(file));
      }
    }
  }

  // Waits for workers 0 to count - 1 and checks that each finished its training (exit 0).
  void require_trained(int count, std::chrono::seconds timeout) {
    for (int worker = 0; worker < count; ++worker) {
      CAPTURE(worker);
      const auto exit = workers[static_cast<std::size_t>(worker)]->wait(timeout);
      CAPTURE(read_file(log(false, worker)));
      REQUIRE(exit.has_value());
      CHECK(exit->exited);
      CHECK(exit->code == 0);
    }
  }

 private:
  std::unique_ptr<Process> start(bool server, int index, const fs::path& output,
                                 const std::map<std::string, std::string>& extra = {}) const {
    std::map<std::string, std::string> env = {
        {"COHORT_ROLE", server ? "ps" : "worker"},
        {"COHORT_RANK", std::to_string(index)},
        {"COHORT_WORLD_SIZE", std::to_string(server ? server_count_ : worker_count_)},
        {server ? "COHORT_WORKER_COUNT" : "COHORT_PS_COUNT",
         std::to_string(server ? worker_count_ : server_count_)},
        {"COHORT_MASTER_ADDR", "127.0.0.1"},
        {"COHORT_MASTER_PORT", port_},
        {"COHORT_JOB_ID", "ps-test"}};
    const auto& own = server ? server_environment_ : worker_environment_;
    env.insert(own.begin(), own.end());
    env.insert(extra.begin(), extra.end());
    return std::make_unique<Process>(command_, env, output);
  }

  int worker_count_;
  int server_count_;
  std::string port_;
  std::map<std::string, std::string> worker_environment_;
  std::map<std::string, std::string> server_environment_;
  std::vector<std::string> command_{COHORT_PS_TRAINER};
};

// The environment entries that pick out one child of cohort-run.
using Victim = std::vector<std::string>;

// SIGKILLs the children of cohort-run `launcher` whose environments have each of `victims`'
// entries, in turn, the next at a point drawn 0.2 to 0.7 s after the last, and returns the
// launcher's log once it has ended with status 0.
std::string succeeded_after_kill(Process& launcher, const fs::path& log,
                                 const std::vector<Victim>& victims) {
  std::mt19937 draw(std::random_device{}());
  for (std::size_t i = 0; i < victims.size(); ++i) {
    if (i > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 700)(draw)));
    }
    const auto child = cohort::testing::child_with(launcher.pid(), victims[i]);
    REQUIRE(child.has_value());
    ::kill(*child, SIGKILL);
  }
  const auto exit = launcher.wait(120s);
  const std::string text = read_file(log);
  CAPTURE(text);
  REQUIRE(exit.has_value());
  CHECK(exit->exited);
  CHECK(exit->code == 0);
  return text;
}

// An elastic job of 4 workers and 2 servers training `steps` steps under `consistency` to `out`,
// started by `cohort-run --np 4 --ps 2 --min-np MIN_NP --max-restarts RESTARTS` with `env` and the
// trainer's `arguments` after its own, and the processes `victims` pick out SIGKILLed, the first
// at a point drawn 0.2 to 0.7 s into training (succeeded_after_kill): the launcher's log, once it
// has succeeded.
std::string elastic_job_after_kill(const std::string& consistency, std::uint64_t steps,
                                   const fs::path& out, const fs::path& log, int restarts,
                                   const std::vector<std::string>& arguments,
                                   const std::map<std::string, std::string>& env,
                                   const std::vector<Victim>& victims, int min_np = 2) {
  std::vector<std::string> command = {COHORT_RUN,
                                      "--np",
                                      "4",
                                      "--ps",
                                      "2",
                                      "--min-np",
                                      std::to_string(min_np),
                                      "--max-restarts",
                                      std::to_string(restarts),
                                      "--",
                                      COHORT_PS_TRAINER,
                                      consistency,
                                      std::to_string(steps),
                                      out.string()};
  command.insert(command.end(), arguments.begin(), arguments.end());
  Process launcher(command, env, log);
  REQUIRE(when_logged(log, "ps_trainer: connected", 60s, 6).has_value());
  std::mt19937 draw(std::random_device{}());
  std::this_thread::sleep_for(
      std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 700)(draw)));
  return succeeded_after_kill(launcher, log, victims);
}

std::string milliseconds(std::chrono::milliseconds duration) {
  return std::to_string(duration.count());
}

double seconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

namespace ps = cohort::strategy::ps;
using LoopbackClient = ps::Client<cohort::transport::Loopback::Endpoint>;

// What a server over Loopback counted, or the error it threw, and when its serve() returned.
struct Served {
  ps::ServerCounts counts;
  std::string error;
  std::chrono::steady_clock::time_point ended;
};

// A server over Loopback (rank 2, worker_timeout 300 ms) of one chunk of 16 floats under SGD,
// with workers 0 and 1 as threads: each presents the same settings, worker 0 initializes the
// chunk, then each runs its body with its Client and the chunk, and closes its endpoint when the
// body returns. A worker's CommError goes to its entry of `worker_errors`.
template <class C, class ChiefBody, class OtherBody>
Served serve_over_loopback(ChiefBody chief_body, OtherBody other_body,
                           std::string (&worker_errors)[2]) {
  using Endpoint = cohort::transport::Loopback::Endpoint;
  cohort::transport::Loopback group({.ranks = 3, .timeout = 5s});
  const ps::Layout layout(16, sizeof(float), 1,
                          {.min_shard_bytes = 0, .alignment = 16, .chunk_bytes = 64});
  const ps::Chunk& chunk = layout.chunks().front();
  const cohort::optimizer::Sgd sgd({.learning_rate = 1.0});
  const auto settings = cohort::settings::encode({{"optimizer", "sgd"}, {"seed", "11"}});
  Served served;
  std::thread server_thread([&] {
    auto endpoint = group.endpoint(2);
    ps::Server<Endpoint, float, cohort::optimizer::Sgd, C> server(
        endpoint, layout,
        {.server = 0, .workers = 2, .worker_timeout = 300ms, .settings = {{"optimizer", "sgd"}}},
        sgd);
    try {
      served.counts = server.serve();
    } catch (const cohort::CommError& error) {
      served.error = error.what();
    }
    served.ended = std::chrono::steady_clock::now();
    endpoint.close();
  });
  const auto worker = [&](int index, auto& body) {
    auto endpoint = group.endpoint(index);
    LoopbackClient client(endpoint, index, 2);
    try {
      client.present(settings, 1);
      if (index == 0) {
        const std::vector<float> parameters(16, 1.0f);
        client.add({.operation = ps::Operation::kInit, .element_bytes = sizeof(float)}, chunk,
                   std::as_bytes(std::span(parameters)));
        client.transfer();
      }
      body(client, chunk);
    } catch (const cohort::CommError& error) {
      worker_errors[index] = error.what();
    }
    endpoint.close();
  };
  std::thread other([&] { worker(1, other_body); });
  worker(0, chief_body);
  other.join();
  server_thread.join();
  return served;
}

// A worker's pull over Loopback, after a push of step `push_step` where given (one step).
void pull(LoopbackClient& client, const ps::Chunk& chunk,
          std::optional<std::uint64_t> push_step = std::nullopt) {
  const std::vector<float> gradient(16, 1.0f);
  std::vector<float> parameters(16);
  if (push_step) {
    client.add(
        {.operation = ps::Operation::kPush, .step = *push_step, .element_bytes = sizeof(float)},
        chunk, std::as_bytes(std::span(gradient)));
  }
  client.add({.operation = ps::Operation::kPull, .element_bytes = sizeof(float)}, chunk, {},
             std::as_writable_bytes(std::span(parameters)));
  client.transfer();
}

// serve_over_loopback with worker 0 training `steps` steps, `pause` apart, then saying it is
// done, and worker 1 pulling once, then silent (its endpoint open) until `quiet` has passed.
template <class C>
Served serve_with_a_silent_worker(int steps, std::chrono::milliseconds pause,
                                  std::chrono::milliseconds quiet,
                                  std::string (&worker_errors)[2]) {
  return serve_over_loopback<C>(
      [&](LoopbackClient& client, const ps::Chunk& chunk) {
        for (int step = 0; step < steps; ++step) {
          pull(client, chunk, static_cast<std::uint64_t>(step));
          std::this_thread::sleep_for(pause);
        }
        client.done(1, cohort::strategy::FitEnd::kReached, static_cast<std::uint64_t>(steps));
      },
      [&](LoopbackClient& client, const ps::Chunk& chunk) {
        pull(client, chunk);
        std::this_thread::sleep_for(quiet);
      },
      worker_errors);
}

// Lines "applied push N of worker W (the slowest live worker has pushed M; ...)" of a log.
struct PushLine {
  unsigned long long push, worker, slowest;
};
std::vector<PushLine> push_lines(const std::string& log) {
  std::vector<PushLine> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("applied push ");
    if (at == std::string::npos) continue;
    PushLine parsed{};
    if (std::sscanf(line.c_str() + at,
                    "applied push %llu of worker %llu (the slowest live worker has pushed %llu",
                    &parsed.push, &parsed.worker, &parsed.slowest) == 3) {
      lines.push_back(parsed);
    }
  }
  return lines;
}

}  // namespace

TEST_CASE("the layout splits on aligned boundaries, respects the minimum shard and chunks") {
  namespace ps = cohort::strategy::ps;
  const ps::Layout small(1000, 4, 4,
                         {.min_shard_bytes = 256 << 10, .alignment = 4096, .chunk_bytes = 1 << 20});
  REQUIRE(small.chunks().size() == 1);  // a small model stays on one server
  CHECK(small.chunks_of(0).size() == 1);
  CHECK(small.chunks_of(1).empty());
  const std::size_t n = 3 * 4096 * 64 + 7;
  const ps::Layout large(n, 4, 2,
                         {.min_shard_bytes = 0, .alignment = 4096, .chunk_bytes = 1 << 18});
  std::size_t covered = 0;
  for (int server = 0; server < 2; ++server) {
    for (const auto& chunk : large.chunks_of(server)) {
      CHECK(chunk.begin == covered);
      CHECK(chunk.size() <= (1u << 18) / 4);
      covered = chunk.end;
    }
    if (server == 0) CHECK(covered % 4096 == 0);  // the shard boundary is aligned
  }
  CHECK(covered == n);
}

TEST_CASE(
    "sync parameter server with 1 and 2 servers, 2, 3 and 4 workers equals Mirrored bit for bit") {
  TemporaryDirectory directory("cohort-ps-sync");
  const std::string expected = mirrored_reference(50);
  // 3 workers are dealt 2, 2 and 4 of the 8 micro-batches.
  for (const auto& [workers, servers] :
       {std::pair{2, 1}, std::pair{2, 2}, std::pair{3, 2}, std::pair{4, 1}, std::pair{4, 2}}) {
    CAPTURE(workers);
    CAPTURE(servers);
    const fs::path out = directory.path / "parameters.bin";
    fs::remove(out);
    const auto [exit, output] =
        launch(workers, servers, {"sync", "50", out}, directory.path / "log.txt");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    CHECK(read_file(out) == expected);
    // Every server applied 50 steps with every worker's push in each.
    CHECK(output.find("pushes applied per worker [50, 50") != std::string::npos);
  }
}

TEST_CASE("workers of 2 replica threads each: sync equals Mirrored, async trains") {
  TemporaryDirectory directory("cohort-ps-local");
  const fs::path out = directory.path / "parameters.bin";
  {
    const auto [exit, output] =
        launch(2, 2, {"sync", "50", out, "--local-replicas", "2"}, directory.path / "sync.log");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    CHECK(read_file(out) == mirrored_reference(50));
    // One push per worker and step: a worker's replicas push their sum once.
    CHECK(output.find("pushes applied per worker [50, 50]") != std::string::npos);
  }
  fs::remove(out);
  const auto [exit, output] =
      launch(2, 1, {"async", "200", out, "--local-replicas", "2"}, directory.path / "async.log");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(accuracy_of(read_file(out)) >= accuracy_of(mirrored_reference(200)) - 0.05);
}

TEST_CASE(
    "pushes in bfloat16 (COHORT_WIRE=bf16) give MultiWorkerMirrored's bfloat16 bits on any worker, "
    "replica and server count, and pushes in float16 its float16 bits") {
  TemporaryDirectory directory("cohort-ps-bf16");
  const std::string expected = multi_worker_reference(cohort::collective::Wire::kBfloat16, 50);
  CHECK(expected != mirrored_reference(50));  // other bits than the float tree's

  const std::map<std::string, std::string> bf16 = {{"COHORT_WIRE", "bf16"}};
  const fs::path out = directory.path / "parameters.bin";
  // 3 workers of 2 replicas: 1, 1, 1, 1, 2 and 2 of the 8 micro-batches.
  for (const auto& [workers, servers, local] : {std::tuple{2, 2, "1"}, std::tuple{2, 1, "2"},
                                                std::tuple{3, 1, "2"}, std::tuple{4, 2, "1"}}) {
    CAPTURE(workers);
    CAPTURE(servers);
    CAPTURE(local);
    fs::remove(out);
    const auto [exit, output] =
        launch(workers, servers, {"sync", "50", out, "--local-replicas", local},
               directory.path / "sync.log", bf16);
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    CHECK(read_file(out) == expected);
  }

  // Pushes in float16: MultiWorkerMirrored's float16 bits.
  const std::string half = multi_worker_reference(cohort::collective::Wire::kFloat16, 50);
  CHECK(half != expected);
  fs::remove(out);
  {
    const auto [exit, output] = launch(2, 2, {"sync", "50", out, "--local-replicas", "2"},
                                       directory.path / "fp16.log", {{"COHORT_WIRE", "fp16"}});
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    CHECK(read_file(out) == half);
  }

  // Asynchronous pushes in bfloat16 train as well as synchronous ones.
  fs::remove(out);
  const auto [exit, output] =
      launch(2, 1, {"async", "200", out}, directory.path / "async.log", bf16);
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(accuracy_of(read_file(out)) >= accuracy_of(mirrored_reference(200)) - 0.05);
}

TEST_CASE("sync with global-norm clipping over 2 servers equals Mirrored bit for bit") {
  TemporaryDirectory directory("cohort-ps-clip");
  constexpr double kClip = 0.05;
  const std::string expected = mirrored_reference(30, kClip);
  REQUIRE(expected != mirrored_reference(30, 1e9));  // the bound clips
  const fs::path out = directory.path / "parameters.bin";
  const auto [exit, output] = launch(2, 2, {"sync", "30", out, "--clip", std::to_string(kClip)},
                                     directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(read_file(out) == expected);
  // Each server held a shard of two chunks: the norm was composed across servers and chunks.
  CHECK(output.find("parameter server 0 (sync, 2 chunks)") != std::string::npos);
  CHECK(output.find("parameter server 1 (sync, 2 chunks)") != std::string::npos);
}

TEST_CASE(
    "clipping with shards that split the norm's blocks is a ConfigError naming alignment, which "
    "the server tells the worker") {
  TemporaryDirectory directory("cohort-ps-clip-alignment");
  const auto [exit, output] = launch(
      1, 1, {"sync", "5", directory.path / "parameters.bin", "--clip", "0.05", "--alignment", "16"},
      directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  CHECK(exit.code != 0);
  // The worker's own line, which cohort-run may print before it stops the server.
  CHECK(output.find("failed at parameter server 0 (rank 1): rank 1 left: 'alignment = 16") !=
        std::string::npos);
  CHECK(output.find("max_gradient_norm") != std::string::npos);
}

TEST_CASE("async and bounded-staleness training reach the accuracy of synchronous training") {
  TemporaryDirectory directory("cohort-ps-async");
  const double reference = accuracy_of(mirrored_reference(150));
  for (const std::string consistency : {"async", "bounded2"}) {
    CAPTURE(consistency);
    const fs::path out = directory.path / "parameters.bin";
    fs::remove(out);
    const auto [exit, output] = launch(4, 2, {consistency, "150", out}, directory.path / "log.txt");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    const double accuracy = accuracy_of(read_file(out));
    MESSAGE(consistency << ": accuracy " << accuracy << ", synchronous " << reference);
    CHECK(accuracy >= reference - 0.05);
    // Each push applied exactly once: every worker's 150 pushes, on every server.
    CHECK(output.find("pushes applied per worker [150, 150, 150, 150]") != std::string::npos);
    CHECK(output.find("staleness {") != std::string::npos);
  }
}

TEST_CASE("with K = 2 and one slow worker, no worker runs more than 2 steps ahead") {
  TemporaryDirectory directory("cohort-ps-bounded");
  const fs::path out = directory.path / "parameters.bin";
  const auto [exit, output] = launch(
      4, 1, {"bounded2", "40", out, "--slow-worker", "3", "--sleep-ms", "10", "--log-pushes"},
      directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  const auto lines = push_lines(output);
  REQUIRE(lines.size() == 4 * 40);
  unsigned long long widest = 0;
  for (const PushLine& line : lines) {
    CAPTURE(line.push);
    CAPTURE(line.worker);
    CHECK(line.push - line.slowest <= 2);
    widest = std::max(widest, line.push - line.slowest);
  }
  CHECK(widest == 2);  // the bound was reached: the fast workers did wait for the slow one
}

TEST_CASE("a worker killed during async training is reported and the others complete") {
  TemporaryDirectory directory("cohort-ps-kill-worker");
  Job job(4, 2,
          {"async", "300", directory.path / "out.bin", "--slow-worker", "3", "--sleep-ms", "20"},
          directory.path);
  job.require_connected();
  REQUIRE_FALSE(job.workers[3]->wait(0ms).has_value());
  job.workers[3]->kill(SIGKILL);
  job.require_trained(3, 90s);
  for (int server = 0; server < 2; ++server) {
    const auto exit = job.servers[static_cast<std::size_t>(server)]->wait(30s);
    const std::string log = read_file(job.log(true, server));
    CAPTURE(log);
    REQUIRE(exit.has_value());
    CHECK(exit->code == 0);
    CHECK(log.find("lost worker 3 (rank 3)") != std::string::npos);
    CHECK(log.find("pushes applied per worker [300, 300, 300, ") != std::string::npos);
  }
  CHECK(fs::exists(directory.path / "out.bin"));
}

TEST_CASE("a server killed mid-training makes every worker exit non-zero naming it") {
  TemporaryDirectory directory("cohort-ps-kill-server");
  Job job(4, 2, {"sync", "1000000", directory.path / "never.bin"}, directory.path);
  job.require_connected();
  for (const auto& worker : job.workers) REQUIRE_FALSE(worker->wait(0ms).has_value());
  job.servers[1]->kill(SIGKILL);
  for (int worker = 0; worker < 4; ++worker) {
    CAPTURE(worker);
    const auto exit = job.workers[static_cast<std::size_t>(worker)]->wait(30s);
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code != 0);
    const std::string log = read_file(job.log(false, worker));
    CAPTURE(log);
    CHECK(log.find("parameter server 1 (rank 5)") != std::string::npos);
  }
}

TEST_CASE("a restart from the last checkpoint reaches the parameters of an uninterrupted run") {
  TemporaryDirectory directory("cohort-ps-restart");
  const std::string expected = mirrored_reference(50);
  const fs::path checkpoint = directory.path / "run.ckpt";
  const fs::path out = directory.path / "parameters.bin";
  {
    // The first run stops after 30 steps (as a crash after the checkpoint at step 30 would).
    const auto [exit, output] =
        launch(2, 2, {"sync", "30", out, "--segment", "10", "--checkpoint", checkpoint},
               directory.path / "first.log");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    REQUIRE(fs::exists(checkpoint));
  }
  // Three saves, one manifest: the shards of the last save, one per server, and no other file.
  const auto manifest =
      cohort::checkpoint::detail::read_container<float, cohort::checkpoint::TrainingState<float>>(
          checkpoint, cohort::checkpoint::kManifestMagic)
          .payload;
  CHECK(manifest.step == 30);
  CHECK(manifest.parameters.empty());
  REQUIRE(manifest.shards.size() == 2);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(directory.path)) {
    if (entry.path().filename().string().starts_with("run.ckpt")) {
      files.push_back(entry.path().filename().string());
    }
  }
  std::sort(files.begin(), files.end());
  CHECK(files ==
        std::vector<std::string>{"run.ckpt", manifest.shards[0].file, manifest.shards[1].file});

  SUBCASE("every process restores the manifest and continues under ParameterServer") {
    CHECK(continue_from(checkpoint, 50, out, directory.path / "second.log") == expected);
  }
  SUBCASE("Mirrored restores the sharded checkpoint and continues with the same bits") {
    cohort::Trainer trainer(
        cohort::testing::small_model(), cohort::strategy::Mirrored<>({.replicas = 2}),
        cohort::optimizer::Adam({.learning_rate = 3e-3}),
        {.global_batch = 64, .seed = 11, .progress = cohort::Progress::kSilent});
    trainer.restore(checkpoint);
    CHECK(trainer.step() == 30);
    trainer.fit(cohort::testing::small_task_data(), {.steps = 50});
    CHECK(bytes_of(cohort::testing::parameters_of(trainer.model())) == expected);
  }
}

// Only the chief writes the manifest; no process may return from save before it, or a restore
// right after would not find the checkpoint whole.
TEST_CASE("every process returns from a sharded save only once the manifest is written") {
  TemporaryDirectory directory("cohort-ps-save-restore");
  const fs::path checkpoint = directory.path / "run.ckpt";
  const fs::path out = directory.path / "parameters.bin";
  const auto [exit, output] =
      launch(2, 2, {"sync", "30", out, "--segment", "10", "--checkpoint", checkpoint, "--reread"},
             directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(read_file(out) == mirrored_reference(30));
}

TEST_CASE(
    "a server killed mid-run: the job restarted from its last checkpoint ends as if "
    "uninterrupted") {
  TemporaryDirectory directory("cohort-ps-kill-restart");
  const std::string expected = mirrored_reference(60);
  const fs::path checkpoint = directory.path / "run.ckpt";
  const fs::path out = directory.path / "parameters.bin";
  {
    // A checkpoint every 10 steps; worker 1's data is slow, so that the run takes seconds.
    const fs::path logs = directory.path / "first";
    fs::create_directories(logs);
    Job job(2, 2,
            {"sync", "60", out, "--segment", "10", "--checkpoint", checkpoint, "--slow-worker", "1",
             "--sleep-ms", "10"},
            logs);
    std::uint64_t saved = 0;
    for (const auto deadline = std::chrono::steady_clock::now() + 60s;
         saved < 20 && std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(20ms)) {
      try {
        saved = cohort::checkpoint::read<float>(checkpoint).step;
      } catch (const cohort::CheckpointError&) {
        // not written yet
      }
    }
    REQUIRE(saved >= 20);
    for (const auto& worker : job.workers) REQUIRE_FALSE(worker->wait(0ms).has_value());
    job.servers[1]->kill(SIGKILL);
    for (int worker = 0; worker < 2; ++worker) {
      const auto exit = job.workers[static_cast<std::size_t>(worker)]->wait(60s);
      CAPTURE(read_file(job.log(false, worker)));
      REQUIRE(exit.has_value());
      CHECK_FALSE((exit->exited && exit->code == 0));
    }
    const auto last = cohort::checkpoint::read<float>(checkpoint).step;
    MESSAGE("server 1 killed after the checkpoint at step " << saved << "; the last one is at step "
                                                            << last);
    CHECK(last < 60);
  }
  CHECK(continue_from(checkpoint, 60, out, directory.path / "second.log") == expected);
}

TEST_CASE(
    "under cohort-run --max-restarts, a server SIGKILLed mid-fit stops the job, every rank starts "
    "again, and the job resumes from the newest checkpoint in its directory to an uninterrupted "
    "run's bits") {
  TemporaryDirectory directory("cohort-ps-run-restart");
  const std::string expected = mirrored_reference(60);
  const fs::path out = directory.path / "parameters.bin";
  const fs::path log = directory.path / "log.txt";
  // A sharded checkpoint every 10 steps; every worker pauses, so that the fit takes seconds.
  Process launcher(
      {COHORT_RUN, "--np", "2", "--ps", "2", "--max-restarts", "2", "--", COHORT_PS_TRAINER, "sync",
       "60", out.string(), "--checkpoint-directory", (directory.path / "checkpoints").string(),
       "--checkpoint-every", "10", "--every-worker-sleep-ms", "40"},
      {}, log);
  REQUIRE(when_logged(log, "for a checkpoint at step 20", 60s).has_value());
  const std::string text =
      succeeded_after_kill(launcher, log, {{"COHORT_ROLE=ps", "COHORT_RANK=1"}});
  CAPTURE(text);
  CHECK(text.find("cohort-run: ps 1 was killed by signal 9 (Killed)") != std::string::npos);
  CHECK(text.find("cohort-run: the job stopped after ps 1 failed; starting every rank again "
                  "(restart 1 of 2)") != std::string::npos);
  CHECK(text.find("cohort: resuming from ") != std::string::npos);
  CHECK(read_file(out) == expected);
}

TEST_CASE(
    "under cohort-run --min-np --max-restarts, an async worker SIGKILLed mid-fit is started again "
    "and takes its place back: each of its steps reaches every chunk once") {
  TemporaryDirectory directory("cohort-ps-take-back");
  const fs::path out = directory.path / "parameters.bin";
  const fs::path log = directory.path / "log.txt";
  // The chief trains slowest, so that its door is open while worker 2 comes back; the others
  // train for about 1.5 s, and worker 2 is killed at a point drawn in its first half.
  const std::string text = elastic_job_after_kill(
      "async", 300, out, log, 1,
      {"--every-worker-sleep-ms", "5", "--slow-worker", "0", "--sleep-ms", "25"},
      {{"COHORT_SECRET", "take-back"}}, {{"COHORT_ROLE=worker", "COHORT_RANK=2"}});
  CAPTURE(text);
  CHECK(text.find("cohort-run: worker 2 was killed by signal 9 (Killed); starting it again "
                  "(restart 1 of 1)") != std::string::npos);
  CHECK(text.find("cohort: worker 2 took its place back, at step ") != std::string::npos);
  for (const char* server : {"parameter server 0", "parameter server 1"}) {
    CAPTURE(server);
    CHECK(text.find(std::string("cohort: ") + server +
                    ": took back worker 2 (rank 2), started "
                    "again") != std::string::npos);
    // Every worker's 300 steps, worker 2's from both of its processes, each pushed once.
    CHECK(text.find(std::string("cohort: ") + server +
                    " (async, 2 chunks): pushes applied per worker [300, 300, 300, 300], workers "
                    "lost 1, taken back 1") != std::string::npos);
  }
  CHECK(fs::exists(out));
}

TEST_CASE(
    "under cohort-run --min-np --max-restarts, an async server SIGKILLed mid-fit stops the job and "
    "every rank starts again, no worker started again for it") {
  // A server's shard lives nowhere else: the elastic job cannot go on without it. The workers
  // fail of its loss right after it; they are not started again to join a job that stops.
  TemporaryDirectory directory("cohort-ps-server-lost");
  const fs::path out = directory.path / "parameters.bin";
  const fs::path log = directory.path / "log.txt";
  const std::string text =
      elastic_job_after_kill("async", 300, out, log, 3, {"--every-worker-sleep-ms", "5"}, {},
                             {{"COHORT_ROLE=ps", "COHORT_RANK=1"}});
  CAPTURE(text);
  CHECK(text.find("cohort-run: ps 1 was killed by signal 9 (Killed)") != std::string::npos);
  CHECK(text.find("cohort-run: the job stopped after ps 1 failed; starting every rank again "
                  "(restart 1 of 3)") != std::string::npos);
  CHECK(text.find("starting it again") == std::string::npos);
  // The second start trains every worker's 300 steps.
  for (const char* server : {"parameter server 0", "parameter server 1"}) {
    CAPTURE(server);
    CHECK(text.find(std::string("cohort: ") + server +
                    " (async, 2 chunks): pushes applied per worker [300, 300, 300, 300], workers "
                    "lost 0") != std::string::npos);
  }
  CHECK(fs::exists(out));
}

// An elastic sync job of 4 workers and 2 servers training `steps` steps under cohort-run
// --min-np 2 --max-restarts RESTARTS, worker `worker` (or one other than the chief, drawn at
// random) SIGKILLed at a random point: which worker, and the launcher's log, once the job has ended
// with Mirrored's bits.
std::pair<int, std::string> sync_job_after_worker_kill(const std::string& name, std::uint64_t steps,
                                                       int restarts,
                                                       std::optional<int> worker = std::nullopt) {
  TemporaryDirectory directory(name);
  const fs::path out = directory.path / "parameters.bin";
  std::mt19937 draw(std::random_device{}());
  const int lost = worker.value_or(std::uniform_int_distribution<int>(1, 3)(draw));
  CAPTURE(lost);
  std::string text = elastic_job_after_kill(
      "sync", steps, out, directory.path / "log.txt", restarts, {"--every-worker-sleep-ms", "5"},
      {{"COHORT_SECRET", name}}, {{"COHORT_ROLE=worker", "COHORT_RANK=" + std::to_string(lost)}});
  CAPTURE(text);
  CHECK(text.find("cohort: workers 4 -> 3 at step ") != std::string::npos);
  CHECK(text.find("(rank " + std::to_string(lost) + " lost: ") != std::string::npos);
  CHECK(read_file(out) == mirrored_reference(steps));
  return {lost, std::move(text)};
}

TEST_CASE(
    "an elastic sync job that loses a worker at a random step retries it over the workers left and "
    "ends with the parameters of a job that lost none") {
  // The servers keep each chunk's parameters from before its last update: wherever the kill falls,
  // some chunks may have taken the step the workers left retry.
  const auto [lost, text] = sync_job_after_worker_kill("cohort-ps-sync-goes-on", 200, 0);
  CAPTURE(text);
  CHECK(text.find("cohort-run: worker " + std::to_string(lost) +
                  " was killed by signal 9 (Killed); 3 workers go on without it (--min-np 2)") !=
        std::string::npos);
  for (const char* server : {"parameter server 0", "parameter server 1"}) {
    CAPTURE(server);
    CHECK(text.find(std::string("cohort: ") + server +
                    " (sync, 2 chunks): pushes applied per worker [200, 200, 200], workers lost "
                    "1") != std::string::npos);
  }
}

TEST_CASE(
    "an elastic sync job takes a lost worker's process started again in at a step boundary, to the "
    "bits of a job that lost none") {
  const auto [lost, text] = sync_job_after_worker_kill("cohort-ps-sync-takes-in", 300, 1);
  CAPTURE(text);
  CHECK(text.find("cohort-run: worker " + std::to_string(lost) +
                  " was killed by signal 9 (Killed); starting it again (restart 1 of 1)") !=
        std::string::npos);
  CHECK(text.find("joined the job of 4 workers at step ") != std::string::npos);
  CHECK(text.find(" (1 joined)") != std::string::npos);
}

// An elastic sync job of 4 workers and 2 servers with backup_workers = 1, training `steps` steps as
// elastic_job_after_kill starts it, with `victims` SIGKILLed: the launcher's log, once the job's
// parameters are checked against those of the same job without elastic and without a kill. There a
// step aggregates the shares of micro-batches of workers 0 to 2 and drops worker 3's, so its bits
// are not Mirrored's (checked too).
std::string backup_job_after_kills(const std::string& name, std::uint64_t steps, int restarts,
                                   const std::vector<Victim>& victims, int min_np) {
  TemporaryDirectory directory(name);
  const fs::path reference = directory.path / "reference.bin";
  const auto [exit, output] =
      launch(4, 2, {"sync", std::to_string(steps), reference.string(), "--backup-workers", "1"},
             directory.path / "reference.log");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  const std::string expected = read_file(reference);
  REQUIRE(!expected.empty());
  CHECK(expected != mirrored_reference(steps));
  const fs::path out = directory.path / "parameters.bin";
  std::string text =
      elastic_job_after_kill("sync", steps, out, directory.path / "log.txt", restarts,
                             {"--every-worker-sleep-ms", "5", "--backup-workers", "1"},
                             {{"COHORT_SECRET", name}}, victims, min_np);
  CAPTURE(text);
  CHECK(read_file(out) == expected);
  return text;
}

TEST_CASE(
    "an elastic sync job with backup workers that loses a worker keeps every share its steps "
    "aggregate, takes the process started again in, and ends with the bits of the job that lost "
    "none") {
  // Worker 1 is lost: the 3 workers left take the first 3 shares, so that every step aggregates
  // the same micro-batches in the same tree, and the process started again takes the backup's
  // share.
  const std::string text = backup_job_after_kills("cohort-ps-sync-backup", 300, 1,
                                                  {{"COHORT_ROLE=worker", "COHORT_RANK=1"}}, 3);
  CAPTURE(text);
  CHECK(text.find("cohort: workers 4 -> 3 at step ") != std::string::npos);
  CHECK(text.find("(rank 1 lost: ") != std::string::npos);
  CHECK(text.find("cohort-run: worker 1 was killed by signal 9 (Killed); starting it again "
                  "(restart 1 of 1)") != std::string::npos);
  CHECK(text.find(" (1 joined)") != std::string::npos);
}

TEST_CASE(
    "an elastic sync job with backup workers that loses more workers than its backups deals the "
    "shares its steps aggregate over the workers left, to the bits of the job that lost none") {
  // Workers 1 and 2 are lost in turn. The 2 workers left take 2 shares and 1 of the 3 a step
  // aggregates, the nodes of the tree over them: the first worker folds its 2 shares as one node,
  // and the servers fold the 2 pushes as the tree over the 3 shares.
  const std::string text = backup_job_after_kills(
      "cohort-ps-sync-below-backups", 500, 0,
      {{"COHORT_ROLE=worker", "COHORT_RANK=1"}, {"COHORT_ROLE=worker", "COHORT_RANK=2"}}, 2);
  CAPTURE(text);
  // One change or two, as the kills fall.
  CHECK(text.find(" -> 2 at step ") != std::string::npos);
  CHECK(text.find("2 workers go on without it (--min-np 2)") != std::string::npos);
}

TEST_CASE(
    "under cohort-run --max-restarts, an elastic sync job that loses its chief starts the chief's "
    "process again once the job went on without it, and takes it in, to the bits of a job that "
    "lost none") {
  // cohort-run cannot tell the consistency: it waits --wait-s (3 s) for the servers, which would
  // end an async job's fit, before it starts the chief again.
  const auto [lost, text] = sync_job_after_worker_kill("cohort-ps-sync-chief-again", 1000, 1, 0);
  CAPTURE(text);
  CHECK(text.find("cohort-run: worker 0 was killed by signal 9 (Killed); 3 workers go on without "
                  "it (--min-np 2); it starts again in 3 s where the job goes on without its "
                  "chief (Sync)") != std::string::npos);
  CHECK(text.find("cohort-run: worker 0 was killed by signal 9 (Killed); starting it again "
                  "(restart 1 of 1)") != std::string::npos);
  CHECK(text.find("joined the job of 4 workers at step ") != std::string::npos);
  CHECK(text.find(" (1 joined)") != std::string::npos);
}

TEST_CASE(
    "an elastic sync worker lost between a step's pushes, after some chunks took the step: the "
    "retry pulls their parameters from before it, to the bits of a job that lost none") {
  // Worker 2 sends 2 of its pushes of the step, waits while the others push theirs (so the servers
  // apply the step to those chunks), then dies; without the servers' copy from before the step,
  // the workers left would retry it on newer parameters.
  TemporaryDirectory directory("cohort-ps-sync-mid-step");
  const fs::path out = directory.path / "parameters.bin";
  std::mt19937 draw(std::random_device{}());
  const int micro_batch = std::uniform_int_distribution<int>(20, 380)(draw);
  CAPTURE(micro_batch);
  const std::map<std::string, std::string> elastic = {{"COHORT_MIN_WORKERS", "2"}};
  Job job(4, 2,
          {"sync", "200", out, "--every-worker-sleep-ms", "2", "--die-mid-step", "2", "--die-after",
           std::to_string(micro_batch)},
          directory.path, elastic, elastic);
  job.require_connected();
  const auto died = job.workers[2]->wait(90s);
  REQUIRE(died.has_value());
  CHECK(read_file(job.log(false, 2)).find("ps_trainer: dying mid-step") != std::string::npos);
  job.require_trained(2, 90s);
  CHECK(job.workers[3]->wait(30s).has_value());
  const std::string chief = read_file(job.log(false, 0));
  CAPTURE(chief);
  // Each worker folds 2 of a step's 8 micro-batches.
  CHECK(chief.find("cohort: workers 4 -> 3 at step " + std::to_string(micro_batch / 2) +
                   " (rank 2 lost: ") != std::string::npos);
  CHECK(read_file(out) == mirrored_reference(200));
}

TEST_CASE(
    "an elastic sync job goes on without its chief: the lowest worker left leads it to the bits of "
    "a job that lost none") {
  const auto [lost, text] = sync_job_after_worker_kill("cohort-ps-sync-chief-lost", 200, 0, 0);
  CAPTURE(text);
  CHECK(text.find("cohort-run: worker 0 was killed by signal 9 (Killed); 3 workers go on without "
                  "it (--min-np 2)") != std::string::npos);
}

TEST_CASE(
    "an elastic sync job that lost its chief takes processes started again in at the next chief's "
    "door, the chief's own too, to the bits of a job that lost none") {
  // The lowest worker left binds the job's rendezvous address, where the first chief listened and
  // a process started again looks for the job.
  TemporaryDirectory directory("cohort-ps-sync-next-door");
  const fs::path out = directory.path / "parameters.bin";
  const std::map<std::string, std::string> elastic = {{"COHORT_MIN_WORKERS", "2"},
                                                      {"COHORT_SECRET", "next-door"}};
  Job job(4, 2, {"sync", "600", out, "--every-worker-sleep-ms", "5"}, directory.path, elastic,
          elastic);
  job.require_connected();
  std::mt19937 draw(std::random_device{}());
  std::this_thread::sleep_for(
      std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 700)(draw)));
  job.workers[0]->kill(SIGKILL);
  REQUIRE_MESSAGE(when_logged(job.log(false, 1), "cohort: workers 4 -> 3 at step ", 60s),
                  read_file(job.log(false, 1)));
  job.start_again(0);
  REQUIRE_MESSAGE(when_logged(job.log(false, 1), "cohort: workers 3 -> 4 at step ", 60s),
                  read_file(job.log(false, 1)));
  job.workers[2]->kill(SIGKILL);
  job.start_again(2);
  for (const int worker : {0, 1, 2, 3}) {
    CAPTURE(worker);
    const fs::path log = worker % 2 == 0 ? job.log_again(worker) : job.log(false, worker);
    const auto exit = job.workers[static_cast<std::size_t>(worker)]->wait(120s);
    CAPTURE(read_file(log));
    REQUIRE(exit.has_value());
    CHECK(exit->code == 0);
  }
  for (std::size_t server = 0; server < 2; ++server) {
    CAPTURE(server);
    const auto exit = job.servers[server]->wait(30s);
    REQUIRE(exit.has_value());
    CHECK(exit->code == 0);
  }
  const std::string chief = read_file(job.log(false, 1));
  CAPTURE(chief);
  CHECK(chief.find("cohort: rank 0: keeps the job's door at 127.0.0.1:") != std::string::npos);
  // Two losses, each followed by a process taken in.
  const auto count = [&](const std::string& text) {
    std::size_t found = 0;
    for (auto at = chief.find(text); at != std::string::npos; at = chief.find(text, at + 1))
      ++found;
    return found;
  };
  CHECK(count("cohort: workers 4 -> 3 at step ") == 2);
  CHECK(count("cohort: workers 3 -> 4 at step ") == 2);
  CHECK(count(" (1 joined)") == 2);
  CHECK(read_file(out) == mirrored_reference(600));
}

TEST_CASE(
    "under cohort-run --min-np --max-restarts, an elastic async job that loses its chief stops, "
    "naming it, and starts again whole") {
  TemporaryDirectory directory("cohort-ps-async-chief-lost");
  const fs::path out = directory.path / "parameters.bin";
  const std::string text = elastic_job_after_kill("async", 300, out, directory.path / "log.txt", 1,
                                                  {"--every-worker-sleep-ms", "5"}, {},
                                                  {{"COHORT_ROLE=worker", "COHORT_RANK=0"}});
  CAPTURE(text);
  CHECK(text.find("worker 0 (rank 0) was lost (") != std::string::npos);
  CHECK(text.find("the chief holds the job's door and brings the optimizer state home, so the job "
                  "cannot go on without it") != std::string::npos);
  CHECK(text.find("; starting every rank again (restart 1 of 1)") != std::string::npos);
  CHECK(text.find("starting it again") == std::string::npos);
  CHECK(fs::exists(out));
}

TEST_CASE(
    "an elastic sync job stops, naming what is missing, where a server is lost or the workers left "
    "are fewer than min_workers") {
  TemporaryDirectory directory("cohort-ps-sync-cannot-go-on");
  // Every process exits non-zero within the roll call's bound, its log holding `expected`.
  const auto stops = [&](const fs::path& where, bool server, int index, const std::string& minimum,
                         const std::string& expected) {
    fs::create_directories(where);
    const std::map<std::string, std::string> elastic = {{"COHORT_MIN_WORKERS", minimum}};
    Job job(4, 2, {"sync", "1000000", where / "never.bin"}, where, elastic, elastic);
    job.require_connected();
    (server ? job.servers : job.workers)[static_cast<std::size_t>(index)]->kill(SIGKILL);
    for (int serving = 0; serving < 2; ++serving) {
      const auto& processes = serving ? job.servers : job.workers;
      for (std::size_t other = 0; other < processes.size(); ++other) {
        if (serving == static_cast<int>(server) && static_cast<int>(other) == index) continue;
        const auto exit = processes[other]->wait(60s);
        const std::string log = read_file(job.log(serving, static_cast<int>(other)));
        CAPTURE(log);
        REQUIRE(exit.has_value());
        CHECK(exit->code != 0);
        CHECK(log.find(expected) != std::string::npos);
      }
    }
  };
  stops(directory.path / "server", true, 1, "2",
        "regroup: parameter server 1 (rank 5) did not answer the roll call: its shard of the "
        "parameters and optimizer state is gone");
  stops(directory.path / "below", false, 2, "4", "fewer than the 6 the job needs");
}

TEST_CASE(
    "the chief of an elastic async job ends its fit with the other workers': its parameters are "
    "the ones the servers end with") {
  TemporaryDirectory directory("cohort-ps-chief-waits");
  const fs::path out = directory.path / "parameters.bin";
  const fs::path checkpoint = directory.path / "run.ckpt";
  // Worker 3 trains for seconds after the others; the servers save their shards after the fit.
  const auto [exit, output] = launch(4, 2,
                                     {"async", "100", out.string(), "--slow-worker", "3",
                                      "--sleep-ms", "20", "--checkpoint", checkpoint.string()},
                                     directory.path / "log.txt", {{"COHORT_MIN_WORKERS", "2"}});
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(output.find("cohort: worker 0 (the chief) is done at step 100; the fit ends with the "
                    "other workers'") != std::string::npos);
  const auto saved = cohort::checkpoint::read<float>(checkpoint);
  CHECK(read_file(out) == std::string(reinterpret_cast<const char*>(saved.parameters.data()),
                                      saved.parameters.size() * sizeof(float)));
}

TEST_CASE(
    "elastic settings a parameter-server job cannot follow are refused before the rendezvous, "
    "naming the field") {
  TemporaryDirectory directory("cohort-ps-elastic-refused");
  // One process of a job of 4 workers and 2 servers; alone it would wait for the others.
  const auto refused = [&](const std::string& consistency,
                           const std::map<std::string, std::string>& variables,
                           const std::vector<std::string>& arguments = {}) {
    std::map<std::string, std::string> environment{
        {"COHORT_ROLE", "worker"},           {"COHORT_RANK", "1"},
        {"COHORT_WORLD_SIZE", "4"},          {"COHORT_PS_COUNT", "2"},
        {"COHORT_MASTER_ADDR", "127.0.0.1"}, {"COHORT_MASTER_PORT", "29999"},
        {"COHORT_MIN_WORKERS", "2"}};
    for (const auto& [name, value] : variables) environment[name] = value;
    std::vector<std::string> command = {COHORT_PS_TRAINER, consistency, "1",
                                        directory.path / "none.bin"};
    command.insert(command.end(), arguments.begin(), arguments.end());
    const auto result =
        cohort::testing::run_to_completion(command, directory.path / "log.txt", environment, 20s);
    REQUIRE(result.has_value());
    CHECK(result->first.code != 0);
    return result->second;
  };
  CHECK(refused("async", {{"COHORT_MAX_WORKERS", "6"}})
            .find("elastic.max_workers = 6: must be 0 or the 4 workers") != std::string::npos);
  CHECK(refused("async", {{"COHORT_RANK", "0"}, {"COHORT_JOIN", "1"}})
            .find("the chief started again cannot take its place back") != std::string::npos);
  CHECK(refused("async", {{"COHORT_ROLE", "ps"},
                          {"COHORT_WORLD_SIZE", "2"},
                          {"COHORT_WORKER_COUNT", "4"},
                          {"COHORT_JOIN", "1"}})
            .find("a parameter server started again cannot take its place back") !=
        std::string::npos);
}

TEST_CASE("malformed requests are refused naming the worker and the field; others go on") {
  TemporaryDirectory directory("cohort-ps-bad");
  const fs::path out = directory.path / "parameters.bin";
  const auto [exit, output] =
      launch(2, 1, {"async", "20", out, "--bad-requests"}, directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  CHECK(exit.code == 0);
  for (const char* field :
       {"shard", "chunk", "length", "version", "worker", "push chunk", "push leaves"}) {
    CAPTURE(field);
    CHECK(output.find(std::string("bad request (") + field + "): refused as expected") !=
          std::string::npos);
  }
  CHECK(fs::exists(out));
}

TEST_CASE(
    "backup workers: a step aggregates R of N workers by the documented rule and reports who was "
    "dropped") {
  // backup_workers = 1 of 4: each step is the pushes of workers 0, 1 and 2 (the R = 3
  // lowest-indexed live workers), whoever arrives first. Worker 2 is slowed, so that a rule of
  // "the first R to arrive" would take worker 3 instead: worker 3's push is dropped every step,
  // and the parameters are the same bits as a run where worker 3 is the slow one.
  TemporaryDirectory directory("cohort-ps-backup");
  constexpr int kSteps = 30;
  std::string parameters[2];
  for (const int slow : {2, 3}) {
    CAPTURE(slow);
    const fs::path out = directory.path / ("parameters" + std::to_string(slow) + ".bin");
    const auto [exit, output] =
        launch(4, 1,
               {"sync", std::to_string(kSteps), out, "--backup-workers", "1", "--slow-worker",
                std::to_string(slow), "--sleep-ms", "5", "--log-pushes"},
               directory.path / "log.txt");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    const std::string steps = std::to_string(kSteps);
    CHECK(output.find("pushes applied per worker [" + steps + ", " + steps + ", " + steps +
                      ", 0], dropped per worker [0, 0, 0, " + steps + "], workers lost 0") !=
          std::string::npos);
    std::size_t applied = 0;
    for (auto at = output.find(" from 3 workers"); at != std::string::npos;
         at = output.find(" from 3 workers", at + 1)) {
      ++applied;
    }
    CHECK(applied == kSteps);
    parameters[slow - 2] = read_file(out);
    REQUIRE(!parameters[slow - 2].empty());
  }
  CHECK(parameters[0] == parameters[1]);
  const double accuracy = accuracy_of(parameters[0]);
  const double reference = accuracy_of(mirrored_reference(kSteps));
  MESSAGE("accuracy with backup workers " << accuracy << ", without " << reference);
  CHECK(accuracy >= reference - 0.1);
}

TEST_CASE("backup workers dealt different micro-batch counts are refused, naming the field") {
  // 3 workers are dealt 2, 2 and 4 of the 8 micro-batches: a step without one push cannot be
  // scaled by the workers over the pushes.
  TemporaryDirectory directory("cohort-ps-backup-deal");
  const auto [exit, output] =
      launch(3, 1, {"sync", "5", directory.path / "parameters.bin", "--backup-workers", "1"},
             directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  CHECK(exit.code != 0);
  CHECK(output.find("backup_workers = 1: needs every worker dealt as many micro-batches "
                    "(micro_batches = 3 workers x a power of two)") != std::string::npos);
}

TEST_CASE("a parameter-server job launched by TF_CONFIG trains") {
  // chief, worker 0 and ps 0 described by TF_CONFIG alone (every COHORT_* variable empty, which
  // counts as unset): the same bits as the job cohort-run --np 2 --ps 1 starts.
  TemporaryDirectory directory("cohort-ps-tf-config");
  const fs::path expected_out = directory.path / "cohort-run.bin";
  {
    const auto [exit, output] =
        launch(2, 1, {"sync", "30", expected_out}, directory.path / "run.log");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
  }
  const fs::path out = directory.path / "tf-config.bin";
  const auto address = [] {
    return "\"127.0.0.1:" + std::to_string(cohort::testing::free_port()) + "\"";
  };
  const std::string cluster = "{\"chief\": [" + address() + "], \"worker\": [" + address() +
                              "], \"ps\": [" + address() + "]}";
  std::vector<std::unique_ptr<Process>> processes;
  std::vector<fs::path> logs;
  for (const auto& [type, name] :
       {std::pair{"chief", "chief"}, std::pair{"worker", "worker0"}, std::pair{"ps", "ps0"}}) {
    std::map<std::string, std::string> env = {
        {"TF_CONFIG", "{\"cluster\": " + cluster + ", \"task\": {\"type\": \"" + std::string(type) +
                          "\", \"index\": 0}}"}};
    for (const char* variable :
         {"COHORT_ROLE", "COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_LOCAL_RANK",
          "COHORT_LOCAL_WORLD_SIZE", "COHORT_PS_COUNT", "COHORT_WORKER_COUNT", "COHORT_MASTER_ADDR",
          "COHORT_MASTER_PORT", "COHORT_JOB_ID"}) {
      env[variable] = "";
    }
    logs.push_back(directory.path / (std::string(name) + ".log"));
    processes.push_back(std::make_unique<Process>(
        std::vector<std::string>{COHORT_PS_TRAINER, "sync", "30", out}, env, logs.back()));
  }
  for (std::size_t i = 0; i < processes.size(); ++i) {
    CAPTURE(i);
    const auto exit = processes[i]->wait(60s);
    const std::string log = read_file(logs[i]);
    CAPTURE(log);
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
    CHECK(log.find("from TF_CONFIG") != std::string::npos);
  }
  CHECK(read_file(logs[2]).find("pushes applied per worker [30, 30]") != std::string::npos);
  REQUIRE(fs::exists(out));
  CHECK(read_file(out) == read_file(expected_out));
}

TEST_CASE("an unauthenticated client is refused and the job goes on") {
  // A job with a secret; a process with another secret claims worker 1's place first. Rank 0
  // refuses it, says so, and waits for the real worker 1, which then trains with the others.
  TemporaryDirectory directory("cohort-ps-unauthenticated");
  const std::string port = std::to_string(cohort::testing::free_port());
  const fs::path out = directory.path / "parameters.bin";
  const auto log = [&](const std::string& name) { return directory.path / (name + ".log"); };
  const auto start = [&](bool server, int index, const std::string& secret,
                         const std::string& name) {
    const std::map<std::string, std::string> env = {
        {"COHORT_ROLE", server ? "ps" : "worker"},
        {"COHORT_RANK", std::to_string(index)},
        {"COHORT_WORLD_SIZE", server ? "1" : "2"},
        {server ? "COHORT_WORKER_COUNT" : "COHORT_PS_COUNT", server ? "2" : "1"},
        {"COHORT_MASTER_ADDR", "127.0.0.1"},
        {"COHORT_MASTER_PORT", port},
        {"COHORT_JOB_ID", "ps-secret-test"},
        {"COHORT_SECRET", secret}};
    return std::make_unique<Process>(std::vector<std::string>{COHORT_PS_TRAINER, "sync", "20", out},
                                     env, log(name));
  };
  auto chief = start(false, 0, "s3cret", "worker0");
  auto server = start(true, 0, "s3cret", "ps0");
  auto rogue = start(false, 1, "wrong", "rogue");
  const auto rogue_exit = rogue->wait(30s);
  REQUIRE(rogue_exit.has_value());
  CHECK(rogue_exit->code != 0);
  CHECK(read_file(log("rogue")).find("authentication failed") != std::string::npos);

  auto worker = start(false, 1, "s3cret", "worker1");
  for (auto* process : {chief.get(), server.get(), worker.get()}) {
    const auto exit = process->wait(60s);
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
  }
  const std::string chief_log = read_file(log("worker0"));
  CAPTURE(chief_log);
  CHECK(chief_log.find("claiming to be rank 1: authentication failed") != std::string::npos);
  CHECK(read_file(log("ps0")).find("pushes applied per worker [20, 20]") != std::string::npos);
  CHECK(fs::exists(out));
}

namespace {

// Waits for every process of a job (60 s at most each); their exits and logs, workers first.
std::vector<std::pair<cohort::testing::Exit, std::string>> finish(Job& job) {
  std::vector<std::pair<cohort::testing::Exit, std::string>> results;
  for (bool server : {false, true}) {
    auto& processes = server ? job.servers : job.workers;
    for (std::size_t i = 0; i < processes.size(); ++i) {
      const auto exit = processes[i]->wait(60s);
      REQUIRE_MESSAGE(exit.has_value(), (server ? "server " : "worker ") << i << " still running");
      results.emplace_back(*exit, read_file(job.log(server, static_cast<int>(i))));
    }
  }
  return results;
}

// Each of `processes` (indices into finish's results) failed with the ConfigError `expected`.
void check_refused(const std::vector<std::pair<cohort::testing::Exit, std::string>>& results,
                   std::initializer_list<std::size_t> processes, const std::string& expected) {
  for (const std::size_t process : processes) {
    const auto& [exit, log] = results[process];
    CAPTURE(process);
    CAPTURE(log);
    CHECK(exit.exited);
    CHECK(exit.code == 1);
    CHECK(log.find("error: " + expected) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("a NaN example under on_nonfinite = raise fails every worker naming the step") {
  TemporaryDirectory directory("cohort-ps-nan");
  const std::uint64_t step = cohort::testing::steps_with_example(5, 11, 64, 8, 1).at(0);
  Job job(2, 2, {"sync", "31", directory.path / "out.bin", "--poison", "5"}, directory.path);
  const auto results = finish(job);
  for (std::size_t worker = 0; worker < 2; ++worker) {
    const auto& [exit, log] = results[worker];
    CAPTURE(log);
    CHECK(exit.exited);
    CHECK(exit.code == 1);
    // The servers apply the reduced gradient: the workers check the parameters they pull.
    CHECK(log.find("a non-finite value (infinity or NaN) in the parameters of step " +
                   std::to_string(step) + ", first at index") != std::string::npos);
  }
  for (std::size_t server = 2; server < 4; ++server) {
    const auto& [exit, log] = results[server];
    CAPTURE(log);
    CHECK(exit.code != 0);
    // The worker that left first said why: the servers quote its error.
    CHECK(log.find("a non-finite value (infinity or NaN) in the parameters") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(directory.path / "out.bin"));
}

TEST_CASE("on_nonfinite = skip_step is refused on every process of a parameter-server job") {
  TemporaryDirectory directory("cohort-ps-skip");
  Job job(1, 1, {"sync", "5", directory.path / "out.bin", "--on-nonfinite", "skip_step"},
          directory.path);
  for (const auto& [exit, log] : finish(job)) {
    CAPTURE(log);
    CHECK(exit.code == 1);
    CHECK(log.find("on_nonfinite = skip_step: is not available under parameter_server") !=
          std::string::npos);
  }
}

TEST_CASE("sync workers with different seeds are refused before the first step naming both") {
  TemporaryDirectory directory("cohort-ps-settings");
  Job job(2, 1, {"sync", "5", directory.path / "out.bin", "--seed-of", "1", "12"}, directory.path);
  const auto results = finish(job);
  for (std::size_t worker = 0; worker < 2; ++worker) {
    const auto& [exit, log] = results[worker];
    CAPTURE(log);
    CHECK(exit.code == 1);
    CHECK(log.find("seed is 11 on worker 0 (replica 0) but 12 on worker 1 (replica 1)") !=
          std::string::npos);
  }
  CHECK(results[2].first.code != 0);  // the server: the chief never sent the parameters
}

TEST_CASE(
    "a server started with another learning rate is refused before the first step, on the "
    "server and every worker, naming both values and who holds each") {
  TemporaryDirectory directory("cohort-ps-server-settings");
  Job job(2, 2,
          {"sync", "5", directory.path / "out.bin", "--log-pushes", "--learning-rate-of-server",
           "1", "0.01"},
          directory.path);
  const auto results = finish(job);
  const std::string expected =
      "the processes of this job run with different settings, refused before the first step: "
      "optimizer option learning_rate is 0.01 on parameter server 1 but 0.003 on worker 0";
  // Both workers and the server that differs: a ConfigError with the same sentence.
  check_refused(results, {0, 1, 3}, expected);
  // Server 0 agreed with the chief: it learns the cause when the chief leaves.
  CAPTURE(results[2].second);
  CHECK(results[2].first.code != 0);
  CHECK(results[2].second.find(expected) != std::string::npos);
  for (const auto& [exit, log] : results) CHECK(log.find("applied step") == std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "out.bin"));
}

TEST_CASE(
    "workers that push in bfloat16 to a server that sums in float are refused before the first "
    "step, naming the gradient sum") {
  TemporaryDirectory directory("cohort-ps-wire-settings");
  Job job(2, 1, {"sync", "5", directory.path / "out.bin", "--log-pushes"}, directory.path,
          {{"COHORT_WIRE", "bf16"}}, {{"COHORT_WIRE", "fp32"}});
  const auto results = finish(job);
  check_refused(results, {0, 1, 2},
                "the processes of this job run with different settings, refused before the first "
                "step: gradient sum is sum on parameter server 0 but sum_bf16 on worker 0");
  for (const auto& [exit, log] : results) CHECK(log.find("applied step") == std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "out.bin"));
}

TEST_CASE(
    "async workers with different seeds are refused through the servers before the first "
    "step, on every process and every replica at once") {
  for (const std::string consistency : {"async", "bounded2"}) {
    CAPTURE(consistency);
    TemporaryDirectory directory("cohort-ps-async-settings-" + consistency);
    Job job(2, 2,
            {consistency, "50", directory.path / "out.bin", "--log-pushes", "--seed-of", "1", "12",
             "--local-replicas", "2"},
            directory.path);
    const auto results = finish(job);
    for (const auto& [exit, log] : results) {
      CAPTURE(log);
      // Not after a timeout: the worker's second replica learns it from the first.
      CHECK(log.find("no progress within") == std::string::npos);
      CHECK(log.find("timed out") == std::string::npos);
      CHECK(exit.exited);
      CHECK(exit.code == 1);
      CHECK(log.find("error: the processes of this job run with different settings, refused "
                     "before the first step: seed is 11 on worker 0 but 12 on worker 1") !=
            std::string::npos);
      CHECK(log.find("applied push") == std::string::npos);
    }
    CHECK_FALSE(fs::exists(directory.path / "out.bin"));
  }
}

TEST_CASE("a push stalled in the middle of its frame holds back no other worker") {
  // Worker 3 writes half of a push's payload frame and stops for good, its connection open. The
  // server takes a frame only once it is whole: workers 0 to 2 train on and finish long before
  // the deadline, and the server then counts worker 3 as lost, saying where it stopped.
  TemporaryDirectory directory("cohort-ps-mid-frame");
  constexpr auto kTimeout = 12s;
  Job job(4, 1,
          {"async", "300", directory.path / "out.bin", "--every-worker-sleep-ms", "3",
           "--stall-mid-frame", "3", "--stall-after", "20", "--timeout-ms", milliseconds(kTimeout)},
          directory.path);
  const auto stalled = when_logged(job.log(false, 3), "ps_trainer: stalled after", 60s);
  REQUIRE_MESSAGE(stalled.has_value(), read_file(job.log(false, 3)));
  for (int worker = 0; worker < 3; ++worker) {
    CAPTURE(worker);
    const auto exit = job.workers[static_cast<std::size_t>(worker)]->wait(60s);
    CAPTURE(read_file(job.log(false, worker)));
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
    // They trained on during the stall, and finished before the server's deadline for worker
    // 3: a server that waited on the whole frame would have held them until it.
    CHECK(read_file(job.log(true, 0)).find("lost worker 3") == std::string::npos);
  }
  const auto exit = job.servers[0]->wait(2 * kTimeout + 10s);
  const std::string log = read_file(job.log(true, 0));
  CAPTURE(log);
  REQUIRE(exit.has_value());
  CHECK(exit->exited);
  CHECK(exit->code == 0);
  CHECK(log.find("lost worker 3 (rank 3): silent") != std::string::npos);
  CHECK(log.find("its push request of chunk") != std::string::npos);
  CHECK(log.find("pushes applied per worker [300, 300, 300, ") != std::string::npos);
  CHECK_FALSE(job.workers[3]->wait(0ms).has_value());  // still stalled: never named as finished
  CHECK(fs::exists(directory.path / "out.bin"));
}

TEST_CASE(
    "a SIGSTOPped worker under async and bounded staleness is lost at the deadline; the others "
    "finish") {
  // Under bounded staleness the others wait for it in their pulls until it is lost; then the
  // bound counts the live workers only.
  constexpr auto kTimeout = 4s;
  // Both jobs at once: each waits out its deadline, which takes time, not the cores.
  const std::array<std::string, 2> consistencies{"async", "bounded2"};
  std::vector<std::unique_ptr<TemporaryDirectory>> directories;
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<std::chrono::steady_clock::time_point> stopped;
  for (const std::string& consistency : consistencies) {
    directories.push_back(std::make_unique<TemporaryDirectory>("cohort-ps-sigstop-" + consistency));
    jobs.push_back(std::make_unique<Job>(
        4, 1,
        std::vector<std::string>{consistency, "400", directories.back()->path / "out.bin",
                                 "--every-worker-sleep-ms", "5", "--timeout-ms",
                                 milliseconds(kTimeout)},
        directories.back()->path));
    Job& job = *jobs.back();
    job.require_connected();  // its port is taken before the next job picks one
    for (const auto& worker : job.workers) REQUIRE_FALSE(worker->wait(0ms).has_value());
    job.workers[3]->kill(SIGSTOP);
    stopped.push_back(std::chrono::steady_clock::now());
  }
  for (std::size_t index = 0; index < jobs.size(); ++index) {
    const std::string& consistency = consistencies[index];
    CAPTURE(consistency);
    Job& job = *jobs[index];
    const auto lost = when_logged(job.log(true, 0), "lost worker 3 (rank 3): silent", 60s);
    REQUIRE_MESSAGE(lost.has_value(), read_file(job.log(true, 0)));
    MESSAGE(consistency << ": worker 3 counted as lost " << seconds(*lost - stopped[index])
                        << " s after SIGSTOP");
    job.require_trained(3, 60s);
    const auto exit = job.servers[0]->wait(30s);
    const std::string log = read_file(job.log(true, 0));
    CAPTURE(log);
    REQUIRE(exit.has_value());
    CHECK(exit->code == 0);
    CHECK(log.find("pushes applied per worker [400, 400, 400, ") != std::string::npos);
    CHECK(log.find("workers lost 1") != std::string::npos);
    CHECK(fs::exists(directories[index]->path / "out.bin"));
  }
}

TEST_CASE(
    "a SIGSTOPped worker under sync training is named by the server at its deadline, and to the "
    "other worker") {
  // Worker 1 stops its process while it computes (in its micro-batch 10, so that the stop lands
  // there whatever the machine's load); worker 0 pushes its step and waits in its pull. The
  // server names worker 1 at its deadline and tells worker 0; nobody blames worker 0 or the
  // server.
  TemporaryDirectory directory("cohort-ps-sigstop-sync");
  constexpr auto kTimeout = 5s;
  Job job(2, 1,
          {"sync", "1000000", directory.path / "never.bin", "--stop-worker", "1", "--stop-after",
           "10", "--timeout-ms", milliseconds(kTimeout), "--log-pushes"},
          directory.path);
  const auto stopped = when_logged(job.log(false, 1), "ps_trainer: stopping itself", 60s);
  REQUIRE_MESSAGE(stopped.has_value(), read_file(job.log(false, 1)));
  REQUIRE_FALSE(job.workers[1]->wait(0ms).has_value());
  const auto chief = job.workers[0]->wait(3 * kTimeout);
  const auto elapsed = std::chrono::steady_clock::now() - *stopped;
  const std::string chief_log = read_file(job.log(false, 0));
  CAPTURE(chief_log);
  REQUIRE(chief.has_value());
  CHECK_FALSE((chief->exited && chief->code == 0));
  MESSAGE("the chief failed " << seconds(elapsed) << " s after SIGSTOP");
  CHECK(chief_log.find("worker 1 (rank 1) was lost (silent") != std::string::npos);
  CHECK(chief_log.find("worker 0 (rank 0) was lost") == std::string::npos);
  CHECK(chief_log.find("failed at parameter server") == std::string::npos);

  const auto server = job.servers[0]->wait(3 * kTimeout);
  const std::string server_log = read_file(job.log(true, 0));
  CAPTURE(server_log);
  REQUIRE(server.has_value());
  CHECK_FALSE((server->exited && server->code == 0));
  CHECK(server_log.find("worker 1 (rank 1) was lost (silent") != std::string::npos);
  CHECK(server_log.find("synchronous training needs 2 of 2 workers") != std::string::npos);
  CHECK(server_log.find("worker 0 (rank 0) was lost") == std::string::npos);
}

TEST_CASE("a server over Loopback counts a silent async worker as lost and serves the other") {
  std::string worker_errors[2];
  const Served served =
      serve_with_a_silent_worker<cohort::strategy::consistency::Async>(20, 40ms, 2s, worker_errors);
  CHECK(served.error.empty());
  CHECK(worker_errors[0].empty());
  REQUIRE(served.counts.lost.size() == 1);
  CHECK(served.counts.lost[0].find("lost worker 1 (rank 1): silent") != std::string::npos);
  CHECK(served.counts.applied == std::vector<std::uint64_t>{20, 0});
}

TEST_CASE("a server over Loopback: a silent sync worker ends the run, named to the waiting one") {
  std::string worker_errors[2];
  const Served served =
      serve_with_a_silent_worker<cohort::strategy::consistency::Sync>(20, 40ms, 2s, worker_errors);
  CAPTURE(served.error);
  CAPTURE(worker_errors[0]);
  CHECK(served.error.find("worker 1 (rank 1) was lost (silent") != std::string::npos);
  CHECK(served.error.find("went quiet together") == std::string::npos);
  CHECK(served.error.find("synchronous training needs 2 of 2 workers") != std::string::npos);
  CHECK(worker_errors[0].find(
            "rank 0: pull: refused: 'parameter server 0: worker 1 (rank 1) was lost") !=
        std::string::npos);
}

TEST_CASE(
    "a server over Loopback: sync workers that go quiet together, their last frames 20 ms apart, "
    "get twice the deadline") {
  // As when one worker stalls a collective between the workers that the other waits in: both
  // pulls answered, worker 1's last frame comes a little after worker 0's, then neither speaks.
  // The cause is theirs to name (their transfers give up at 3/2 x timeout), so the server waits
  // 2 x worker_timeout (600 ms) before it names anyone, and says why.
  std::chrono::steady_clock::time_point quiet_since[2];
  const auto step_then_quiet = [&](int worker, std::chrono::milliseconds before_last_pull) {
    return
        [&quiet_since, worker, before_last_pull](LoopbackClient& client, const ps::Chunk& chunk) {
          pull(client, chunk, 0);
          std::this_thread::sleep_for(before_last_pull);
          pull(client, chunk);  // answered at once: its push is applied
          quiet_since[worker] = std::chrono::steady_clock::now();
          std::this_thread::sleep_for(1500ms);
        };
  };
  std::string worker_errors[2];
  const Served served = serve_over_loopback<cohort::strategy::consistency::Sync>(
      step_then_quiet(0, 0ms), step_then_quiet(1, 20ms), worker_errors);
  CAPTURE(served.error);
  const auto waited = served.ended - quiet_since[0];
  MESSAGE("the server failed " << seconds(waited) << " s after worker 0 went quiet");
  CHECK(served.error.find("worker 0 (rank 0) was lost (silent") != std::string::npos);
  CHECK(served.error.find("every worker went quiet together") != std::string::npos);
}

TEST_CASE(
    "a server over Loopback: sync pushes that are not nodes of the reduction tree end the run, "
    "naming their micro-batch counts") {
  // Worker 0's push sums 1 micro-batch and worker 1's 2: no deal gives a tree over 3 leaves so.
  const auto push_summing = [](std::uint32_t leaves) {
    return [leaves](LoopbackClient& client, const ps::Chunk& chunk) {
      const std::vector<float> gradient(16, 1.0f);
      std::vector<float> parameters(16);
      client.add(
          {.operation = ps::Operation::kPush, .element_bytes = sizeof(float), .leaves = leaves},
          chunk, std::as_bytes(std::span(gradient)));
      client.add({.operation = ps::Operation::kPull, .element_bytes = sizeof(float)}, chunk, {},
                 std::as_writable_bytes(std::span(parameters)));
      client.transfer();
    };
  };
  std::string worker_errors[2];
  const Served served = serve_over_loopback<cohort::strategy::consistency::Sync>(
      push_summing(1), push_summing(2), worker_errors);
  CAPTURE(served.error);
  CHECK(served.error.find("the pushes of step 0 sum [1, 2] micro-batches (workers 0 to 1), which "
                          "are not consecutive nodes of the reduction tree") != std::string::npos);
  for (const std::string& error : worker_errors) {
    CAPTURE(error);
    CHECK(error.find("which are not consecutive nodes of the reduction tree") != std::string::npos);
  }
}
