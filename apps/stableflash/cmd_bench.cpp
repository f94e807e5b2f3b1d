// `stableflash bench`: `train` (training speed) here, `attention` in bench_attention.cpp (shared with
// the kernel lab's program).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_attention.hpp"
#include "commands.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/train/bench.hpp"
#include "stableflash/train/config.hpp"

namespace stableflash::cli {
namespace {

using namespace stableflash::attention;

struct BenchTrainCommand {
  std::string preset = "gpt2-124m", config_file, device = "auto", json;
  std::vector<std::string> sets;
  int gpus = 0;
  train::BenchTrainOptions options;
};

int run_train(const BenchTrainCommand& c) {
  if (const int code = launch_ranks_if_asked(c.gpus); code >= 0) return code;
  train::ConfigSources sources;
  sources.preset = c.preset;
  sources.config_file = c.config_file;
  sources.sets = c.sets;
  const train::TrainConfig config = train::build_config(sources);
  train::BenchTrainOptions o = c.options;
  o.device = c.device == "cuda" ? train::TrainDevice::cuda : c.device == "cpu" ? train::TrainDevice::cpu : train::TrainDevice::automatic;
  o.world = train::world_from_environment();
  const train::BenchTrainResult r = train::bench_training(config, o);
  if (o.world.rank != 0) return 0;
  std::printf("%s x %d: %s, B %d x T %d x accumulation %d, %.1fM parameters: %.2f ms/step, %.0f tokens/s, peak memory %.2f GiB "
              "(rank 0), MFU %.1f%%, loss %.4f\n",
              r.device.c_str(), r.ranks, config.preset.c_str(), config.train.batch_size, config.train.seq_len, config.train.grad_accum,
              double(r.parameters) / 1e6, r.ms_per_step, r.tokens_per_s, r.peak_memory_gib, 100.0 * r.mfu, r.last_loss);
  std::printf("  parts, each timed alone: forward %.2f ms, forward + backward %.2f ms, gradient norm + optimizer %.2f ms "
              "(per micro-batch of B %d x T %d)\n",
              r.forward_ms, r.forward_backward_ms, r.optimizer_ms, config.train.batch_size, config.train.seq_len);
  if (!r.execution.empty())
    std::printf("  timed steps %s CUDA graphs; %s\n", r.cuda_graph ? "replayed from" : "NOT replayed from", r.execution.c_str());
  if (r.optimizer_overlapped)
    std::printf("  optimizer overlapped with the next forward (train.overlap_optimizer): the forward waited %.2f ms/step for it "
                "(norm, embeddings' update, layers it caught up with); the rest of its %.2f ms ran beside the forward\n",
                r.optimizer_wait_ms, r.optimizer_ms);
  // Per rank: peak memory and the share of the step the GPU stood waiting for communication.
  auto list = [](const std::vector<double>& v, const char* format, double scale) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, format, v[i] * scale);
      out += (i ? ", " : "") + std::string(buf);
    }
    return out;
  };
  if (r.ranks > 1)
    std::printf("  per rank: peak memory [%s] GiB, waiting on communication [%s]%% of the step (rank 0: %.3f ms/step)\n",
                list(r.peak_memory_gib_per_rank, "%.2f", 1.0).c_str(), list(r.communication_wait_share_per_rank, "%.1f", 100.0).c_str(),
                r.communication_wait_ms);
  if (r.wq_probe_ms >= 0) {
    // A probe every N steps costs its ms once per N steps of ms_per_step.
    auto share = [&](double ms, std::int64_t every) { return 100.0 * ms / (r.ms_per_step * double(every)); };
    std::printf("  probes (each alone, over a plain step): W_Q norms %.2f ms = %.2f%% at train.probe_every = %lld", r.wq_probe_ms,
                share(r.wq_probe_ms, r.probe_every), static_cast<long long>(r.probe_every));
    if (r.attention_probe_ms >= 0)
      std::printf("; attention capture %.2f ms = %.2f%% at probe.attention_every = %lld", r.attention_probe_ms,
                  share(r.attention_probe_ms, r.attention_every), static_cast<long long>(r.attention_every));
    if (r.sigma_probe_ms >= 0)
      std::printf("; every matrix's norm %.2f ms = %.2f%% at probe.sigma_every = %lld", r.sigma_probe_ms, share(r.sigma_probe_ms, r.sigma_every),
                  static_cast<long long>(r.sigma_every));
    std::printf("; together %.2f%% of the training time\n", 100.0 * r.probe_share());
  }
  if (!c.json.empty()) {
    std::ofstream out(c.json, std::ios::app);
    if (!out) throw std::runtime_error(c.json + ": cannot open for appending");
    char line[2048];
    std::snprintf(line, sizeof line,
                  "{\"bench\": \"train\", \"preset\": \"%s\", \"device\": \"%s\", \"ranks\": %d, \"B\": %d, \"T\": %d, \"grad_accum\": %d, "
                  "\"deterministic\": %s, \"ms_per_step\": %.4f, \"tokens_per_s\": %.1f, \"peak_mem_gib\": %.3f, \"mfu\": %.4f, "
                  "\"loss\": %.6f, \"parameters\": %lld, \"forward_ms\": %.4f, \"forward_backward_ms\": %.4f, \"optimizer_ms\": %.4f, "
                  "\"optimizer_overlapped\": %s, \"optimizer_wait_ms\": %.4f, \"cuda_graph\": %s, "
                  "\"communication_wait_ms\": %.4f, \"communication_wait_share\": %.5f, \"peak_mem_gib_per_rank\": [%s], "
                  "\"communication_wait_share_per_rank\": [%s], \"zero_stage\": %d, \"bucket_mb\": %g, \"split_embedding\": %s, "
                  "\"wq_probe_ms\": %.4f, \"attention_probe_ms\": %.4f, \"sigma_probe_ms\": %.4f, \"probe_share\": %.5f, "
                  "\"method\": \"median of 5 windows\"}\n",
                  config.preset.c_str(), r.device.c_str(), r.ranks, config.train.batch_size, config.train.seq_len, config.train.grad_accum,
                  config.train.deterministic ? "true" : "false", r.ms_per_step, r.tokens_per_s, r.peak_memory_gib, r.mfu, r.last_loss,
                  static_cast<long long>(r.parameters), r.forward_ms, r.forward_backward_ms, r.optimizer_ms,
                  r.optimizer_overlapped ? "true" : "false", r.optimizer_wait_ms, r.cuda_graph ? "true" : "false", r.communication_wait_ms,
                  r.communication_wait_share, list(r.peak_memory_gib_per_rank, "%.4f", 1.0).c_str(),
                  list(r.communication_wait_share_per_rank, "%.5f", 1.0).c_str(), config.dist.zero_stage, config.dist.bucket_mb,
                  config.dist.split_embedding ? "true" : "false", r.wq_probe_ms, r.attention_probe_ms, r.sigma_probe_ms, r.probe_share());
    out << line;
  }
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto c = std::make_shared<AttentionBenchConfig>();
  auto t = std::make_shared<BenchTrainCommand>();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (CUDA)");
  bench->require_subcommand(1);
  CLI::App* train_sub = bench->add_subcommand("train", "Training speed: ms/step, tokens/s, peak GPU memory and MFU on random tokens");
  train_sub->add_option("--preset", t->preset, "Model and batch: tiny, gpt2-124m (default), gpt2-350m")->capture_default_str();
  train_sub->add_option("--config", t->config_file, "TOML or JSON file of settings")->check(CLI::ExistingFile);
  train_sub->add_option("--set", t->sets, "Override one key (as in `stableflash train`), e.g. --set train.grad_accum=1");
  train_sub->add_option("--device", t->device, "cuda, cpu or auto")->check(CLI::IsMember({"auto", "cuda", "cpu"}))->capture_default_str();
  train_sub->add_option("--steps", t->options.steps, "Timed steps (5 windows)")->capture_default_str();
  train_sub->add_option("--warmup", t->options.warmup_steps, "Untimed steps first")->capture_default_str();
  train_sub->add_option("--seed", t->options.seed, "Seed of the random tokens")->capture_default_str();
  train_sub->add_option("--json", t->json, "Append one JSON object to this file");
  train_sub->add_option("--gpus", t->gpus, "Data parallel over N GPUs (one process each; set train.grad_accum to a multiple of N)")
      ->check(CLI::Range(1, 1024));
  CLI::App* sub = bench->add_subcommand("attention", "TFLOP/s of the CUDA attention, forward and backward");
  add_attention_bench_flags(sub, *c);
  return [c, t, train_sub] { return train_sub->parsed() ? run_train(*t) : run_attention_bench(*c); };
}

}  // namespace stableflash::cli
