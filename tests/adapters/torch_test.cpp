// The LibTorch adapter: its spans are the module's storage through training and restore, it gives
// the same bits for every replica count and strategy, its gradients are LibTorch's, and it refuses
// what it cannot train, naming it.
//
// LibTorch is heavy to compile, so this one file is the room's whole executable: the tests, and,
// when started with --train-worker, one process of the multi-process tests (cohort-run starts it).
#include "cohort/adapters/torch.hpp"  // first: the header compiles alone

#define DOCTEST_CONFIG_IMPLEMENT
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cohort/cohort.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cohort/strategy/parameter_server.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "error_message.hpp"
#include "jobs.hpp"
#include "processes.hpp"

namespace {

using cohort::adapters::TorchBatch;
using cohort::adapters::TorchDataset;
using cohort::adapters::TorchModel;
using cohort::adapters::TorchModuleError;
using Reason = TorchModuleError::Reason;
using cohort::testing::contains;

struct SummedCrossEntropy {
  torch::Tensor operator()(const torch::Tensor& outputs, const torch::Tensor& labels) const {
    return torch::nn::functional::cross_entropy(
        outputs, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
};

using Model = TorchModel<torch::nn::SequentialImpl, SummedCrossEntropy>;

// The kinds of module the example trains, small: an MLP on 8 features (also with dropout, whose
// masks must follow the micro-batch) and a CNN on 6 x 6 images, 4 classes each; initialized from
// `seed`.
torch::nn::Sequential mlp(std::uint64_t seed = 5) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 4));
}

torch::nn::Sequential dropout_mlp(std::uint64_t seed = 5) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Dropout(0.5),
                               torch::nn::Linear(16, 4));
}

torch::nn::Sequential cnn(std::uint64_t seed = 5) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)),
                               torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(4 * 3 * 3, 4));
}

enum class Kind { kMlp, kDropoutMlp, kCnn };

torch::nn::Sequential module_of(Kind kind) {
  switch (kind) {
    case Kind::kMlp:
      return mlp();
    case Kind::kDropoutMlp:
      return dropout_mlp();
    case Kind::kCnn:
      break;
  }
  return cnn();
}

// 512 examples whose label is the part of the input (a quarter of the features, or of the image)
// with the largest sum: learnable by both modules.
TorchDataset data_for(Kind kind) {
  torch::manual_seed(3);
  const torch::Tensor inputs =
      kind == Kind::kCnn ? torch::randn({512, 1, 6, 6}) : torch::randn({512, 8});
  const torch::Tensor parts = inputs.reshape({512, 4, -1}).sum(2);
  return TorchDataset(inputs, parts.argmax(1));
}

// Every test trains with these settings.
template <class Strategy>
cohort::Trainer<Model, Strategy, cohort::optimizer::Adam> trainer_of(Model model,
                                                                     Strategy strategy) {
  return {
      std::move(model),
      std::move(strategy),
      cohort::optimizer::Adam({.learning_rate = 3e-3}),
      {.global_batch = 64, .micro_batches = 8, .seed = 11, .progress = cohort::Progress::kSilent}};
}

std::string bytes_of(std::span<const float> values) {
  return {reinterpret_cast<const char*>(values.data()), values.size_bytes()};
}

template <class Trainer>
bool strategy_serves(const Trainer& trainer) {
  if constexpr (requires { trainer.strategy().serves(); }) {
    return trainer.strategy().serves();
  } else {
    return false;
  }
}

template <class Strategy>
std::string train(Kind kind, Strategy strategy, std::uint64_t steps) {
  auto trainer = trainer_of(Model(module_of(kind), SummedCrossEntropy{}), std::move(strategy));
  trainer.fit(data_for(kind), {.steps = steps});
  return strategy_serves(trainer) ? std::string() : bytes_of(trainer.model().parameters());
}

// Every trainable parameter of the module, and its gradient, lies in the spans at its offset.
void check_views(const Model& model) {
  const std::span<float> parameters = model.parameters();
  const std::span<float> gradients = model.gradients();
  std::size_t offset = 0;
  for (const auto& item : model.module()->named_parameters()) {
    CAPTURE(item.key());
    CHECK(item.value().data_ptr<float>() == parameters.data() + offset);
    REQUIRE(item.value().grad().defined());
    CHECK(item.value().grad().data_ptr<float>() == gradients.data() + offset);
    offset += static_cast<std::size_t>(item.value().numel());
  }
  CHECK(offset == parameters.size());
}

// The module's parameters, read through LibTorch, one after the other.
std::vector<float> module_values(const Model& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& parameter : model.module()->parameters()) flat.push_back(parameter.flatten());
  const torch::Tensor all = torch::cat(flat);
  return {all.data_ptr<float>(), all.data_ptr<float>() + all.numel()};
}

// The refusal that f throws, or nothing.
template <class F>
std::optional<TorchModuleError> refusal(F&& f) {
  try {
    f();
  } catch (const TorchModuleError& error) {
    return error;
  }
  return std::nullopt;
}

TorchBatch first_examples(Kind kind, std::size_t count) {
  std::vector<std::size_t> indices(count);
  for (std::size_t i = 0; i < count; ++i) indices[i] = 3 * i + 1;
  return data_for(kind).batch(indices);
}

// One process of the multi-process tests: trains the dropout MLP 30 steps with `strategy`
// (multi_worker or parameter_server, with Sync) and, on the chief, writes the parameters to `out`.
int train_worker(std::string_view strategy, const std::filesystem::path& out) {
  const auto run = [&](auto&& strategy) {
    const bool chief = strategy.is_chief();
    const std::string parameters = train(Kind::kDropoutMlp, std::move(strategy), 30);
    if (chief && !parameters.empty()) std::ofstream(out, std::ios::binary) << parameters;
    return 0;
  };
  using namespace std::chrono_literals;
  if (strategy == "multi_worker") {
    return run(cohort::strategy::MultiWorkerMirrored<>({.connect_timeout = 30s, .timeout = 10s}));
  }
  return run(cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync>(
      {.connect_timeout = 30s, .timeout = 10s}));
}

constexpr std::string_view kWorkerFlag = "--train-worker";

}  // namespace

TEST_CASE("the module's parameters and gradients are the spans, through steps and restore") {
  cohort::testing::TemporaryDirectory directory("cohort-adapters-restore");
  const auto file = directory.path / "run.ckpt";
  const TorchDataset data = data_for(Kind::kMlp);
  auto trainer =
      trainer_of(Model(mlp(), SummedCrossEntropy{}), cohort::strategy::Mirrored<>({.replicas = 2}));
  trainer.fit(data, {.steps = 5});
  check_views(trainer.model());
  const std::vector<float> saved = module_values(trainer.model());
  CHECK(bytes_of(saved) == bytes_of(trainer.model().parameters()));
  trainer.save(file);

  trainer.fit(data, {.steps = 10});
  CHECK(module_values(trainer.model()) != saved);  // the steps moved the module itself
  const std::string uninterrupted = bytes_of(trainer.model().parameters());

  trainer.restore(file);
  check_views(trainer.model());
  CHECK(module_values(trainer.model()) == saved);  // the restore wrote into the module
  trainer.fit(data, {.steps = 10});
  CHECK(bytes_of(module_values(trainer.model())) == uninterrupted);
}

TEST_CASE_TEMPLATE_DEFINE("Mirrored on 1, 2 and 4 replicas gives bit-identical parameters", K,
                          bit_identical) {
  constexpr Kind kind = K::value;
  const std::string one = train(kind, cohort::strategy::Mirrored<>({.replicas = 1}), 30);
  REQUIRE(one != bytes_of(Model(module_of(kind), SummedCrossEntropy{}).parameters()));
  for (std::size_t replicas : {2, 4}) {
    CAPTURE(replicas);
    CHECK(train(kind, cohort::strategy::Mirrored<>({.replicas = replicas}), 30) == one);
  }
}
TEST_CASE_TEMPLATE_INVOKE(bit_identical, std::integral_constant<Kind, Kind::kMlp>,
                          std::integral_constant<Kind, Kind::kDropoutMlp>,
                          std::integral_constant<Kind, Kind::kCnn>);

TEST_CASE("dropout draws masks in training: its run differs from the same module in eval mode") {
  const std::string dropped =
      train(Kind::kDropoutMlp, cohort::strategy::Mirrored<>({.replicas = 2}), 30);
  torch::nn::Sequential evaluated = dropout_mlp();
  evaluated->eval();
  auto trainer = trainer_of(Model(evaluated, SummedCrossEntropy{}),
                            cohort::strategy::Mirrored<>({.replicas = 2}));
  trainer.fit(data_for(Kind::kDropoutMlp), {.steps = 30});
  CHECK(bytes_of(trainer.model().parameters()) != dropped);
}

TEST_CASE("the gradients are LibTorch's own, and each call overwrites them") {
  for (Kind kind : {Kind::kMlp, Kind::kCnn}) {
    CAPTURE(static_cast<int>(kind));
    const TorchBatch batch = first_examples(kind, 16);
    torch::nn::Sequential reference = module_of(kind);
    const torch::Tensor expected_loss =
        SummedCrossEntropy{}(reference->forward(batch.inputs), batch.targets);
    expected_loss.backward();
    std::vector<torch::Tensor> gradients;
    for (const auto& parameter : reference->parameters()) {
      gradients.push_back(parameter.grad().flatten());
    }
    const torch::Tensor expected = torch::cat(gradients);

    Model model(module_of(kind), SummedCrossEntropy{});
    for (int call = 0; call < 2; ++call) {
      CAPTURE(call);
      CHECK(model.forward_backward(batch) == expected_loss.item<double>());
      const torch::Tensor adapted = torch::from_blob(
          model.gradients().data(), {static_cast<std::int64_t>(model.gradients().size())});
      CHECK(torch::equal(adapted, expected));
    }
  }
}

TEST_CASE("each parameter's gradient is reported ready once, final, as backward finishes it") {
  for (Kind kind : {Kind::kMlp, Kind::kCnn}) {
    CAPTURE(static_cast<int>(kind));
    const TorchBatch batch = first_examples(kind, 16);
    Model model(module_of(kind), SummedCrossEntropy{});
    model.forward_backward(batch);
    const std::vector<float> expected(model.gradients().begin(), model.gradients().end());
    std::vector<float> seen(expected.size(), -1.0f);
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    const auto gradients = model.gradients();
    auto on_ready = [&](std::size_t begin, std::size_t end) {
      ranges.emplace_back(begin, end);
      std::copy(gradients.begin() + static_cast<std::ptrdiff_t>(begin),
                gradients.begin() + static_cast<std::ptrdiff_t>(end),
                seen.begin() + static_cast<std::ptrdiff_t>(begin));
    };
    model.forward_backward(batch, cohort::GradientReady(on_ready));
    CHECK(seen == expected);  // what was reported was final
    std::sort(ranges.begin(), ranges.end());
    REQUIRE(ranges.size() == model.module()->parameters().size());
    CHECK(ranges.front().first == 0);
    CHECK(ranges.back().second == expected.size());
    for (std::size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i].first == ranges[i - 1].second);
  }
}

TEST_CASE("a gradient set to none is put back into the buffer") {
  Model model(mlp(), SummedCrossEntropy{});
  const TorchBatch batch = first_examples(Kind::kMlp, 8);
  model.forward_backward(batch);
  const std::vector<float> first(model.gradients().begin(), model.gradients().end());
  model.module()->zero_grad(/*set_to_none=*/true);
  model.forward_backward(batch);
  check_views(model);
  CHECK(std::vector<float>(model.gradients().begin(), model.gradients().end()) == first);
}

TEST_CASE("a parameter that does not require grad is a constant, kept by every replica") {
  torch::nn::Sequential net = mlp();
  torch::Tensor frozen = net[0]->as<torch::nn::Linear>()->weight;
  frozen.set_requires_grad(false);
  const torch::Tensor initial = frozen.clone();
  const Model model(net, SummedCrossEntropy{});
  CHECK(model.parameters().size() == 16 + 16 * 4 + 4);  // the first layer's bias, the second layer

  auto trainer = trainer_of(model, cohort::strategy::Mirrored<>({.replicas = 2}));
  trainer.fit(data_for(Kind::kMlp), {.steps = 5});
  torch::nn::Sequential trained(trainer.model().module());
  const torch::Tensor& kept = trained[0]->as<torch::nn::Linear>()->weight;
  CHECK_FALSE(kept.requires_grad());
  CHECK(torch::equal(kept, initial));
  CHECK_FALSE(torch::equal(trained[0]->as<torch::nn::Linear>()->bias,
                           net[0]->as<torch::nn::Linear>()->bias));
}

TEST_CASE("a copy is an independent replica with its own buffers") {
  const Model model(mlp(), SummedCrossEntropy{});
  Model copy = model;
  CHECK(copy.parameters().data() != model.parameters().data());
  CHECK(bytes_of(copy.parameters()) == bytes_of(model.parameters()));
  copy.parameters()[0] += 1.0f;
  CHECK(copy.parameters()[0] != model.parameters()[0]);
  check_views(copy);
  Model moved = std::move(copy);
  check_views(moved);
}

TEST_CASE("intra_op_threads sets LibTorch's and OpenBLAS's thread counts") {
  using GetThreads = int (*)();
  const auto openblas_threads =
      reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const Model two(mlp(), SummedCrossEntropy{}, {.intra_op_threads = 2});
  CHECK(torch::get_num_threads() == 2);
  if (openblas_threads != nullptr) CHECK(openblas_threads() == 2);
  const Model one(mlp(), SummedCrossEntropy{});  // the default
  CHECK(torch::get_num_threads() == 1);
  if (openblas_threads != nullptr) CHECK(openblas_threads() == 1);
  const Model untouched(mlp(), SummedCrossEntropy{}, {.intra_op_threads = 0});
  CHECK(torch::get_num_threads() == 1);
}

// A module whose reset() registers its parameters in another order than its constructor.
struct ReorderedImpl : torch::nn::Cloneable<ReorderedImpl> {
  ReorderedImpl() {
    register_parameter("a", torch::ones({2}));
    register_parameter("b", torch::ones({3}));
  }
  void reset() override {
    register_parameter("b", torch::ones({3}));
    register_parameter("a", torch::ones({2}));
  }
  torch::Tensor forward(const torch::Tensor& inputs) {
    return inputs * named_parameters()["a"].sum() + named_parameters()["b"].sum();
  }
};

TEST_CASE("a module the adapter cannot train is refused, naming the parameter or buffer") {
  SUBCASE("double parameters") {
    torch::nn::Sequential net = mlp();
    net->to(torch::kDouble);
    const auto error = refusal([&] { Model(net, SummedCrossEntropy{}); });
    REQUIRE(error);
    CHECK(error->reason == Reason::kNotFloat);
    CHECK(error->tensor == "0.weight");
    CHECK(contains(error->what(), "parameter '0.weight' is Double"));
    CHECK(contains(error->what(), "float32 parameters only"));
  }
  SUBCASE("parameters off the host") {
    torch::nn::Sequential net = mlp();
    net->register_parameter("offset", torch::zeros({4}, torch::Device(torch::kMeta)));
    const auto error = refusal([&] { Model(net, SummedCrossEntropy{}); });
    REQUIRE(error);
    CHECK(error->reason == Reason::kNotOnHost);
    CHECK(error->tensor == "offset");
    CHECK(contains(error->what(), "parameter 'offset' is Float on meta"));
  }
  SUBCASE("batch norm's running statistics") {
    torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                              torch::nn::Linear(16, 4));
    const auto error = refusal([&] { Model(net, SummedCrossEntropy{}); });
    REQUIRE(error);
    CHECK(error->reason == Reason::kBuffer);
    CHECK(error->tensor == "1.running_mean");
    CHECK(contains(error->what(), "track_running_stats(false)"));
    // Without running statistics, batch norm has no buffer and is taken.
    torch::nn::Sequential stateless(
        torch::nn::Linear(8, 16),
        torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(16).track_running_stats(false)),
        torch::nn::Linear(16, 4));
    CHECK_FALSE(refusal([&] { Model(stateless, SummedCrossEntropy{}); }));
  }
  SUBCASE("tied weights") {
    const torch::nn::Linear shared(8, 8);
    torch::nn::Sequential net(shared, torch::nn::ReLU(), shared);
    const auto error = refusal([&] { Model(net, SummedCrossEntropy{}); });
    REQUIRE(error);
    CHECK(error->reason == Reason::kTied);
    CHECK(error->tensor == "2.weight");
    CHECK(contains(error->what(), "'2.weight' is parameter '0.weight'"));
  }
  SUBCASE("nothing to train") {
    torch::nn::Sequential net = mlp();
    for (auto& parameter : net->parameters()) parameter.set_requires_grad(false);
    const auto error = refusal([&] { Model(net, SummedCrossEntropy{}); });
    REQUIRE(error);
    CHECK(error->reason == Reason::kNoParameters);
    CHECK(error->tensor.empty());
  }
  SUBCASE("a clone laid out differently") {
    const TorchModel model(
        std::make_shared<ReorderedImpl>(),
        [](const torch::Tensor& outputs, const torch::Tensor&) { return outputs.sum(); });
    const auto error = refusal([&] { auto copy = model; });
    REQUIRE(error);
    CHECK(error->reason == Reason::kCloneDiffers);
    CHECK(error->tensor == "a");
    CHECK(contains(error->what(), "reset() must register the parameters the constructor does"));
  }
}

TEST_CASE("a module changed after adaptation is refused at the next step, naming the change") {
  const TorchBatch batch = first_examples(Kind::kMlp, 8);
  Model model(mlp(), SummedCrossEntropy{});
  torch::nn::Sequential net(model.module());
  const auto step = [&] { model.forward_backward(batch); };
  const auto expect = [&](Reason reason, const std::string& tensor, const std::string& what) {
    const auto error = refusal(step);
    REQUIRE(error);
    CHECK(error->reason == reason);
    CHECK(error->tensor == tensor);
    CHECK(contains(error->what(), what));
  };
  SUBCASE("a submodule replaced") {
    net->replace_module("2", torch::nn::Linear(16, 4));
    expect(Reason::kChanged, "2.weight", "'2.weight' was removed, replaced");
  }
  SUBCASE("a parameter registered") {
    net[2]->register_parameter("scale", torch::ones({4}));
    expect(Reason::kChanged, "2.scale", "'2.scale' was added");
  }
  SUBCASE("a parameter frozen") {
    net[2]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
    expect(Reason::kChanged, "2.bias", "'2.bias' was removed, replaced or made not to require");
  }
  SUBCASE("a parameter's storage replaced") {
    torch::NoGradGuard no_grad;
    net[0]->as<torch::nn::Linear>()->weight.set_data(torch::zeros({16, 8}));
    expect(Reason::kChanged, "0.weight", "given other storage");
  }
  SUBCASE("a buffer registered") {
    net[0]->register_buffer("count", torch::zeros({1}));
    expect(Reason::kBuffer, "0.count", "has buffer '0.count'");
  }
}

TEST_CASE("a loss that is not a summed scalar of the parameters is refused") {
  const TorchBatch batch = first_examples(Kind::kMlp, 8);
  const auto per_example = [](const torch::Tensor& outputs, const torch::Tensor& labels) {
    return torch::nn::functional::cross_entropy(
        outputs, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  };
  TorchModel unreduced(mlp(), per_example);
  auto error = refusal([&] { unreduced.forward_backward(batch); });
  REQUIRE(error);
  CHECK(error->reason == Reason::kLoss);
  CHECK(contains(error->what(), "shape [8]"));

  TorchModel constant(mlp(),
                      [](const torch::Tensor&, const torch::Tensor&) { return torch::zeros({}); });
  error = refusal([&] { constant.forward_backward(batch); });
  REQUIRE(error);
  CHECK(error->reason == Reason::kLoss);
  CHECK(contains(error->what(), "does not depend on any trainable parameter"));
}

TEST_CASE("TorchDataset selects the examples in order and refuses unequal sizes") {
  const TorchDataset data(torch::arange(12, torch::kFloat).reshape({6, 2}),
                          torch::arange(6, torch::kLong));
  CHECK(data.size() == 6);
  const std::vector<std::size_t> indices{4, 1};
  const TorchBatch batch = data.batch(indices);
  CHECK(torch::equal(batch.inputs, torch::tensor({8.0f, 9.0f, 2.0f, 3.0f}).reshape({2, 2})));
  CHECK(torch::equal(batch.targets, torch::tensor({4, 1}, torch::kLong)));
  const std::string message = cohort::testing::config_error_message([] {
    TorchDataset(torch::zeros({6, 2}), torch::zeros({5}));
  });
  CHECK(contains(message, "targets.size(0) = 5: must equal inputs.size(0) (6)"));
}

#if defined(COHORT_RUN)
TEST_CASE(
    "2 processes of MultiWorkerMirrored or ParameterServer<Sync> give Mirrored's bits, with "
    "dropout") {
  cohort::testing::TemporaryDirectory directory("cohort-adapters-processes");
  const std::string expected =
      train(Kind::kDropoutMlp, cohort::strategy::Mirrored<>({.replicas = 1}), 30);
  for (const std::string strategy : {"multi_worker", "parameter_server"}) {
    CAPTURE(strategy);
    const auto out = directory.path / (strategy + ".bin");
    std::vector<std::string> command{COHORT_RUN, "--np", "2"};
    if (strategy == "parameter_server") command.insert(command.end(), {"--ps", "1"});
    command.insert(command.end(),
                   {"--", COHORT_ADAPTERS_TEST, std::string(kWorkerFlag), strategy, out.string()});
    cohort::testing::output_of_success(command, directory.path / "log");
    CHECK(cohort::testing::read_file(out) == expected);
  }
}
#endif

int main(int argc, char** argv) {
  if (argc == 4 && argv[1] == kWorkerFlag) {
    try {
      return train_worker(argv[2], argv[3]);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "error: %s\n", error.what());
      return 1;
    }
  }
  return doctest::Context(argc, argv).run();
}
