// Shared by the tokenizer tests: the tokenizer (loaded once), the tiktoken peer, text generators.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stableflash/data/tokenizer.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::testing {

using data::Gpt2Encoder;
using data::Gpt2Tokenizer;

// The set-up (scripts/setup-deps.sh) always installs the ranks file, so its absence is a failure
// (with the way out in the message), never a skip.
inline std::shared_ptr<const Gpt2Tokenizer> gpt2() {
  static const std::shared_ptr<const Gpt2Tokenizer> tok = Gpt2Tokenizer::load(data::resolve_gpt2_ranks_path());
  return tok;
}

inline std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6)), s += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += char(0xE0 | (c >> 12)), s += char(0x80 | ((c >> 6) & 0x3F)), s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xF0 | (c >> 18)), s += char(0x80 | ((c >> 12) & 0x3F)), s += char(0x80 | ((c >> 6) & 0x3F)), s += char(0x80 | (c & 0x3F));
  }
  return s;
}

// tiktoken on many inputs at once (tests/peers/tiktoken_batch.py, the project's copy of
// ../shared/peers/tiktoken_peer.py). nullopt with `why` set when tiktoken is not installed.
inline std::optional<std::vector<std::vector<std::uint32_t>>> tiktoken_encode(const std::vector<std::string>& inputs, std::string& why) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("stableflash_peer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string in = (dir / "in.bin").string(), err = (dir / "err.txt").string();
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& s : inputs) {
      const auto n = std::uint32_t(s.size());
      const char len[4] = {char(n), char(n >> 8), char(n >> 16), char(n >> 24)};
      f.write(len, 4).write(s.data(), std::streamsize(s.size()));
    }
  }
  const std::string src = STABLEFLASH_SOURCE_DIR;
  const std::string cmd = "PYTHONPATH='" + src + "/.deps/python' python3 '" + src + "/tests/peers/tiktoken_batch.py' --ranks '" +
                          gpt2()->ranks_path() + "' < '" + in + "' 2> '" + err + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[1 << 16];
  for (std::size_t n; p && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  std::ifstream ef(err);
  const std::string errors{std::istreambuf_iterator<char>(ef), std::istreambuf_iterator<char>()};
  fs::remove_all(dir);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    why = errors;
    return std::nullopt;
  }
  if (status != 0) throw std::runtime_error("tiktoken peer failed (" + cmd + "): " + errors);
  std::vector<std::vector<std::uint32_t>> result;
  std::size_t start = 0;
  for (std::size_t nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1)
    result.push_back(nlohmann::json::parse(out.substr(start, nl - start)).get<std::vector<std::uint32_t>>());
  if (result.size() != inputs.size())
    throw std::runtime_error("tiktoken peer answered " + std::to_string(result.size()) + " of " + std::to_string(inputs.size()) + " inputs");
  return result;
}

// Skips when tiktoken is missing on a developer's machine; in CI (CI=true) the set-up must have
// installed it, so there a missing peer fails instead of hiding the comparison.
#define SF_TIKTOKEN_OR_SKIP(var, inputs)                                                              \
  std::string why_##var;                                                                              \
  auto var = ::stableflash::testing::tiktoken_encode(inputs, why_##var);                              \
  if (!var) {                                                                                         \
    const char* ci = std::getenv("CI");                                                               \
    if (ci && std::string(ci) == "true") FAIL() << "tiktoken peer missing in CI: " << why_##var;     \
    GTEST_SKIP() << "tiktoken is not installed (scripts/setup-deps.sh installs it): " << why_##var;   \
  }

// A deterministic mixture of the things the pattern and the merges have to get right.
inline std::string random_mixed_text(SplitMix64& rng, std::size_t pieces) {
  static const std::vector<std::string> pool = {
      "the", " the", "The", "Hello", " world", "don't", "I'm", "we'll", "they've", "'s", "'S", "'t", "'re", "'ve", "'m",
      "'ll", "'d", "'", "\"", "12", "3456789", " 42", "٣٤", "²", "Ⅻ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n",
      "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\ufeff", "é", "e\u0301", "a\u0300\u0316\u0317", "ß", "Ω", "мир", "世界",
      "日本語", "한국어", "العربية", "עברית", "हिन्दी", "ไทย", "👍", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "🤖", "𝔘𝔫𝔦", "𐍈",
      "\U0002A6D6", "!", "?!", "...", "--", "(", ")", "{}", "<|endoftext|>", "://", "#", "@", "$", "%", "_", "`", "~",
      "\x01", "\x7f", "A", "Z", "z", "\u01c5", "\u02b0", "\u3007"};
  std::string s;
  for (std::size_t i = 0; i < pieces; ++i) s += pool[rng.next() % pool.size()];
  return s;
}

}  // namespace stableflash::testing
