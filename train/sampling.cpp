// Temperature / top-k sampling (see sampling.hpp).
#include "stableflash/train/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "stableflash/numerics/random.hpp"

namespace stableflash::train {

std::vector<int> generate(model::Gpt2<float>& model, std::vector<int> tokens, const SampleOptions& o) {
  if (tokens.empty()) throw std::invalid_argument("sample: the prompt needs at least one token");
  if (o.temperature < 0 || !std::isfinite(o.temperature)) throw std::invalid_argument("sample: --temperature must be >= 0");
  if (o.top_k < 0) throw std::invalid_argument("sample: --top-k must be >= 0");
  const int V = model.config().vocab_size, Vp = model.config().padded_vocab_size, ctx = model.config().block_size;
  SplitMix64 rng(o.seed);
  std::vector<int> order(static_cast<std::size_t>(V), 0);
  std::vector<double> prob(static_cast<std::size_t>(V));
  for (int n = 0; n < o.max_new_tokens; ++n) {
    const int len = std::min<int>(ctx, int(tokens.size()));
    const std::vector<int> window(tokens.end() - len, tokens.end());
    model.forward(window, {}, 1, len);
    const float* logits = model.logits().data() + std::size_t(len - 1) * Vp;  // the last position
    std::iota(order.begin(), order.end(), 0);
    if (o.temperature == 0) {
      tokens.push_back(int(std::max_element(logits, logits + V) - logits));
      continue;
    }
    const int k = o.top_k == 0 ? V : std::min(o.top_k, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const double max = logits[order[0]];
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += (prob[i] = std::exp((logits[order[i]] - max) / o.temperature));
    double r = rng.uniform() * sum;
    int pick = order[k - 1];
    for (int i = 0; i < k; ++i) {
      if (r < prob[i]) {
        pick = order[i];
        break;
      }
      r -= prob[i];
    }
    tokens.push_back(pick);
  }
  return tokens;
}

}  // namespace stableflash::train
