// test_cuda's main: doctest's, plus two things for machines without a GPU.
//
//   --cohort-skip-without-gpu   (ctest passes it) exit 77, ctest's SKIP_RETURN_CODE, when no test
//                               case ran: the case needed a GPU, or more GPUs than are present
//                               (its name says how many), and ctest prints "Skipped" next to it
//   --list-test-cases           lists GPU cases too (doctest leaves skipped cases out of lists),
//                               so that ctest registers them on a machine without a GPU
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu.hpp"

namespace {

int cases_run = 0;

// Counts the cases that actually ran (skipped ones never start).
struct RunCounter : doctest::IReporter {
  explicit RunCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++cases_run; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("cohort_run_counter", 1, RunCounter);

}  // namespace

int main(int argc, char** argv) {
  bool skip_code = false;
  bool listing = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cohort-skip-without-gpu") == 0) {
      skip_code = true;
      continue;
    }
    if (std::strncmp(argv[i], "--list-test-cases", 17) == 0 ||
        std::strncmp(argv[i], "-ltc", 4) == 0) {
      listing = true;
    }
    args.push_back(argv[i]);
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  if (listing) context.setOption("no-skip", true);
  if (!cohort::test::gpu_present() && !listing) {
    std::printf("[cohort] no usable CUDA device (%s): GPU test cases are skipped\n",
                cohort::device::cuda::unavailable().c_str());
  }
  const int result = context.run();
  if (context.shouldExit() || listing) return result;
  if (skip_code && result == 0 && cases_run == 0) {
    std::printf("[cohort] skipped: this machine has %d usable GPU(s), fewer than the case needs\n",
                cohort::device::cuda::device_count());
    return 77;
  }
  return result;
}
