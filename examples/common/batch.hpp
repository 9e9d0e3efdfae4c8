// The batch every example data set builds and every example model consumes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace example {

struct Batch {
  std::size_t features = 0;
  std::vector<float> inputs;         // size() x features, row-major
  std::vector<std::int32_t> labels;  // one per example
  std::size_t size() const { return labels.size(); }
};

}  // namespace example
