// Uses the installed package as a researcher embedding cpformer would: the autograd core (loss = sum(w * w)
// has gradient 2 * w), the distributed library (its private libcrypto), and the model stack above it
// (cpformer::models, which brings attention, nn, optim and io): a small GPT trains a few AdamW steps on a
// fixed sequence, its loss must fall, and its weights survive a safetensors round trip. And the mistake
// the CP API exists to refuse: on two thread ranks, q cut dual-chunk with k and v cut contiguously (the
// same shapes, other tokens) must be refused by context parallel attention, naming the three cuts.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/rendezvous_tcp.h"
#include "framework/io/safetensors.h"
#include "framework/optim/adamw.h"
#include "models/gpt.h"
#include "models/gpt_input.h"

namespace {

bool gradient_of_square() {
  cpf::Tensor w = cpf::from_vector<float>({1.0f, 2.0f, 3.0f}, {3});
  w.set_requires_grad();
  cpf::Tensor loss = cpf::sum(cpf::mul(w, w));
  cpf::backward(loss);
  const std::vector<float> grad = w.grad().to_vector<float>();
  std::cout << "loss = " << loss.item<float>() << "\ndloss/dw = [";
  for (size_t i = 0; i < grad.size(); ++i) std::cout << (i ? ", " : "") << grad[i];
  std::cout << "]\n";
  return grad == std::vector<float>{2.0f, 4.0f, 6.0f};
}

// Next-token prediction of one fixed sequence; returns the loss before and after `steps` updates.
bool trains_a_gpt(int steps) {
  cpf::Generator gen(7);
  cpf::models::GPT model(cpf::models::GPTOptions{.vocab_size = 16, .hidden_size = 32, .num_layers = 2, .num_heads = 4},
                         &gen);
  cpf::optim::AdamW adamw(model.named_parameters(), cpf::optim::AdamWOptions{.lr = 1e-2});
  const std::vector<int64_t> sequence = {1, 5, 9, 13, 2, 6, 10, 14, 3, 7};
  const std::vector<int64_t> inputs(sequence.begin(), sequence.end() - 1);
  const cpf::Tensor labels = cpf::from_vector<int64_t>(std::vector<int64_t>(sequence.begin() + 1, sequence.end()),
                                                       {static_cast<int64_t>(inputs.size())});
  const cpf::models::GPTInput input = cpf::models::make_prompt_input({inputs});
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    const cpf::Tensor loss = cpf::models::GPT::loss(model.forward(input), labels, static_cast<int64_t>(inputs.size()));
    cpf::backward(loss);
    adamw.step();
    adamw.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::cout << "GPT: " << model.num_parameters() << " parameters, loss " << first << " -> " << last << " in " << steps
            << " steps\n";
  const std::string path = "consumer_weights.safetensors";
  cpf::io::save_safetensors(path, model.named_parameters());
  const cpf::io::NamedTensors back = cpf::io::load_safetensors(path);
  std::remove(path.c_str());
  return last < first && back.size() == model.named_parameters().size();
}

// Returns true when the mis-sharded call is refused with the sharding named on both ranks.
bool refuses_mis_sharded_kv() {
  std::atomic<int> refused{0};
  cpf::dist::launch(2, [&](cpf::dist::RankContext& ctx) {
    cpf::dist::DeviceMesh mesh(ctx.world, {.cp = 2, .require_cp = true});
    const cpf::cp::ContextParallel cp{cpf::cp::CommType::p2p, mesh.cp(), nullptr, nullptr};
    const cpf::Tensor global = cpf::zeros({1, 8, 2, 4});  // (B, S, H, D)
    const cpf::cp::ShardedTensor q = cpf::cp::dual_chunk_shard(global, 1, 2, ctx.rank);
    const cpf::cp::ShardedTensor kv = cpf::cp::contiguous_shard(global, 1, 2, ctx.rank);  // same shape
    try {
      cpf::cp::context_parallel_attention(
          q, kv, kv, {.qkv_format = cpf::QkvFormat::bshd, .mask = cpf::MaskType::causal}, std::nullopt, cp);
    } catch (const cpf::Error& e) {
      const std::string message = e.what();
      if (message.find("q, k and v are sharded differently along the sequence") != std::string::npos) ++refused;
      if (ctx.rank == 0) std::cout << "mis-sharded K/V: " << message.substr(0, message.find(';')) << "\n";
    }
  });
  return refused == 2;
}

}  // namespace

int main() {
  const bool autograd_ok = gradient_of_square();
  const std::string token = cpf::dist::generate_rendezvous_token();  // links libcrypto
  std::cout << "rendezvous token: " << token.size() << " hex digits\n";
  const bool model_ok = trains_a_gpt(5);
  std::cout << (model_ok ? "GPT trained" : "GPT did not train") << "\n";
  const bool refused = refuses_mis_sharded_kv();
  std::cout << (refused ? "mis-sharded K/V refused" : "mis-sharded K/V ACCEPTED") << "\n";
  return autograd_ok && token.size() == 32 && model_ok && refused ? 0 : 1;
}
