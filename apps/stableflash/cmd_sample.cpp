// `stableflash sample CHECKPOINT`: generates tokens from a trained model.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/sampling.hpp"

namespace stableflash::cli {
namespace {

struct SampleCommand {
  std::string path, prompt = "50256";
  train::SampleOptions options;
};

// Token ids -> text. The GPT-2 tokenizer lands with the data pipeline (issue "GPT-2 tokenizer and
// token-shard pipeline"); wire its decoder here, the only place that needs it. Until then the ids
// are printed alone.
std::optional<std::string> decode_tokens(const std::vector<int>& /*ids*/) { return std::nullopt; }

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::istringstream s(text);
  for (std::string tok; s >> tok;) {
    try {
      std::size_t used = 0;
      ids.push_back(std::stoi(tok, &used));
      if (used != tok.size()) throw std::invalid_argument(tok);
    } catch (const std::exception&) {
      throw std::invalid_argument("--prompt-tokens: '" + tok + "' is not a token id");
    }
  }
  return ids;
}

int run(const SampleCommand& cmd) {
  namespace fs = std::filesystem;
  // A run directory means its latest checkpoint.
  const std::string dir = fs::exists(fs::path(cmd.path) / "checkpoints" / "latest") ? train::latest_checkpoint(cmd.path) : cmd.path;
  const train::Checkpoint ckpt = train::open_checkpoint(dir);
  model::Gpt2<float> model(ckpt.config.model, ckpt.config.layer_attention());
  train::load_weights(ckpt, model);
  const auto prompt = parse_ids(cmd.prompt);
  for (int id : prompt)
    if (id < 0 || id >= model.config().vocab_size)
      throw std::invalid_argument("--prompt-tokens: id " + std::to_string(id) + " outside the vocabulary [0, " +
                                  std::to_string(model.config().vocab_size) + ")");
  const auto out = train::generate(model, prompt, cmd.options);
  for (std::size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
  std::printf("\n");
  if (const auto text = decode_tokens(out)) std::printf("%s\n", text->c_str());
  return 0;
}

}  // namespace

Runner add_sample_command(CLI::App& app) {
  auto cmd = std::make_shared<SampleCommand>();
  auto* sub = app.add_subcommand("sample", "Generate tokens from a checkpoint (or a run directory's latest checkpoint)");
  sub->add_option("checkpoint", cmd->path, "Checkpoint folder or run directory")->required();
  sub->add_option("--prompt-tokens", cmd->prompt, "Prompt as space-separated token ids (default: 50256, <|endoftext|>)");
  sub->add_option("-n,--tokens", cmd->options.max_new_tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", cmd->options.temperature, "Softmax temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", cmd->options.top_k, "Sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", cmd->options.seed, "Sampling seed");
  return [cmd] { return run(*cmd); };
}

}  // namespace stableflash::cli
