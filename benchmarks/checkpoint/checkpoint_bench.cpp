// What a checkpoint's write costs, against the least any write of the same bytes costs, on the
// state of the examples' MLP 784-1024-1024-10 with Adam (1,863,690 parameters and two moments:
// 22 MB), the checkpoint a fit takes every N steps in the background (trainer/
// periodic_checkpoints.hpp).
//
//   write          checkpoint::write: the Boost archive streamed to a temporary file with its
//                  CRC-32, fsync, rename, fsync of the directory
//   write/in_place the same file written in place (checkpoint::InPlaceWrite): the values written
//                  and checksummed in one share, then the rest of the archive around them
//   write/in_place/finish  only the latter: what a fit leaves to its background thread, once its
//                  replicas wrote and checksummed their shares (trainer/snapshot_write.hpp)
//   raw_write      the same bytes with write, fsync and rename alone: the floor, no archive and
//                  no checksum
//   crc32/zlib     the checksum cohort computes (checkpoint/detail/checksummed_file.hpp)
//   crc32/boost    the same value, a table lookup per byte (boost::crc_32_type, cohort's before)
//
// The CPU time column is the calling thread's, the kernel's share of the write and the fsync
// included: what a background write takes from the replicas on the same cores. Files go to
// CHECKPOINT_BENCH_DIRECTORY (default: the system's temporary directory).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cohort/checkpoint/checkpoint.hpp>
#include <cohort/checkpoint/detail/checksummed_file.hpp>
#include <cohort/checkpoint/in_place_write.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kParameters = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10;

fs::path directory() {
  const char* chosen = std::getenv("CHECKPOINT_BENCH_DIRECTORY");
  return chosen != nullptr ? fs::path(chosen) : fs::temp_directory_path();
}

const cohort::checkpoint::TrainingState<float>& mlp_state() {
  static const auto state = [] {
    cohort::checkpoint::TrainingState<float> made;
    made.optimizer = "adam";
    made.parameters.resize(kParameters);
    made.optimizer_state.resize(2 * kParameters);
    for (std::size_t i = 0; i < kParameters; ++i) {
      made.parameters[i] = static_cast<float>(i % 1000) * 1e-3f;
      made.optimizer_state[i] = static_cast<float>(i % 7) * 1e-5f;
      made.optimizer_state[kParameters + i] = static_cast<float>(i % 11) * 1e-9f;
    }
    return made;
  }();
  return state;
}

std::size_t state_bytes() {
  return (mlp_state().parameters.size() + mlp_state().optimizer_state.size()) * sizeof(float);
}

void write(benchmark::State& state) {
  const fs::path file = directory() / "cohort-bench-write.ckpt";
  for (auto _ : state) cohort::checkpoint::write(file, mlp_state());
  fs::remove(file);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * state_bytes()));
}

// A checkpoint written in place (checkpoint::InPlaceWrite), its values in one share: the whole
// write, or only what a fit leaves to its background thread once the replicas wrote and
// checksummed their shares (`finish_only`).
void write_in_place(benchmark::State& state, bool finish_only) {
  const fs::path file = directory() / "cohort-bench-in-place.ckpt";
  const auto& values = mlp_state();
  cohort::checkpoint::TrainingState<float> fields;
  fields.optimizer = values.optimizer;
  const std::span<const float> parameters(values.parameters);
  const std::span<const float> optimizer_state(values.optimizer_state);
  const auto checksum = [](std::span<const float> block) {
    return cohort::checkpoint::detail::crc32(
        std::string_view(reinterpret_cast<const char*>(block.data()), block.size_bytes()));
  };
  for (auto _ : state) {
    if (finish_only) state.PauseTiming();
    cohort::checkpoint::InPlaceWrite<float> write(file, fields, parameters, optimizer_state);
    write.write(cohort::checkpoint::Values::kParameters, 0, parameters);
    write.write(cohort::checkpoint::Values::kOptimizerState, 0, optimizer_state);
    const std::uint32_t parameters_crc32 = checksum(parameters);
    const std::uint32_t optimizer_state_crc32 = checksum(optimizer_state);
    if (finish_only) state.ResumeTiming();
    write.commit(parameters_crc32, optimizer_state_crc32);
  }
  fs::remove(file);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * state_bytes()));
}

void raw_write(benchmark::State& state) {
  const fs::path file = directory() / "cohort-bench-raw.bin";
  const fs::path temporary = directory() / "cohort-bench-raw.bin.tmp";
  const auto& values = mlp_state();
  for (auto _ : state) {
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    for (const auto* part : {&values.parameters, &values.optimizer_state}) {
      const auto* bytes = reinterpret_cast<const char*>(part->data());
      std::size_t left = part->size() * sizeof(float);
      while (left > 0) {
        const ssize_t written = ::write(fd, bytes, left);
        if (written <= 0) {
          state.SkipWithError("write failed");
          break;
        }
        bytes += written;
        left -= static_cast<std::size_t>(written);
      }
    }
    ::fsync(fd);
    ::close(fd);
    fs::rename(temporary, file);
    const int dir = ::open(directory().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ::fsync(dir);
    ::close(dir);
  }
  fs::remove(file);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * state_bytes()));
}

std::string_view state_as_bytes() {
  const auto& values = mlp_state().optimizer_state;
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)};
}

void crc32_zlib(benchmark::State& state) {
  const std::string_view bytes = state_as_bytes();
  for (auto _ : state) benchmark::DoNotOptimize(cohort::checkpoint::detail::crc32(bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
}

void crc32_boost(benchmark::State& state) {
  const std::string_view bytes = state_as_bytes();
  for (auto _ : state) {
    boost::crc_32_type crc;
    crc.process_bytes(bytes.data(), bytes.size());
    benchmark::DoNotOptimize(crc.checksum());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
}

BENCHMARK(write)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(write_in_place, whole, false)
    ->Name("write/in_place")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(write_in_place, finish, true)
    ->Name("write/in_place/finish")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(raw_write)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(crc32_zlib)->Name("crc32/zlib")->Unit(benchmark::kMillisecond);
BENCHMARK(crc32_boost)->Name("crc32/boost")->Unit(benchmark::kMillisecond);

}  // namespace
