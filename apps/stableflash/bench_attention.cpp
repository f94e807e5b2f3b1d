// `stableflash bench attention`: TFLOP/s of the CUDA attention, forward and backward, timed as
// shared/peers/torch_peers.py times its peers (median over windows of back-to-back calls between
// CUDA events), after checking each configuration against the CPU oracle on a small input.
#include "bench_attention.hpp"

#include "stableflash/attention/option_text.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace stableflash::cli {

using namespace stableflash::attention;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "BxHxTxD:causal" or "BxHxTxD:full" (Tq = Tk = T), optionally ":kvN" for N KV heads (grouped-query).
BenchShape parse_shape(const std::string& s, const char* flag) {
  const auto fields = split(s, ':');
  const std::string mask = fields.size() > 1 ? fields[1] : "causal", kv = fields.size() > 2 ? fields[2] : "";
  const auto parts = split(fields.empty() ? "" : fields[0], 'x');
  if (parts.size() != 4 || fields.size() > 3 || (mask != "causal" && mask != "full") || (!kv.empty() && kv.rfind("kv", 0) != 0))
    throw std::invalid_argument(std::string(flag) + ": expected BxHxTxD:causal|full[:kvN], got '" + s + "'");
  BenchShape b;
  try {
    b.shape = {std::stoi(parts[0]), std::stoi(parts[1]), std::stoi(parts[2]), std::stoi(parts[2]), std::stoi(parts[3])};
    if (!kv.empty()) b.shape.kv_heads = std::stoi(kv.substr(2));
  } catch (const std::exception&) {
    throw std::invalid_argument(std::string(flag) + ": bad number in '" + s + "'");
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

}  // namespace

std::vector<BenchShape> parse_bench_shapes(const std::string& list, const char* flag) {
  std::vector<BenchShape> out;
  for (const auto& s : split(list, ',')) out.push_back(parse_shape(s, flag));
  return out;
}

int run_attention_bench(const AttentionBenchConfig& c, const attention::cuda::Kernels& kernels) {
  if (!cuda::built()) throw std::runtime_error("bench attention: this build has no CUDA kernels");
  if (!cuda::has_device()) throw std::runtime_error("bench attention: no CUDA device");
  const auto layout = parse_layout(c.layout);
  if (!layout) throw std::invalid_argument("--layout: expected bhtd or bthd");
  const std::vector<BenchShape> shapes = parse_bench_shapes(c.shapes);
  const auto numerics = parse_list(c.numerics, parse_numerics, "--numerics", "fused, paper");
  const auto policies = parse_list(c.policies, parse_shift_policy, "--policy", valid_names_shift_policy());
  const auto deltas = parse_list(c.delta_sources, parse_delta_source, "--delta-source", valid_names_delta_source());
  // the knobs one value covers for the whole run, through the library's one text parser
  AttentionOptions run_options;
  run_options.device = Device::cuda, run_options.deterministic = c.deterministic;
  set_option(run_options, "normalizer", c.normalizer, "--normalizer");
  const std::string normalizer(to_string(run_options.normalizer));  // what runs, as the records name it

  std::FILE* json = nullptr;
  if (!c.json.empty() && !(json = std::fopen(c.json.c_str(), "w"))) throw std::runtime_error("--json " + c.json + ": cannot open for writing: " + std::strerror(errno));
  const std::string device = cuda::device_name();
  std::printf("stableflash bench attention on %s (median over %d windows of back-to-back calls, >= %.0f ms each; normalizer %s)\n",
              device.c_str(), c.windows, c.min_window_ms, normalizer.c_str());
  std::printf("%-22s %-7s %-6s %-14s %-11s %9s %9s %9s %9s  %s\n", "shape (B,H,T,D)", "mask", "num", "policy", "delta",
              "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "oracle check");
  std::map<std::string, bool> checked;  // small-input checks, once per configuration
  int failures = 0;
  for (const BenchShape& b : shapes)
    for (Numerics n : numerics)
      for (ShiftPolicy pol : policies)
        for (DeltaSource ds : deltas) {
          AttentionOptions opt = run_options;
          opt.numerics = n, opt.policy = pol, opt.delta_source = ds, opt.causal = b.causal;
          std::string check = "skipped";
          if (!c.no_check) {
            const std::string key = std::to_string(b.shape.head_dim) + (b.causal ? "c" : "f") + std::string(to_string(n)) +
                                    std::string(to_string(pol)) + std::string(to_string(ds));
            if (!checked.count(key)) {
              const AttentionShape small{1, 2, c.check_len, c.check_len, b.shape.head_dim};
              const cuda::OracleCheck oc = cuda::check_against_oracle(small, *layout, opt, c.seed + 1, 1.0, 2.0, kernels);
              checked[key] = oc.pass();
              if (!oc.pass()) std::fprintf(stderr, "oracle check failed for %s:\n%s", key.c_str(), oc.describe().c_str());
            }
            check = checked[key] ? "pass" : "FAIL";
            failures += !checked[key];
          }
          const cuda::BenchTiming t = cuda::bench(b.shape, *layout, opt, c.seed, c.warmup_s, c.windows, c.min_window_ms, kernels);
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
                         "\"policy\": \"%s\", \"delta_source\": \"%s\", \"normalizer\": \"%s\", \"deterministic\": %s, \"fwd_ms\": %.6f, "
                         "\"bwd_ms\": %.6f, \"fwd_tflops\": %.3f, \"bwd_tflops\": %.3f, \"check\": \"%s\", \"device\": \"%s\", "
                         "\"method\": \"median over windows of back-to-back calls\"}\n",
                         b.shape.batch, b.shape.heads, b.shape.resolved_kv_heads(), b.shape.q_len, b.shape.head_dim,
                         b.causal ? "true" : "false",
                         c.layout.c_str(), std::string(to_string(n)).c_str(), std::string(to_string(pol)).c_str(),
                         std::string(to_string(ds)).c_str(), normalizer.c_str(), c.deterministic ? "true" : "false", t.fwd_ms, t.bwd_ms, fwd_tf,
                         bwd_tf, check.c_str(), device.c_str());
        }
  if (json) std::fclose(json);
  return failures ? 1 : 0;
}

void add_attention_bench_flags(CLI::App* app, AttentionBenchConfig& c) {
  app->add_option("--shapes", c.shapes,
                  "Comma-separated BxHxTxD:causal|full[:kvN] (kvN: N KV heads, grouped-query; the oracle check runs "
                  "multi-head, grouped-query heads are checked by the GPU tests)")
      ->capture_default_str();
  app->add_option("--numerics", c.numerics, "Comma-separated: fused, paper")->capture_default_str();
  app->add_option("--policy", c.policies, "Comma-separated shift policies: " + valid_names_shift_policy())->capture_default_str();
  app->add_option("--delta-source", c.delta_sources, "Comma-separated: " + valid_names_delta_source())->capture_default_str();
  app->add_option("--normalizer", c.normalizer, "fused: the row sums' terms, " + valid_names_normalizer())->capture_default_str();
  app->add_option("--layout", c.layout, "bhtd or bthd")->capture_default_str();
  app->add_flag("--deterministic", c.deterministic, "Deterministic backward (ordered dQ accumulation)");
  app->add_option("--warmup", c.warmup_s, "Warm-up seconds per measurement")->capture_default_str();
  app->add_option("--windows", c.windows, "Timing windows (the median is reported)")->capture_default_str();
  app->add_option("--min-window-ms", c.min_window_ms, "Minimum length of a window")->capture_default_str();
  app->add_option("--check-len", c.check_len, "Sequence length of the oracle check (B=1, H=2)")->capture_default_str();
  app->add_flag("--no-check", c.no_check, "Skip the oracle check");
  app->add_option("--json", c.json, "Write one JSON object per measurement to this file");
  app->add_option("--seed", c.seed, "Seed of the random inputs")->capture_default_str();
}

}  // namespace stableflash::cli
