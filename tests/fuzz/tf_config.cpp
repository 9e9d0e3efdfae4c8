// TF_CONFIG as any text: parse_tf_config, then the whole resolution of a process whose
// environment holds it (cluster::resolve reads no network). Either succeeds with a consistent
// result or throws a ConfigError naming TF_CONFIG; anything else is a finding.
#include <cohort/cluster/cluster.hpp>
#include <cohort/cluster/tf_config.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const cohort::cluster::TfConfig config = cohort::cluster::parse_tf_config(text);
    const auto& tasks = config.tasks_of(config.task_type);
    const bool unlisted_evaluator = config.task_type == "evaluator" && tasks.empty();
    if (config.chief.size() > 1 || config.evaluator.size() > 1 || config.task_index < 0 ||
        (!unlisted_evaluator && static_cast<std::size_t>(config.task_index) >= tasks.size())) {
      std::abort();  // a configuration parse_tf_config promises to refuse
    }
  } catch (const cohort::ConfigError& error) {
    if (!std::string_view(error.what()).starts_with("TF_CONFIG")) std::abort();
  }
  try {
    const cohort::cluster::Spec spec =
        cohort::cluster::resolve({}, cohort::cluster::environment_from({{"TF_CONFIG", text}}));
    if (spec.rank < 0 || spec.size < 1 || spec.rank >= spec.size) std::abort();
    (void)cohort::cluster::describe(spec);
  } catch (const cohort::ConfigError&) {
  }
  return 0;
}
