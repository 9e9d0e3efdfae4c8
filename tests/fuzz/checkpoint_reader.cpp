// One checkpoint file, as any bytes. The first byte chooses the value type and how the rest
// becomes the file: as it is (the header's checks), or as the payload of a container of a
// complete checkpoint, a manifest or a shard with a true checksum, so that the fuzzer reaches
// the decoder behind the checksum. read() and the shard reader either return a state or throw a
// CheckpointError naming the file; a state read back is written and read again unchanged.
#include <cohort/checkpoint/checkpoint.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_dir.hpp"

namespace {

namespace checkpoint = cohort::checkpoint;

void write_file(const std::filesystem::path& file, std::string_view bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

std::string container(const checkpoint::Magic& magic, std::uint32_t value_bytes,
                      std::string_view payload) {
  std::string bytes(magic.begin(), magic.end());
  const auto append = [&](auto value) {
    bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
  };
  append(checkpoint::kFormatVersion);
  append(value_bytes);
  append(static_cast<std::uint64_t>(payload.size()));
  append(checkpoint::detail::crc32(payload));
  bytes += payload;
  return bytes;
}

void require_named(const cohort::CheckpointError& error, const std::filesystem::path& file) {
  if (std::string_view(error.what()).find(file.string()) == std::string_view::npos) std::abort();
}

// Equal bit for bit (a NaN read back is the same NaN).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
void read_as(const std::filesystem::path& file, const std::filesystem::path& again) {
  try {
    const auto state = checkpoint::read<T>(file);
    checkpoint::write(again, state);
    const auto reread = checkpoint::read<T>(again);
    if (reread.optimizer != state.optimizer || !same_bits(reread.parameters, state.parameters) ||
        !same_bits(reread.optimizer_state, state.optimizer_state) || reread.step != state.step ||
        reread.shards.size() != state.shards.size()) {
      std::abort();
    }
  } catch (const cohort::CheckpointError& error) {
    require_named(error, file);
  }
  try {
    const auto shard = checkpoint::detail::read_container<T, checkpoint::ShardState<T>>(
        file, checkpoint::kShardMagic);
    if (shard.payload.parameters.size() + shard.payload.optimizer_state.size() >
        std::filesystem::file_size(file)) {
      std::abort();  // more values than the file has bytes
    }
  } catch (const cohort::CheckpointError& error) {
    require_named(error, file);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::filesystem::path& directory = cohort::fuzz::scratch_directory();
  const std::filesystem::path file = directory / "run.ckpt";
  const std::filesystem::path again = directory / "again.ckpt";
  std::filesystem::remove(again);  // what a manifest may name must not depend on earlier inputs
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool doubles = (data[0] & 1) != 0;
  const std::uint32_t value_bytes = doubles ? 8 : 4;
  // 0: the bytes as they are; 1, 2, 3: the payload of a complete checkpoint, manifest, shard.
  const int framing = (data[0] >> 1) % 4;
  const checkpoint::Magic magics[] = {checkpoint::kMagic, checkpoint::kManifestMagic,
                                      checkpoint::kShardMagic};
  write_file(file,
             framing == 0 ? std::string(rest) : container(magics[framing - 1], value_bytes, rest));
  if (doubles) {
    read_as<double>(file, again);
  } else {
    read_as<float>(file, again);
  }
  return 0;
}
