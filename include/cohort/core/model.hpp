// The Model concept: what cohort needs from a model that a user wrote.
//
// cohort never looks inside a model. It reaches one only through cohort::ModelTraits<M>, a traits
// template the user specializes (non-intrusive, so that a model from another library can be
// adapted without touching it). The primary template is empty: a type nobody described is not a
// Model, and Trainer says so in one sentence.
//
// A specialization provides:
//   using value_type = ...;   // float or double: the type of every parameter and gradient
//   using batch_type = ...;   // what the Dataset builds and forward_backward consumes
//   static std::span<value_type> parameters(M&);  // every trainable parameter, one contiguous span
//   static std::span<value_type> gradients(M&);   // same size; written by forward_backward
//   static double forward_backward(M&, const batch_type&);
//     // runs forward and backward on the batch, OVERWRITES gradients with the gradient of the
//     // SUMMED per-example loss (not the mean: cohort divides by the global batch size once, after
//     // reduction, which is what keeps results independent of how the batch was split), and
//     // returns that summed loss. From then until the next forward_backward the gradients are the
//     // Trainer's: where a replica folds one micro-batch a step it may reduce them where they
//     // lie, so what they hold after a step is unspecified.
//
// Optionally, where a replica is made on a device (model placement):
//   static M replicate(const M& prototype, const Place& place);
//     // a replica of prototype (the model given to Trainer) that lives at place, the strategy's
//     // place for it (strategy/strategy.hpp, device/device.hpp). For
//     // Mirrored<device::Cuda, collective::Nccl> and MultiWorkerMirrored<device::Cuda>, place is
//     // a device::cuda::Place {device, stream}: the replica's parameters() and gradients() are
//     // then memory of that GPU, and its forward_backward enqueues its work on place.stream
//     // (cohort enqueues the gradient fold and the optimizer step behind it on the same stream,
//     // and orders the all-reduce after it, so the model needs no synchronization of its own
//     // beyond what returning the loss takes). The prototype itself may live anywhere, for
//     // example on the host.
// Without replicate, a replica is a copy of the prototype, which is what host replicas
// (device::Cpu) need. A model trained on any other device must provide it: Trainer says so at
// compile time.
//
// Optionally, so that communication overlaps the backward pass (the gradient readiness):
//   static double forward_backward(M&, const batch_type&, GradientReady ready);
//     the same pass, which also calls ready(begin, end) as soon as gradients()[begin, end) are
//     final for this batch, typically once per layer in backward order; the pass then no longer
//     reads or writes them (the Trainer may be reducing them there). Together the ranges
//     cover every index exactly once; a range reported twice, out of bounds, or an index never
//     reported is a ConfigError naming the range. The Trainer calls this form on the last
//     micro-batch of each step (the others need no readiness) and starts reducing each bucket of
//     the gradient while the pass goes on; the result is the same bits with or without it.
//
// Optionally, for evaluation on held-out data inside fit (trainer/validation.hpp):
//   static cohort::NamedSums evaluate(M&, const batch_type&);
//     // a forward pass only: named sums over the batch's examples, the same names in the same
//     // order at every call, for example {{"loss", summed loss}, {"correct", correct
//     // predictions}}. The Trainer sums them over the held-out set and divides by its size.
//     // Without it, evaluation sums forward_backward's loss (a backward pass computed for
//     // nothing).
//
// Requirements the compiler cannot check:
//   - M is copyable, and a copy is an independent replica (its spans point into the copy; a copy
//     of a placed replica lives at the same place);
//   - forward_backward is deterministic: the same parameters and batch give the same bits. A
//     pass that draws random numbers (dropout) draws them from its micro-batch's stream,
//     random_stream(*current_micro_batch()) (core/micro_batch.hpp), never from a generator that
//     replicas share. It is called from one thread per replica, concurrently on different
//     replicas; for a placed replica, the place's device is current on that thread;
//   - a replica made by replicate holds the prototype's parameters: the chief's first replica
//     starts the run from them, and the others receive them by broadcast.
//
// A model that already has these as members (replicate too, as a static member) can say so in one
// line:
//   template <> struct cohort::ModelTraits<Mlp> : cohort::ModelMembers<Mlp> {};
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/core/readiness.hpp"

namespace cohort {

template <class M>
struct ModelTraits {};

template <class M>
concept FloatingPointParameters = std::same_as < typename ModelTraits<M>::value_type,
float > || std::same_as<typename ModelTraits<M>::value_type, double>;

template <class M>
concept Model = std::copyable<M> && requires {
  typename ModelTraits<M>::value_type;
  typename ModelTraits<M>::batch_type;
} && FloatingPointParameters<M> &&
    requires(M& model, const typename ModelTraits<M>::batch_type& batch) {
  {
    ModelTraits<M>::parameters(model)
    } -> std::same_as<std::span<typename ModelTraits<M>::value_type>>;
  {
    ModelTraits<M>::gradients(model)
    } -> std::same_as<std::span<typename ModelTraits<M>::value_type>>;
  { ModelTraits<M>::forward_backward(model, batch) } -> std::convertible_to<double>;
};

template <Model M>
using ValueType = typename ModelTraits<M>::value_type;

template <Model M>
using BatchType = typename ModelTraits<M>::batch_type;

// Whether ModelTraits<M> says how a replica is made at a Place (replicate, above).
template <class M, class Place>
concept Placeable = requires(const M& prototype, const Place& place) {
  { ModelTraits<M>::replicate(prototype, place) } -> std::same_as<M>;
};

// Whether ModelTraits<M> has the forward_backward that reports gradient readiness (above).
template <class M>
concept ReportsReadiness =
    requires(M& model, const typename ModelTraits<M>::batch_type& batch, GradientReady ready) {
  { ModelTraits<M>::forward_backward(model, batch, ready) } -> std::convertible_to<double>;
};

// What an evaluate(model, batch) returns (above): each sum by its name.
using NamedSums = std::vector<std::pair<std::string, double>>;

// Whether ModelTraits<M> has evaluate (above).
template <class M>
concept Evaluates = requires(M& model, const typename ModelTraits<M>::batch_type& batch) {
  { ModelTraits<M>::evaluate(model, batch) } -> std::convertible_to<NamedSums>;
};

// A replica of prototype at place: ModelTraits<M>::replicate where given, else a copy.
template <Model M, class Place>
M replicate(const M& prototype, const Place& place) {
  if constexpr (Placeable<M, Place>) {
    return ModelTraits<M>::replicate(prototype, place);
  } else {
    (void)place;
    return prototype;
  }
}

namespace detail {

// What a member type that M lacks stands for in ModelMembers<M>: not float or double, so M is no
// Model, and every declaration that names it is still well formed, so that the sentence naming
// the missing member is the error a user reads.
struct MissingMemberType {};

template <class M>
struct MemberTypes {
  using value_type = MissingMemberType;
  using batch_type = MissingMemberType;
};

template <class M>
requires requires {
  typename M::value_type;
  typename M::batch_type;
}
struct MemberTypes<M> {
  using value_type = typename M::value_type;
  using batch_type = typename M::batch_type;
};

// Whether M's members give what ModelMembers<M> forwards; true where a member type is missing,
// which its own sentence names.
template <class M>
constexpr bool member_spans() {
  using Types = MemberTypes<M>;
  if constexpr (std::same_as<typename Types::value_type, MissingMemberType>) {
    return true;
  } else {
    return requires(M & model) {
      { model.parameters() } -> std::convertible_to<std::span<typename Types::value_type>>;
      { model.gradients() } -> std::convertible_to<std::span<typename Types::value_type>>;
    };
  }
}

template <class M>
constexpr bool member_forward_backward() {
  using Types = MemberTypes<M>;
  if constexpr (std::same_as<typename Types::batch_type, MissingMemberType>) {
    return true;
  } else {
    return requires(M & model, const typename Types::batch_type& batch) {
      { model.forward_backward(batch) } -> std::convertible_to<double>;
    };
  }
}

}  // namespace detail

// Adapts a model whose members already have the required names and types. A member it needs and
// M lacks is named in a sentence of its own (ModelMembers is what a user wrote to say M has them).
template <class M>
struct ModelMembers {
  static_assert(
      requires { typename M::value_type; },
      "cohort: ModelMembers<M> needs the member type M::value_type (float or double: "
      "the type of every parameter and gradient), for example `using value_type = "
      "float;` in the model. See include/cohort/core/model.hpp.");
  static_assert(
      requires { typename M::batch_type; },
      "cohort: ModelMembers<M> needs the member type M::batch_type (what the Dataset's "
      "batch(indices) builds and forward_backward takes), for example `using "
      "batch_type = MyBatch;` in the model. See include/cohort/core/model.hpp.");
  static_assert(detail::member_spans<M>(),
                "cohort: ModelMembers<M> needs the member functions parameters() and gradients(), "
                "callable on a non-const M and each returning std::span<M::value_type>: every "
                "trainable parameter in one contiguous span, and its gradient of the same size. "
                "See include/cohort/core/model.hpp.");
  static_assert(detail::member_forward_backward<M>(),
                "cohort: ModelMembers<M> needs the member function forward_backward(const "
                "M::batch_type&), callable on a non-const M and returning the summed loss as a "
                "double. See include/cohort/core/model.hpp.");
  using value_type = typename detail::MemberTypes<M>::value_type;
  using batch_type = typename detail::MemberTypes<M>::batch_type;
  static std::span<value_type> parameters(M& model) { return model.parameters(); }
  static std::span<value_type> gradients(M& model) { return model.gradients(); }
  static double forward_backward(M& model, const batch_type& batch) {
    return model.forward_backward(batch);
  }
  // Only for a model with a member forward_backward(batch, ready).
  static double forward_backward(M& model, const batch_type& batch, GradientReady ready)
    requires requires { model.forward_backward(batch, ready); }
  {
    return model.forward_backward(batch, ready);
  }
  // Only for a model with a member evaluate(batch).
  static NamedSums evaluate(M& model, const batch_type& batch)
    requires requires { model.evaluate(batch); }
  {
    return model.evaluate(batch);
  }
  // Only for a model with a static member replicate(prototype, place).
  template <class Place>
    requires requires(const M& prototype, const Place& place) {
      { M::replicate(prototype, place) } -> std::same_as<M>;
    }
  static M replicate(const M& prototype, const Place& place) {
    return M::replicate(prototype, place);
  }
};

// The sentence a user reads when the type given to Trainer is not a Model.
#define COHORT_MODEL_REQUIREMENT_MESSAGE                                                        \
  "cohort: the model type is not a cohort::Model. Specialize cohort::ModelTraits<YourModel> "   \
  "with value_type (float or double), batch_type, parameters(m) and gradients(m) returning "    \
  "std::span<value_type>, and forward_backward(m, batch) returning the summed loss; or write "  \
  "`template <> struct cohort::ModelTraits<YourModel> : cohort::ModelMembers<YourModel> {};`. " \
  "See include/cohort/core/model.hpp."

}  // namespace cohort
