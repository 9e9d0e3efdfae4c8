// Errors: one hierarchy, so that a user can catch cohort::Error and know it came from cohort.
//
//   ConfigError      bad Options, a bad cluster description or environment, processes of one job
//                    with different settings: names the field and the value(s)
//   CommError        a peer lost, a timeout, a protocol or shape mismatch: the reporting rank, the
//                    peer, the operation and its sequence number, as fields (rank(), peer(),
//                    operation(), sequence(), detail())
//   DeviceError      a CUDA or NCCL failure: names the call, the code and its text
//   CheckpointError  a checkpoint that cannot be read or does not match: names the file and field
//   NumericError     an infinity or NaN where training needs finite numbers: the step and the first
//                    non-finite index, as fields (step(), index(), where())
//
// Each derives from cohort::Error, a std::system_error whose code lives in cohort::category().
// Bugs inside cohort are not errors: COHORT_ASSERT aborts with file and line in every build type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace cohort {

enum class Errc {
  kConfig = 1,
  kComm,
  kDevice,
  kCheckpoint,
  kNumeric,
};

class ErrorCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cohort"; }
  std::string message(int code) const override {
    switch (static_cast<Errc>(code)) {
      case Errc::kConfig:
        return "invalid configuration";
      case Errc::kComm:
        return "communication failure";
      case Errc::kDevice:
        return "device failure";
      case Errc::kCheckpoint:
        return "checkpoint refused";
      case Errc::kNumeric:
        return "non-finite value";
    }
    return "unknown cohort error";
  }
};

inline const std::error_category& category() noexcept {
  static const ErrorCategory instance;
  return instance;
}

inline std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), category()};
}

class Error : public std::system_error {
 public:
  Error(Errc code, const std::string& what)
      : std::system_error(make_error_code(code), what), message_(what) {}

  // The message alone: system_error would append the category's text ("communication failure"),
  // which the message already says better.
  const char* what() const noexcept override { return message_.what(); }

 private:
  std::runtime_error message_;  // copies share the string and never throw
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(Errc::kConfig, what) {}
};

// What a communication failure is, field by field. Every field but detail may be unknown.
struct CommFailure {
  int rank = -1;  // the rank that reports the failure; -1 before it has one
  int peer = -1;  // the other rank involved (the one that closed, stalled or sent a wrong frame);
                  // -1 when none, or several
  // What the reporting rank was doing: "all_reduce", "rendezvous", "push". Empty where the
  // reporter cannot say: a transport moves frames for the layer above, which names the operation
  // when it passes the failure on.
  std::string operation{};
  std::uint64_t sequence = 0;  // the operation's sequence number (frames carry it), from 1; 0 none
  std::string detail{};        // what happened, in words
};

// A peer lost, a timeout, a protocol or shape mismatch. The rank, peer, operation and sequence are
// fields, and the message is made from them ("rank 0: all_reduce #7: rank 2 closed the connection
// ..."), so that a layer that passes a failure on builds its own from these fields, never from
// the text. Copies share the fields and never throw.
class CommError : public Error {
 public:
  explicit CommError(CommFailure failure)
      : Error(Errc::kComm, sentence(failure)),
        failure_(std::make_shared<const CommFailure>(std::move(failure))) {}

  int rank() const noexcept { return failure_->rank; }
  int peer() const noexcept { return failure_->peer; }
  std::string_view operation() const noexcept { return failure_->operation; }
  std::uint64_t sequence() const noexcept { return failure_->sequence; }
  std::string_view detail() const noexcept { return failure_->detail; }

  // "rank R: operation #S: detail", each part present when known (the sequence with its
  // operation).
  static std::string sentence(const CommFailure& failure) {
    std::string text;
    if (failure.rank >= 0) text = "rank " + std::to_string(failure.rank) + ": ";
    if (!failure.operation.empty()) {
      text += failure.operation;
      if (failure.sequence != 0) text += " #" + std::to_string(failure.sequence);
      text += ": ";
    }
    return text + failure.detail;
  }

 private:
  std::shared_ptr<const CommFailure> failure_;
};

class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& what) : Error(Errc::kDevice, what) {}
};

class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& what) : Error(Errc::kCheckpoint, what) {}
};

// What Trainer::Options::on_nonfinite does when a step's reduced gradient holds an infinity or NaN.
// Every replica sees the same reduced gradient, so every replica decides the same way.
enum class NonFinite {
  kRaise,     // fit throws NumericError naming the step and the first non-finite index
  kSkipStep,  // every replica leaves its parameters and optimizer state as they were; the step
              // still counts (data order, Adam's bias correction), and Report::skipped_steps
              // counts it
};

constexpr std::string_view name(NonFinite policy) {
  return policy == NonFinite::kRaise ? "raise" : "skip_step";
}

// An infinity or NaN where training needs finite numbers. The numbers are fields, so that no
// caller parses them back out of the message:
//   step()   the step of the run (from 0) whose values were found non-finite
//   index()  the first non-finite element of them
//   where()  which values: the step's reduced gradient, or the parameters or optimizer state of
//            a replica (found after the step, or by a save that refused to write them)
class NumericError : public Error {
 public:
  enum class Where { kGradient, kParameters, kOptimizerState };

  NumericError(Where where, std::uint64_t step, std::size_t index, const std::string& context)
      : Error(Errc::kNumeric, describe(where, step, index, context)),
        where_(where),
        step_(step),
        index_(index) {}

  Where where() const noexcept { return where_; }
  std::uint64_t step() const noexcept { return step_; }
  std::size_t index() const noexcept { return index_; }

  static const char* name(Where where) {
    switch (where) {
      case Where::kGradient:
        return "the reduced gradient";
      case Where::kParameters:
        return "the parameters";
      case Where::kOptimizerState:
        return "the optimizer state";
    }
    return "values";
  }

 private:
  static std::string describe(Where where, std::uint64_t step, std::size_t index,
                              const std::string& context) {
    std::string message = "a non-finite value (infinity or NaN) in " + std::string(name(where)) +
                          " of step " + std::to_string(step) + ", first at index " +
                          std::to_string(index);
    if (!context.empty()) message += ": " + context;
    return message;
  }

  Where where_;
  std::uint64_t step_;
  std::size_t index_;
};

// Text that another process sent (a reason for leaving, a refusal), as it may appear in an error
// or a log line: in single quotes, printable ASCII as it is, every other byte (a line break, an
// escape sequence) as \xNN, cut after kMaxPeerTextBytes with "...", so that a peer can neither
// forge lines nor flood a log.
inline constexpr std::size_t kMaxPeerTextBytes = 240;

inline std::string quote_peer_text(std::string_view text) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string quoted = "'";
  for (std::size_t i = 0; i < text.size() && i < kMaxPeerTextBytes; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      quoted += static_cast<char>(byte);
    } else {
      quoted += "\\x";
      quoted += kDigits[byte >> 4];
      quoted += kDigits[byte & 15];
    }
  }
  return quoted + (text.size() > kMaxPeerTextBytes ? "'..." : "'");
}

// What a captured exception says: its what(), for passing a failure on as a reason.
inline std::string what_of(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// Whether a captured exception is a CommError: a failure of the job's communication, rather than
// of this process's own work.
inline bool is_comm_error(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const CommError&) {
    return true;
  } catch (...) {
    return false;
  }
}

namespace detail {
[[noreturn]] inline void assertion_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "cohort: internal error: %s failed at %s:%d\n", condition, file, line);
  std::abort();
}
}  // namespace detail

}  // namespace cohort

template <>
struct std::is_error_code_enum<cohort::Errc> : std::true_type {};

// Checked in every build type: a broken invariant inside cohort must never become wrong numbers.
#define COHORT_ASSERT(condition)      \
  ((condition) ? static_cast<void>(0) \
               : ::cohort::detail::assertion_failed(#condition, __FILE__, __LINE__))
