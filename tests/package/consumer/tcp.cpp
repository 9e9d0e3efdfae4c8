// The part of the consumer that uses cohort::tcp, compiled only where the consumer links it: a
// frame checksum (xxHash), a handshake proof (OpenSSL's libcrypto) and a TF_CONFIG (nlohmann/json),
// so that each dependency's headers and libraries must come through cohort::tcp; and two ranks
// that meet and exchange a frame over loopback, which runs cohort's compiled part (the listener,
// the rendezvous and the transport) where it is compiled separately.
#include "cohort/transport/tcp/tcp.hpp"

#include <array>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <future>
#include <span>
#include <thread>

#include "cohort/cluster/tf_config.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/handshake.hpp"

namespace {

// Rank 1 sends its rank to rank 0: what rank 0 received.
int exchange() {
  namespace tcp = cohort::transport::tcp;
  tcp::Options options{.size = 2, .rendezvous_port = 0};
  tcp::Listener listener(options);
  options.rendezvous_port = listener.rendezvous_port();
  auto sender = std::async(std::launch::async, [options]() mutable {
    options.rank = 1;
    tcp::Tcp transport(options);
    const std::array<int, 1> value = {1};
    const cohort::transport::Send send{0, {.type = 1}, std::as_bytes(std::span(value))};
    transport.transfer(std::span(&send, 1), {});
  });
  tcp::Tcp transport(std::move(listener));
  std::array<int, 1> value = {0};
  const cohort::transport::Receive receive{
      1, {.type = 1}, std::as_writable_bytes(std::span(value))};
  transport.transfer({}, std::span(&receive, 1));
  sender.get();
  return value[0];
}

}  // namespace

int check_tcp() {
  namespace tcp = cohort::transport::tcp;
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: wrong: %s\n", what);
      ++failures;
    }
  };
  const std::byte bytes[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  expect(tcp::checksum(7, bytes) == tcp::checksum(7, bytes) &&
             tcp::checksum(7, bytes) != tcp::checksum(8, bytes),
         "frame checksums depend on the seed");
  const auto proof = tcp::proof("secret", tcp::Role::kConnector, bytes, {});
  expect(tcp::proofs_equal(proof, tcp::proof("secret", tcp::Role::kConnector, bytes, {})) &&
             !tcp::proofs_equal(proof, tcp::proof("other", tcp::Role::kConnector, bytes, {})),
         "handshake proofs depend on the secret");
  const auto config = cohort::cluster::parse_tf_config(
      R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})");
  expect(config.worker.size() == 2 && config.task_index == 1, "TF_CONFIG is read");
  try {
    expect(exchange() == 1, "a frame crosses the transport");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "consumer: %s\n", error.what());
    ++failures;
  }
  return failures;
}
