// The CUDA trainer with its micro-batches replayed from CUDA graphs (train.cuda_graph, on by
// default; ctest label `gpu`, skipped without a GPU) against the same runs without them. A replay
// must see everything the host changes between steps: the batch (staged into device memory before
// the launch), and, outside the graph, the learning rate of the schedule, AdamW's step count and
// the clipping. With the deterministic attention backward a graphed run equals one of plain
// launches in every loss, gradient norm and validation loss, and in the final weights and
// optimizer state; for AdamW with a learning rate that changes every step and for Muon, with
// gradient accumulation and without, a `standard` attention layer among flash ones, and probes
// (whose steps run as launches between replays). Checkpoints resume across the two modes bit for
// bit, and the benchmark says whether its timed steps were replays.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "bitwise_runs.hpp"
#include "require_gpu.hpp"
#include "stableflash/train/bench.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

TrainConfig config(const std::string& data_dir) {
  TrainConfig c = bitwise_config(data_dir);
  c.train.probe_every = 0;
  // Warm-up over the first 6 steps, then the cosine: every step has a learning rate of its own.
  c.optim.lr = 3e-3, c.optim.warmup_steps = 6, c.optim.decay_steps = 12, c.optim.min_lr = 3e-4;
  return c;
}

class CudaGraphGpu : public ShardsTest {};

TEST_F(CudaGraphGpu, ReplayedStepsAreBitwiseThoseOfPlainLaunches) {
  SF_REQUIRE_GPU();
  struct Case {
    const char* name;
    optim::OptimizerKind kind;
    int grad_accum;
    double clip;
    bool standard_layer, probes;
  };
  // A clip of 0.01 clips every step (these norms are far above it).
  for (const Case& k : {Case{"adamw_schedule", optim::OptimizerKind::adamw, 2, 1.0, false, false},
                        Case{"adamw_one_micro_batch_clipped", optim::OptimizerKind::adamw, 1, 0.01, false, false},
                        Case{"muon_standard_layer", optim::OptimizerKind::muon, 2, 0.01, true, false},
                        Case{"adamw_probes", optim::OptimizerKind::adamw, 2, 1.0, false, true}}) {
    SCOPED_TRACE(k.name);
    TrainConfig c = config(dir.file("data"));
    c.optim.kind = k.kind, c.optim.grad_clip = k.clip, c.train.grad_accum = k.grad_accum;
    if (k.standard_layer) c.set("attention.layer.1.numerics", "standard", "test");
    if (k.probes) c.train.probe_every = 1, c.probe.attention_every = 3, c.probe.sigma_every = 4;
    TrainConfig launches = c;
    launches.train.cuda_graph = false;
    const std::string a = dir.file(std::string(k.name) + "_graph"), b = dir.file(std::string(k.name) + "_launches");
    const TrainResult graphed = run_on_gpu(c, a);
    const TrainResult plain = run_on_gpu(launches, b);
    expect_same_steps(graphed.steps, plain.steps);
    expect_same_checkpoint(a, b);
    // Not vacuous: the graphed run replayed every micro-batch but the first (which ran as launches
    // to make every first use) and the probed steps' last ones; the other replayed none.
    const std::int64_t micro_batches = c.train.steps * c.train.grad_accum;
    std::int64_t probed = 0;
    if (k.probes)
      for (std::int64_t s = 0; s < c.train.steps; ++s) probed += ((s + 1) % c.probe.attention_every == 0 || s + 1 == c.train.steps) ? 1 : 0;
    EXPECT_EQ(graphed.graph_replays, micro_batches - 1 - probed) << graphed.execution;
    EXPECT_EQ(plain.graph_replays, 0);
    EXPECT_NE(graphed.execution.find("replayed"), std::string::npos) << graphed.execution;
    EXPECT_NE(plain.execution.find("train.cuda_graph = false"), std::string::npos) << plain.execution;
    // The learning rate changed every step, and the runs learn (not two flat lines agreeing).
    std::set<double> rates;
    for (const auto& m : graphed.steps) rates.insert(m.lr);
    EXPECT_EQ(rates.size(), graphed.steps.size());
    EXPECT_LT(graphed.steps.back().loss, graphed.steps.front().loss);
  }
}

// A checkpoint of either mode resumes in the other and continues bit for bit, and a graphed run
// resumed equals one that never stopped (the graph is recorded anew after the resume).
TEST_F(CudaGraphGpu, CheckpointsResumeExactlyAcrossTheModes) {
  SF_REQUIRE_GPU();
  TrainConfig c = config(dir.file("data"));
  c.train.checkpoint_every = 4;
  const auto whole = train_on_gpu(c, dir.file("whole"));
  for (const bool first_graphed : {true, false}) {
    for (const bool then_graphed : {true, false}) {
      const std::string run = dir.file(std::string(first_graphed ? "graph" : "launches") + "_then_" + (then_graphed ? "graph" : "launches"));
      SCOPED_TRACE(run);
      TrainConfig first = c;
      first.train.steps = 4, first.train.cuda_graph = first_graphed;
      train_on_gpu(first, run);
      TrainConfig rest = c;
      rest.train.cuda_graph = then_graphed;
      const TrainResult resumed = run_on_gpu(rest, run, /*resume=*/true);
      ASSERT_EQ(resumed.steps.size(), 4u);
      expect_same_steps(whole, resumed.steps, 4);
      expect_same_checkpoint(dir.file("whole"), run);
      if (then_graphed) {
        EXPECT_EQ(resumed.graph_replays, 4 * c.train.grad_accum - 1) << resumed.execution;
      }
    }
  }
}

// Where graphs cannot be used the engine says why and runs its launches: the overlapped optimizer.
TEST_F(CudaGraphGpu, OverlappedOptimizerRunsWithoutGraphsAndSaysSo) {
  SF_REQUIRE_GPU();
  TrainConfig c = config(dir.file("data"));
  c.train.overlap_optimizer = true;
  const TrainResult overlapped = run_on_gpu(c, dir.file("overlapped"));
  EXPECT_EQ(overlapped.graph_replays, 0);
  EXPECT_NE(overlapped.execution.find("train.overlap_optimizer"), std::string::npos) << overlapped.execution;
  c.train.overlap_optimizer = false;
  const TrainResult graphed = run_on_gpu(c, dir.file("graphed"));
  expect_same_steps(overlapped.steps, graphed.steps);
}

// The benchmark's timed steps are replays (its warm-up recorded the graph), it says so, and it ends
// at the bits of the benchmark without graphs.
TEST_F(CudaGraphGpu, BenchTimesReplaysAndSaysSo) {
  SF_REQUIRE_GPU();
  TrainConfig c = preset("tiny");
  c.train.deterministic = true;
  BenchTrainOptions o;
  o.device = TrainDevice::cuda;
  o.warmup_steps = 2, o.steps = 10;
  const BenchTrainResult graphed = bench_training(c, o);
  c.train.cuda_graph = false;
  const BenchTrainResult plain = bench_training(c, o);
  EXPECT_TRUE(graphed.cuda_graph) << graphed.execution;
  EXPECT_FALSE(plain.cuda_graph) << plain.execution;
  EXPECT_NE(graphed.execution.find("replayed"), std::string::npos) << graphed.execution;
  EXPECT_EQ(graphed.last_loss, plain.last_loss);
}

}  // namespace
}  // namespace stableflash::train
