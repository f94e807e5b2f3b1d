// The optimizer step overlapped with the next forward (train.overlap_optimizer, off by default;
// ctest label `gpu`, skipped without a GPU). The update runs on a second stream, part by
// part in the order the forward reads the weights, and the forward waits per layer; the clipping
// factor is computed and read on the device; the update zeroes the gradients as it reads them.
// None of that may change a bit: with the deterministic attention backward, an overlapped run
// equals a sequential one (the same kernels on one stream) in every loss, gradient norm,
// validation loss and probe, and in the final weights and optimizer state; with validation,
// checkpoints and probes on (which read the weights while an update may still be running) and
// gradient accumulation, for AdamW and Muon, clipped and not. Checkpoints resume across the two.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bitwise_runs.hpp"
#include "require_gpu.hpp"
#include "stableflash/data/safetensors.hpp"
#include "stableflash/train/bench.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/trainer.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

TrainConfig config(const std::string& data_dir) {
  TrainConfig c = bitwise_config(data_dir);
  c.train.probe_every = 1;
  c.train.overlap_optimizer = true;  // not the default: each test compares it with the sequential update
  c.optim.lr = 3e-3, c.optim.warmup_steps = 2, c.optim.decay_steps = 40;
  return c;
}

class OverlapGpu : public ShardsTest {};

TEST_F(OverlapGpu, OverlappedOptimizerIsBitwiseTheSequentialOne) {
  SF_REQUIRE_GPU();
  struct Case {
    const char* name;
    optim::OptimizerKind kind;
    double clip;
  };
  // A clip of 0.01 clips every step (these norms are far above it); 0 never clips.
  for (const Case& k : {Case{"adamw_clipped", optim::OptimizerKind::adamw, 0.01}, Case{"adamw_unclipped", optim::OptimizerKind::adamw, 0.0},
                        Case{"muon_clipped", optim::OptimizerKind::muon, 0.01}}) {
    SCOPED_TRACE(k.name);
    TrainConfig c = config(dir.file("data"));
    c.optim.kind = k.kind, c.optim.grad_clip = k.clip;
    TrainConfig sequential = c;
    sequential.train.overlap_optimizer = false;
    const std::string a = dir.file(std::string(k.name) + "_overlapped"), b = dir.file(std::string(k.name) + "_sequential");
    const auto overlapped = train_on_gpu(c, a);
    const auto plain = train_on_gpu(sequential, b);
    expect_same_steps(overlapped, plain);
    expect_same_checkpoint(a, b);
    EXPECT_LT(overlapped.back().loss, overlapped.front().loss);  // it learns: not two flat lines agreeing
    if (k.clip > 0) {
      for (const auto& m : overlapped) EXPECT_GT(m.grad_norm, k.clip) << "step " << m.step << ": meant to clip";
    }
  }
}

// A checkpoint of either mode resumes in the other and continues bit for bit (losses, norms,
// validation, final weights and optimizer state).
TEST_F(OverlapGpu, CheckpointsResumeAcrossTheModesBitwise) {
  SF_REQUIRE_GPU();
  TrainConfig c = config(dir.file("data"));
  c.train.checkpoint_every = 4;
  c.train.probe_every = 0;  // a resumed W_Q probe starts its power iteration cold: not comparable
  const auto whole = train_on_gpu(c, dir.file("whole"));
  for (const bool first_overlapped : {true, false}) {
    const std::string run = dir.file(first_overlapped ? "overlapped_first" : "sequential_first");
    TrainConfig first = c;
    first.train.steps = 4, first.train.overlap_optimizer = first_overlapped;
    train_on_gpu(first, run);
    TrainConfig rest = c;
    rest.train.overlap_optimizer = !first_overlapped;
    const auto resumed = train_on_gpu(rest, run, /*resume=*/true);
    ASSERT_EQ(resumed.size(), 4u);
    expect_same_steps(whole, resumed, 4);
    expect_same_checkpoint(dir.file("whole"), run);
  }
}

// A loss or gradient norm that is not finite still stops the run naming the step, with the last
// checkpoint intact (the update queued before the norm is read changes nothing).
TEST_F(OverlapGpu, NonFiniteLossStillStopsWithTheCheckpointIntact) {
  SF_REQUIRE_GPU();
  TrainConfig c = config(dir.file("data"));
  c.optim.lr = 1e30, c.optim.warmup_steps = 0, c.train.checkpoint_every = 1, c.train.val_every = 0, c.train.probe_every = 0;
  try {
    train_on_gpu(c, dir.file("run"));
    FAIL() << "expected the run to stop";
  } catch (const NonFiniteLoss& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("stopped before updating the weights"), std::string::npos) << msg;
  }
  const Checkpoint ckpt = open_checkpoint(latest_checkpoint(dir.file("run")));  // intact and verifiable
  EXPECT_GE(ckpt.state.step, 1);
}

// The benchmark's own sequence (steps, parts timed alone, probes) runs overlapped, reports the
// overlap and the forward's wait for it, and with the deterministic backward ends at the bits of
// the sequential run.
TEST_F(OverlapGpu, BenchReportsTheOverlapAndKeepsTheBits) {
  SF_REQUIRE_GPU();
  TrainConfig c = preset("tiny");
  c.train.deterministic = true;
  c.train.overlap_optimizer = true;  // not the default
  BenchTrainOptions o;
  o.device = TrainDevice::cuda;
  o.warmup_steps = 2, o.steps = 10;
  const BenchTrainResult overlapped = bench_training(c, o);
  c.train.overlap_optimizer = false;
  const BenchTrainResult plain = bench_training(c, o);
  EXPECT_TRUE(overlapped.optimizer_overlapped);
  EXPECT_FALSE(plain.optimizer_overlapped);
  EXPECT_GE(overlapped.optimizer_wait_ms, 0.0);
  EXPECT_EQ(plain.optimizer_wait_ms, 0.0);
  EXPECT_GT(overlapped.optimizer_ms, 0.0);
  EXPECT_EQ(overlapped.last_loss, plain.last_loss);
}

}  // namespace
}  // namespace stableflash::train
