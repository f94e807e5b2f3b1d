// `stableflash bench attention`: TFLOP/s of the CUDA attention, forward and backward, timed as
// shared/peers/torch_peers.py times its peers (median over windows of back-to-back calls between
// CUDA events), after checking each configuration against the CPU oracle on a small input.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/train/bench.hpp"
#include "stableflash/train/config.hpp"

namespace stableflash::cli {
namespace {

using namespace stableflash::attention;

struct BenchCommand {
  // the four multi-head shapes of docs/benchmarks.md and a grouped-query one (Llama: 64 query, 8 KV heads)
  std::string shapes =
      "16x12x1024x64:causal,16x12x1024x64:full,8x16x4096x128:causal,2x16x16384x128:causal,2x64x4096x128:causal:kv8";
  std::string numerics = "fused", policies = "standard", delta_sources = "rounded", layout = "bhtd", json;
  double warmup_s = 0.3, min_window_ms = 20.0;
  int windows = 7, check_len = 333;
  bool no_check = false, deterministic = false;
  std::uint64_t seed = 0;
};

struct BenchShape {
  AttentionShape shape;
  bool causal = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "BxHxTxD:causal" or "BxHxTxD:full" (Tq = Tk = T), optionally ":kvN" for N KV heads (grouped-query).
BenchShape parse_shape(const std::string& s) {
  const auto fields = split(s, ':');
  const std::string mask = fields.size() > 1 ? fields[1] : "causal", kv = fields.size() > 2 ? fields[2] : "";
  const auto parts = split(fields.empty() ? "" : fields[0], 'x');
  if (parts.size() != 4 || fields.size() > 3 || (mask != "causal" && mask != "full") || (!kv.empty() && kv.rfind("kv", 0) != 0))
    throw std::invalid_argument("--shapes: expected BxHxTxD:causal|full[:kvN], got '" + s + "'");
  BenchShape b;
  try {
    b.shape = {std::stoi(parts[0]), std::stoi(parts[1]), std::stoi(parts[2]), std::stoi(parts[2]), std::stoi(parts[3])};
    if (!kv.empty()) b.shape.kv_heads = std::stoi(kv.substr(2));
  } catch (const std::exception&) {
    throw std::invalid_argument("--shapes: bad number in '" + s + "'");
  }
  b.causal = mask == "causal";
  return b;
}

template <class E>
std::vector<E> parse_list(const std::string& s, std::optional<E> (*parse)(std::string_view), const char* flag,
                          const std::string& valid) {
  std::vector<E> out;
  for (const auto& item : split(s, ',')) {
    const auto v = parse(item);
    if (!v) throw std::invalid_argument(std::string(flag) + ": unknown value '" + item + "' (expected one of: " + valid + ")");
    out.push_back(*v);
  }
  return out;
}

double fwd_flop(const BenchShape& b) {
  const AttentionShape& s = b.shape;
  return 4.0 * s.batch * s.heads * double(s.q_len) * s.k_len * s.head_dim / (b.causal ? 2.0 : 1.0);
}

int run(const BenchCommand& c) {
  if (!cuda::built()) throw std::runtime_error("bench attention: this build has no CUDA kernels");
  if (!cuda::has_device()) throw std::runtime_error("bench attention: no CUDA device");
  const auto layout = parse_layout(c.layout);
  if (!layout) throw std::invalid_argument("--layout: expected bhtd or bthd");
  std::vector<BenchShape> shapes;
  for (const auto& s : split(c.shapes, ',')) shapes.push_back(parse_shape(s));
  const auto numerics = parse_list(c.numerics, parse_numerics, "--numerics", "fused, paper");
  const auto policies = parse_list(c.policies, parse_shift_policy, "--policy", valid_names_shift_policy());
  const auto deltas = parse_list(c.delta_sources, parse_delta_source, "--delta-source", valid_names_delta_source());

  std::FILE* json = nullptr;
  if (!c.json.empty() && !(json = std::fopen(c.json.c_str(), "w"))) throw std::runtime_error("--json " + c.json + ": cannot open for writing: " + std::strerror(errno));
  const std::string device = cuda::device_name();
  std::printf("stableflash bench attention on %s (median over %d windows of back-to-back calls, >= %.0f ms each)\n",
              device.c_str(), c.windows, c.min_window_ms);
  std::printf("%-22s %-7s %-6s %-14s %-11s %9s %9s %9s %9s  %s\n", "shape (B,H,T,D)", "mask", "num", "policy", "delta",
              "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "oracle check");
  std::map<std::string, bool> checked;  // small-input checks, once per configuration
  int failures = 0;
  for (const BenchShape& b : shapes)
    for (Numerics n : numerics)
      for (ShiftPolicy pol : policies)
        for (DeltaSource ds : deltas) {
          AttentionOptions opt;
          opt.device = Device::cuda, opt.numerics = n, opt.policy = pol, opt.delta_source = ds;
          opt.causal = b.causal, opt.deterministic = c.deterministic;
          std::string check = "skipped";
          if (!c.no_check) {
            const std::string key = std::to_string(b.shape.head_dim) + (b.causal ? "c" : "f") + std::string(to_string(n)) +
                                    std::string(to_string(pol)) + std::string(to_string(ds));
            if (!checked.count(key)) {
              const AttentionShape small{1, 2, c.check_len, c.check_len, b.shape.head_dim};
              const cuda::OracleCheck oc = cuda::check_against_oracle(small, *layout, opt, c.seed + 1);
              checked[key] = oc.pass();
              if (!oc.pass()) std::fprintf(stderr, "oracle check failed for %s:\n%s", key.c_str(), oc.describe().c_str());
            }
            check = checked[key] ? "pass" : "FAIL";
            failures += !checked[key];
          }
          const cuda::BenchTiming t = cuda::bench(b.shape, *layout, opt, c.seed, c.warmup_s, c.windows, c.min_window_ms);
          const double f = fwd_flop(b), fwd_tf = f / t.fwd_ms / 1e9, bwd_tf = 2.5 * f / t.bwd_ms / 1e9;
          char shape[64];  // grouped-query: H/H_kv
          const std::string heads = std::to_string(b.shape.heads) +
                                    (b.shape.resolved_kv_heads() != b.shape.heads ? "/" + std::to_string(b.shape.resolved_kv_heads()) : "");
          std::snprintf(shape, sizeof shape, "%d,%s,%d,%d", b.shape.batch, heads.c_str(), b.shape.q_len, b.shape.head_dim);
          std::printf("%-22s %-7s %-6s %-14s %-11s %9.3f %9.1f %9.3f %9.1f  %s\n", shape, b.causal ? "causal" : "full",
                      std::string(to_string(n)).c_str(), std::string(to_string(pol)).c_str(),
                      std::string(to_string(ds)).c_str(), t.fwd_ms, fwd_tf, t.bwd_ms, bwd_tf, check.c_str());
          std::fflush(stdout);
          if (json)
            std::fprintf(json,
                         "{\"B\": %d, \"H\": %d, \"Hkv\": %d, \"T\": %d, \"D\": %d, \"causal\": %s, \"layout\": \"%s\", \"numerics\": \"%s\", "
                         "\"policy\": \"%s\", \"delta_source\": \"%s\", \"deterministic\": %s, \"fwd_ms\": %.6f, "
                         "\"bwd_ms\": %.6f, \"fwd_tflops\": %.3f, \"bwd_tflops\": %.3f, \"check\": \"%s\", \"device\": \"%s\", "
                         "\"method\": \"median over windows of back-to-back calls\"}\n",
                         b.shape.batch, b.shape.heads, b.shape.resolved_kv_heads(), b.shape.q_len, b.shape.head_dim,
                         b.causal ? "true" : "false",
                         c.layout.c_str(), std::string(to_string(n)).c_str(), std::string(to_string(pol)).c_str(),
                         std::string(to_string(ds)).c_str(), c.deterministic ? "true" : "false", t.fwd_ms, t.bwd_ms, fwd_tf,
                         bwd_tf, check.c_str(), device.c_str());
        }
  if (json) std::fclose(json);
  return failures ? 1 : 0;
}

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
                  "\"communication_wait_ms\": %.4f, \"communication_wait_share\": %.5f, \"peak_mem_gib_per_rank\": [%s], "
                  "\"communication_wait_share_per_rank\": [%s], \"zero_stage\": %d, \"bucket_mb\": %g, "
                  "\"wq_probe_ms\": %.4f, \"attention_probe_ms\": %.4f, \"sigma_probe_ms\": %.4f, \"probe_share\": %.5f, "
                  "\"method\": \"median of 5 windows\"}\n",
                  config.preset.c_str(), r.device.c_str(), r.ranks, config.train.batch_size, config.train.seq_len, config.train.grad_accum,
                  config.train.deterministic ? "true" : "false", r.ms_per_step, r.tokens_per_s, r.peak_memory_gib, r.mfu, r.last_loss,
                  static_cast<long long>(r.parameters), r.forward_ms, r.forward_backward_ms, r.optimizer_ms, r.communication_wait_ms,
                  r.communication_wait_share, list(r.peak_memory_gib_per_rank, "%.4f", 1.0).c_str(),
                  list(r.communication_wait_share_per_rank, "%.5f", 1.0).c_str(), config.dist.zero_stage, config.dist.bucket_mb,
                  r.wq_probe_ms, r.attention_probe_ms, r.sigma_probe_ms, r.probe_share());
    out << line;
  }
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto c = std::make_shared<BenchCommand>();
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
  sub->add_option("--shapes", c->shapes,
                  "Comma-separated BxHxTxD:causal|full[:kvN] (kvN: N KV heads, grouped-query; the oracle check runs "
                  "multi-head, grouped-query heads are checked by the GPU tests)")
      ->capture_default_str();
  sub->add_option("--numerics", c->numerics, "Comma-separated: fused, paper")->capture_default_str();
  sub->add_option("--policy", c->policies, "Comma-separated shift policies: " + valid_names_shift_policy())->capture_default_str();
  sub->add_option("--delta-source", c->delta_sources, "Comma-separated: " + valid_names_delta_source())->capture_default_str();
  sub->add_option("--layout", c->layout, "bhtd or bthd")->capture_default_str();
  sub->add_flag("--deterministic", c->deterministic, "Deterministic backward (ordered dQ accumulation)");
  sub->add_option("--warmup", c->warmup_s, "Warm-up seconds per measurement")->capture_default_str();
  sub->add_option("--windows", c->windows, "Timing windows (the median is reported)")->capture_default_str();
  sub->add_option("--min-window-ms", c->min_window_ms, "Minimum length of a window")->capture_default_str();
  sub->add_option("--check-len", c->check_len, "Sequence length of the oracle check (B=1, H=2)")->capture_default_str();
  sub->add_flag("--no-check", c->no_check, "Skip the oracle check");
  sub->add_option("--json", c->json, "Write one JSON object per measurement to this file");
  sub->add_option("--seed", c->seed, "Seed of the random inputs")->capture_default_str();
  return [c, t, train_sub] { return train_sub->parsed() ? run_train(*t) : run(*c); };
}

}  // namespace stableflash::cli
