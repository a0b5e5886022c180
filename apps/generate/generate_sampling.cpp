#include "apps/generate/generate_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "framework/core/error.h"
#include "framework/tensor/random.h"

namespace cpf::trainer {
namespace {

int64_t argmax(const std::vector<double>& logits) {
  return std::max_element(logits.begin(), logits.end()) - logits.begin();  // first of equal maxima
}

}  // namespace

void check_sampling_options(const SamplingOptions& o) {
  CPF_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "generate: --temperature ", o.temperature,
            " must be >= 0 (0 = greedy)");
  CPF_CHECK(o.top_k >= 0, "generate: --top-k ", o.top_k, " must be >= 0 (0 = keep every token)");
  CPF_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, "generate: --top-p ", o.top_p,
            " must be in (0, 1] (1 = keep every token)");
  CPF_CHECK(o.temperature > 0 || (o.top_k == 0 && o.top_p == 1), "generate: --top-k ", o.top_k, " / --top-p ", o.top_p,
            " filter sampling, but --temperature 0 is greedy decoding (always the most likely token); ",
            "set --temperature > 0 (e.g. 0.8) to sample");
}

std::vector<double> sampling_distribution(const std::vector<double>& logits, const SamplingOptions& o) {
  CPF_CHECK(!logits.empty(), "generate: no logits to sample from");
  std::vector<double> p(logits.size(), 0.0);
  if (o.temperature <= 0) {
    p[static_cast<size_t>(argmax(logits))] = 1.0;
    return p;
  }
  const double top = logits[static_cast<size_t>(argmax(logits))];
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp((logits[i] - top) / o.temperature);
  if (o.top_k == 0 && o.top_p == 1) {  // no filter: nothing to order
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& v : p) v /= total;
    return p;
  }
  // Token ids by decreasing probability, lower id first among equals (a total order, so a partial sort
  // gives exactly the first places of the full one).
  std::vector<int64_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  size_t keep = order.size();
  if (o.top_k > 0) keep = std::min(keep, static_cast<size_t>(o.top_k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), before);
  if (o.top_p < 1) {
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += p[order[i]];
    double mass = 0;
    size_t nucleus = 0;
    while (nucleus < keep) {
      mass += p[order[nucleus++]];
      if (mass >= o.top_p * total) break;
    }
    keep = nucleus;
  }
  for (size_t i = keep; i < order.size(); ++i) p[order[i]] = 0.0;
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= total;
  return p;
}

int64_t sample_token(const std::vector<double>& logits, const SamplingOptions& o, Generator& gen) {
  if (o.temperature <= 0) return argmax(logits);
  const std::vector<double> p = sampling_distribution(logits, o);
  double u = uniform({1}, 0.0, 1.0, {.dtype = DType::f64}, &gen).item<double>();
  int64_t last_kept = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last_kept = static_cast<int64_t>(i);
    u -= p[i];
    if (u < 0) return last_kept;
  }
  return last_kept;  // rounding left u a hair above the total: the last kept token
}

}  // namespace cpf::trainer
