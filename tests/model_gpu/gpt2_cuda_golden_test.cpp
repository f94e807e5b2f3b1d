// The whole CUDA GPT-2, forward and backward, against PyTorch in float64
// (tests/golden/gpt2_tiny_golden.safetensors, written by tests/golden/make_gpt2_golden.py).
//
// The bound is the project's rule for low-precision results: twice the error of an honest naive
// BF16 implementation plus one BF16 rounding step. The naive implementation is PyTorch's BF16
// autocast of the same model, emulated on the CPU (Gpt2<float>::set_bf16_autocast); the golden
// model has head dim 16, so every layer uses standard attention (FP32 on the GPU, as in the CPU
// model).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "stableflash/data/safetensors.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/model/gpt2_cuda.hpp"
#include "require_gpu.hpp"

#ifndef STABLEFLASH_GOLDEN_FILE
#error "STABLEFLASH_GOLDEN_FILE must name tests/golden/gpt2_tiny_golden.safetensors"
#endif

namespace stableflash::model {
namespace {

double ulp_bf16(double x) { return x == 0 ? 0x1p-133 : std::ldexp(1.0, std::ilogb(std::abs(x)) - 7); }

TEST(Gpt2CudaGolden, LossAndEveryGradientWithinTwiceTheAutocastError) {
  SF_REQUIRE_GPU();
  const auto file = data::SafetensorsFile::read(STABLEFLASH_GOLDEN_FILE);
  auto f64 = [&](const std::string& name) {
    const data::Tensor* t = file.find(name);
    if (!t) throw std::runtime_error("golden file lacks " + name);
    const auto v = t->as<double>();
    return std::vector<double>(v.begin(), v.end());
  };
  auto meta = [&](const char* k) { return std::stoi(file.metadata.at(k)); };
  Gpt2Config c;
  c.n_layer = meta("n_layer"), c.n_head = meta("n_head"), c.n_embd = meta("n_embd"), c.block_size = meta("block_size");
  c.vocab_size = meta("vocab_size"), c.padded_vocab_size = meta("padded_vocab_size");
  const int B = meta("batch"), T = meta("seq_len");
  const std::vector<LayerAttention> att(std::size_t(c.n_layer), LayerAttention{AttentionKind::standard, {}});

  // Batch 0's inputs and targets from tokens [6, B, T + 1].
  const auto tok = file.find("tokens")->as<std::int32_t>();
  std::vector<int> in, tg;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < T; ++i) in.push_back(tok[std::size_t(b * (T + 1) + i)]), tg.push_back(tok[std::size_t(b * (T + 1) + i + 1)]);

  Gpt2<float> emu(c, att);
  for (const auto& t : emu.tensors()) {
    const auto v = f64("param." + t.name);
    for (std::int64_t i = 0; i < t.size; ++i) emu.params()[t.offset + i] = float(v[std::size_t(i)]);
  }
  emu.set_bf16_autocast(true);
  emu.zero_grad();
  const double emu_loss = emu.forward(in, tg, B, T);
  emu.backward(1.0f);

  Gpt2Cuda gpu(c, att, B, T, /*deterministic=*/true);
  gpu.set_params(emu.params());
  gpu.zero_grad();
  gpu.train_micro_batch(in, tg, B, T, 1.0f);
  const double gpu_loss = gpu.take_loss_sum();
  std::vector<float> grads(std::size_t(gpu.parameter_count()));
  gpu.get_grads(grads);

  const double want_loss = f64("loss")[0];
  EXPECT_LE(std::abs(gpu_loss - want_loss), 2 * std::abs(emu_loss - want_loss) + ulp_bf16(want_loss))
      << "loss: fp64 " << want_loss << ", autocast emulation " << emu_loss << ", gpu " << gpu_loss;
  double worst = 0;
  for (const auto& t : emu.tensors()) {
    const auto want = f64("grad." + t.name);
    double max_ref = 0, err_gpu = 0, err_emu = 0;
    for (std::int64_t i = 0; i < t.size; ++i) {
      const double w = want[std::size_t(i)];
      max_ref = std::max(max_ref, std::abs(w));
      err_gpu = std::max(err_gpu, std::abs(double(grads[std::size_t(t.offset + i)]) - w));
      err_emu = std::max(err_emu, std::abs(double(emu.grads()[std::size_t(t.offset + i)]) - w));
    }
    const double bound = 2 * err_emu + ulp_bf16(max_ref);
    EXPECT_LE(err_gpu, bound) << t.name << " (autocast emulation's error " << err_emu << ")";
    worst = std::max(worst, err_gpu / bound);
  }
  std::printf("golden (GPU): loss err %.3g (emulation %.3g); worst gradient err / bound %.3f\n", std::abs(gpu_loss - want_loss),
              std::abs(emu_loss - want_loss), worst);
}

}  // namespace
}  // namespace stableflash::model
