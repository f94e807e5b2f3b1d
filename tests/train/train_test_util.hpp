// Small shards and a small config for trainer tests (no corpus needed).
#pragma once

#include <string>
#include <vector>

#include "stableflash/data/shards.hpp"
#include "stableflash/numerics/random.hpp"
#include "stableflash/train/config.hpp"

namespace stableflash::testing {

// Writes train_000000.bin, train_000001.bin and val_000000.bin of a learnable token stream into
// `dir`: 80% of tokens continue a cycle through 16 ids, the rest are uniform over the vocabulary.
inline void write_test_shards(const std::string& dir, int vocab = 256) {
  SplitMix64 rng(99);
  auto stream = [&](std::size_t n) {
    std::vector<std::uint16_t> t(n);
    std::uint32_t x = 0;
    for (auto& v : t) {
      x = rng.uniform() < 0.8 ? (x + 1) % 16u : std::uint32_t(rng.next() % std::uint64_t(vocab));
      v = std::uint16_t(x);
    }
    return t;
  };
  data::write_shard(dir + "/train_000000.bin", stream(20000));
  data::write_shard(dir + "/train_000001.bin", stream(5000));
  data::write_shard(dir + "/val_000000.bin", stream(3000));
}

inline train::TrainConfig small_config(const std::string& data_dir) {
  train::TrainConfig c = train::preset("tiny");
  c.model.n_layer = 2, c.model.n_head = 2, c.model.n_embd = 32, c.model.block_size = 16;
  c.model.vocab_size = 256, c.model.padded_vocab_size = 256;
  c.train.batch_size = 2, c.train.seq_len = 16, c.train.grad_accum = 2;
  c.train.steps = 6, c.train.val_every = 3, c.train.val_batches = 2, c.train.checkpoint_every = 3;
  c.optim.warmup_steps = 2, c.optim.decay_steps = 20, c.optim.lr = 1e-2;
  c.data.dir = data_dir;
  return c;
}

}  // namespace stableflash::testing
