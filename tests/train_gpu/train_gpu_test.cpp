// The CUDA trainer end to end against the CPU trainer (ctest label `gpu`; skipped without a GPU).
//
// How close must the GPU trainer stay to the CPU one? The CPU trainer computes in FP32; the GPU in
// BF16 mixed precision. The honest naive BF16 implementation of the same recipe is PyTorch's
// autocast, which the CPU model emulates exactly (Gpt2::set_bf16_autocast: BF16 matmul operands
// and outputs, BF16 GELU and logits). So, per step s, with loss_cpu the FP32 trainer,
// loss_emu the autocast emulation and loss_gpu the CUDA trainer on identical batches:
//   |loss_gpu(s) - loss_cpu(s)| <= 2 max_{s' <= s} |loss_emu(s') - loss_cpu(s')| + ulp_bf16(loss_cpu(s))
// (the project's rule: twice the naive BF16 implementation's error plus one rounding step). The
// running maximum is used because trajectories that separate through rounding keep separating:
// a chance crossing of emu and cpu at one step says nothing about how far apart BF16 runs are.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "stableflash/data/safetensors.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/trainer.hpp"
#include "require_gpu.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::ScratchDir;

enum class Where { cpu, cpu_autocast, cuda };

std::vector<StepMetrics> train(const TrainConfig& c, const std::string& run_dir, Where where, bool resume = false) {
  TrainOptions o;
  o.run_dir = run_dir, o.resume = resume, o.progress = false;
  o.device = where == Where::cuda ? TrainDevice::cuda : TrainDevice::cpu;
  o.cpu_bf16_autocast = where == Where::cpu_autocast;
  return run_training(c, o).steps;
}

double ulp_bf16(double x) { return std::ldexp(1.0, std::ilogb(std::abs(x)) - 7); }

// A model the flash kernels take (head dim 64) that still trains in seconds on the CPU.
TrainConfig gpu_config(const std::string& data_dir) {
  TrainConfig c = stableflash::testing::small_config(data_dir);
  c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = 128, c.model.block_size = 64;
  c.train.batch_size = 4, c.train.seq_len = 64, c.train.grad_accum = 2;
  c.train.steps = 20, c.train.val_every = 10, c.train.val_batches = 2, c.train.checkpoint_every = 10;
  c.optim.lr = 3e-3, c.optim.warmup_steps = 4, c.optim.decay_steps = 40;
  return c;
}

class TrainGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  // Every step's (and validation's) GPU loss within the bound of the header comment.
  void expect_agreement(const std::vector<StepMetrics>& cpu, const std::vector<StepMetrics>& emu, const std::vector<StepMetrics>& gpu) {
    ASSERT_EQ(cpu.size(), gpu.size());
    ASSERT_EQ(cpu.size(), emu.size());
    double naive = 0.0, naive_val = 0.0;
    for (std::size_t s = 0; s < cpu.size(); ++s) {
      naive = std::max(naive, std::abs(emu[s].loss - cpu[s].loss));
      const double bound = 2.0 * naive + ulp_bf16(cpu[s].loss);
      EXPECT_LE(std::abs(gpu[s].loss - cpu[s].loss), bound)
          << "step " << s << ": cpu " << cpu[s].loss << ", autocast emulation " << emu[s].loss << ", gpu " << gpu[s].loss;
      ASSERT_EQ(cpu[s].val_loss.has_value(), gpu[s].val_loss.has_value());
      if (cpu[s].val_loss) {
        naive_val = std::max(naive_val, std::abs(*emu[s].val_loss - *cpu[s].val_loss));
        EXPECT_LE(std::abs(*gpu[s].val_loss - *cpu[s].val_loss), 2.0 * std::max(naive, naive_val) + ulp_bf16(*cpu[s].val_loss))
            << "validation after step " << s;
      }
    }
    // The runs learn: the check above is not two flat lines agreeing.
    EXPECT_LT(gpu.back().loss, gpu.front().loss - 0.5);
  }
  ScratchDir dir;
};

TEST_F(TrainGpu, FirstTwentyStepsStayWithinTheNaiveBf16ErrorOfTheCpuTrainer) {
  SF_REQUIRE_GPU();
  const TrainConfig c = gpu_config(dir.file("data"));  // the default attention in every layer (fused, standard shift, compensated delta)
  expect_agreement(train(c, dir.file("cpu"), Where::cpu), train(c, dir.file("emu"), Where::cpu_autocast), train(c, dir.file("gpu"), Where::cuda));
}

TEST_F(TrainGpu, MixedLayersAgreeToo) {
  SF_REQUIRE_GPU();
  // Standard FP32 attention in layer 0, paper numerics with the published policy in layer 1.
  TrainConfig c = gpu_config(dir.file("data"));
  c.set("attention.layer.0.numerics", "standard", "test");
  c.set("attention.layer.1.numerics", "paper", "test");
  c.set("attention.layer.1.policy", "paper", "test");
  c.set("attention.layer.1.delta_source", "rounded", "test");
  c.set("attention.layer.1.tile_k", "64", "test");
  c.train.steps = 10;
  expect_agreement(train(c, dir.file("cpu"), Where::cpu), train(c, dir.file("emu"), Where::cpu_autocast), train(c, dir.file("gpu"), Where::cuda));
}

TEST_F(TrainGpu, ResumeIsBitwiseExact) {
  SF_REQUIRE_GPU();
  TrainConfig c = gpu_config(dir.file("data"));
  c.train.steps = 8, c.train.checkpoint_every = 4;
  c.train.deterministic = true;  // the attention backward's dQ in a fixed order
  const auto whole = train(c, dir.file("whole"), Where::cuda);
  TrainConfig first = c;
  first.train.steps = 4;
  train(first, dir.file("split"), Where::cuda);
  const auto rest = train(c, dir.file("split"), Where::cuda, /*resume=*/true);
  ASSERT_EQ(rest.size(), 4u);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].loss, whole[4 + i].loss) << "step " << 4 + i;
    EXPECT_EQ(rest[i].grad_norm, whole[4 + i].grad_norm) << "step " << 4 + i;
  }
  // The final weights, bit for bit.
  const auto a = data::SafetensorsFile::read(latest_checkpoint(dir.file("whole")) + "/model.safetensors");
  const auto b = data::SafetensorsFile::read(latest_checkpoint(dir.file("split")) + "/model.safetensors");
  for (const auto& [name, t] : a.tensors) {
    const auto x = t.as<float>(), y = b.find(name)->as<float>();
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << name;
  }
}

TEST_F(TrainGpu, CheckpointsResumeOnTheOtherDevice) {
  SF_REQUIRE_GPU();
  TrainConfig c = gpu_config(dir.file("data"));
  c.train.steps = 6, c.train.checkpoint_every = 3;
  TrainConfig half = c;
  half.train.steps = 3;
  // Written by each device, resumed by the other (and by the autocast emulation for the bound):
  // at the first resumed step both start from the same weights, so they differ by one step's numerics.
  for (const Where writer : {Where::cpu, Where::cuda}) {
    const Where reader = writer == Where::cpu ? Where::cuda : Where::cpu;
    const std::string base = dir.file(writer == Where::cpu ? "by_cpu" : "by_gpu");
    train(half, base, writer);
    for (const char* copy : {"_same", "_other", "_emu"}) fs::copy(base, base + copy, fs::copy_options::recursive);
    const auto same = train(c, base + "_same", writer, /*resume=*/true);
    const auto other = train(c, base + "_other", reader, /*resume=*/true);
    const auto emu = train(c, base + "_emu", Where::cpu_autocast, /*resume=*/true);
    ASSERT_EQ(other.size(), 3u);
    ASSERT_EQ(other.front().step, 3);
    const auto& cpu = writer == Where::cpu ? same : other;
    const auto& gpu = writer == Where::cpu ? other : same;
    const double bound = 2.0 * std::abs(emu.front().loss - cpu.front().loss) + ulp_bf16(cpu.front().loss);
    EXPECT_LE(std::abs(gpu.front().loss - cpu.front().loss), bound) << "checkpoint written on " << (writer == Where::cpu ? "cpu" : "gpu");
  }
}

}  // namespace
}  // namespace stableflash::train
