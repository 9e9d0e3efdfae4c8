// A LibTorch module trained by cohort: an MLP or a small CNN, on generated 28 x 28 images, under
// Mirrored (one process), MultiWorkerMirrored or ParameterServer<Sync> (processes started by a
// launcher, for example cohort-run). The module is ordinary LibTorch; cohort::adapters::TorchModel
// (include/cohort/adapters/torch.hpp) pairs it with its loss and makes it a cohort model. The final
// parameters are the same bits for every replica count and strategy, given the same --batch and
// --micro-batches.
//
// Each run prints one line,
//   <label>: N examples/s, held-out accuracy A%, parameters HEX
// (HEX: FNV-1a of the parameters' bytes), which the benchmark scripts read.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cohort/strategy/parameter_server.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "demo.hpp"  // example::fingerprint

namespace {

struct Settings {
  std::string model = "mlp";
  std::vector<std::int64_t> layers{784, 1024, 1024, 10};
  std::string strategy = "mirrored";
  std::vector<std::size_t> replicas{1, 2, 4};
  std::size_t local_replicas = 1;
  std::size_t batch = 256;
  std::size_t micro_batches = 8;
  std::int64_t examples = 20'000;
  std::uint64_t epochs = 2;
  std::uint64_t steps = 0;
  double learning_rate = 1e-3;
  std::uint64_t seed = 1;
  int intra_op_threads = 1;
  bool quiet = false;

  std::int64_t side() const { return static_cast<std::int64_t>(std::lround(std::sqrt(layers[0]))); }
  std::int64_t classes() const { return layers.back(); }
};

// --- The user's LibTorch code: the task, the modules and the loss ------------------------------

// side x side grey images of `classes` classes. Each class is three blurred dots at places the
// seed chooses; an example is its class's dots moved together by up to 3 pixels each way, each dot
// a little larger or smaller, plus pixel noise. So a class is no single point in pixel space, and
// neighbouring pixels go together (what a convolution exploits). `stream` draws another sample of
// the same task (the held-out set).
cohort::adapters::TorchDataset images(const Settings& settings, std::int64_t examples,
                                      std::uint64_t stream) {
  constexpr std::int64_t kDots = 3;
  const std::int64_t side = settings.side();
  torch::Generator task = at::detail::createCPUGenerator(settings.seed);
  const auto margin = static_cast<double>(side) * 0.2;
  const torch::Tensor dot_x =
      torch::rand({settings.classes(), kDots}, task) * (side - 2 * margin) + margin;
  const torch::Tensor dot_y =
      torch::rand({settings.classes(), kDots}, task) * (side - 2 * margin) + margin;
  const torch::Tensor dot_width = torch::rand({settings.classes(), kDots}, task) * 1.5 + 1.5;

  torch::Generator sample = at::detail::createCPUGenerator(settings.seed * 1000 + stream + 1);
  const torch::Tensor labels = torch::randint(settings.classes(), {examples}, sample);
  const torch::Tensor shift_x = torch::randint(-3, 4, {examples, 1}, sample).to(torch::kFloat);
  const torch::Tensor shift_y = torch::randint(-3, 4, {examples, 1}, sample).to(torch::kFloat);
  const auto of_each = [&](const torch::Tensor& per_class) {
    return per_class.index_select(0, labels);
  };
  const torch::Tensor width =
      of_each(dot_width) * (1.0 + 0.2 * torch::randn({examples, kDots}, sample));
  // A dot is a separable Gaussian: the image is the sum over dots of (column profile) x (row
  // profile), one batched matrix product.
  const torch::Tensor grid = torch::arange(side, torch::kFloat).view({1, 1, side});
  const auto profile = [&](const torch::Tensor& centre) {
    const torch::Tensor distance = grid - centre.unsqueeze(2);
    return torch::exp(-distance * distance / (2 * width * width).unsqueeze(2));
  };
  const torch::Tensor rows = profile(of_each(dot_y) + shift_y);        // n x dots x side
  const torch::Tensor columns = profile(of_each(dot_x) + shift_x);     // n x dots x side
  torch::Tensor pictures = torch::bmm(rows.transpose(1, 2), columns);  // n x side x side
  pictures += 0.3 * torch::randn(pictures.sizes(), sample);
  const torch::Tensor inputs = settings.model == "cnn" ? pictures.view({examples, 1, side, side})
                                                       : pictures.view({examples, side * side});
  return cohort::adapters::TorchDataset(inputs.contiguous(), labels);
}

// Linear layers of the sizes in `layers`, ReLU between them.
torch::nn::Sequential mlp(const std::vector<std::int64_t>& layers) {
  torch::nn::Sequential net;
  for (std::size_t layer = 0; layer + 1 < layers.size(); ++layer) {
    if (layer > 0) net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(layers[layer], layers[layer + 1]));
  }
  return net;
}

// Two 5 x 5 convolutions (16 and 32 channels), each followed by ReLU and 2 x 2 max pooling, then a
// linear layer to the classes.
torch::nn::Sequential cnn(std::int64_t side, std::int64_t classes) {
  using namespace torch::nn;
  const std::int64_t pooled = side / 4;
  return Sequential(Conv2d(Conv2dOptions(1, 16, 5).padding(2)), ReLU(), MaxPool2d(2),
                    Conv2d(Conv2dOptions(16, 32, 5).padding(2)), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(32 * pooled * pooled, classes));
}

torch::nn::Sequential module_of(const Settings& settings) {
  torch::manual_seed(settings.seed);  // the initialization
  return settings.model == "cnn" ? cnn(settings.side(), settings.classes()) : mlp(settings.layers);
}

// cohort wants the loss summed over the batch, not averaged.
struct SummedCrossEntropy {
  torch::Tensor operator()(const torch::Tensor& outputs, const torch::Tensor& labels) const {
    return torch::nn::functional::cross_entropy(
        outputs, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
};

using Model = cohort::adapters::TorchModel<torch::nn::SequentialImpl, SummedCrossEntropy>;

// --- Training with cohort -----------------------------------------------------------------------

struct Data {
  cohort::adapters::TorchDataset train;
  cohort::adapters::TorchDataset held_out;
};

struct Outcome {
  double examples_per_second = 0.0;
  double accuracy = 0.0;
  std::uint64_t fingerprint = 0;
  std::vector<float> parameters;
};

double accuracy(const Model& trained, const cohort::adapters::TorchDataset& data) {
  Model evaluated = trained;  // a replica of its own: eval() must not reach a training replica
  evaluated.module()->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor predictions = evaluated.module()->forward(data.inputs()).argmax(1);
  return predictions.eq(data.targets()).to(torch::kDouble).mean().item<double>();
}

// Trains a fresh module with `strategy`; the outcome on the chief, nothing elsewhere.
template <class Strategy>
std::optional<Outcome> train(const Settings& settings, Strategy strategy, const Data& data) {
  const bool chief = strategy.is_chief();
  bool serves = false;
  if constexpr (requires { strategy.serves(); }) serves = strategy.serves();

  cohort::Trainer trainer(
      Model(module_of(settings), SummedCrossEntropy{},
            {.intra_op_threads = settings.intra_op_threads}),
      std::move(strategy), cohort::optimizer::Adam({.learning_rate = settings.learning_rate}),
      {.global_batch = settings.batch,
       .micro_batches = settings.micro_batches,
       .seed = settings.seed,
       .log_every = 50,
       .progress = settings.quiet || !chief ? cohort::Progress::kSilent : cohort::Progress::kAuto});
  const cohort::Report report =
      trainer.fit(data.train, {.epochs = settings.epochs, .steps = settings.steps});
  if (!chief || serves) return std::nullopt;
  const std::span<const float> parameters = trainer.model().parameters();
  return Outcome{.examples_per_second = report.examples_per_second,
                 .accuracy = accuracy(trainer.model(), data.held_out),
                 .fingerprint = example::fingerprint(parameters),
                 .parameters = {parameters.begin(), parameters.end()}};
}

// The peer of a 1-replica run: the same module, batch and data trained by LibTorch alone, in one
// loop with torch::optim::Adam (its own order of operations, so other bits).
Outcome train_without_cohort(const Settings& settings, const Data& data) {
  cohort::adapters::set_intra_op_threads(settings.intra_op_threads);
  torch::nn::Sequential module = module_of(settings);
  torch::optim::Adam adam(module->parameters(), torch::optim::AdamOptions(settings.learning_rate));
  const auto batch = static_cast<std::int64_t>(settings.batch);
  const std::int64_t steps_per_epoch = static_cast<std::int64_t>(data.train.size()) / batch;
  std::int64_t steps = static_cast<std::int64_t>(settings.epochs) * steps_per_epoch;
  if (settings.steps != 0) steps = std::min(steps, static_cast<std::int64_t>(settings.steps));
  torch::Generator shuffle = at::detail::createCPUGenerator(settings.seed);
  torch::Tensor order;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < steps; ++step) {
    if (step % steps_per_epoch == 0) order = torch::randperm(data.train.size(), shuffle);
    const torch::Tensor rows = order.narrow(0, (step % steps_per_epoch) * batch, batch);
    adam.zero_grad();
    const torch::Tensor loss =
        SummedCrossEntropy{}(module->forward(data.train.inputs().index_select(0, rows)),
                             data.train.targets().index_select(0, rows)) /
        static_cast<double>(batch);
    loss.backward();
    adam.step();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Adapted once trained, only to be read as the other runs are: its parameters in one buffer.
  const Model trained(module, SummedCrossEntropy{}, {.intra_op_threads = 0});
  const std::span<const float> parameters = trained.parameters();
  return Outcome{.examples_per_second = static_cast<double>(steps * batch) / seconds,
                 .accuracy = accuracy(trained, data.held_out),
                 .fingerprint = example::fingerprint(parameters),
                 .parameters = {parameters.begin(), parameters.end()}};
}

std::string model_label(const Settings& settings) {
  if (settings.model == "cnn") {
    return "libtorch cnn " + std::to_string(settings.side()) + "x" +
           std::to_string(settings.side()) + "-c16-c32-" + std::to_string(settings.classes());
  }
  std::string label = "libtorch mlp ";
  for (std::size_t i = 0; i < settings.layers.size(); ++i) {
    label += (i == 0 ? "" : "-") + std::to_string(settings.layers[i]);
  }
  return label;
}

void print(const std::string& label, const Outcome& outcome) {
  std::printf("%s: %.0f examples/s, held-out accuracy %.2f%%, parameters %llx\n", label.c_str(),
              outcome.examples_per_second, 100.0 * outcome.accuracy,
              static_cast<unsigned long long>(outcome.fingerprint));
  std::fflush(stdout);
}

template <class Strategy>
void train_in_processes(const Settings& settings, Strategy strategy, const Data& data,
                        const std::string& what) {
  const std::size_t workers = strategy.replicas() / settings.local_replicas;
  std::string label = model_label(settings) + ", " + what + " " + std::to_string(workers) +
                      " worker(s) x " + std::to_string(settings.local_replicas) + " replica(s)";
  if constexpr (requires { strategy.servers(); }) {
    label += ", " + std::to_string(strategy.servers()) + " server(s)";
  }
  if (const auto outcome = train(settings, std::move(strategy), data)) print(label, *outcome);
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  CLI::App app{
      "A LibTorch MLP or CNN trained by cohort (Mirrored, MultiWorkerMirrored or "
      "ParameterServer<Sync>)"};
  app.add_option("--model", settings.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--layers", settings.layers,
                 "MLP layer sizes, inputs first (a square: the images are its square root on a "
                 "side) and classes last; the CNN takes the image side and classes from them")
      ->delimiter(',')
      ->expected(2, 64);
  app.add_option("--strategy", settings.strategy,
                 "mirrored (one process), multi_worker or parameter_server (Sync; processes "
                 "started by a launcher, e.g. cohort-run), or libtorch: the peer, the same "
                 "training by LibTorch alone, without cohort")
      ->check(CLI::IsMember({"mirrored", "multi_worker", "parameter_server", "libtorch"}));
  app.add_option("--replicas", settings.replicas,
                 "Mirrored: replica counts to train with, in turn (e.g. 1,2,4)")
      ->delimiter(',')
      ->expected(1, 16);
  app.add_option("--local-replicas", settings.local_replicas,
                 "multi_worker, parameter_server: replica threads in each worker process");
  app.add_option("--batch", settings.batch, "global batch size (over all replicas)");
  app.add_option("--micro-batches", settings.micro_batches, "micro-batches per global batch");
  app.add_option("--examples", settings.examples, "training examples (held out: 5000)");
  app.add_option("--epochs", settings.epochs, "epochs to train");
  app.add_option("--steps", settings.steps, "steps to train (stops at whichever comes first)");
  app.add_option("--learning-rate", settings.learning_rate, "Adam's learning rate");
  app.add_option("--seed", settings.seed, "seed of the task, the initialization and the order");
  app.add_option("--intra-op-threads", settings.intra_op_threads,
                 "threads of each LibTorch and OpenBLAS operation, process-wide (TorchModel's "
                 "intra_op_threads)");
  app.add_flag("--quiet", settings.quiet, "no progress lines");
  CLI11_PARSE(app, argc, argv);
  if (settings.side() * settings.side() != settings.layers[0]) {
    std::fprintf(stderr, "error: --layers: the first size, %lld, must be a square (images)\n",
                 static_cast<long long>(settings.layers[0]));
    return 2;
  }

  try {
    const Data data{images(settings, settings.examples, 0), images(settings, 5'000, 1)};
    if (settings.strategy == "multi_worker") {
      train_in_processes(
          settings,
          cohort::strategy::MultiWorkerMirrored<>({.local_replicas = settings.local_replicas}),
          data, "multi_worker");
      return 0;
    }
    if (settings.strategy == "libtorch") {
      print(model_label(settings) + ", LibTorch alone (torch::optim::Adam)",
            train_without_cohort(settings, data));
      return 0;
    }
    if (settings.strategy == "parameter_server") {
      train_in_processes(settings,
                         cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync>(
                             {.local_replicas = settings.local_replicas}),
                         data, "parameter_server sync");
      return 0;
    }
    std::vector<Outcome> outcomes;
    for (std::size_t replicas : settings.replicas) {
      const auto outcome =
          train(settings, cohort::strategy::Mirrored<>({.replicas = replicas}), data);
      print(model_label(settings) + ", mirrored " + std::to_string(replicas) + " replica(s)",
            *outcome);
      outcomes.push_back(*outcome);
    }
    if (outcomes.size() > 1) {
      bool identical = true;
      for (const Outcome& outcome : outcomes) {
        identical =
            identical && std::ranges::equal(std::as_bytes(std::span(outcome.parameters)),
                                            std::as_bytes(std::span(outcomes[0].parameters)));
      }
      std::printf("parameters bit-identical across replica counts: %s\n", identical ? "yes" : "NO");
      return identical ? 0 : 1;
    }
    return 0;
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
