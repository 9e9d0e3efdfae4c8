// Gradient readiness: how a model says which gradients are final while its backward pass goes
// on (core/model.hpp), and the Trainer's check of what it says.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {

// The callback a forward_backward with readiness calls: ready(begin, end) says that gradients()
// [begin, end) are final. A non-owning reference to the Trainer's handler, cheap to copy.
class GradientReady {
 public:
  template <class Handler>
  requires(!std::same_as<std::remove_cvref_t<Handler>, GradientReady>) explicit GradientReady(
      Handler& handler)
      : handler_(&handler), call_([](void* handler, std::size_t begin, std::size_t end) {
          (*static_cast<Handler*>(handler))(begin, end);
        }) {}

  void operator()(std::size_t begin, std::size_t end) const { call_(handler_, begin, end); }

 private:
  void* handler_;
  void (*call_)(void*, std::size_t, std::size_t);
};

// The Trainer's check of one pass's ranges: each within the gradient, none twice, all of it
// covered. A violation is a ConfigError naming the range.
class ReadinessCheck {
 public:
  void begin(std::size_t elements) {
    elements_ = elements;
    ranges_.clear();
  }

  void add(std::size_t begin, std::size_t end) {
    if (begin > end) refuse(begin, end, "ends before it begins");
    if (end > elements_) {
      refuse(begin, end,
             "is out of bounds: the model has " + std::to_string(elements_) + " gradients");
    }
    for (const auto& [seen_begin, seen_end] : ranges_) {
      if (begin == seen_begin && end == seen_end) refuse(begin, end, "was reported twice");
      if (begin < seen_end && seen_begin < end) {
        refuse(begin, end, "overlaps " + text(seen_begin, seen_end) + ", reported before");
      }
    }
    if (begin != end) ranges_.emplace_back(begin, end);
  }

  void require_complete() {
    std::sort(ranges_.begin(), ranges_.end());
    std::size_t covered = 0;
    for (const auto& [begin, end] : ranges_) {
      if (begin != covered) break;
      covered = end;
    }
    if (covered == elements_) return;
    const auto next = std::find_if(ranges_.begin(), ranges_.end(),
                                   [&](const auto& range) { return range.first > covered; });
    refuse(covered, next == ranges_.end() ? elements_ : next->first, "was never reported ready");
  }

 private:
  static std::string text(std::size_t begin, std::size_t end) {
    std::string range(1, '[');  // appended piece by piece: GCC 12 warns on "[" + std::string
    range += std::to_string(begin);
    range += ", ";
    range += std::to_string(end);
    range += ')';
    return range;
  }
  [[noreturn]] static void refuse(std::size_t begin, std::size_t end, const std::string& why) {
    throw ConfigError("forward_backward: gradient range " + text(begin, end) + " " + why);
  }

  std::size_t elements_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> ranges_;
};

}  // namespace cohort
