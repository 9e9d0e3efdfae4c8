// A module that derives from torch::nn::Module directly cannot be cloned into replicas: TorchModel
// says so in a sentence.
#include <cohort/adapters/torch.hpp>

struct NetImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& inputs) { return inputs; }
};

int main() {
  const auto loss = [](const torch::Tensor& outputs, const torch::Tensor&) {
    return outputs.sum();
  };
  cohort::adapters::TorchModel model(std::make_shared<NetImpl>(), loss);
}
