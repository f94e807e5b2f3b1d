// `stableflash sample CHECKPOINT`: generates tokens from a trained model.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "stableflash/data/tokenizer.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/sampling.hpp"

namespace stableflash::cli {
namespace {

struct SampleCommand {
  std::string path, prompt_tokens, prompt_text, ranks;
  train::SampleOptions options;
};

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

// Token ids -> text with GPT-2's tokenizer. Ids in the vocabulary's padding (50257..50303, never
// trained on) have no text and are left out. Without a ranks file the ids are printed alone.
std::optional<std::string> decode_tokens(const std::vector<int>& ids, const std::string& ranks) {
  std::string path;
  try {
    path = data::resolve_gpt2_ranks_path(ranks);
  } catch (const std::exception& e) {
    if (!ranks.empty()) throw;
    std::fprintf(stderr, "sample: no GPT-2 ranks file, printing ids only (%s)\n", e.what());
    return std::nullopt;
  }
  std::vector<std::uint32_t> known;
  for (int id : ids)
    if (id >= 0 && std::uint32_t(id) < data::kGpt2VocabSize) known.push_back(std::uint32_t(id));
  return data::Gpt2Tokenizer::load(path)->decode(known);
}

// The prompt: ids given as numbers, or text encoded with GPT-2's tokenizer after the document
// separator (each training document starts with <|endoftext|>), or the separator alone.
std::vector<int> prompt_ids(const SampleCommand& cmd) {
  if (!cmd.prompt_tokens.empty() && !cmd.prompt_text.empty())
    throw std::invalid_argument("--prompt and --prompt-tokens: give one of them");
  if (!cmd.prompt_tokens.empty()) return parse_ids(cmd.prompt_tokens);
  std::vector<int> ids{int(data::kEndOfText)};
  if (!cmd.prompt_text.empty()) {
    data::Gpt2Encoder enc(data::Gpt2Tokenizer::load(data::resolve_gpt2_ranks_path(cmd.ranks)));
    for (std::uint32_t t : enc.encode(cmd.prompt_text)) ids.push_back(int(t));
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
  const auto prompt = prompt_ids(cmd);
  for (int id : prompt)
    if (id < 0 || id >= model.config().vocab_size)
      throw std::invalid_argument("--prompt-tokens: id " + std::to_string(id) + " outside the vocabulary [0, " +
                                  std::to_string(model.config().vocab_size) + ")");
  const auto out = train::generate(model, prompt, cmd.options);
  for (std::size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
  std::printf("\n");
  if (const auto text = decode_tokens(out, cmd.ranks)) std::printf("%s\n", text->c_str());
  return 0;
}

}  // namespace

Runner add_sample_command(CLI::App& app) {
  auto cmd = std::make_shared<SampleCommand>();
  auto* sub = app.add_subcommand("sample", "Generate tokens from a checkpoint (or a run directory's latest checkpoint)");
  sub->add_option("checkpoint", cmd->path, "Checkpoint folder or run directory")->required();
  sub->add_option("--prompt", cmd->prompt_text, "Prompt text, encoded with GPT-2's tokenizer after <|endoftext|>");
  sub->add_option("--prompt-tokens", cmd->prompt_tokens, "Prompt as space-separated token ids (default: 50256, <|endoftext|>)");
  sub->add_option("--ranks", cmd->ranks, "GPT-2 ranks file (default: $STABLEFLASH_GPT2_RANKS, else the set-up's .deps/gpt2.tiktoken)");
  sub->add_option("-n,--tokens", cmd->options.max_new_tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", cmd->options.temperature, "Softmax temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", cmd->options.top_k, "Sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", cmd->options.seed, "Sampling seed");
  return [cmd] { return run(*cmd); };
}

}  // namespace stableflash::cli
