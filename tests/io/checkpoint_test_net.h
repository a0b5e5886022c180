#pragma once
// The small model the checkpoint tests save and load: two linear layers, one optimizer step on a
// fixed batch, a copy of named tensors' values for before/after comparisons, a folder's sorted names,
// and the pieces a rank of a sharded run would hold.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd/ops.h"
#include "framework/nn/linear.h"
#include "framework/optim/optimizer.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf::testing {

class Net : public nn::Module {
 public:
  explicit Net(int64_t hidden = 4, uint64_t seed = 1) {
    Generator gen(seed);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{3, hidden}, &gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{hidden, 2}, &gen));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(tanh(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// One optimizer step on a fixed batch.
inline void train_step(const Net& net, optim::Optimizer& opt) {
  const Tensor x = random_tensor({5, 3}, DType::f32, 42);
  backward(mean(square(net.forward(x))));
  opt.step();
  opt.zero_grad();
}

// The names in a folder (checkpoints, temporaries), sorted.
inline std::vector<std::string> sorted_names(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<std::vector<float>> snapshot(const optim::NamedTensors& tensors) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, t] : tensors) out.push_back(t.to_vector<float>());
  return out;
}

// Rank r's pieces of `tensors` over `world` ranks: each tensor's flattened elements cut into `world`
// contiguous ranges (the last ones may be empty and are left out), shifted by `overlap` elements into the
// previous rank's range (0: an exact tiling).
inline optim::NamedTensors pieces_of(const optim::NamedTensors& tensors, int64_t rank, int64_t world,
                                     int64_t overlap = 0) {
  optim::NamedTensors out;
  for (const auto& [name, t] : tensors) {
    const int64_t n = t.numel(), per = (n + world - 1) / world;
    const int64_t begin = std::max<int64_t>(0, std::min(n, rank * per) - (rank > 0 ? overlap : 0));
    const int64_t end = std::min(n, (rank + 1) * per);
    if (begin >= end) continue;
    const Tensor flat = raw::view(raw::contiguous(t), {n});
    out.emplace_back(name + "[" + std::to_string(begin) + ":" + std::to_string(end) + "]",
                     raw::clone(raw::narrow(flat, 0, begin, end - begin)));
  }
  return out;
}

}  // namespace cpf::testing
