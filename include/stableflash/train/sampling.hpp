// Text generation from a trained model: temperature and top-k sampling over the real vocabulary
// (the padded rows of the head are never drawn).
#pragma once

#include <cstdint>
#include <vector>

#include "stableflash/model/gpt2.hpp"

namespace stableflash::train {

struct SampleOptions {
  int max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int top_k = 40;            // 0: the whole vocabulary
  std::uint64_t seed = 42;
};

// Returns the prompt followed by the generated ids. The context is the last block_size tokens.
std::vector<int> generate(model::Gpt2<float>& model, std::vector<int> prompt, const SampleOptions& options);

}  // namespace stableflash::train
