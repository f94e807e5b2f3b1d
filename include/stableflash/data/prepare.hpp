// `stableflash prepare`: a corpus (text, JSON lines, .zst) -> GPT-2 tokens -> llm.c shards,
// train and val, on all cores, the same bytes for the same inputs and seed on any machine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stableflash/data/tokenizer.hpp"

namespace stableflash::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  // Each document goes to val with this probability, decided by a hash of (seed, document index),
  // so the split does not depend on threads or batching.
  double val_fraction = 0.005;
  std::uint64_t seed = 1337;
  // Tokens per shard (llm.c's FineWeb shards hold 10^8); the last shard of a split is shorter.
  std::uint64_t shard_tokens = 100'000'000;
  int threads = 0;         // 0: every core
  bool overwrite = false;  // replace train_*/val_* shards already in out_dir instead of refusing
};

struct PrepareProgress {
  std::uint64_t bytes_consumed = 0, bytes_total = 0;  // input files on disk
  std::uint64_t text_bytes = 0, documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareSummary {
  PrepareProgress totals;
  std::uint64_t train_documents = 0, val_documents = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;
  int threads = 0;
};

// Runs the pipeline; `progress` (may be empty) is called from the calling thread after each batch
// and once at the end. Also writes OUT_DIR/prepare.json, a manifest of inputs, options and counts.
PrepareSummary prepare_shards(std::shared_ptr<const Gpt2Tokenizer> tokenizer, const PrepareOptions& options,
                              const std::function<void(const PrepareProgress&)>& progress = {});

// Whether document `index` belongs to the validation split for this seed and fraction.
bool is_val_document(std::uint64_t seed, std::uint64_t index, double val_fraction);

}  // namespace stableflash::data
