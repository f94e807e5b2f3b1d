// The data-parallel code path on one GPU (ctest label `gpu`; skipped without a GPU): a single rank
// with World::force_collectives runs everything two ranks run (the rendezvous, NCCL, gradient
// buckets reduce-scattered from the backward's hook, the sharded optimizer, the per-bucket
// all-gather and BF16 cast, the forward's waits, the norm from per-rank parts, the checkpoint
// gather) where every collective of one rank is the identity. So with the deterministic attention
// backward it must reproduce the plain one-GPU trainer bit for bit; only the gradient norm's FP64
// summation order differs (per-bucket slices), so clipping is off here and the norm is compared
// to a relative 1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "stableflash/train/trainer.hpp"
#include "require_gpu.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::ScratchDir;

std::vector<StepMetrics> train_on_gpu(const TrainConfig& c, const std::string& run_dir, bool collectives, bool resume = false) {
  TrainOptions o;
  o.run_dir = run_dir, o.resume = resume, o.progress = false;
  o.device = TrainDevice::cuda;
  if (collectives) {
    o.world.force_collectives = true;
    o.world.master_addr = "127.0.0.1", o.world.master_port = 0;  // rank 0 alone: any free port
  }
  return run_training(c, o).steps;
}

TrainConfig config(const std::string& data_dir, int zero_stage) {
  TrainConfig c = stableflash::testing::small_config(data_dir);
  c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = 128, c.model.block_size = 64;  // head dim 64: the flash kernels
  c.train.batch_size = 4, c.train.seq_len = 64, c.train.grad_accum = 2;
  c.train.steps = 8, c.train.val_every = 4, c.train.val_batches = 2, c.train.checkpoint_every = 4, c.train.probe_every = 3;
  c.train.deterministic = true;
  c.optim.lr = 3e-3, c.optim.warmup_steps = 4, c.optim.decay_steps = 40, c.optim.grad_clip = 0.0;
  c.dist.zero_stage = zero_stage;
  c.dist.bucket_mb = 0.1;  // about 18 buckets of 25,000 values on this 0.44M-parameter model
  return c;
}

void expect_same_steps(const std::vector<StepMetrics>& plain, const std::vector<StepMetrics>& dp, std::size_t first = 0) {
  ASSERT_EQ(dp.size() + first, plain.size());
  for (std::size_t i = 0; i < dp.size(); ++i) {
    const StepMetrics &a = plain[first + i], &b = dp[i];
    EXPECT_EQ(a.loss, b.loss) << "step " << a.step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-12 * a.grad_norm) << "step " << a.step;
    ASSERT_EQ(a.val_loss.has_value(), b.val_loss.has_value()) << "step " << a.step;
    if (a.val_loss) {
      EXPECT_EQ(*a.val_loss, *b.val_loss) << "validation after step " << a.step;
    }
    EXPECT_EQ(a.wq_sigma, b.wq_sigma) << "W_Q probe after step " << a.step;
  }
}

class ZeroSingleRankGpu : public ::testing::TestWithParam<std::pair<int, optim::OptimizerKind>> {
 protected:
  void SetUp() override {
    fs::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  ScratchDir dir;
};

TEST_P(ZeroSingleRankGpu, MatchesThePlainTrainerBitwiseAndCheckpointsCrossOver) {
  SF_REQUIRE_GPU();
  TrainConfig c = config(dir.file("data"), GetParam().first);
  c.optim.kind = GetParam().second;
  const auto plain = train_on_gpu(c, dir.file("plain"), /*collectives=*/false);
  const auto dp = train_on_gpu(c, dir.file("dp"), /*collectives=*/true);
  expect_same_steps(plain, dp);
  EXPECT_LT(plain.back().loss, plain.front().loss);  // it learns: not two flat lines agreeing

  // A checkpoint of either path resumes on the other (the optimizer state taken from and gathered
  // into the one-device layout) and continues bit for bit.
  TrainConfig longer = c;
  longer.train.steps = 12;
  const auto plain_more = train_on_gpu(longer, dir.file("plain"), /*collectives=*/true, /*resume=*/true);
  const auto dp_more = train_on_gpu(longer, dir.file("dp"), /*collectives=*/false, /*resume=*/true);
  ASSERT_EQ(plain_more.size(), 4u);
  expect_same_steps(plain_more, dp_more);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroSingleRankGpu,
                         ::testing::Values(std::pair{1, optim::OptimizerKind::adamw}, std::pair{1, optim::OptimizerKind::muon},
                                           std::pair{0, optim::OptimizerKind::adamw}),
                         [](const auto& test) {
                           return std::string(test.param.first == 1 ? "zero1_" : "allreduce_") + std::string(optim::to_string(test.param.second));
                         });

}  // namespace
}  // namespace stableflash::train
