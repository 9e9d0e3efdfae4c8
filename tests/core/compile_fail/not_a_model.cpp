// Must not compile: a type nobody described through cohort::ModelTraits is not a Model, and the
// user is told so in one sentence (tests/core/CMakeLists.txt expects "is not a cohort::Model").
#include "cohort/core/model.hpp"

struct NotAModel {
  float weight = 0.0f;
};

static_assert(cohort::Model<NotAModel>, COHORT_MODEL_REQUIREMENT_MESSAGE);

int main() { return 0; }
