// CUDA graphs of the CUDA GPT-2's train micro-batches (Gpt2Cuda::set_cuda_graph; ctest label `gpu`,
// skipped without a GPU). A replay must compute the bits of the launches it recorded, with every
// input the host changes between micro-batches (tokens, targets, the rows grouped by token and
// their count) seen anew, and a graph per shape: a micro-batch of another batch size or loss scale
// runs once as launches, is then recorded, and the graphs of the earlier shapes stay valid (also
// after more shapes than the model keeps graphs of).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "stableflash/attention/option_text.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/model/gpt2_cuda.hpp"
#include "stableflash/numerics/random.hpp"
#include "require_gpu.hpp"

namespace stableflash::model {
namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Head dim 64 (the flash kernels) in two layers, a `standard` one (FP32 materialized softmax, its
// own batched products) in the middle.
struct SmallModel {
  Gpt2Config config;
  std::vector<LayerAttention> attention;
  SmallModel() {
    config.n_layer = 3, config.n_head = 2, config.n_embd = 128, config.block_size = 64;
    config.vocab_size = 500, config.padded_vocab_size = 512;
    LayerAttention flash{AttentionKind::flash, attention::recommended_options()};
    attention = {flash, LayerAttention{AttentionKind::standard, {}}, flash};
  }
};

// Two models of SmallModel with the same weights (seed) and zero gradients: one replaying graphs,
// one launching as usual; deterministic, so that the two can agree bit for bit.
struct GraphedAndLaunched {
  Gpt2Cuda graphed, launched;
  std::vector<float> params;
  GraphedAndLaunched(const SmallModel& s, int max_batch, int len, std::uint64_t seed)
      : graphed(s.config, s.attention, max_batch, len, /*deterministic=*/true),
        launched(s.config, s.attention, max_batch, len, /*deterministic=*/true),
        params(std::size_t(graphed.parameter_count())) {
    init_parameters<float>(s.config, graphed.tensors(), seed, params);
    graphed.set_params(params), launched.set_params(params);
    graphed.zero_grad(), launched.zero_grad();
    graphed.set_cuda_graph(true);
  }
};

TEST(Gpt2CudaGraph, ReplaysAreBitwiseTheLaunchesForEveryShapeAndBatch) {
  SF_REQUIRE_GPU();
  constexpr int kMaxBatch = 4, kLen = 64;
  GraphedAndLaunched models(SmallModel{}, kMaxBatch, kLen, 7);
  Gpt2Cuda &graphed = models.graphed, &launched = models.launched;
  const std::vector<float>& params = models.params;

  struct MicroBatch {
    int batch, len;
    float loss_scale;
  };
  // Each shape three times or more (the first runs as launches, the second is recorded); then back
  // to the first shape, and five shapes in all, one more than the model keeps graphs of.
  std::vector<MicroBatch> order;
  for (const MicroBatch mb : {MicroBatch{4, 64, 0.5f}, MicroBatch{2, 64, 0.5f}, MicroBatch{4, 64, 1.0f}, MicroBatch{4, 32, 0.5f},
                              MicroBatch{3, 17, 0.25f}, MicroBatch{4, 64, 0.5f}})
    for (int i = 0; i < 3; ++i) order.push_back(mb);

  SplitMix64 rng(11);
  std::vector<float> g_graphed(params.size()), g_launched(params.size());
  int index = 0;
  for (const MicroBatch& mb : order) {
    SCOPED_TRACE("micro-batch " + std::to_string(index++) + ": B " + std::to_string(mb.batch) + ", T " + std::to_string(mb.len) +
                 ", loss scale " + std::to_string(mb.loss_scale));
    // Fresh tokens every time, from a small vocabulary (many repeats: the embedding backward's
    // groups change in number and size between batches).
    const std::size_t n = std::size_t(mb.batch) * mb.len;
    std::vector<int> tokens(n), targets(n);
    const std::uint64_t vocab = 20 + rng.next() % 400;
    for (int& t : tokens) t = int(rng.next() % vocab);
    for (int& t : targets) t = int(rng.next() % vocab);
    graphed.train_micro_batch(tokens, targets, mb.batch, mb.len, mb.loss_scale);
    launched.train_micro_batch(tokens, targets, mb.batch, mb.len, mb.loss_scale);
    const double loss_graphed = graphed.take_loss_sum(), loss_launched = launched.take_loss_sum();
    EXPECT_EQ(loss_graphed, loss_launched);
    graphed.get_grads(g_graphed), launched.get_grads(g_launched);
    ASSERT_TRUE(bitwise_equal(g_graphed, g_launched)) << "accumulated gradients differ";
  }
  const Gpt2Cuda::GraphUse use = graphed.graph_use();
  EXPECT_TRUE(use.on) << use.failure;
  EXPECT_TRUE(use.failure.empty()) << use.failure;
  // Shapes 1-5 are each run once and recorded once; the sixth group is the first shape again,
  // whose graph was dropped with the others when the fifth shape came (at most four are kept), but
  // whose first uses are done: recorded at once, no launches.
  EXPECT_EQ(use.eager, 5);
  EXPECT_EQ(use.captures, 6);
  EXPECT_EQ(use.replays, std::int64_t(order.size()) - 5);
  EXPECT_EQ(launched.graph_use().replays, 0);
}

// A micro-batch with a probe capture requested runs as launches (host copies, a synchronous
// counting forward), between replays, and leaves the replays' bits alone.
TEST(Gpt2CudaGraph, ProbeCapturesRunAsLaunchesBetweenReplays) {
  SF_REQUIRE_GPU();
  constexpr int kBatch = 2, kLen = 64;
  GraphedAndLaunched models(SmallModel{}, kBatch, kLen, 8);
  Gpt2Cuda &graphed = models.graphed, &launched = models.launched;
  const std::vector<float>& params = models.params;
  SplitMix64 rng(12);
  std::vector<float> g_graphed(params.size()), g_launched(params.size());
  for (int i = 0; i < 6; ++i) {
    std::vector<int> tokens(std::size_t(kBatch) * kLen), targets(tokens.size());
    for (int& t : tokens) t = int(rng.next() % 500);
    for (int& t : targets) t = int(rng.next() % 500);
    if (i == 3) {
      CaptureRequest r;
      r.layers = {0, 2};
      r.count_ties = true;
      graphed.request_capture(r), launched.request_capture(r);
    }
    graphed.train_micro_batch(tokens, targets, kBatch, kLen, 1.0f);
    launched.train_micro_batch(tokens, targets, kBatch, kLen, 1.0f);
    if (i == 3) {
      const Capture a = graphed.take_capture(), b = launched.take_capture();
      ASSERT_EQ(a.layers.size(), 2u);
      ASSERT_EQ(b.layers.size(), 2u);
      const auto& x = a.layers[1].o;
      const auto& y = b.layers[1].o;
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0]))) << "the captured output differs";
    }
    EXPECT_EQ(graphed.take_loss_sum(), launched.take_loss_sum()) << "micro-batch " << i;
    graphed.get_grads(g_graphed), launched.get_grads(g_launched);
    ASSERT_TRUE(bitwise_equal(g_graphed, g_launched)) << "micro-batch " << i;
  }
  const Gpt2Cuda::GraphUse use = graphed.graph_use();
  EXPECT_EQ(use.eager, 2);  // the first micro-batch and the probed one
  EXPECT_EQ(use.captures, 1);
  EXPECT_EQ(use.replays, 4);
}

}  // namespace
}  // namespace stableflash::model
