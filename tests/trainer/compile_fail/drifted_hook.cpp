// Must not compile: a strategy that claims to save its own checkpoint (strategy.hpp,
// SavesOwnCheckpoint) but whose save() has lost its parameter count. Had the Trainer probed for the
// hook, it would silently have let the chief write the whole state instead; the claim makes the
// drift an error that names the capability.
#include <cstddef>
#include <filesystem>

#include "cohort/cohort.hpp"

class DriftedSaver : public cohort::strategy::Mirrored<> {
 public:
  using Mirrored::Mirrored;
  template <class T>
  void save(const std::filesystem::path&, const cohort::checkpoint::TrainingState<T>&) const {}
  template <class T>
  void restored(const cohort::checkpoint::TrainingState<T>&) {}
};

static_assert(cohort::strategy::SavesOwnCheckpoint<DriftedSaver, float>,
              "DriftedSaver claims SavesOwnCheckpoint (strategy.hpp)");

int main() { return 0; }
