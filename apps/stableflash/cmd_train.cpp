// `stableflash train`: builds the config (preset, file, --set, --steps), then runs the trainer.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "stableflash/train/config.hpp"
#include "stableflash/train/signals.hpp"
#include "stableflash/train/trainer.hpp"

namespace stableflash::cli {
namespace {

struct TrainCommand {
  std::string preset, config_file, run_dir, replay, device = "auto";
  std::vector<std::string> sets;
  std::optional<long long> steps;
  int gpus = 0;
  bool resume = false, quiet = false, print_config = false;
};

std::string default_run_dir(const std::string& preset) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + preset + "-" + stamp;
}

void print_summary(const train::TrainConfig& c, const std::string& run_dir) {
  const auto layout = model::parameter_layout(c.model);
  long long params = 0;
  for (const auto& t : layout) params += t.size;
  std::fprintf(stderr, "stableflash train: preset %s, %d layers x %d heads x %d wide, context %d, %.2fM parameters\n", c.preset.c_str(),
               c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size, params / 1e6);
  const auto att = c.layer_attention();
  for (int l = 0; l < c.model.n_layer; ++l) {
    const auto& a = att[l];
    if (a.kind == model::AttentionKind::standard) {
      std::fprintf(stderr, "  layer %d attention: standard (materialized softmax, FP32)\n", l);
    } else {
      std::fprintf(stderr, "  layer %d attention: %s numerics, %s policy, delta %s, normalizer %s, round_bits %d\n", l,
                   std::string(attention::to_string(a.options.numerics)).c_str(), std::string(attention::to_string(a.options.policy)).c_str(),
                   std::string(attention::to_string(a.options.delta_source)).c_str(),
                   std::string(attention::to_string(a.options.normalizer)).c_str(), a.options.round_bits);
    }
  }
  std::fprintf(stderr, "  %s, lr %g, %lld steps of %lld tokens; data %s; run dir %s\n", std::string(optim::to_string(c.optim.kind)).c_str(),
               c.optim.lr, static_cast<long long>(c.train.steps), static_cast<long long>(c.tokens_per_step()), c.data.dir.c_str(),
               run_dir.c_str());
}

int run(const TrainCommand& cmd) {
  std::string run_dir = cmd.run_dir;
  // Checked here, not with CLI11's PositiveNumber, whose message reads "Value 0 not in range 0 to 1.79e308".
  if (cmd.steps && *cmd.steps < 1) throw std::invalid_argument("--steps must be >= 1 (got " + std::to_string(*cmd.steps) + ")");
  if (cmd.gpus > 1 && run_dir.empty() && !cmd.print_config)
    throw std::invalid_argument("--gpus needs --run-dir DIR (every rank must name the same run directory)");
  if (const int code = launch_ranks_if_asked(cmd.gpus); code >= 0) return code;
  const train::World world = train::world_from_environment();
  if (cmd.resume && run_dir.empty()) throw std::invalid_argument("--resume needs --run-dir DIR (the run to continue)");
  train::ConfigSources sources;
  sources.preset = cmd.preset;
  sources.resume_run_dir = cmd.resume ? run_dir : "";
  sources.config_file = cmd.config_file;
  sources.sets = cmd.sets;
  sources.steps = cmd.steps.value_or(0);
  const train::TrainConfig config = train::build_config(sources);
  if (cmd.print_config) {
    for (const auto& [k, v] : config.entries()) std::printf("%s=%s\n", k.c_str(), v.c_str());
    return 0;
  }
  if (run_dir.empty()) run_dir = default_run_dir(config.preset);
  if (!cmd.quiet && world.rank == 0) print_summary(config, run_dir);
  train::TrainOptions options;
  options.run_dir = run_dir;
  options.resume = cmd.resume;
  options.replay_log = cmd.replay;
  options.progress = !cmd.quiet;
  options.world = world;
  options.stop_on_signals = true;
  options.device = cmd.device == "cuda" ? train::TrainDevice::cuda : cmd.device == "cpu" ? train::TrainDevice::cpu : train::TrainDevice::automatic;
  const auto result = train::run_training(config, options);
  // The shell's convention for "ended by signal N" (130 for Ctrl-C, 143 for SIGTERM): scripts and
  // schedulers see the run was stopped, not finished.
  const int status = result.stopped_by_signal ? 128 + result.stopped_by_signal : 0;
  if (world.rank != 0) return status;
  if (result.stopped_by_signal) {
    const long long at = result.steps.empty() ? -1 : static_cast<long long>(result.steps.back().step + 1);
    std::fprintf(stderr, "stopped by %s", train::signal_name(result.stopped_by_signal));
    if (at >= 0) std::fprintf(stderr, " after step %lld of %lld", at, static_cast<long long>(config.train.steps));
    if (!result.last_checkpoint.empty())
      std::fprintf(stderr, "; checkpoint %s\ncontinue with: stableflash train --resume --run-dir %s\n", result.last_checkpoint.c_str(),
                   run_dir.c_str());
    else
      std::fprintf(stderr, " before any step; no checkpoint written\n");
    return status;
  }
  if (!result.steps.empty()) {
    const auto& last = result.steps.back();
    std::fprintf(stderr, "done: step %lld, loss %.4f%s; metrics in %s/metrics.jsonl, checkpoint %s\n", static_cast<long long>(last.step + 1),
                 last.loss, last.val_loss ? (", val loss " + std::to_string(*last.val_loss)).c_str() : "", run_dir.c_str(),
                 result.last_checkpoint.c_str());
  } else {
    std::fprintf(stderr, "nothing to do: the run is already at step %lld\n", static_cast<long long>(config.train.steps));
  }
  return 0;
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto cmd = std::make_shared<TrainCommand>();
  auto* sub = app.add_subcommand("train", "Train GPT-2 on a GPU or the CPU (tiny preset on the default corpus without arguments)");
  sub->add_option("--preset", cmd->preset, "Starting point: tiny (default), gpt2-124m, gpt2-350m");
  sub->add_option("--config", cmd->config_file, "TOML or JSON file of settings (keys: docs/training.md)")->check(CLI::ExistingFile);
  sub->add_option("--set", cmd->sets, "Override one key, e.g. --set attention.layer.1.delta_source=rounded (repeatable)");
  sub->add_option("--steps", cmd->steps, "Train up to this many optimizer steps (train.steps)");
  sub->add_option("--run-dir", cmd->run_dir, "Run directory (default runs/PRESET-DATE-TIME)");
  sub->add_option("--device", cmd->device, "Where to train: cuda, cpu, or auto (the default: cuda when this build has it and a GPU is visible)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  sub->add_option("--gpus", cmd->gpus, "Data parallel over N GPUs of this machine (one process per GPU, NCCL); "
                                        "several machines: launch with torchrun or srun instead (docs/training.md)")
      ->check(CLI::Range(1, 1024));
  sub->add_flag("--resume", cmd->resume, "Continue the run in --run-dir from its latest checkpoint");
  sub->add_option("--replay", cmd->replay, "Train on exactly the windows of this batch log (RUN/batches.log of an earlier run)")
      ->check(CLI::ExistingFile);
  sub->add_flag("--quiet", cmd->quiet, "No summary or progress bar");
  sub->add_flag("--print-config", cmd->print_config, "Print the resolved settings as key=value and exit");
  return [cmd] { return run(*cmd); };
}

}  // namespace stableflash::cli
