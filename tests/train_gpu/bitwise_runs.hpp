// Helpers of the GPU trainer tests that compare two runs bit for bit (the overlapped optimizer, CUDA
// graphs): a run on the GPU, and the steps' metrics and the final checkpoints compared exactly.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "stableflash/data/safetensors.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/trainer.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {

// A fixture with the test shards in dir/data, for the tests that train on the GPU.
class ShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  stableflash::testing::ScratchDir dir;
};

// The small deterministic run both bitwise comparisons start from (3 layers of head dim 64, the
// flash kernels; two micro-batches a step; checkpoints every 3 of 8 steps); each test sets what it
// varies (probes, the optimizer overlap, the schedule).
inline TrainConfig bitwise_config(const std::string& data_dir) {
  TrainConfig c = stableflash::testing::small_config(data_dir);
  c.model.n_layer = 3, c.model.n_head = 2, c.model.n_embd = 128, c.model.block_size = 64;
  c.train.batch_size = 4, c.train.seq_len = 64, c.train.grad_accum = 2;
  c.train.steps = 8, c.train.val_every = 2, c.train.val_batches = 2, c.train.checkpoint_every = 3;
  c.train.deterministic = true;
  return c;
}

inline TrainResult run_on_gpu(const TrainConfig& c, const std::string& run_dir, bool resume = false) {
  TrainOptions o;
  o.run_dir = run_dir, o.resume = resume, o.progress = false;
  o.device = TrainDevice::cuda;
  return run_training(c, o);
}

inline std::vector<StepMetrics> train_on_gpu(const TrainConfig& c, const std::string& run_dir, bool resume = false) {
  return run_on_gpu(c, run_dir, resume).steps;
}

inline void expect_same_steps(const std::vector<StepMetrics>& a, const std::vector<StepMetrics>& b, std::size_t first = 0) {
  ASSERT_EQ(b.size() + first, a.size());
  for (std::size_t i = 0; i < b.size(); ++i) {
    const StepMetrics &x = a[first + i], &y = b[i];
    EXPECT_EQ(x.loss, y.loss) << "step " << x.step;
    EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << x.step;
    ASSERT_EQ(x.val_loss.has_value(), y.val_loss.has_value()) << "step " << x.step;
    if (x.val_loss) {
      EXPECT_EQ(*x.val_loss, *y.val_loss) << "validation after step " << x.step;
    }
    EXPECT_EQ(x.wq_sigma, y.wq_sigma) << "W_Q probe after step " << x.step;
  }
}

// The final checkpoints' weights and optimizer state, bit for bit.
inline void expect_same_checkpoint(const std::string& run_a, const std::string& run_b) {
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    const auto a = data::SafetensorsFile::read(latest_checkpoint(run_a) + file);
    const auto b = data::SafetensorsFile::read(latest_checkpoint(run_b) + file);
    ASSERT_EQ(a.tensors.size(), b.tensors.size()) << file;
    for (const auto& [name, t] : a.tensors) {
      const auto* other = b.find(name);
      ASSERT_NE(other, nullptr) << file << ": " << name;
      const auto x = t.as<float>(), y = other->as<float>();
      ASSERT_EQ(x.size(), y.size()) << name;
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << file << ": " << name;
    }
  }
}

}  // namespace stableflash::train
