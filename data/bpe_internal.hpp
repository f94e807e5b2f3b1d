// Internals of the GPT-2 tokenizer shared by its .cpp files (not a public header).
#pragma once

// 8-bit code units: the tokenizer works on UTF-8 bytes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "stableflash/data/tokenizer.hpp"

namespace stableflash::data {

inline constexpr std::uint32_t kNoRank = UINT32_MAX;

// A fast 64-bit hash of short byte strings (pieces are a few bytes; std::hash is slower).
inline std::uint64_t hash_bytes(const char* p, std::size_t n) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    p += 8, n -= 8;
  }
  if (n) {
    std::uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

inline std::uint64_t hash_u64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// The ranks as tables tuned for the encoder: token bytes in one arena, an open-addressing map
// bytes -> rank, and a map (left token, right token) -> merged token. Token ids are ranks, so a
// merge's priority is the id it produces; looking merges up by token pair is equivalent to
// tiktoken's lookup of the concatenated bytes because every part is always a whole token.
struct BpeTables {
  std::string arena;                    // all token bytes, special token last
  std::vector<std::uint32_t> offset;    // token i is arena[offset[i], offset[i+1])
  std::vector<std::uint32_t> slots;     // bytes -> rank+1 (0 = empty); size a power of two
  std::vector<std::uint64_t> pair_keys; // (a << 32 | b) + 1 (0 = empty)
  std::vector<std::uint32_t> pair_vals; // merged token
  std::uint32_t byte_token[256] = {};
  std::vector<std::uint8_t> all_space;  // token bytes are all ' ', '\n', '\t' (tiktoken's rule)

  std::string_view bytes(std::uint32_t id) const { return {arena.data() + offset[id], offset[id + 1] - offset[id]}; }

  // The rank of a mergeable token with exactly these bytes, or kNoRank.
  std::uint32_t rank_of(const char* p, std::size_t n) const { return rank_of(p, n, hash_bytes(p, n)); }
  std::uint32_t rank_of(const char* p, std::size_t n, std::uint64_t hash) const {
    const std::size_t mask = slots.size() - 1;
    for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
      const std::uint32_t s = slots[i];
      if (s == 0) return kNoRank;
      const std::uint32_t id = s - 1;
      if (offset[id + 1] - offset[id] == n && std::memcmp(arena.data() + offset[id], p, n) == 0) return id;
    }
  }

  // The token that merging adjacent tokens a and b makes, or kNoRank.
  std::uint32_t pair(std::uint32_t a, std::uint32_t b) const {
    const std::uint64_t key = (std::uint64_t(a) << 32 | b) + 1;
    const std::size_t mask = pair_keys.size() - 1;
    for (std::size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
      if (pair_keys[i] == key) return pair_vals[i];
      if (pair_keys[i] == 0) return kNoRank;
    }
  }
};

// Reusable buffers of the merge loop, so that encoding a piece allocates nothing.
struct MergeScratch {
  std::vector<std::uint32_t> tok, rank, prev, next;
  std::vector<std::uint64_t> heap;
};

// Appends the BPE tokens of `piece` to `out` (the piece has at least 2 bytes). Repeatedly merges
// the adjacent pair whose merged token has the lowest rank, the leftmost one among equals, like
// tiktoken's byte_pair_encode; O(n^2) with tiny constants for short pieces, O(n log n) for long.
void bpe_merge(const BpeTables& t, std::string_view piece, std::vector<std::uint32_t>& out, MergeScratch& s);

// GPT-2's pre-tokenization pattern compiled by PCRE2 (UTF, Unicode properties, JIT).
class Pretokenizer {
 public:
  Pretokenizer();
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Per-thread matching state.
  class Matcher {
   public:
    explicit Matcher(const Pretokenizer& p);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // End of the piece starting at `pos` of valid UTF-8 `text` (pos < size). The pattern
    // matches every character, so pieces tile the text.
    std::size_t piece_end(std::string_view text, std::size_t pos);

   private:
    const Pretokenizer& p_;
    pcre2_match_data* md_ = nullptr;
    pcre2_match_context* mctx_ = nullptr;
    pcre2_jit_stack* stack_ = nullptr;
  };

  static const char* pattern();
  bool jit() const { return jit_; }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace stableflash::data
