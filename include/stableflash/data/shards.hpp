// Token shards in llm.c's format, and the loader primitives the trainer samples batches from.
// Format (llm.c, docs/tokenizer.md): a 1024-byte header of 256 little-endian int32 — magic 20240520,
// version 1, token count, the rest zero — then `count` uint16 tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stableflash/data/tokenizer.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::data {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 256 * sizeof(std::int32_t);

// Writes a shard atomically (temporary file + rename). Throws naming `path` on failure.
void write_shard(const std::string& path, std::span<const std::uint16_t> tokens);

// Passed as a vocabulary size: every uint16 is accepted (no id check).
inline constexpr std::uint32_t kAnyTokenId = 0x10000;

// A validated, read-only, memory-mapped shard. Bad files are refused with an error naming the file
// and what is wrong (short header, bad magic or version, truncated body, odd byte count, a token id
// >= vocab_size with its offset). Version-1 llm.c shards hold GPT-2 tokens, hence the default; a
// model with another vocabulary passes its model.vocab_size.
class Shard {
 public:
  static Shard open(const std::string& path, std::uint32_t vocab_size = kGpt2VocabSize);
  Shard(Shard&&) noexcept;
  Shard& operator=(Shard&&) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  const std::string& path() const { return path_; }
  std::span<const std::uint16_t> tokens() const { return {tokens_, count_}; }

 private:
  Shard() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint16_t* tokens_ = nullptr;
  std::size_t count_ = 0;
};

// The shards of one split in a folder, OUTDIR/{split}_NNNNNN.bin, in name order.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);

// Where a training window starts: shard index and token offset. Logged per step for replay.
struct WindowStart {
  std::uint32_t shard = 0;
  std::uint64_t offset = 0;
  bool operator==(const WindowStart&) const = default;
};

// All shards of a split, sampled uniformly over every valid window start (windows never cross a
// shard boundary), reproducibly from a SplitMix64 stream.
class ShardSet {
 public:
  // Opens (and validates, ids included: see Shard::open) every shard up front.
  explicit ShardSet(const std::vector<std::string>& paths, std::uint32_t vocab_size = kGpt2VocabSize);
  std::size_t shard_count() const { return shards_.size(); }
  const Shard& shard(std::size_t i) const { return shards_[i]; }
  std::uint64_t total_tokens() const { return total_tokens_; }

  // Number of distinct windows of `len` tokens (0 if no shard is long enough).
  std::uint64_t window_count(std::size_t len) const;
  // A uniformly random window start; throws if no shard holds `len` tokens.
  WindowStart sample(SplitMix64& rng, std::size_t len) const;
  // The tokens of a window; throws naming the shard if it does not fit (e.g. a replayed log
  // from other data).
  std::span<const std::uint16_t> window(const WindowStart& w, std::size_t len) const;

 private:
  std::vector<Shard> shards_;
  std::uint64_t total_tokens_ = 0;
};

}  // namespace stableflash::data
