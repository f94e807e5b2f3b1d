// nanoGPT initialisation: N(0, 0.02) weights and embeddings, N(0, 0.02 / sqrt(2L)) residual
// projections, LayerNorm weights 1, biases 0; reproducible from the seed.
#include <gtest/gtest.h>

#include <cmath>

#include "stableflash/model/gpt2.hpp"

namespace stableflash::model {
namespace {

TEST(Init, StandardDeviationsFollowNanoGpt) {
  Gpt2Config c;
  c.n_layer = 3, c.n_head = 2, c.n_embd = 64, c.block_size = 64, c.vocab_size = 500, c.padded_vocab_size = 512, c.bias = true;
  Gpt2<float> m(c, std::vector<LayerAttention>(3, LayerAttention{AttentionKind::standard, {}}));
  m.init_weights(42);
  for (const auto& t : m.tensors()) {
    const auto p = m.params().subspan(t.offset, t.size);
    if (t.role == ParamRole::vector) {
      const float want = t.name.find("ln_") != std::string::npos && t.name.ends_with(".weight") ? 1.0f : 0.0f;
      for (float x : p) ASSERT_EQ(x, want) << t.name;
      continue;
    }
    double sum = 0, sq = 0;
    for (float x : p) sum += x, sq += double(x) * x;
    const double n = double(p.size()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    const bool residual = t.name.ends_with("c_proj.weight");
    const double want = residual ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02;
    // The sample standard deviation of n normal draws has relative standard error 1/sqrt(2n);
    // the mean has standard error sd/sqrt(n). Five standard errors each.
    EXPECT_NEAR(sd, want, 5 * want / std::sqrt(2 * n)) << t.name;
    EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(n)) << t.name;
  }
  Gpt2<float> again(c, std::vector<LayerAttention>(3, LayerAttention{AttentionKind::standard, {}}));
  again.init_weights(42);
  EXPECT_TRUE(std::equal(m.params().begin(), m.params().end(), again.params().begin()));
  again.init_weights(43);
  EXPECT_FALSE(std::equal(m.params().begin(), m.params().end(), again.params().begin()));
}

}  // namespace
}  // namespace stableflash::model
