// The handshake's payloads (transport/tcp/handshake.hpp) on any bytes: decode_hello,
// rank_of_hello and decode_table never read past the payload, a decoded hello re-encodes to the
// same bytes, and check_hello compares any hello with any expectation without failing.
#include <algorithm>
#include <cohort/transport/tcp/handshake.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tcp = cohort::transport::tcp;
  cohort::fuzz::FuzzInput input(data, size);
  const int table_size = input.take<std::uint8_t>();
  tcp::Expectation mine;
  mine.rank = input.take<std::uint8_t>();
  mine.size = input.take<std::uint8_t>();
  mine.lowest_peer = input.take<std::uint8_t>();
  mine.highest_peer = input.take<std::uint8_t>();
  mine.authenticates = (input.take<std::uint8_t>() & 1) != 0;
  const std::string job_id = input.take_string(16);
  mine.job_id = job_id;
  const auto* rest = reinterpret_cast<const std::byte*>(input.rest().data());
  const std::span<const std::byte> payload(rest, input.rest().size());

  if (const auto hello = tcp::decode_hello(payload)) {
    const std::vector<std::byte> again = tcp::encode_hello(*hello);
    if (!std::equal(again.begin(), again.end(), payload.begin(), payload.end())) std::abort();
    if (tcp::rank_of_hello(payload) != hello->rank) std::abort();
    (void)tcp::check_hello(*hello, mine);
  }
  if (const auto table = tcp::decode_table(payload, table_size)) {
    if (table->size() != static_cast<std::size_t>(table_size)) std::abort();
    const std::vector<std::byte> again = tcp::encode_table(*table);
    if (!std::equal(again.begin(), again.end(), payload.begin(), payload.end())) std::abort();
  }
  (void)tcp::decode_text(payload);
  return 0;
}
