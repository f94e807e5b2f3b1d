// libFuzzer target: the shard reader on arbitrary files. A file is either refused with an error
// (std::runtime_error naming it) or accepted with a token count that matches its size exactly,
// and then every token and sampled window can be read.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "stableflash/data/shards.hpp"

using namespace stableflash::data;

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  static const std::string path = "/tmp/stableflash_fuzz_shard_" + std::to_string(::getpid()) + ".bin";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  try {
    const Shard s = Shard::open(path);
    if (kShardHeaderBytes + 2 * s.tokens().size() != size) {
      std::fprintf(stderr, "fuzz_shard: accepted a shard whose size does not match its header\n");
      std::abort();
    }
    unsigned sum = 0;
    for (const auto t : s.tokens()) sum += t;  // touch every mapped token
    if (!s.tokens().empty()) {
      ShardSet set({path});
      stableflash::SplitMix64 rng(sum);
      const auto w = set.sample(rng, 1);
      (void)set.window(w, 1);
    }
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find(path) != 0) {
      std::fprintf(stderr, "fuzz_shard: error does not name the file: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
