// Trains the small test model in a process of its own, for the kill-and-resume test:
//   resume_worker run STEPS OUT               train STEPS steps, write the parameters to OUT
//   resume_worker save-and-die STEPS CKPT     train STEPS steps, save CKPT, then SIGKILL itself
//   resume_worker resume CKPT STEPS OUT       restore CKPT, train to STEPS, write OUT
#include <csignal>
#include <cstdio>
#include <string>

#include "training.hpp"

namespace {

auto make_trainer(std::size_t replicas) {
  return cohort::Trainer(cohort::testing::small_model(),
                         cohort::strategy::Mirrored<>({.replicas = replicas}),
                         cohort::optimizer::Adam({.learning_rate = 3e-3}),
                         {.global_batch = 64, .seed = 5, .progress = cohort::Progress::kSilent});
}

template <class Trainer>
void write_parameters(const Trainer& trainer, const std::string& file) {
  cohort::testing::write_parameters(file, cohort::testing::parameters_of(trainer.model()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return 64;
  const std::string mode = argv[1];
  const auto& data = cohort::testing::small_task_data();
  if (mode == "run" && argc == 4) {
    auto trainer = make_trainer(4);
    trainer.fit(data, {.steps = std::stoull(argv[2])});
    write_parameters(trainer, argv[3]);
    return 0;
  }
  if (mode == "save-and-die" && argc == 4) {
    auto trainer = make_trainer(4);
    trainer.fit(data, {.steps = std::stoull(argv[2])});
    trainer.save(argv[3]);
    std::raise(SIGKILL);
  }
  if (mode == "resume" && argc == 5) {
    auto trainer = make_trainer(2);  // a different replica count: the result must not care
    trainer.restore(argv[2]);
    trainer.fit(data, {.steps = std::stoull(argv[3])});
    write_parameters(trainer, argv[4]);
    return 0;
  }
  return 64;
}
