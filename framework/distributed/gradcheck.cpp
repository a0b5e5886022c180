#include "framework/distributed/gradcheck.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "framework/autograd/engine.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/gradcheck_tally.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/random.h"

namespace cpf::dist {
namespace {

using gradcheck_detail::contract;  // this rank's sum_k <w_k, out_k>
using gradcheck_detail::GradcheckTally;

double global_sum(ProcessGroup& group, double value) {
  return group.all_reduce(scalar_tensor(value, {.dtype = DType::f64})).item<double>();
}

struct Element {
  size_t input = 0;
  int64_t index = 0;
};

void check_inputs(const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  CPF_CHECK(options.eps > 0, "dist::gradcheck: eps must be positive, got ", options.eps);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    CPF_CHECK(inputs[i].dtype() == DType::f64, "dist::gradcheck: input ", i, " of shape ", inputs[i].shape(), " is ",
              inputs[i].dtype(), "; finite differences need f64 inputs");
    // Elements are perturbed through host pointers below.
    CPF_CHECK(inputs[i].device().is_cpu(), "dist::gradcheck: input ", i, " of shape ", inputs[i].shape(), " is on ",
              inputs[i].device(), "; pass CPU inputs (fn may move them to the device with to(device))");
  }
}

// Analytic: every rank seeds backward with its own random weights at the same time. Returns the
// weights (one per output; undefined for outputs that are not floating).
std::vector<Tensor> seed_backward(const GradcheckFn& fn, const std::vector<Tensor>& inputs, uint64_t rank_seed) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) t.set_grad(Tensor());
  }
  std::vector<Tensor> weights;
  std::vector<Tensor> outputs = fn(inputs);
  Generator weight_gen(rank_seed);
  std::vector<Tensor> roots, seeds;
  for (const Tensor& out : outputs) {
    if (!out.defined() || !is_floating(out.dtype())) {
      weights.emplace_back();
      continue;
    }
    weights.push_back(randn(out.shape(), {.dtype = DType::f64}, &weight_gen));
    if (out.requires_grad()) {
      roots.push_back(out);
      seeds.push_back(raw::to(weights.back(), out.dtype()));
    }
  }
  if (!roots.empty()) backward(roots, seeds);
  return weights;
}

// The elements this rank checks: all of each input, or a random max_elements_per_input of them.
std::vector<Element> elements_to_check(const std::vector<Tensor>& inputs, const GradcheckOptions& options,
                                       uint64_t rank_seed) {
  std::mt19937_64 rng(rank_seed);
  std::vector<Element> mine;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    std::vector<int64_t> all(static_cast<size_t>(inputs[i].numel()));
    std::iota(all.begin(), all.end(), 0);
    if (options.max_elements_per_input > 0 && inputs[i].numel() > options.max_elements_per_input) {
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(static_cast<size_t>(options.max_elements_per_input));
    }
    for (int64_t e : all) mine.push_back({i, e});
  }
  return mine;
}

}  // namespace

GradcheckReport gradcheck(ProcessGroup& group, const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          GradcheckOptions options) {
  check_inputs(inputs, options);
  const uint64_t rank_seed = options.seed + 7919 * static_cast<uint64_t>(group.rank());
  const std::vector<Tensor> weights = seed_backward(fn, inputs, rank_seed);
  // The elements this rank checks, and how many every rank checks (they take turns).
  const std::vector<Element> mine = elements_to_check(inputs, options, rank_seed);
  const std::vector<int64_t> counts =
      group.all_gather(from_vector<int64_t>({static_cast<int64_t>(mine.size())}, {1})).to_vector<int64_t>();

  NoGradGuard no_grad;
  std::vector<Tensor> perturbed(inputs.size());
  std::vector<Tensor> analytic(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    perturbed[i] = raw::clone(inputs[i].detach());
    if (inputs[i].requires_grad()) {
      analytic[i] = inputs[i].grad().defined() ? raw::contiguous(inputs[i].grad()) : zeros_like(inputs[i].detach());
    }
  }
  const auto global_loss = [&] { return global_sum(group, contract(fn(perturbed), weights)); };

  GradcheckTally tally(options);
  for (int owner = 0; owner < group.size(); ++owner) {
    for (int64_t k = 0; k < counts[static_cast<size_t>(owner)]; ++k) {
      const bool is_mine = owner == group.rank();
      double* x = nullptr;
      double original = 0;
      if (is_mine) {
        x = perturbed[mine[static_cast<size_t>(k)].input].data<double>() + mine[static_cast<size_t>(k)].index;
        original = *x;
        *x = original + options.eps;
      }
      const double plus = global_loss();
      if (is_mine) *x = original - options.eps;
      const double minus = global_loss();
      if (!is_mine) continue;
      *x = original;
      const Element& el = mine[static_cast<size_t>(k)];
      tally.add(el.input, el.index, inputs[el.input].shape(), analytic[el.input].data<double>()[el.index],
                (plus - minus) / (2 * options.eps));
    }
  }
  // Every rank gets the same verdict.
  GradcheckReport report = tally.report();
  report.ok = global_sum(group, report.ok ? 0.0 : 1.0) == 0.0;
  return report;
}

}  // namespace cpf::dist
