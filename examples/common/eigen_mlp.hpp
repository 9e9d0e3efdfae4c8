// A multilayer perceptron written with Eigen 3.4 the way a user writes one: each micro-batch goes
// through the layers as matrix products of the whole micro-batch at once. Dense layers with ReLU
// between them and a softmax cross-entropy at the end, any list of layer sizes.
//
//   example::EigenMlp model({784, 1024, 1024, 10}, /*seed=*/1, /*threads=*/2);
//   cohort::Trainer trainer(model, cohort::strategy::Mirrored<>({.replicas = 2}), ...);
//
// BasicEigenMlp<T> computes in T (float or double: EigenMlp is the float one, which trains; the
// double one is for checking gradients against finite differences). Parameters and gradients
// have Mlp's flat layout and He initialization (mlp_layout.hpp): for a seed, EigenMlp and Mlp
// start from the same parameters and compute the same function (not the same bits: the products
// sum in another order).
//
// Layer l's weights, out = sizes[l + 1] rows of in = sizes[l] in the flat vector, are read as the
// column-major in x out matrix W (column o: the weights into unit o), and a micro-batch of n
// examples as the column-major in x n matrix X (column e: example e, which is Batch's row-major
// layout as it is). Forward, for each layer: Z = W^T X + b, ReLU on hidden layers. Backward, from
// the last layer down, with D = d loss / dZ (softmax minus one-hot at the top):
//   dW = X D^T,  db = the sum of D's columns, example by example,
//   D below = (W D) where the layer's input was positive, else 0.
// Each layer's weight and bias gradients are final when its step of the backward pass ends
// (layer_gradients), last layer first: forward_backward(batch, ready) says so as it goes.
//
// Threads: with threads = T, each product is split into T blocks of rows of its result (the
// forward pass and dW by output unit, D below by input unit; blocks start on multiples of 16
// rows), computed at once by the model's own ThreadTeam (thread_team.hpp). Every element is still
// one product over the whole inner dimension, but a library may multiply a smaller block with
// another kernel (OpenBLAS's small-matrix kernels, Eigen's edge kernels), so T is part of what
// defines the bits. Each replica owns its team: replicas training side by side share no threads
// and no thread count. Run R replicas x T threads on at most as many cores (examples/README.md).
//
// Matrix products: Eigen's own kernels, or a BLAS when the build defines EIGEN_USE_BLAS (the
// examples' CMake does, with OpenBLAS: docs/dependencies.md). With OpenBLAS, the model sets it to
// one thread per call once, for the whole process: the model's threads are its own. Where OpenBLAS
// chose its generic kernels on a processor that has AVX2 or AVX-512, it says so once, with the
// setting that picks the right ones (warn_of_generic_blas_kernels).
//
// Floating point: the model computes with denormals flushed to zero (FlushDenormals, below), on
// its own threads and, during forward_backward and predict, on the caller's; the caller's mode is
// restored before they return, so the optimizer and the reductions see the thread's own mode.
//
// Determinism: the same parameters, batch and thread count give the same bits, run to run and on
// every replica (all buffers are the model's own, aligned alike, and every sum has a fixed order).
// Across machines, docs/architecture.md ("Which bits are the same where") says what may change.
// forward_backward allocates nothing once its buffers fit the largest micro-batch so far (with
// OpenBLAS; Eigen's own kernels allocate their packing buffers per product).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cohort/core/model.hpp>
#include <cohort/core/options.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "batch.hpp"
#include "mlp_layout.hpp"
#include "thread_team.hpp"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#if defined(EIGEN_USE_BLAS)
// OpenBLAS's thread count and the kernels it chose, where OpenBLAS is the BLAS (weak references:
// null with another one).
extern "C" [[gnu::weak]] void openblas_set_num_threads(int);
extern "C" [[gnu::weak]] char* openblas_get_corename();
#endif

namespace example {

// While it lives, the calling thread computes with denormal numbers flushed to zero, as results
// and as inputs (x86's FTZ and DAZ; elsewhere it does nothing); then the thread's mode is as
// before. A well-trained model's deltas underflow (softmax probabilities of e^-100), and a
// product with denormal operands runs several times slower (measured: 784-1024-1024-10 trained
// to a loss near 0 ran at 4,200 examples/s, and at 7,200 with them flushed). TensorFlow flushes
// them on its threads by default too.
class FlushDenormals {
 public:
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000;
  static constexpr unsigned kDenormalsAreZero = 0x0040;
  unsigned saved_;
#else
  FlushDenormals() = default;
#endif
};

// OpenBLAS picks its kernels by the processor's model number, and a release older than the
// processor falls back to its generic x86-64 kernels, "Prescott": Debian bookworm's 0.3.21 on a
// Xeon of model 207 multiplies the demo's matrices at 20 to 29 GFLOP/s, and at 104 with the
// AVX-512 kernels its instructions allow. Said once per process, with the setting that fixes it,
// since the choice is made when the library loads, before any code of the program runs.
inline void warn_of_generic_blas_kernels([[maybe_unused]] std::string_view core) {
#if defined(__x86_64__)
  if (core != "Prescott" || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* fitting = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                        : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                          : nullptr;
  if (fitting == nullptr) return;
  std::fprintf(stderr,
               "warning: OpenBLAS does not know this processor and multiplies with its generic "
               "kernels (%.*s), several times slower than the processor allows; set "
               "OPENBLAS_CORETYPE=%s to use the kernels its instructions allow\n",
               static_cast<int>(core.size()), core.data(), fitting);
#endif
}

template <class T>
class BasicEigenMlp {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "example::BasicEigenMlp computes in float or double");

 public:
  using value_type = T;
  using batch_type = Batch;

  // layers: inputs, hidden..., classes (at least two entries, none 0). Weights by He
  // initialization from seed, biases 0. threads: the threads that compute each micro-batch (the
  // calling thread and threads - 1 of the model's own).
  BasicEigenMlp(std::vector<std::size_t> layers, std::uint64_t seed, std::size_t threads = 1)
      : sizes_(std::move(layers)), team_(threads) {
    if (sizes_.size() < 2) {
      cohort::options::reject("layers", describe(sizes_), "needs the inputs and the classes");
    }
    if (std::find(sizes_.begin(), sizes_.end(), 0) != sizes_.end()) {
      cohort::options::reject("layers", describe(sizes_), "every layer needs a unit");
    }
    cohort::options::require_positive("threads", threads);
    const std::size_t total = lay_out(sizes_, weight_offsets_, bias_offsets_);
    parameters_ = Vector::Zero(static_cast<Eigen::Index>(total));
    gradients_ = Vector::Zero(static_cast<Eigen::Index>(total));
    initialize_he(sizes_, weight_offsets_, seed, parameters());
    activations_.resize(sizes_.size());
    deltas_.resize(sizes_.size());
#if defined(EIGEN_USE_BLAS)
    static const bool one_blas_thread = [] {
      if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
      if (openblas_get_corename != nullptr) warn_of_generic_blas_kernels(openblas_get_corename());
      return true;
    }();
    (void)one_blas_thread;
#endif
  }

  std::span<T> parameters() {
    return {parameters_.data(), static_cast<std::size_t>(parameters_.size())};
  }
  std::span<T> gradients() {
    return {gradients_.data(), static_cast<std::size_t>(gradients_.size())};
  }
  const std::vector<std::size_t>& layers() const { return sizes_; }
  std::size_t threads() const { return team_.size(); }

  // Overwrites the gradients with those of the summed cross-entropy over the batch; returns that
  // summed loss.
  double forward_backward(const Batch& batch) {
    return forward_backward(batch, [](std::size_t, std::size_t) {});
  }

  // The same, and calls ready(begin, end) as soon as each layer's gradients [begin, end) are
  // final, last layer first, before the backward pass goes on to the layer below: a trainer can
  // communicate them meanwhile (cohort's gradient readiness, core/model.hpp). ready runs in the
  // caller's floating-point mode, not the model's: what it computes must not depend on the model.
  template <class Ready>
  double forward_backward(const Batch& batch, Ready&& ready) {
    double loss = 0.0;
    {
      const FlushDenormals flush;
      forward(batch);
      loss = softmax_cross_entropy(batch.labels);
    }
    for (std::size_t layer = layer_count(); layer-- > 0;) {
      {
        const FlushDenormals flush;
        layer_gradients(layer);
      }
      ready(weight_offsets_[layer], bias_offsets_[layer] + sizes_[layer + 1]);
      if (layer > 0) {
        const FlushDenormals flush;
        delta_below(layer);
      }
    }
    return loss;
  }

  // A forward pass only: the summed cross-entropy and the number of correct predictions
  // (cohort's evaluation on held-out data, core/model.hpp).
  cohort::NamedSums evaluate(const Batch& batch) {
    const FlushDenormals flush;
    forward(batch);
    const double loss = softmax_cross_entropy(batch.labels);
    double correct = 0.0;
    for (std::size_t example = 0; example < batch.size(); ++example) {
      Eigen::Index predicted = 0;
      activations_.back().col(static_cast<Eigen::Index>(example)).maxCoeff(&predicted);
      correct += predicted == batch.labels[example] ? 1.0 : 0.0;
    }
    return {{"loss", loss}, {"correct", correct}};
  }

  // The class of highest logit for each example of the batch (the first, on ties).
  std::vector<std::size_t> predict(const Batch& batch) {
    const FlushDenormals flush;
    forward(batch);
    std::vector<std::size_t> classes(batch.size());
    for (std::size_t example = 0; example < batch.size(); ++example) {
      activations_.back().col(static_cast<Eigen::Index>(example)).maxCoeff(&classes[example]);
    }
    return classes;
  }

 private:
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;  // column-major
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  using MatrixMap = Eigen::Map<Matrix>;
  using VectorMap = Eigen::Map<Vector>;

  // Splits are made on multiples of the widest SIMD register's floats, the row unit of the
  // product kernels, so that no thread's block starts inside one.
  static constexpr std::size_t kRowGrain = 16;

  struct Rows {
    Eigen::Index begin = 0;
    Eigen::Index size = 0;
  };

  static std::string describe(const std::vector<std::size_t>& sizes) {
    std::string text;
    for (std::size_t size : sizes) {
      if (!text.empty()) text += ',';
      text += std::to_string(size);
    }
    return text;
  }

  static Eigen::Index index(std::size_t value) { return static_cast<Eigen::Index>(value); }

  std::size_t layer_count() const { return sizes_.size() - 1; }
  Eigen::Index inputs(std::size_t layer) const { return index(sizes_[layer]); }
  Eigen::Index outputs(std::size_t layer) const { return index(sizes_[layer + 1]); }

  MatrixMap weights(Vector& flat, std::size_t layer) {
    return {flat.data() + weight_offsets_[layer], inputs(layer), outputs(layer)};
  }
  VectorMap biases(Vector& flat, std::size_t layer) {
    return {flat.data() + bias_offsets_[layer], outputs(layer)};
  }

  // task(part) on every thread of the team, in the model's floating-point mode.
  template <class Task>
  void run_on_team(const Task& task) {
    team_.run([&](std::size_t part) {
      const FlushDenormals flush;
      task(part);
    });
  }

  // Team thread `part`'s share of `units` rows.
  Rows share(Eigen::Index units, std::size_t part) const {
    const auto grain = index(kRowGrain);
    const auto parts = index(team_.size());
    const auto at = index(part);
    const Eigen::Index grains = (units + grain - 1) / grain;
    const Eigen::Index begin = std::min(units, grains * at / parts * grain);
    const Eigen::Index end = std::min(units, grains * (at + 1) / parts * grain);
    return {begin, end - begin};
  }

  // Loads the batch and computes every layer's activations (the last layer's are the logits).
  void forward(const Batch& batch) {
    if (batch.features != sizes_.front() || batch.inputs.size() != batch.size() * batch.features) {
      throw std::invalid_argument(
          "EigenMlp: batch.features = " + std::to_string(batch.features) + " with " +
          std::to_string(batch.inputs.size()) + " inputs for " + std::to_string(batch.size()) +
          " labels; the model's input layer has " + std::to_string(sizes_.front()) + " units");
    }
    examples_ = index(batch.size());
    if (activations_.front().cols() < examples_) {
      for (std::size_t layer = 0; layer < sizes_.size(); ++layer) {
        activations_[layer].resize(index(sizes_[layer]), examples_);
        if (layer > 0) deltas_[layer].resize(index(sizes_[layer]), examples_);
      }
    }
    activations_.front().leftCols(examples_) =
        Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>>(batch.inputs.data(),
                                                                               inputs(0), examples_)
            .template cast<T>();
    for (std::size_t layer = 0; layer < layer_count(); ++layer) {
      run_on_team([&](std::size_t part) { forward_layer(layer, share(outputs(layer), part)); });
    }
  }

  // Z = W^T X + b for the output units `rows`, then ReLU unless it is the last layer.
  void forward_layer(std::size_t layer, Rows rows) {
    if (rows.size == 0) return;
    auto z = activations_[layer + 1].block(rows.begin, 0, rows.size, examples_);
    z.noalias() = weights(parameters_, layer).middleCols(rows.begin, rows.size).transpose() *
                  activations_[layer].leftCols(examples_);
    const auto b = biases(parameters_, layer).segment(rows.begin, rows.size);
    if (layer + 1 < layer_count()) {
      z = (z.colwise() + b).cwiseMax(T(0));
    } else {
      z.colwise() += b;
    }
  }

  // The summed softmax cross-entropy of the logits against the labels; leaves its gradient with
  // respect to the logits in the last deltas. In the plain loops of Mlp, with its precision: the
  // normalizer in double.
  double softmax_cross_entropy(const std::vector<std::int32_t>& labels) {
    const Eigen::Index classes = index(sizes_.back());
    double loss = 0.0;
    for (Eigen::Index example = 0; example < examples_; ++example) {
      const std::int32_t label = labels[static_cast<std::size_t>(example)];
      if (label < 0 || label >= classes) {
        throw std::invalid_argument("EigenMlp: label " + std::to_string(label) + " of example " +
                                    std::to_string(example) + " is not one of the " +
                                    std::to_string(classes) + " classes");
      }
      const auto logits = activations_.back().col(example);
      auto delta = deltas_.back().col(example);
      const T top = logits.maxCoeff();
      double normalizer = 0.0;
      for (Eigen::Index c = 0; c < classes; ++c) {
        delta[c] = std::exp(logits[c] - top);
        normalizer += delta[c];
      }
      for (Eigen::Index c = 0; c < classes; ++c) delta[c] = static_cast<T>(delta[c] / normalizer);
      loss += std::log(normalizer) - static_cast<double>(logits[label] - top);
      delta[label] -= T(1);
    }
    return loss;
  }

  // Layer `layer`'s weight and bias gradients from the deltas of its outputs, and the deltas of
  // its inputs (unless it is the first layer); after it, the layer's gradients are final.
  // dW and db of `layer` from the deltas of its outputs.
  void layer_gradients(std::size_t layer) {
    run_on_team([&](std::size_t part) {
      const auto delta = deltas_[layer + 1].leftCols(examples_);
      if (const Rows units = share(outputs(layer), part); units.size > 0) {
        weights(gradients_, layer).middleCols(units.begin, units.size).noalias() =
            activations_[layer].leftCols(examples_) *
            delta.middleRows(units.begin, units.size).transpose();
        auto db = biases(gradients_, layer).segment(units.begin, units.size);
        db.setZero();
        for (Eigen::Index example = 0; example < examples_; ++example) {
          db += delta.col(example).segment(units.begin, units.size);
        }
      }
    });
  }

  // The deltas of `layer`'s inputs (layer > 0): the layer below's outputs.
  void delta_below(std::size_t layer) {
    run_on_team([&](std::size_t part) {
      const auto delta = deltas_[layer + 1].leftCols(examples_);
      if (const Rows units = share(inputs(layer), part); units.size > 0) {
        auto below = deltas_[layer].block(units.begin, 0, units.size, examples_);
        below.noalias() = weights(parameters_, layer).middleRows(units.begin, units.size) * delta;
        // ReLU's derivative: the layer's input is its activation. A plain loop, which compilers
        // vectorize (Eigen 3.4's select does not).
        for (Eigen::Index example = 0; example < examples_; ++example) {
          const T* input = activations_[layer].col(example).data() + units.begin;
          T* gradient = below.col(example).data();
          for (Eigen::Index unit = 0; unit < units.size; ++unit) {
            gradient[unit] = input[unit] > T(0) ? gradient[unit] : T(0);
          }
        }
      }
    });
  }

  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> weight_offsets_;
  std::vector<std::size_t> bias_offsets_;
  // Eigen's own storage: aligned alike in every replica, so that no result depends on where a
  // replica's buffers happen to lie.
  Vector parameters_;
  Vector gradients_;
  // Per layer, one column per example of the micro-batch in flight (the first examples_ columns
  // of buffers sized for the largest micro-batch so far): the layer's activations (inputs, after
  // ReLU, logits for the last) and the loss's gradient with respect to its pre-activations.
  std::vector<Matrix> activations_;
  std::vector<Matrix> deltas_;
  Eigen::Index examples_ = 0;
  ThreadTeam team_;
};

using EigenMlp = BasicEigenMlp<float>;

}  // namespace example

template <class T>
struct cohort::ModelTraits<example::BasicEigenMlp<T>>
    : cohort::ModelMembers<example::BasicEigenMlp<T>> {};
