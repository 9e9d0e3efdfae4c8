// The LibTorch adapter: a torch::nn::Module and a loss function, trained by cohort.
//
//   #include <cohort/adapters/torch.hpp>
//
//   torch::nn::Sequential net(torch::nn::Linear(784, 256), torch::nn::ReLU(),
//                             torch::nn::Linear(256, 10));
//   auto summed_cross_entropy = [](const torch::Tensor& outputs, const torch::Tensor& labels) {
//     return torch::nn::functional::cross_entropy(
//         outputs, labels,
//         torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
//   };
//   cohort::adapters::TorchModel model(net, summed_cross_entropy);
//   cohort::adapters::TorchDataset data(images, labels);  // examples along dimension 0
//   cohort::Trainer trainer(model, cohort::strategy::Mirrored<>({.replicas = 2}),
//                           cohort::optimizer::Adam({.learning_rate = 1e-3}),
//                           {.global_batch = 128, .micro_batches = 2});
//   trainer.fit(data, {.epochs = 1});
//   torch::nn::Sequential trained(trainer.model().module());
//
// Only for programs that link LibTorch (find_package(Torch), target `torch`); cohort itself never
// needs it. The adapter is cohort::ModelTraits<TorchModel<Module, Loss>> (core/model.hpp), so
// every strategy and optimizer trains it as it trains a hand-written model.
//
// TorchModel<Module, Loss>
//   Module   the module's class: what derives from torch::nn::Module (NetImpl for a
//            TORCH_MODULE(Net), torch::nn::SequentialImpl for a torch::nn::Sequential). It must
//            derive from torch::nn::Cloneable<Module>, whose reset() registers the same
//            parameters as the constructor (a replica is a clone), and have
//            forward(torch::Tensor) returning a tensor.
//   Loss     a function object, loss(outputs, targets) -> torch::Tensor: the loss SUMMED over the
//            examples of the batch, a scalar (reduction kSum; a mean would scale every gradient
//            by 1 / micro-batch size, and cohort divides by the global batch itself).
//
//   TorchModel(module, loss, options)
//     module: a module holder (torch::nn::Sequential, a TORCH_MODULE) or a std::shared_ptr to the
//     module. The module is adapted in place: each trainable parameter (defined, requires_grad)
//     becomes a view into one flat float buffer, with its values, and its .grad() a view into one
//     flat gradient buffer. cohort's parameters() and gradients() spans ARE those buffers, so an
//     optimizer step or a checkpoint restore writes straight into the module's parameters.
//     Options:
//       intra_op_threads  threads each LibTorch operation may use, set when the model is made:
//                         torch::set_num_threads and, where the process's BLAS is OpenBLAS,
//                         openblas_set_num_threads (LibTorch's setting does not reach OpenBLAS's
//                         own pool). Both are process-global, shared by every replica of the
//                         process, and the last TorchModel made decides. 1 (the default): the
//                         replicas are the parallelism, one thread each, which is also what keeps
//                         an operation's bits the same in every run (a reduction split over
//                         threads sums in another order when the thread count changes). With R
//                         replica threads on C cores, C / R may be faster; the bits then hold
//                         across runs with the same setting. 0 leaves both settings alone.
//                         set_intra_op_threads(n) does the same for code without a TorchModel.
//   m.module()    this replica's module. The Trainer trains replicas (copies) of the model it is
//                 given, so the trained module is trainer.model().module(), not the one passed
//                 in here; to evaluate it, copy the model first (below).
//   copy          an independent replica: the module cloned (Cloneable::clone), its
//                 requires_grad flags carried over, adapted again with the same values
//   move          keeps the buffers, so the spans stay valid
//
// What is trained: every defined parameter that requires grad, in named_parameters() order. A
// parameter with requires_grad(false) is a constant: cloned into every replica, never updated,
// not in the spans nor in checkpoints.
//
// Refused, with a TorchModuleError (a ConfigError) whose `reason` says what and whose `tensor`
// names the parameter or buffer ("fc1.weight"):
//   kNotFloat        a trainable parameter that is not float32 (cohort's value_type is float)
//   kNotOnHost       a trainable parameter that is not a dense tensor in host memory
//   kBuffer          any buffer (batch-norm running statistics, say): forward updates it outside
//                    the gradient, from each replica's own micro-batches, so replicas would
//                    diverge and the result would depend on the replica count. Batch norm with
//                    track_running_stats(false) (statistics of each micro-batch, the same for any
//                    replica count), LayerNorm and GroupNorm have no buffers; a constant can be a
//                    parameter with requires_grad(false). Why not DDP's answers: broadcasting
//                    rank 0's running statistics keeps the updates of rank 0's micro-batches
//                    only, and which ones those are changes with the replica count;
//                    SyncBatchNorm normalizes over every replica's batch at once, while cohort
//                    computes a replica's micro-batches one after another (the statistics of the
//                    last are unknown when the first runs its forward pass). Running statistics
//                    that kept the bits would have to be folded per micro-batch in the reduction
//                    tree, which the adapter does not do.
//   kTied            a parameter registered under two names (tied weights): a replica is a clone,
//                    and cloning unties them
//   kNoParameters    a module without trainable parameters
//   kChanged         at forward_backward: a trainable parameter added, removed, replaced (a new
//                    submodule, register_parameter, a requires_grad flag turned) or moved off its
//                    buffer (set_data) since the model was made, or a buffer registered since.
//                    cohort sized the spans, the optimizer state and the checkpoints to the
//                    parameters it adapted: make a new TorchModel from the changed module.
//   kCloneDiffers    a clone whose parameters differ in name or order from the original's (reset()
//                    does not register what the constructor did): replicas must lay their
//                    buffers out alike
//   kLoss            a loss that is not a floating-point scalar, or that does not depend on any
//                    trainable parameter
// A gradient set to none (zero_grad(true)) is not refused: forward_backward reattaches the view.
//
// forward_backward(batch): zeroes the gradient buffer, runs module.forward(batch.inputs), the
// loss against batch.targets and backward, and returns the loss. Gradients accumulate into the
// views in place (LibTorch adds to a defined .grad() without replacing it), so the buffer holds
// the values LibTorch's own backward computes (after a step, where the Trainer reduced them in
// place, the views may hold the step's sum until the next forward_backward zeroes them). cohort
// calls it from one thread per replica, concurrently on different replicas; LibTorch's CPU
// autograd runs backward on the calling thread.
//
// Random draws (dropout, RReLU): LibTorch draws every CPU random number from one generator per
// process, which replica threads would reach in the order the scheduler runs them. Where the
// module has a dropout or RReLU submodule (or Options::random_draws is set) and is in training
// mode, each forward pass holds a process-wide lock and first seeds that generator from its
// micro-batch's stream (core/micro_batch.hpp). A micro-batch then draws the same masks on any
// replica count, strategy and launcher and after a restore, so the bits hold with dropout, as
// for any other model. The price: such forward passes run one at a time within a process
// (backward passes still run together; processes are not affected), and the generator's state
// after a fit is the last micro-batch's.
//
// Requirements the compiler cannot check:
//   - forward and the loss are deterministic apart from the draws above: the same parameters and
//     batch give the same bits;
//   - nothing changes a replica's mode during fit (train() / eval()): evaluate a copy,
//       auto evaluated = trainer.model();  evaluated.module()->eval();
//
// TorchDataset(inputs, targets): a cohort Dataset (core/dataset.hpp) over two tensors whose
// dimension 0 is the example (the same size); batch(indices) selects those rows of each
// (index_select), in order. Safe to call from every replica thread at once.
#pragma once

#include <dlfcn.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/micro_batch.hpp"
#include "cohort/core/model.hpp"

namespace cohort::adapters {

// A module or loss that the adapter cannot train; see the top of this file for each reason.
class TorchModuleError : public ConfigError {
 public:
  enum class Reason {
    kNotFloat,
    kNotOnHost,
    kBuffer,
    kTied,
    kNoParameters,
    kChanged,
    kCloneDiffers,
    kLoss
  };

  TorchModuleError(Reason reason, std::string tensor, const std::string& what)
      : ConfigError(what), reason(reason), tensor(std::move(tensor)) {}

  Reason reason;
  std::string tensor;  // the parameter or buffer's name in the module; empty for kNoParameters
                       // and kLoss
};

struct TorchBatch {
  torch::Tensor inputs;   // what module.forward takes; examples along dimension 0
  torch::Tensor targets;  // what the loss takes beside the outputs; examples along dimension 0
};

class TorchDataset {
 public:
  TorchDataset(torch::Tensor inputs, torch::Tensor targets)
      : inputs_(std::move(inputs)), targets_(std::move(targets)) {
    const auto require_examples = [](const char* field, const torch::Tensor& tensor) {
      if (!tensor.defined() || tensor.dim() == 0) {
        throw ConfigError(std::string("TorchDataset: ") + field +
                          " must be a tensor with the examples along dimension 0");
      }
    };
    require_examples("inputs", inputs_);
    require_examples("targets", targets_);
    if (targets_.size(0) != inputs_.size(0)) {
      throw ConfigError("TorchDataset: targets.size(0) = " + std::to_string(targets_.size(0)) +
                        ": must equal inputs.size(0) (" + std::to_string(inputs_.size(0)) +
                        "), one target per example");
    }
  }

  std::size_t size() const { return static_cast<std::size_t>(inputs_.size(0)); }

  TorchBatch batch(std::span<const std::size_t> indices) const {
    torch::Tensor rows = torch::empty({static_cast<std::int64_t>(indices.size())}, torch::kLong);
    std::copy(indices.begin(), indices.end(), rows.data_ptr<std::int64_t>());
    return {inputs_.index_select(0, rows), targets_.index_select(0, rows)};
  }

  const torch::Tensor& inputs() const { return inputs_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor inputs_;
  torch::Tensor targets_;
};

// TorchModel's options (intra_op_threads: see the top of this file).
struct TorchModelOptions {
  int intra_op_threads = 1;
  // The module's forward draws random numbers through functions, not modules
  // (torch::nn::functional::dropout, torch::rand): set true so that its draws follow the
  // micro-batch (see the top of this file). Dropout and RReLU modules are found without it.
  bool random_draws = false;
};

namespace detail {

using Reason = TorchModuleError::Reason;

struct NamedParameter {
  std::string name;
  torch::Tensor tensor;
};

// The trainable parameters of `module`, in named_parameters() order. Refuses tied ones: a replica
// is a clone, and cloning unties them (each submodule is cloned on its own).
inline std::vector<NamedParameter> trainable_parameters(const torch::nn::Module& module) {
  std::vector<NamedParameter> trainable;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& parameter = item.value();
    if (!parameter.requires_grad()) continue;  // named_parameters() lists defined ones only
    for (const NamedParameter& earlier : trainable) {
      if (earlier.tensor.is_same(parameter)) {
        throw TorchModuleError(Reason::kTied, item.key(),
                               "TorchModel: parameter '" + item.key() + "' is parameter '" +
                                   earlier.name +
                                   "' (tied weights): a replica is a clone of the module, and "
                                   "cloning unties them");
      }
    }
    trainable.push_back({item.key(), parameter});
  }
  return trainable;
}

// Refuses a module with a buffer, naming the first.
inline void refuse_buffers(const torch::nn::Module& module) {
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (!item.value().defined()) continue;
    throw TorchModuleError(
        Reason::kBuffer, item.key(),
        "TorchModel: the module has buffer '" + item.key() +
            "': forward may update a buffer outside the gradient (batch-norm running statistics), "
            "from each replica's own micro-batches, so replicas would diverge and the result "
            "would depend on the replica count. Use modules without buffers: batch norm with "
            "track_running_stats(false), LayerNorm or GroupNorm; hold a constant as a parameter "
            "with requires_grad(false)");
  }
}

inline std::string describe(const torch::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.scalar_type() << " on " << tensor.device() << ", layout " << tensor.layout();
  return text.str();
}

// Views into two flat float buffers standing in for a module's trainable parameters and their
// gradients: the storage behind cohort's parameters() and gradients() spans. Moves keep the
// buffers (a tensor handle moves, its storage stays).
class FlatParameters {
 public:
  // Moves every trainable parameter of `module` into the buffers, values unchanged, and makes
  // each .grad() a view of the gradient buffer. Refuses what the adapter cannot train.
  explicit FlatParameters(torch::nn::Module& module) {
    refuse_buffers(module);
    std::vector<NamedParameter> trainable = trainable_parameters(module);
    if (trainable.empty()) {
      throw TorchModuleError(Reason::kNoParameters, "",
                             "TorchModel: the module has no trainable parameter (none is defined "
                             "and requires grad): there is nothing to train");
    }
    std::int64_t total = 0;
    for (const NamedParameter& parameter : trainable) {
      refuse_unless_trainable(parameter);
      total += parameter.tensor.numel();
    }
    values_ = torch::empty({total}, torch::kFloat);
    gradients_ = torch::zeros({total}, torch::kFloat);
    torch::NoGradGuard no_grad;  // the copy below is no step of any graph
    std::int64_t offset = 0;
    for (NamedParameter& parameter : trainable) {
      torch::Tensor& tensor = parameter.tensor;
      const std::int64_t count = tensor.numel();
      torch::Tensor values = values_.narrow(0, offset, count).view(tensor.sizes());
      values.copy_(tensor);
      // set_data keeps the parameter's identity (the module, autograd and every handle to it see
      // the change) and gives it the buffer's storage.
      tensor.set_data(values);
      torch::Tensor gradient = gradients_.narrow(0, offset, count).view(tensor.sizes());
      tensor.mutable_grad() = gradient;
      adapted_.push_back({std::move(parameter), std::move(values), std::move(gradient)});
      ranges_.emplace_back(static_cast<std::size_t>(offset),
                           static_cast<std::size_t>(offset + count));
      offset += count;
    }
  }

  FlatParameters(FlatParameters&&) noexcept = default;
  FlatParameters& operator=(FlatParameters&&) noexcept = default;

  std::span<float> values() const { return {values_.data_ptr<float>(), size()}; }
  std::span<float> gradients() const { return {gradients_.data_ptr<float>(), size()}; }
  std::size_t size() const { return static_cast<std::size_t>(values_.numel()); }

  // Before a backward pass: refuses any change to the module's parameters or buffers since
  // adaptation, reattaches every gradient view (a gradient set to none, or replaced, would leave
  // the buffer) and zeroes the gradient buffer.
  void prepare_backward(const torch::nn::Module& module) {
    const std::vector<NamedParameter> now = trainable_parameters(module);
    for (std::size_t i = 0; i < std::max(now.size(), adapted_.size()); ++i) {
      if (i < now.size() && i < adapted_.size() &&
          now[i].tensor.is_same(adapted_[i].parameter.tensor)) {
        if (now[i].tensor.data_ptr() != adapted_[i].values.data_ptr()) {
          refuse_change(now[i].name, "was given other storage (set_data)");
        }
        continue;
      }
      // The first difference: an adapted parameter gone, or else one that is new.
      if (i < adapted_.size() &&
          std::none_of(now.begin() + static_cast<std::ptrdiff_t>(i), now.end(),
                       [&](const NamedParameter& p) {
                         return p.tensor.is_same(adapted_[i].parameter.tensor);
                       })) {
        refuse_change(adapted_[i].parameter.name,
                      "was removed, replaced or made not to require grad");
      }
      refuse_change(now[i].name, "was added or made to require grad");
    }
    refuse_buffers(module);
    for (Adapted& adapted : adapted_) adapted.parameter.tensor.mutable_grad() = adapted.gradient;
    gradients_.zero_();
  }

  // Runs backward(), calling ready(begin, end) with each parameter's range of the gradient buffer
  // as soon as autograd has accumulated its gradient there: a post hook on the parameter's
  // AccumulateGrad node, the node that writes .grad(). Parameters that no gradient reached are
  // reported after backward (their zeros are final). Call it after the forward pass, which made
  // the nodes. A failure of ready (a collective's) is rethrown after backward, as itself.
  template <class Backward>
  void backward_reporting(GradientReady ready, Backward&& backward) {
    using torch::autograd::variable_list;
    std::vector<bool> reported(adapted_.size(), false);
    std::exception_ptr failure;
    struct Hook {
      std::shared_ptr<torch::autograd::Node> node;
      std::uintptr_t key;
    };
    std::vector<Hook> hooks;
    const auto report = [&](std::size_t i) {
      reported[i] = true;
      if (failure) return;
      try {
        ready(ranges_[i].first, ranges_[i].second);
      } catch (...) {
        failure = std::current_exception();
      }
    };
    for (std::size_t i = 0; i < adapted_.size(); ++i) {
      std::shared_ptr<torch::autograd::Node> node =
          torch::autograd::impl::grad_accumulator(adapted_[i].parameter.tensor);
      if (!node) continue;
      const std::uintptr_t key =
          node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [&report, i](const variable_list& outputs, const variable_list&) {
                report(i);
                return outputs;
              }));
      hooks.push_back({std::move(node), key});
    }
    const auto remove_hooks = [&] {
      for (const Hook& hook : hooks) hook.node->del_post_hook(hook.key);
    };
    try {
      backward();
    } catch (...) {
      remove_hooks();
      throw;
    }
    remove_hooks();
    for (std::size_t i = 0; i < adapted_.size(); ++i) {
      if (!reported[i]) report(i);
    }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  struct Adapted {
    NamedParameter parameter;
    torch::Tensor values;    // its view of values_
    torch::Tensor gradient;  // its view of gradients_
  };

  static void refuse_unless_trainable(const NamedParameter& parameter) {
    const torch::Tensor& tensor = parameter.tensor;
    if (tensor.scalar_type() != torch::kFloat) {
      throw TorchModuleError(Reason::kNotFloat, parameter.name,
                             "TorchModel: parameter '" + parameter.name + "' is " +
                                 describe(tensor) +
                                 ": the adapter trains float32 parameters only (convert the "
                                 "module with module->to(torch::kFloat))");
    }
    if (!tensor.device().is_cpu() || tensor.layout() != torch::kStrided) {
      throw TorchModuleError(Reason::kNotOnHost, parameter.name,
                             "TorchModel: parameter '" + parameter.name + "' is " +
                                 describe(tensor) +
                                 ": the adapter trains dense parameters in host memory");
    }
  }

  [[noreturn]] static void refuse_change(const std::string& name, const std::string& what) {
    throw TorchModuleError(Reason::kChanged, name,
                           "TorchModel: parameter '" + name + "' " + what +
                               " after the model was made; cohort sized the spans, the optimizer "
                               "state and the checkpoints to the parameters it adapted: make a "
                               "new TorchModel from the changed module");
  }

  std::vector<Adapted> adapted_;  // in buffer order
  std::vector<std::pair<std::size_t, std::size_t>>
      ranges_;  // each one's [begin, end) in the buffers
  torch::Tensor values_;
  torch::Tensor gradients_;
};

// Whether `module` or a submodule draws random numbers in training mode: dropout of every kind,
// and RReLU's slopes.
inline bool has_random_modules(const torch::nn::Module& module) {
  for (const auto& submodule : module.modules(/*include_self=*/true)) {
    const torch::nn::Module* m = submodule.get();
    if (dynamic_cast<const torch::nn::DropoutImpl*>(m) ||
        dynamic_cast<const torch::nn::Dropout2dImpl*>(m) ||
        dynamic_cast<const torch::nn::Dropout3dImpl*>(m) ||
        dynamic_cast<const torch::nn::AlphaDropoutImpl*>(m) ||
        dynamic_cast<const torch::nn::FeatureAlphaDropoutImpl*>(m) ||
        dynamic_cast<const torch::nn::RReLUImpl*>(m)) {
      return true;
    }
  }
  return false;
}

// LibTorch draws every CPU random number from one generator per process. A forward pass that
// draws holds this lock and first seeds the generator from its micro-batch (core/micro_batch.hpp),
// so that its draws are the micro-batch's, whichever replica thread runs it and whenever.
inline std::mutex& random_draws_mutex() {
  static std::mutex mutex;
  return mutex;
}

template <class Forward>
torch::Tensor with_micro_batch_draws(Forward&& forward) {
  const std::lock_guard lock(random_draws_mutex());
  if (const MicroBatch* micro_batch = current_micro_batch()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const std::lock_guard generator_lock(generator.mutex());
    generator.set_current_seed(random_stream(*micro_batch));
  }
  return forward();
}

// A clone of `module` with the requires_grad flags of its parameters, which Cloneable::clone
// resets (its reset() registers every parameter anew, requiring grad).
template <class Module>
std::shared_ptr<Module> clone_of(const Module& module) {
  // Cloneable<Module>::clone makes a Module (a cast, as Module is a virtual base).
  auto clone = std::dynamic_pointer_cast<Module>(module.clone());
  const auto originals = module.named_parameters(/*recurse=*/true);
  const auto copies = clone->named_parameters(/*recurse=*/true);
  for (std::size_t i = 0; i < std::max(originals.size(), copies.size()); ++i) {
    if (i >= originals.size() || i >= copies.size() || originals[i].key() != copies[i].key()) {
      const std::string name = i < originals.size() ? originals[i].key() : copies[i].key();
      throw TorchModuleError(Reason::kCloneDiffers, name,
                             "TorchModel: the module's clone differs from it at parameter '" +
                                 name +
                                 "': a replica is a clone, so reset() must register the "
                                 "parameters the constructor does, under the same names");
    }
    copies[i].value().set_requires_grad(originals[i].value().requires_grad());
  }
  return clone;
}

inline void check_loss(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1 || !loss.is_floating_point()) {
    std::ostringstream text;
    text << "TorchModel: the loss function returned ";
    if (loss.defined()) {
      text << "a tensor of " << loss.scalar_type() << " with shape " << loss.sizes();
    } else {
      text << "an undefined tensor";
    }
    text << ": it must return the loss summed over the batch, a floating-point scalar "
            "(reduction kSum)";
    throw TorchModuleError(Reason::kLoss, "", text.str());
  }
  if (!loss.requires_grad()) {
    throw TorchModuleError(Reason::kLoss, "",
                           "TorchModel: the loss does not depend on any trainable parameter (it "
                           "does not require grad): the module's output must reach it");
  }
}

}  // namespace detail

// Sets the threads of every LibTorch operation of this process: torch::set_num_threads and, where
// the process's BLAS is OpenBLAS, openblas_set_num_threads; nothing for threads <= 0. What
// TorchModel's intra_op_threads does (see the top of this file); for LibTorch code of the same
// program that runs without cohort.
inline void set_intra_op_threads(int threads) {
  if (threads <= 0) return;
  torch::set_num_threads(threads);
  // Looked up rather than linked: a process whose BLAS is not OpenBLAS has no such symbol.
  using SetThreads = void (*)(int);
  if (const auto set_openblas_threads =
          reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_openblas_threads(threads);
  }
}

template <class Module, class Loss>
class TorchModel {
  static_assert(std::derived_from<Module, torch::nn::Cloneable<Module>>,
                "cohort: TorchModel<Module, Loss> makes replicas by cloning the module, so Module "
                "must derive from torch::nn::Cloneable<Module> (not torch::nn::Module directly) "
                "and register its parameters and submodules in reset(). See "
                "include/cohort/adapters/torch.hpp.");
  static_assert(
      requires(Module & module, const torch::Tensor& inputs) {
        { module.forward(inputs) } -> std::convertible_to<torch::Tensor>;
      },
      "cohort: TorchModel<Module, Loss> calls module.forward(inputs) with the batch's inputs "
      "tensor and needs a tensor back. See include/cohort/adapters/torch.hpp.");
  static_assert(
      std::copy_constructible<Loss> &&
          requires(Loss & loss, const torch::Tensor& outputs, const torch::Tensor& targets) {
            { loss(outputs, targets) } -> std::convertible_to<torch::Tensor>;
          },
      "cohort: the loss of TorchModel<Module, Loss> is a copyable function object "
      "loss(outputs, targets) returning the loss summed over the batch as a scalar tensor. See "
      "include/cohort/adapters/torch.hpp.");

 public:
  using value_type = float;
  using batch_type = TorchBatch;
  using Options = TorchModelOptions;

  TorchModel(std::shared_ptr<Module> module, Loss loss, Options options = {})
      : module_(std::move(module)),
        loss_(std::make_shared<Loss>(std::move(loss))),
        parameters_(*module_),
        random_draws_(options.random_draws || detail::has_random_modules(*module_)) {
    set_intra_op_threads(options.intra_op_threads);
  }

  TorchModel(const torch::nn::ModuleHolder<Module>& module, Loss loss, Options options = {})
      : TorchModel(module.ptr(), std::move(loss), options) {}

  TorchModel(const TorchModel& other)
      : module_(detail::clone_of(*other.module_)),
        loss_(std::make_shared<Loss>(*other.loss_)),
        parameters_(*module_),
        random_draws_(other.random_draws_) {}

  TorchModel(TorchModel&&) noexcept = default;
  TorchModel& operator=(TorchModel&&) noexcept = default;
  TorchModel& operator=(const TorchModel& other) {
    if (this != &other) *this = TorchModel(other);
    return *this;
  }
  ~TorchModel() = default;

  const std::shared_ptr<Module>& module() const { return module_; }

  // The buffers: the module's parameters and their gradients, in named_parameters() order.
  std::span<float> parameters() const { return parameters_.values(); }
  std::span<float> gradients() const { return parameters_.gradients(); }

  double forward_backward(const TorchBatch& batch) {
    torch::AutoGradMode grad_mode(true);
    parameters_.prepare_backward(*module_);
    const torch::Tensor loss = forward_loss(batch);
    detail::check_loss(loss);
    loss.backward();
    return loss.item<double>();
  }

  // The same, reporting each parameter's gradient ready as backward finishes it (gradient
  // readiness, core/model.hpp), so that cohort reduces it while backward goes on.
  double forward_backward(const TorchBatch& batch, GradientReady ready) {
    torch::AutoGradMode grad_mode(true);
    parameters_.prepare_backward(*module_);
    const torch::Tensor loss = forward_loss(batch);
    detail::check_loss(loss);
    parameters_.backward_reporting(ready, [&] { loss.backward(); });
    return loss.item<double>();
  }

 private:
  // The forward pass and the loss; where they draw random numbers, their draws are the
  // micro-batch's. Backward draws none: dropout's backward reuses the forward's mask.
  torch::Tensor forward_loss(const TorchBatch& batch) {
    const auto forward = [&] { return (*loss_)(module_->forward(batch.inputs), batch.targets); };
    if (!random_draws_ || !module_->is_training()) return forward();
    return detail::with_micro_batch_draws(forward);
  }

  std::shared_ptr<Module> module_;
  std::shared_ptr<Loss> loss_;  // this replica's own copy; a pointer so that any loss assigns
  detail::FlatParameters parameters_;
  bool random_draws_;  // the forward pass draws random numbers (TorchModelOptions::random_draws)
};

}  // namespace cohort::adapters

template <class Module, class Loss>
struct cohort::ModelTraits<cohort::adapters::TorchModel<Module, Loss>>
    : cohort::ModelMembers<cohort::adapters::TorchModel<Module, Loss>> {};
