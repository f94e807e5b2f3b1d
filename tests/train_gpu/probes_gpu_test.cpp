// The probes on the CUDA trainer against the CPU (ctest label `gpu`; skipped without a GPU).
//   - Probes never change GPU training: with train.deterministic the losses of a run with every
//     probe on every step equal, bit for bit, those of a run without probes (the capture writes
//     O's residual beside O, and the kernels' counters run in a separate forward).
//   - The capture is what the layer computed: the CPU oracle run on the GPU's captured q, k, v
//     gives the captured O, lse and residual within the numerics contract's bound for `paper`
//     numerics (S bitwise equal; outputs within 2 BF16 ulps at max|O|, docs/numerics-contract.md), and the
//     GPU kernels' per-head tie counters equal the CPU kernel's on the same inputs (S is bitwise
//     equal in `paper` numerics, so the counted events are the same).
//   - The delta shadow of the GPU capture equals the shadow of the CPU recomputation within the
//     bound that follows: |sum dO (O + r)_gpu - sum dO (O + r)_cpu| <= sum |dO| 2 ulp(max|O|) per
//     row (plus delta_used's own FP32 rounding, D 2^-24 sum |dO O|, twice).
//   - Spectral norms: the same host code on the downloaded FP32 weights: equal to the CPU engine's
//     after the same initialisation, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "engine.hpp"
#include "stableflash/diag/attention_probes.hpp"
#include "stableflash/diag/weight_spectra.hpp"
#include "stableflash/train/trainer.hpp"
#include "require_gpu.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::ScratchDir;

// Head dim 64 (the kernels' smallest); layer 1 in the failing setting magnified (paper numerics).
TrainConfig probe_config(const std::string& data_dir) {
  TrainConfig c = stableflash::testing::small_config(data_dir);
  c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = 128, c.model.block_size = 128;
  c.train.batch_size = 2, c.train.seq_len = 128, c.train.grad_accum = 2, c.train.steps = 6;
  c.set("attention.layer.1.numerics", "paper", "test");
  c.set("attention.layer.1.policy", "standard", "test");
  c.set("attention.layer.1.delta_source", "rounded", "test");
  c.set("attention.layer.1.round_bits", "3", "test");
  c.set("attention.layer.1.tile_k", "64", "test");
  c.probe.spike_loss_factor = 0, c.probe.spike_sigma_factor = 0;
  return c;
}

class ProbesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  ScratchDir dir;
};

TEST_F(ProbesGpu, NeverChangeDeterministicTraining) {
  SF_REQUIRE_GPU();
  TrainConfig on = probe_config(dir.file("data"));
  on.train.deterministic = true;
  on.train.probe_every = 1, on.probe.sigma_every = 2, on.probe.sequences = 2;
  TrainConfig off = on;
  off.train.probe_every = 0;
  TrainOptions o;
  o.progress = false, o.device = TrainDevice::cuda;
  o.run_dir = dir.file("on");
  const auto a = run_training(on, o).steps;
  o.run_dir = dir.file("off");
  const auto b = run_training(off, o).steps;
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << i;
  }
}

double ulp_bf16(double x) { return x == 0 ? 0x1p-133 : std::ldexp(1.0, std::ilogb(std::abs(x)) - 7); }

TEST_F(ProbesGpu, CaptureAndCountersMatchTheCpuOracle) {
  SF_REQUIRE_GPU();
  const TrainConfig c = probe_config(dir.file("data"));
  auto gpu = make_cuda_engine(c, 0);
  gpu->init_weights(c.train.seed);
  const int B = c.train.batch_size, T = c.train.seq_len;
  std::vector<int> tokens(std::size_t(B) * T), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = int(i * 7 % 200), targets[i] = int(i * 11 % 200);
  model::CaptureRequest req;
  req.layers = {0, 1}, req.sequences = B, req.count_ties = true;
  gpu->zero_grad();
  gpu->request_capture(req);
  gpu->train_micro_batch(tokens, targets, B, T, 1.0f, true);
  const model::Capture cap = gpu->take_capture();
  ASSERT_EQ(cap.layers.size(), 2u);
  ASSERT_EQ(cap.head_ties.size(), 2u);
  const model::LayerCapture& g = cap.layers[1];  // paper numerics: the contract's bitwise S
  ASSERT_EQ(g.layer, 1);
  ASSERT_EQ(g.d_o.size(), g.o.size());

  // The CPU oracle on the GPU's inputs.
  model::LayerCapture cpu = g;
  std::vector<attention::TieCounts> heads(std::size_t(g.shape.heads));
  attention::ForwardArgs a;
  a.shape = g.shape, a.layout = attention::Layout::bthd;
  a.q = cpu.q.data(), a.k = cpu.k.data(), a.v = cpu.v.data(), a.o = cpu.o.data(), a.lse = cpu.lse.data();
  a.o_residual = cpu.o_residual.data(), a.head_ties = heads.data();
  attention::AttentionOptions opt = g.options;
  opt.device = attention::Device::cpu;
  attention::attention_forward(a, opt);
  for (int h = 0; h < g.shape.heads; ++h) {
    EXPECT_EQ(cap.head_ties[1][std::size_t(h)].tie_event_rows, heads[std::size_t(h)].tie_event_rows) << "head " << h;
    EXPECT_EQ(cap.head_ties[1][std::size_t(h)].repeated_max_rows, heads[std::size_t(h)].repeated_max_rows) << "head " << h;
  }
  double max_o = 0;
  for (const auto& x : cpu.o) max_o = std::max(max_o, std::abs(double(x.to_float())));
  const double tol = 2 * ulp_bf16(max_o);
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < g.o.size(); ++i) {
    const double full_gpu = double(g.o[i].to_float()) + double(g.o_residual[i].to_float());
    const double full_cpu = double(cpu.o[i].to_float()) + double(cpu.o_residual[i].to_float());
    ASSERT_LE(std::abs(full_gpu - full_cpu), tol) << "element " << i;
    differing += g.o[i].bits != cpu.o[i].bits;
  }
  std::printf("captured O: %lld of %zu elements differ from the CPU oracle's (exp accuracy)\n", static_cast<long long>(differing), g.o.size());

  const auto sg = diag::delta_shadow(g), sc = diag::delta_shadow(cpu);
  const int D = g.shape.head_dim;
  for (int h = 0; h < g.shape.heads; ++h) {
    double bound = 0;
    for (int b = 0; b < g.shape.batch; ++b)
      for (int i = 0; i < T; ++i) {
        const std::size_t at = ((std::size_t(b) * T + i) * g.shape.heads + h) * D;
        double abs_do = 0, abs_do_o = 0;
        for (int d = 0; d < D; ++d) {
          abs_do += std::abs(double(g.d_o[at + d].to_float()));
          abs_do_o += std::abs(double(g.d_o[at + d].to_float()) * double(g.o[at + d].to_float()));
        }
        bound += abs_do * 2 * tol + 2 * D * 0x1p-24 * abs_do_o + 2 * ulp_bf16(abs_do_o);  // paper's delta is BF16-rounded: one ulp each
      }
    EXPECT_NEAR(sg.heads[std::size_t(h)], sc.heads[std::size_t(h)], bound) << "head " << h;
  }
}

TEST_F(ProbesGpu, SpectralNormsEqualTheCpuEnginesBitwise) {
  SF_REQUIRE_GPU();
  const TrainConfig c = probe_config(dir.file("data"));
  auto gpu = make_cuda_engine(c, 0);
  auto cpu = make_cpu_engine(c);
  gpu->init_weights(c.train.seed), cpu->init_weights(c.train.seed);
  diag::WeightSpectra sg(c.model), sc(c.model);
  const auto a = sg.measure(gpu->parameters_on_host(), diag::SpectraScope::all);
  const auto b = sc.measure(cpu->parameters_on_host(), diag::SpectraScope::all);
  ASSERT_EQ(a.matrices.size(), b.matrices.size());
  for (std::size_t i = 0; i < a.matrices.size(); ++i) EXPECT_EQ(a.matrices[i].second, b.matrices[i].second) << a.matrices[i].first;
  EXPECT_EQ(a.wq_heads, b.wq_heads);
  EXPECT_EQ(a.wo_heads, b.wo_heads);
}

}  // namespace
}  // namespace stableflash::train
