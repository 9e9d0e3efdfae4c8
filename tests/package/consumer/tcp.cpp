// The part of the consumer that uses cohort::tcp, compiled only where the consumer links it: a
// frame checksum (xxHash), a handshake proof (OpenSSL's libcrypto) and a TF_CONFIG (nlohmann/json),
// so that each dependency's headers and libraries must come through cohort::tcp.
#include <cstddef>
#include <cstdio>
#include <span>

#include "cohort/cluster/tf_config.hpp"
#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/handshake.hpp"

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
  return failures;
}
