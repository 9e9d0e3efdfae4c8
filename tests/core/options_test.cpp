#include "cohort/core/options.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <string>

#include "error_message.hpp"

namespace {

using cohort::testing::config_error_message;
using cohort::testing::contains;

}  // namespace

using namespace cohort::options;

TEST_CASE("require_positive names the field and the value") {
  const std::string message =
      config_error_message([] { require_positive("SgdOptions::learning_rate", -0.5); });
  CHECK(contains(message, "SgdOptions::learning_rate"));
  CHECK(contains(message, "-0.5"));
  CHECK(contains(message, "greater than 0"));

  CHECK(contains(config_error_message([] { require_positive("Options::replicas", 0); }),
                 "Options::replicas = 0"));
  CHECK_NOTHROW(require_positive("Options::replicas", 1));
  CHECK_NOTHROW(require_positive("Options::learning_rate", 1e-9));
}

TEST_CASE("require_positive rejects NaN") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(contains(config_error_message([&] { require_positive("Options::beta", nan); }),
                 "Options::beta"));
}

TEST_CASE("require_finite rejects infinities and NaN, naming the field") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(contains(config_error_message([&] { require_finite("Options::epsilon", inf); }),
                 "Options::epsilon"));
  CHECK(contains(config_error_message([&] { require_finite("Options::epsilon", nan); }), "finite"));
  CHECK_NOTHROW(require_finite("Options::epsilon", -3.0));
}

TEST_CASE("require_finite_positive and require_finite_non_negative") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(contains(config_error_message([&] { require_finite_positive("Options::lr", inf); }),
                 "Options::lr"));
  CHECK(contains(config_error_message([] { require_finite_positive("Options::lr", 0.0); }),
                 "Options::lr = 0"));
  CHECK_NOTHROW(require_finite_positive("Options::lr", 0.1));

  CHECK(contains(config_error_message([] { require_finite_non_negative("Options::wd", -1.0); }),
                 "must not be negative"));
  CHECK(contains(config_error_message([&] { require_finite_non_negative("Options::wd", inf); }),
                 "Options::wd"));
  CHECK_NOTHROW(require_finite_non_negative("Options::wd", 0.0));
}

TEST_CASE("require_in_range names the field, the value and the bounds") {
  const std::string message =
      config_error_message([] { require_in_range("AdamOptions::beta1", 1.5, 0.0, 1.0); });
  CHECK(contains(message, "AdamOptions::beta1 = 1.5"));
  CHECK(contains(message, "[0, 1]"));
  CHECK_NOTHROW(require_in_range("AdamOptions::beta1", 0.0, 0.0, 1.0));  // bounds are inclusive
  CHECK_NOTHROW(require_in_range("AdamOptions::beta1", 1.0, 0.0, 1.0));
}

TEST_CASE("an options failure can be caught as cohort::Error") {
  CHECK_THROWS_AS(require_positive("Options::x", -1), cohort::Error);
  CHECK_THROWS_AS(require_positive("Options::x", -1), std::system_error);
}
