// Loading GPT-2's ranks file (tiktoken format) into the encoder's tables; decoding; the
// ranks-file search path; GPT-2's byte -> unicode mapping.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "bpe_internal.hpp"
#include "stableflash/data/file_checks.hpp"

#ifndef STABLEFLASH_DEFAULT_GPT2_RANKS
#define STABLEFLASH_DEFAULT_GPT2_RANKS ".deps/gpt2.tiktoken"
#endif

namespace stableflash::data {
namespace {

constexpr std::string_view kEndOfTextText = "<|endoftext|>";

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw std::runtime_error(where + ": " + what); }

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 with padding, as tiktoken writes it.
bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (std::size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0, ++pad;
      } else {
        if (pad) return false;  // data after padding
        v[k] = base64_value(c);
        if (v[k] < 0) return false;
      }
    }
    const std::uint32_t w = std::uint32_t(v[0]) << 18 | std::uint32_t(v[1]) << 12 | std::uint32_t(v[2]) << 6 | std::uint32_t(v[3]);
    out.push_back(char(w >> 16));
    if (pad < 2) out.push_back(char(w >> 8 & 0xff));
    if (pad < 1) out.push_back(char(w & 0xff));
  }
  return true;
}

std::size_t pow2_at_least(std::size_t n) {
  std::size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

void build_tables(BpeTables& t, const std::vector<std::string>& tokens, const std::string& path) {
  const auto n = std::uint32_t(tokens.size());  // mergeable ranks; the special token follows
  t.offset.assign(1, 0);
  for (const auto& b : tokens) t.arena += b, t.offset.push_back(std::uint32_t(t.arena.size()));
  t.arena += kEndOfTextText;
  t.offset.push_back(std::uint32_t(t.arena.size()));

  t.slots.assign(pow2_at_least(std::size_t(n) * 2), 0);
  const std::size_t mask = t.slots.size() - 1;
  for (std::uint32_t id = 0; id < n; ++id) {
    const auto b = t.bytes(id);
    std::size_t i = hash_bytes(b.data(), b.size()) & mask;
    while (t.slots[i] != 0) i = (i + 1) & mask;
    t.slots[i] = id + 1;
  }
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    const std::uint32_t id = t.rank_of(&c, 1);
    if (id == kNoRank) bad(path, "byte " + std::to_string(b) + " has no token; a byte-level BPE needs all 256");
    t.byte_token[b] = id;
  }

  // Every way to write a token as two tokens is a merge producing it.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> pairs;
  for (std::uint32_t c = 0; c < n; ++c) {
    const auto b = t.bytes(c);
    for (std::size_t k = 1; k < b.size(); ++k) {
      const std::uint32_t l = t.rank_of(b.data(), k), r = t.rank_of(b.data() + k, b.size() - k);
      if (l != kNoRank && r != kNoRank) pairs.emplace_back(std::uint64_t(l) << 32 | r, c);
    }
  }
  t.pair_keys.assign(pow2_at_least(pairs.size() * 2 + 2), 0);
  t.pair_vals.assign(t.pair_keys.size(), 0);
  const std::size_t pmask = t.pair_keys.size() - 1;
  for (const auto& [k, v] : pairs) {
    std::size_t i = hash_u64(k + 1) & pmask;
    while (t.pair_keys[i] != 0) i = (i + 1) & pmask;
    t.pair_keys[i] = k + 1, t.pair_vals[i] = v;
  }

  t.all_space.assign(n + 1, 0);
  for (std::uint32_t id = 0; id < n; ++id) {
    bool all = true;
    for (char c : t.bytes(id)) all = all && (c == ' ' || c == '\n' || c == '\t');
    t.all_space[id] = all;
  }
}

}  // namespace

std::string resolve_gpt2_ranks_path(const std::string& explicit_path) {
  std::string path = explicit_path, from = "--ranks";
  if (path.empty()) {
    if (const char* env = std::getenv("STABLEFLASH_GPT2_RANKS"); env && *env)
      path = env, from = "$STABLEFLASH_GPT2_RANKS";
    else
      path = STABLEFLASH_DEFAULT_GPT2_RANKS, from = "the built-in default";
  }
  if (std::filesystem::is_directory(path))
    throw std::runtime_error("GPT-2 ranks file " + path + " (" + from + ") is a folder, expected the file gpt2.tiktoken");
  if (!std::filesystem::is_regular_file(path))
    throw std::runtime_error("GPT-2 ranks file not found at " + path + " (" + from +
                             "); scripts/setup-deps.sh fetches and verifies it, or pass --ranks / set STABLEFLASH_GPT2_RANKS");
  return path;
}

std::shared_ptr<const Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& ranks_path) {
  require_readable_file(ranks_path, "GPT-2 ranks file");
  std::ifstream in(ranks_path, std::ios::binary);
  if (!in) bad(ranks_path, std::string("cannot open GPT-2 ranks file: ") + std::strerror(errno));
  std::vector<std::string> tokens(kGpt2MergeableRanks);
  std::vector<bool> seen(kGpt2MergeableRanks, false);
  std::string line, bytes;
  std::size_t lineno = 0, count = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const std::string where = ranks_path + ":" + std::to_string(lineno);
    const auto sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      bad(where, "expected 'base64 rank' (tiktoken format)");
    if (!base64_decode(std::string_view(line).substr(0, sp), bytes)) bad(where, "bad base64 token");
    const std::string rank_text = line.substr(sp + 1);
    char* end = nullptr;
    const unsigned long rank = std::strtoul(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || rank_text[0] == '-') bad(where, "bad rank '" + rank_text + "'");
    if (rank >= kGpt2MergeableRanks)
      bad(where, "rank " + rank_text + " out of range: GPT-2 has ranks 0.." + std::to_string(kGpt2MergeableRanks - 1));
    if (seen[rank]) bad(where, "rank " + rank_text + " appears twice");
    seen[rank] = true, tokens[rank] = bytes, ++count;
  }
  if (count != kGpt2MergeableRanks)
    bad(ranks_path, "holds " + std::to_string(count) + " ranks, GPT-2's file holds " + std::to_string(kGpt2MergeableRanks) +
                        " (is this the gpt2.tiktoken file?)");
  std::shared_ptr<Gpt2Tokenizer> tok(new Gpt2Tokenizer());
  tok->path_ = ranks_path;
  tok->tables_ = std::make_unique<BpeTables>();
  build_tables(*tok->tables_, tokens, ranks_path);
  // Two ranks with the same bytes would make encoding ambiguous.
  for (std::uint32_t id = 0; id < kGpt2MergeableRanks; ++id) {
    const auto b = tok->tables_->bytes(id);
    if (tok->tables_->rank_of(b.data(), b.size()) != id) bad(ranks_path, "rank " + std::to_string(id) + " repeats the bytes of another rank");
  }
  tok->pre_ = std::make_unique<Pretokenizer>();
  return tok;
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::string_view Gpt2Tokenizer::token_bytes(std::uint32_t id) const {
  if (id >= kGpt2VocabSize) throw std::out_of_range("token id " + std::to_string(id) + " is not in GPT-2's vocabulary (0.." + std::to_string(kGpt2VocabSize - 1) + ")");
  return tables_->bytes(id);
}

std::string Gpt2Tokenizer::decode(std::span<const std::uint32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (const auto id : ids) out += token_bytes(id);
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const std::uint16_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (const auto id : ids) out += token_bytes(id);
  return out;
}

char32_t gpt2_byte_to_unicode(std::uint8_t b) {
  // GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes
  // to U+0100 onwards in byte order, so every token prints without control characters.
  const auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF); };
  if (printable(b)) return b;
  int n = 0;
  for (int x = 0; x < b; ++x) n += !printable(x);
  return char32_t(256 + n);
}

std::string gpt2_visible_token(std::string_view token_bytes) {
  std::string out;
  for (const char c : token_bytes) {
    const char32_t u = gpt2_byte_to_unicode(static_cast<std::uint8_t>(c));
    if (u < 0x80) {
      out += char(u);
    } else {  // all mapped code points are below U+0800: two UTF-8 bytes
      out += char(0xC0 | (u >> 6));
      out += char(0x80 | (u & 0x3F));
    }
  }
  return out;
}

}  // namespace stableflash::data
