// kernel_lab: `stableflash bench attention` (the same table, oracle check and JSON) on the kernel
// lab's comparison kernels, e.g.
//   kernel_lab --forward-kernel mma --backward-kernel mma --shapes 16x12x1024x64:causal
//   kernel_lab --forward-kernel wgmma-1wg --shapes 8x16x4096x128:causal --policy hashed_offset
//   kernel_lab --backward-parts   (the delta pass and dQ conversion alone, old vs new; lab/backward_parts.cu)
//   kernel_lab --forward-timeline --timeline-shapes 2x16x8192x128:full   (where a warp-specialized step's cycles go)
// These kernels are not part of the library that programs link (docs/cuda-kernels.md "Kernel lab").
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "bench_attention.hpp"
#include "lab/lab.hpp"

int main(int argc, char** argv) {
  using namespace stableflash;
  CLI::App app("kernel_lab: TFLOP/s and the oracle check of the CUDA attention's comparison kernels");
  cli::AttentionBenchConfig config;
  std::string forward = "production", backward = "production";
  app.add_option("--forward-kernel", forward, "production, mma (mma.sync), wgmma-1wg (one warpgroup), wgmma-serial "
                                              "(no softmax / P V overlap), wgmma-ws (warp-specialized, D = 64 too), wgmma-ws-rounds (tiles fixed in "
                                              "advance), wgmma-ws-tiles (one CTA per tile), wgmma-ws-2c / "
                                              "wgmma-ws-3c (two / three consumers at D = 64), wgmma-ws-1c (one consumer, both head dims)")
      ->capture_default_str();
  app.add_option("--backward-kernel", backward, "production, mma (mma.sync), wgmma-dqwg (a third warpgroup for dQ), wgmma-64k / wgmma-128k (production with 64- / 128-key CTAs)")->capture_default_str();
  bool backward_parts = false;
  std::string parts_shapes = "16x12x1024x64,8x16x4096x128,3x5x333x64,2x3x100x128";
  int parts_repeats = 20;
  app.add_flag("--backward-parts", backward_parts,
               "instead of the table: time the backward's delta pass and dQ conversion alone (the lab's earlier kernels "
               "against production's, outputs compared bit for bit) and the dQ workspace memset");
  app.add_option("--parts-shapes", parts_shapes, "--backward-parts: BxHxTxD,...")->capture_default_str();
  app.add_option("--parts-repeats", parts_repeats, "--backward-parts: launches per timing")->capture_default_str();
  bool forward_timeline = false;
  std::string timeline_shapes = "2x16x8192x128:full,16x12x1024x64:causal";
  app.add_flag("--forward-timeline", forward_timeline,
               "instead of the table: the warp-specialized forward with clock stamps at every phase of its steps "
               "(lab/forward_timeline.cu): cycles per phase, and CTA 0's first steps");
  app.add_option("--timeline-shapes", timeline_shapes, "--forward-timeline: BxHxTxD:causal|full,...")->capture_default_str();
  cli::add_attention_bench_flags(&app, config);
  CLI11_PARSE(app, argc, argv);
  try {
    if (backward_parts) return attention::cuda::lab::run_backward_parts(parts_shapes, parts_repeats);
    if (forward_timeline) {
      std::vector<attention::cuda::lab::MaskedShape> shapes;
      for (const cli::BenchShape& b : cli::parse_bench_shapes(timeline_shapes, "--timeline-shapes")) shapes.push_back({b.shape, b.causal});
      return attention::cuda::lab::run_forward_timeline(shapes);
    }
    const auto f = attention::cuda::lab::parse_forward_choice(forward);
    const auto b = attention::cuda::lab::parse_backward_choice(backward);
    if (!f) throw std::invalid_argument("--forward-kernel: unknown kernel '" + forward + "'");
    if (!b) throw std::invalid_argument("--backward-kernel: unknown kernel '" + backward + "'");
    const attention::cuda::Kernels kernels = attention::cuda::lab::kernels(*f, *b);
    std::printf("kernel lab: %s\n", kernels.name.c_str());
    return cli::run_attention_bench(config, kernels);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_lab: %s\n", e.what());
    return 2;
  }
}
