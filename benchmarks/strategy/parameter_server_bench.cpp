// Parameter-server push and pull throughput over TCP on 127.0.0.1, against the loopback
// bandwidth of the same transport measured in the same run.
//
//   BM_ps_push_pull/<MiB>/<servers>   one worker pushes the whole gradient and pulls the whole
//                                     parameter vector (a kPush and a kPull per chunk, in one
//                                     transfer) per iteration; the servers apply SGD.
//                                     bytes_per_second counts push + pull bytes; updates_per_second
//                                     counts whole-model updates.
//   BM_tcp_loopback/<MiB>             one rank sends, one receives the same bytes: the ceiling.
// Target: a 64 MiB model on 2 servers at 70% or more of the loopback figure (push and pull
// travel in opposite directions at once, so a mesh can exceed a one-way transfer).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cohort/optimizer/sgd.hpp>
#include <cohort/strategy/parameter_server/client.hpp>
#include <cohort/strategy/parameter_server/server.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

namespace {

namespace tcp = cohort::transport::tcp;
namespace ps = cohort::strategy::ps;
using namespace std::chrono_literals;

tcp::Options options_for(int rank, int size, std::uint16_t port) {
  return {.rank = rank,
          .size = size,
          .job_id = "bench-ps",
          .rendezvous_port = port,
          .connect_timeout = 30s,
          .operation_timeout = 60s};
}

// Ranks 1 .. size-1 run `body` on threads; rank 0 (the caller's) runs `main`.
template <class Main, class Body>
void run_mesh(int size, Main main, Body body) {
  tcp::Listener listener(options_for(0, size, 0));
  const std::uint16_t port = listener.rendezvous_port();
  std::vector<std::thread> threads;
  for (int rank = 1; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        tcp::Tcp transport(options_for(rank, size, port));
        body(transport);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      }
    });
  }
  try {
    tcp::Tcp transport(std::move(listener));
    main(transport);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank 0: %s\n", error.what());
  }
  for (auto& thread : threads) thread.join();
}

void BM_ps_push_pull(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  const int servers = static_cast<int>(state.range(1));
  const std::size_t elements = bytes / sizeof(float);
  const ps::Layout layout(elements, sizeof(float), servers,
                          {.min_shard_bytes = 0, .alignment = 4096, .chunk_bytes = 1 << 20});
  const cohort::optimizer::Sgd sgd({.learning_rate = 1e-3});
  std::vector<float> parameters(elements, 1.0f);
  std::vector<float> gradients(elements, 0.5f);
  run_mesh(
      1 + servers,
      [&](tcp::Tcp& transport) {
        ps::Client<tcp::Tcp> client(transport, 0, 1);
        client.present({}, servers);  // a fit begins with the settings (none here)
        for (const ps::Chunk& chunk : layout.chunks()) {
          client.add({.operation = ps::Operation::kInit, .element_bytes = sizeof(float)}, chunk,
                     std::as_bytes(std::span(parameters).subspan(chunk.begin, chunk.size())));
        }
        client.transfer();
        std::uint64_t step = 0;
        for (auto _ : state) {
          // Every chunk's push and pull in one transfer: the pull of a chunk is answered once
          // the server has applied its push.
          for (const ps::Chunk& chunk : layout.chunks()) {
            client.add({.operation = ps::Operation::kPush,
                        .step = step,
                        .inverse_batch = 1.0,
                        .element_bytes = sizeof(float)},
                       chunk,
                       std::as_bytes(std::span(gradients).subspan(chunk.begin, chunk.size())));
            client.add(
                {.operation = ps::Operation::kPull, .element_bytes = sizeof(float)}, chunk, {},
                std::as_writable_bytes(std::span(parameters).subspan(chunk.begin, chunk.size())));
          }
          client.transfer();
          ++step;
        }
        client.done(servers, cohort::strategy::FitEnd::kReached, step);
      },
      [&](tcp::Tcp& transport) {
        transport.isolate_peer_failures();
        ps::Server<tcp::Tcp, float, cohort::optimizer::Sgd> server(
            transport, layout, {.server = transport.rank() - 1, .workers = 1}, sgd);
        server.serve();
      });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
  state.counters["updates_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ps_push_pull)
    ->ArgsProduct({{1, 4, 16, 64}, {1, 2, 4}})
    ->ArgNames({"MiB", "servers"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_tcp_loopback(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  std::vector<std::byte> out(bytes, std::byte{1});
  std::vector<std::byte> in(bytes);
  const cohort::transport::Header header{cohort::transport::message_type::kParameterServer, 0, 1};
  std::promise<std::size_t> rounds_promise;
  auto rounds = rounds_promise.get_future().share();
  run_mesh(
      2,
      [&](tcp::Tcp& transport) {
        std::size_t count = 0;
        for (auto _ : state) {
          const cohort::transport::Send send{1, header, out};
          transport.transfer(std::span(&send, 1), {});
          const cohort::transport::Receive ack{1, header, {}};
          transport.transfer({}, std::span(&ack, 1));
          ++count;
        }
        rounds_promise.set_value(count);
      },
      [&](tcp::Tcp& transport) {
        // Receives until the sender says how many rounds there were: one more receive each.
        while (true) {
          const cohort::transport::Receive receive{0, header, in};
          std::error_code error;
          transport.transfer({}, std::span(&receive, 1), error);
          if (error) return;
          const cohort::transport::Send ack{0, header, {}};
          transport.transfer(std::span(&ack, 1), {}, error);
          if (error) return;
        }
      });
  (void)rounds;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_tcp_loopback)
    ->Arg(1)
    ->Arg(64)
    ->ArgName("MiB")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
