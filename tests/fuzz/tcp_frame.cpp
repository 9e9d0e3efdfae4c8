// The TCP transport's frame format (transport/tcp/frame.hpp) on any bytes: a header decodes and
// re-encodes to the same 32 bytes, a frame built around any payload decodes to its header and
// length, and the checksum computed over the payload in any cut equals the one computed whole.
#include <cohort/transport/tcp/frame.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tcp = cohort::transport::tcp;
  if (size < tcp::kHeaderBytes + 2) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const tcp::FrameHeader frame = tcp::decode_header(bytes);
  const tcp::HeaderBytes again = tcp::encode_header(frame.header, frame.length, frame.version);
  // Every field but the magic round-trips; the magic is always written as kMagic.
  if (std::memcmp(again.data() + 4, bytes + 4, tcp::kHeaderBytes - 4) != 0) std::abort();
  if ((frame.magic == tcp::kMagic) != (std::memcmp(again.data(), bytes, 4) == 0)) std::abort();

  const std::span<const std::byte> payload(bytes + tcp::kHeaderBytes + 2,
                                           size - tcp::kHeaderBytes - 2);
  const auto built = tcp::make_frame(frame.header, payload, frame.version);
  const tcp::FrameHeader decoded = tcp::decode_header(built.data());
  if (decoded.length != payload.size() || decoded.header.type != frame.header.type ||
      decoded.header.sequence != frame.header.sequence || decoded.header.tag != frame.header.tag ||
      decoded.version != frame.version || decoded.magic != tcp::kMagic) {
    std::abort();
  }
  const std::uint64_t seed = tcp::checksum_seed(built.data());
  const std::uint64_t whole = tcp::checksum(seed, payload);
  if (tcp::detail::load_le<std::uint64_t>(built.data() + tcp::kHeaderBytes + payload.size()) !=
      whole) {
    std::abort();
  }
  // Two bytes choose where the streaming checksum cuts the payload.
  const std::size_t first = payload.empty() ? 0 : data[tcp::kHeaderBytes] % (payload.size() + 1);
  const std::size_t second =
      payload.size() - first == 0 ? 0 : data[tcp::kHeaderBytes + 1] % (payload.size() - first + 1);
  tcp::StreamingChecksum streaming;
  streaming.reset(seed);
  streaming.update(payload.subspan(0, first));
  streaming.update(payload.subspan(first, second));
  streaming.update(payload.subspan(first + second));
  if (streaming.digest() != whole) std::abort();
  return 0;
}
