// Gloo's ring all-reduce (gloo::AllreduceRing<float>, sum) over Gloo's TCP transport, measured as
// cohort-bench measures (peer_sweep.hpp).
//
//   cohort-run --np 4 -- peer_gloo_allreduce -b 4 -e 64M -f 4 --store /tmp/gloo-store
//
// Ranks find each other through a gloo::rendezvous::FileStore in --store (one directory per run;
// the job id from COHORT_JOB_ID separates runs that share it). Rank and size come from cohort-run's
// COHORT_RANK and COHORT_WORLD_SIZE. Gloo's ring reduces in place; out-of-place is a copy, then the
// in-place call, as for cohort. Each size and placement builds its AllreduceRing once (Gloo
// registers the buffer with every pair then), outside the timed calls.
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "machine.hpp"
#include "peer_sweep.hpp"

namespace {

std::string environment(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  // --store DIR is ours; the rest are cohort-bench's flags.
  std::string store_path;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--store" && i + 1 < argc) {
      store_path = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (store_path.empty()) {
    std::fprintf(stderr, "%s: --store DIR is required (a directory every rank can reach)\n",
                 argv[0]);
    return 2;
  }
  const cohort::peers::Flags flags =
      cohort::peers::parse_flags(static_cast<int>(rest.size()), rest.data());
  const int rank = std::stoi(environment("COHORT_RANK", "0"));
  const int size = std::stoi(environment("COHORT_WORLD_SIZE", "1"));

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device =
      gloo::transport::tcp::CreateDevice(attr);  // connectFullMesh takes it by non-const reference
  gloo::rendezvous::FileStore file_store(store_path);
  gloo::rendezvous::PrefixStore store(environment("COHORT_JOB_ID", "gloo"), file_store);
  const auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);

  cohort::peers::PeerOps ops;
  ops.rank = rank;
  ops.size = size;
  ops.barrier = [context] { gloo::BarrierAllToAll(context).run(); };
  ops.prepare_in_place = [context](std::span<float> buffer) -> std::function<void()> {
    if (buffer.empty() || context->size == 1) return [] {};
    auto ring = std::make_shared<gloo::AllreduceRing<float>>(
        context, std::vector<float*>{buffer.data()}, static_cast<int>(buffer.size()));
    return [ring] { ring->run(); };
  };
  const auto reduce_doubles = [context](std::span<double> values,
                                        const gloo::ReductionFunction<double>* fn) {
    if (values.empty() || context->size == 1) return;
    gloo::AllreduceRing<double>(context, {values.data()}, static_cast<int>(values.size()), fn)
        .run();
  };
  ops.max = [reduce_doubles](std::span<double> v) {
    reduce_doubles(v, gloo::ReductionFunction<double>::max);
  };
  ops.sum = [reduce_doubles](std::span<double> v) {
    reduce_doubles(v, gloo::ReductionFunction<double>::sum);
  };

  cohort::bench::RunInfo run;
  run.tool = "peer_gloo_allreduce";
  run.backend = "gloo";
  run.algorithm = flags.label.empty() ? "ring" : flags.label;
  run.details = "gloo::AllreduceRing over gloo::transport::tcp";
  run.launcher = "cohort-run (COHORT_* variables), FileStore rendezvous";
  run.machine = cohort::bench::this_machine();
  std::vector<double> pids(static_cast<std::size_t>(size), 0.0);  // every rank's, for the header
  pids[static_cast<std::size_t>(rank)] = static_cast<double>(::getpid());
  ops.sum(pids);
  for (int r = 0; r < size; ++r) {
    run.rank_info.push_back(
        {r, static_cast<long>(pids[static_cast<std::size_t>(r)]), run.machine.hostname});
  }
  return cohort::peers::run(flags, ops, run);
}
