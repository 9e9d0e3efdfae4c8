#include "cohort/core/error.hpp"

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through operator<<
#include <string>
#include <system_error>
#include <type_traits>

namespace {

// An E whose message is `what`: a CommError is made from fields, and a detail alone is its message.
template <class E>
E error_saying(const std::string& what) {
  if constexpr (std::is_same_v<E, cohort::CommError>) {
    return E({.detail = what});
  } else {
    return E(what);
  }
}

// Throws E and catches it as `Catch`, returning what was caught.
template <class E, class Catch>
std::error_code code_when_caught_as(const std::string& what, std::string& caught_what) {
  try {
    throw error_saying<E>(what);
  } catch (const Catch& error) {
    caught_what = error.what();
    return error.code();
  }
  return {};
}

}  // namespace

TEST_CASE_TEMPLATE("every cohort error is a cohort::Error and a std::system_error", E,
                   cohort::ConfigError, cohort::CommError, cohort::DeviceError,
                   cohort::CheckpointError) {
  static_assert(std::is_base_of_v<cohort::Error, E>);
  static_assert(std::is_base_of_v<std::system_error, E>);
  static_assert(std::is_nothrow_destructible_v<E>);

  std::string what;
  const std::error_code as_error = code_when_caught_as<E, cohort::Error>("rank 3 lost", what);
  CHECK(std::string(as_error.category().name()) == "cohort");
  CHECK(&as_error.category() == &cohort::category());
  CHECK(what.find("rank 3 lost") != std::string::npos);

  const std::error_code as_system = code_when_caught_as<E, std::system_error>("field x", what);
  CHECK(as_system == as_error);
  CHECK(what.find("field x") != std::string::npos);
}

TEST_CASE_TEMPLATE("what() is the message alone, without the category's text", E,
                   cohort::ConfigError, cohort::CommError, cohort::DeviceError,
                   cohort::CheckpointError) {
  const std::string message = "TF_CONFIG task.index = 5: out of range for 3 worker tasks";
  const E error = error_saying<E>(message);
  CHECK(std::string(error.what()) == message);
  CHECK(std::string(static_cast<const std::system_error&>(error).what()) == message);
  CHECK(error.code().message() != "");
  CHECK(std::string(error.what()).find(error.code().message()) == std::string::npos);
}

TEST_CASE("each error type carries its own code") {
  CHECK(cohort::ConfigError("x").code() == cohort::Errc::kConfig);
  CHECK(cohort::CommError({.detail = "x"}).code() == cohort::Errc::kComm);
  CHECK(cohort::DeviceError("x").code() == cohort::Errc::kDevice);
  CHECK(cohort::CheckpointError("x").code() == cohort::Errc::kCheckpoint);
  CHECK(cohort::ConfigError("x").code() != cohort::Errc::kComm);
}

TEST_CASE("Errc converts to std::error_code in the cohort category") {
  const std::error_code code = cohort::Errc::kComm;  // is_error_code_enum
  CHECK(code.value() == static_cast<int>(cohort::Errc::kComm));
  CHECK(std::string(code.category().name()) == "cohort");
  CHECK(code == cohort::make_error_code(cohort::Errc::kComm));
  CHECK(code != std::make_error_code(std::errc::connection_reset));
}

TEST_CASE("the cohort category has a distinct message for every code") {
  const std::string config = cohort::category().message(static_cast<int>(cohort::Errc::kConfig));
  const std::string comm = cohort::category().message(static_cast<int>(cohort::Errc::kComm));
  const std::string device = cohort::category().message(static_cast<int>(cohort::Errc::kDevice));
  const std::string checkpoint =
      cohort::category().message(static_cast<int>(cohort::Errc::kCheckpoint));
  CHECK(config != comm);
  CHECK(comm != device);
  CHECK(device != checkpoint);
  CHECK(checkpoint != config);
  CHECK_FALSE(cohort::category().message(0).empty());
  CHECK_FALSE(cohort::category().message(12345).empty());
}

TEST_CASE("COHORT_ASSERT of a true condition does nothing") {
  int evaluated = 0;
  COHORT_ASSERT(++evaluated == 1);
  CHECK(evaluated == 1);  // the condition is evaluated exactly once, in every build type
}

TEST_CASE("NumericError carries the step and the first non-finite index as fields") {
  const cohort::NumericError error(cohort::NumericError::Where::kGradient, 12, 3077,
                                   "fit stopped (on_nonfinite = raise)");
  CHECK(error.code() == cohort::Errc::kNumeric);
  CHECK(error.step() == 12);
  CHECK(error.index() == 3077);
  CHECK(error.where() == cohort::NumericError::Where::kGradient);
  const std::string what = error.what();
  CHECK(what.find("reduced gradient of step 12") != std::string::npos);
  CHECK(what.find("index 3077") != std::string::npos);
  CHECK(what.find("on_nonfinite = raise") != std::string::npos);
  static_assert(std::is_base_of_v<cohort::Error, cohort::NumericError>);
  CHECK(cohort::category().message(static_cast<int>(cohort::Errc::kNumeric)) !=
        cohort::category().message(static_cast<int>(cohort::Errc::kCheckpoint)));
}

TEST_CASE(
    "CommError carries rank, peer, operation and sequence as fields, its message made of them") {
  const cohort::CommError error({.rank = 0,
                                 .peer = 2,
                                 .operation = "all_reduce",
                                 .sequence = 7,
                                 .detail = "rank 2 closed the connection during sequence 7"});
  CHECK(error.code() == cohort::Errc::kComm);
  CHECK(error.rank() == 0);
  CHECK(error.peer() == 2);
  CHECK(error.operation() == "all_reduce");
  CHECK(error.sequence() == 7);
  CHECK(error.detail() == "rank 2 closed the connection during sequence 7");
  CHECK(std::string(error.what()) ==
        "rank 0: all_reduce #7: rank 2 closed the connection during sequence 7");

  // A copy shares the fields.
  const cohort::CommError copy = error;
  CHECK(copy.detail().data() == error.detail().data());
  static_assert(std::is_nothrow_copy_constructible_v<cohort::CommError>);
}

TEST_CASE("a CommError's message leaves out the fields nobody knew") {
  CHECK(std::string(cohort::CommError({.detail = "no nonce"}).what()) == "no nonce");
  CHECK(std::string(cohort::CommError({.rank = 3, .detail = "x"}).what()) == "rank 3: x");
  CHECK(std::string(cohort::CommError({.operation = "handshake", .detail = "x"}).what()) ==
        "handshake: x");
  CHECK(std::string(
            cohort::CommError({.rank = 1, .operation = "rendezvous", .detail = "x"}).what()) ==
        "rank 1: rendezvous: x");
  // A transport's sequence without an operation: the detail says "during sequence N" itself.
  const cohort::CommError transport({.rank = 1, .peer = 0, .sequence = 4, .detail = "x"});
  CHECK(std::string(transport.what()) == "rank 1: x");
  CHECK(transport.sequence() == 4);
  CHECK(transport.operation().empty());
  const cohort::CommError unknown({.detail = "x"});
  CHECK(unknown.rank() == -1);
  CHECK(unknown.peer() == -1);
  CHECK(unknown.sequence() == 0);
}

TEST_CASE("quote_peer_text quotes, escapes and cuts what another process sent") {
  CHECK(cohort::quote_peer_text("done here") == "'done here'");
  CHECK(cohort::quote_peer_text("two\nlines\x1b[31m") == "'two\\x0alines\\x1b[31m'");
  const std::string flood(cohort::kMaxPeerTextBytes + 1, 'a');
  CHECK(cohort::quote_peer_text(flood) ==
        "'" + flood.substr(0, cohort::kMaxPeerTextBytes) + "'...");
  CHECK(cohort::quote_peer_text(flood.substr(1)) == "'" + flood.substr(1) + "'");
}
