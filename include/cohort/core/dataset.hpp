// The Dataset concept: a data set reports its size and builds a batch from example indices.
//
// The trainer, not the dataset, decides which indices each replica sees (core/sharding.hpp), so a
// dataset is random access and stateless:
//   std::size_t size() const;                                       // number of examples
//   Batch batch(std::span<const std::size_t> indices) const;        // those examples, in order
// batch() is called concurrently from every replica thread and must be safe to call so.
//
// Datasets are written for cohort (they are the user's input pipeline), so unlike models they
// are described by members rather than by a traits specialization.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

namespace cohort {

template <class D, class Batch>
concept Dataset = requires(const D& data, std::span<const std::size_t> indices) {
  { data.size() } -> std::convertible_to<std::size_t>;
  { data.batch(indices) } -> std::convertible_to<Batch>;
};

// The sentence a user reads when the data set given to Trainer::fit is not a Dataset of the
// model's batches.
#define COHORT_DATASET_REQUIREMENT_MESSAGE                                                       \
  "cohort: the data set given to fit is not a cohort::Dataset of the model's batches. It needs " \
  "`std::size_t size() const` and `batch(std::span<const std::size_t> indices) const` "          \
  "returning ModelTraits<YourModel>::batch_type (or a type convertible to it). See "             \
  "include/cohort/core/dataset.hpp."

}  // namespace cohort
