// `stableflash encode` and `stableflash decode`: GPT-2 tokens of a text, and text of tokens
// (given as JSON or read from a shard range).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "commands.hpp"
#include "stableflash/data/file_checks.hpp"
#include "stableflash/data/shards.hpp"
#include "stableflash/data/tokenizer.hpp"

namespace stableflash::cli {
namespace {

using namespace stableflash::data;

std::string read_all(const std::string& path) {
  if (path.empty() || path == "-") return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  require_readable_file(path, "text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open text file: " + std::strerror(errno));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_stdout(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) throw std::runtime_error("cannot write to standard output");
}

struct EncodeCommand {
  std::string file, ranks;
  bool visible = false, bench = false;
};

// The peer's timing protocol (tiktoken_peer.py bench): input already in memory -> list of ids,
// one thread, median of 5 runs after a warm-up, each run with a fresh encoder (no warm cache).
int run_bench(const std::shared_ptr<const Gpt2Tokenizer>& tok, const std::string& text) {
  Gpt2Encoder(tok).encode(text);  // warm-up: page in the tables
  std::vector<double> times;
  std::size_t tokens = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Gpt2Encoder enc(tok);
    tokens = enc.encode(text).size();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double dt = times[2];
  nlohmann::json j = {{"peer", "stableflash"}, {"bytes", text.size()}, {"tokens", tokens}, {"seconds", dt},
                      {"MB_per_s", double(text.size()) / dt / 1e6}, {"threads", 1}};
  write_stdout(j.dump() + "\n");
  return 0;
}

int run_encode(const EncodeCommand& c) {
  std::ios::sync_with_stdio(false);
  const std::string text = read_all(c.file);
  auto tok = Gpt2Tokenizer::load(resolve_gpt2_ranks_path(c.ranks));
  if (c.bench) return run_bench(tok, text);
  Gpt2Encoder enc(tok);
  const auto ids = enc.encode(text);
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";  // Python's json.dumps layout, so outputs diff cleanly against tiktoken's
    if (c.visible)
      out += nlohmann::json(gpt2_visible_token(tok->token_bytes(ids[i]))).dump();
    else
      out += std::to_string(ids[i]);
  }
  out += "]\n";
  write_stdout(out);
  return 0;
}

// An offending element is quoted, but never whole: one can be megabytes long.
std::string capped(const std::string& s, std::size_t max = 80) {
  if (s.size() <= max) return s;
  return s.substr(0, max) + "... (" + std::to_string(s.size()) + " bytes in all)";
}

// A token list needs depth 1. The bound keeps printing an offending element (nlohmann's dump
// recurses once per level) far from exhausting the stack; 128 is serde_json's default limit.
constexpr int kMaxJsonDepth = 128;

nlohmann::json parse_token_list(const std::string& text) {
  auto bounded = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      throw std::runtime_error("standard input: JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                               " levels; expected a flat array of token ids");
    return true;
  };
  try {
    return nlohmann::json::parse(text, bounded);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error("standard input: expected a JSON array of token ids: " + capped(e.what(), 200));
  }
}

struct DecodeCommand {
  std::string ranks, shard;
  std::uint64_t start = 0;
  std::int64_t count = -1;
};

int run_decode(const DecodeCommand& c) {
  auto tok = Gpt2Tokenizer::load(resolve_gpt2_ranks_path(c.ranks));
  if (!c.shard.empty()) {
    const Shard s = Shard::open(c.shard);
    const auto t = s.tokens();
    if (c.start > t.size())
      throw std::runtime_error(c.shard + ": --start " + std::to_string(c.start) + " is past its " + std::to_string(t.size()) + " tokens");
    const std::size_t n = c.count < 0 ? t.size() - c.start : std::min<std::size_t>(std::size_t(c.count), t.size() - c.start);
    write_stdout(tok->decode(t.subspan(c.start, n)));
    return 0;
  }
  const nlohmann::json j = parse_token_list(read_all("-"));
  if (!j.is_array()) throw std::runtime_error("standard input: expected a JSON array of token ids");
  std::vector<std::uint32_t> ids;
  ids.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_unsigned()) throw std::runtime_error("standard input: element " + std::to_string(i) + " is not a token id: " + capped(j[i].dump()));
    const auto v = j[i].get<std::uint64_t>();
    if (v >= kGpt2VocabSize) throw std::runtime_error("standard input: element " + std::to_string(i) + ": token id " + std::to_string(v) + " is not in GPT-2's vocabulary (0..50256)");
    ids.push_back(std::uint32_t(v));
  }
  write_stdout(tok->decode(ids));
  return 0;
}

// CLI11 reads "-5" into an unsigned as 2^64-5, and --count -5 would mean "to the end" (-1 inside).
const CLI::Validator kNonNegative(
    [](std::string& v) { return v.starts_with('-') ? std::string("must be 0 or more (leave the option out for its default)") : std::string(); },
    "N>=0");

const char* kRanksHelp = "GPT-2 ranks file in tiktoken format (default: $STABLEFLASH_GPT2_RANKS, else the set-up's .deps/gpt2.tiktoken)";

}  // namespace

Runner add_encode_command(CLI::App& app) {
  auto c = std::make_shared<EncodeCommand>();
  CLI::App* sub = app.add_subcommand("encode", "Print the GPT-2 token ids of a text as a JSON array (tiktoken's encode_ordinary)");
  sub->add_option("file", c->file, "Text file (standard input when absent or '-')");
  sub->add_option("--ranks", c->ranks, kRanksHelp);
  sub->add_flag("--visible", c->visible, "Print each token's bytes as GPT-2 shows them (\"Ġthe\") instead of ids");
  sub->add_flag("--bench", c->bench, "Print single-thread encode throughput as JSON (tiktoken_peer.py's bench protocol)");
  return [c] { return run_encode(*c); };
}

Runner add_decode_command(CLI::App& app) {
  auto c = std::make_shared<DecodeCommand>();
  CLI::App* sub = app.add_subcommand("decode", "Turn GPT-2 token ids (a JSON array on standard input, or a shard range) back into bytes");
  sub->add_option("--shard", c->shard, "Read the tokens from this llm.c shard instead of standard input");
  sub->add_option("--start", c->start, "First token of the shard range")->capture_default_str()->check(kNonNegative);
  sub->add_option("--count", c->count, "Tokens in the shard range (default: to the end)")
      ->check(kNonNegative);
  sub->add_option("--ranks", c->ranks, kRanksHelp);
  return [c] { return run_decode(*c); };
}

}  // namespace stableflash::cli
