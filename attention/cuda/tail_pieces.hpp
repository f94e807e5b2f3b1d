// Full attention's last round of the warp-specialized forward as pieces (host and device: the
// kernel's WsTileOrder, the launch's grid size and the CPU tests, tests/attention/launch_plan_test.cpp).
//
// Full-attention tiles are equal, so a last round of r tiles on S SMs takes a whole tile's time with
// S - r SMs idle. The schedule's last r tiles (head by head: the rest of one head and every head
// after it) are taken instead as items of `group` 64-row blocks of one head each, fewer than a
// tile's C: a CTA's consumers 0 .. group - 1 compute an item's blocks, the others have no rows. Any
// blocks of one head can share a CTA, since in full attention they walk the same K/V; and a row
// walks the same steps in an item as in a tile, so the bits do not change.
#pragma once

#include "stableflash/numerics/host_device.hpp"

namespace stableflash::attention::cuda {

struct WsTailPieces {
  // The split of a grid of batch_heads heads of q_len rows in tiles of `consumers` 64-row blocks,
  // whose last tail_tiles tiles go as items of `group` blocks (group 0: none).
  SF_HD static WsTailPieces of(int q_len, int batch_heads, int consumers, int tail_tiles, int group) {
    const int head_tiles = (q_len + 64 * consumers - 1) / (64 * consumers);
    return {(q_len + 63) / 64, head_tiles, consumers, head_tiles * batch_heads - tail_tiles, tail_tiles > 0 ? group : 0};
  }

  int blocks;       // 64-row blocks a head: ceil(Tq / 64)
  int head_tiles;   // tiles a head: ceil(Tq / (64 C))
  int consumers;    // C
  int first_tile;   // the schedule's first split tile (tiles - r)
  int group;        // 64-row blocks an item (1 .. C - 1; 0: nothing split)

  // The first split head's blocks from its first split tile on, and its items; every later head's.
  SF_HD int first_block() const { return first_tile % head_tiles * consumers; }
  SF_HD int first_head_items() const { return (blocks - first_block() + group - 1) / group; }
  SF_HD int head_items() const { return (blocks + group - 1) / group; }
  // Items of the schedule past first_tile, given the heads of the grid (batch x heads).
  SF_HD int items(int batch_heads) const {
    if (group <= 0) return 0;
    const int first_head = first_tile / head_tiles;
    return first_head_items() + (batch_heads - 1 - first_head) * head_items();
  }
  // The schedule's length: the tiles before the split, then the items.
  SF_HD int schedule(int batch_heads) const { return group > 0 ? first_tile + items(batch_heads) : head_tiles * batch_heads; }
  struct Item {
    int bh;      // batch x heads index
    int m0;      // its first row
    int blocks;  // its 64-row blocks (the head's last item may have fewer than group)
  };
  // Item q (0 .. items - 1).
  SF_HD Item at(int q) const {
    const int first_head = first_tile / head_tiles, in_first = first_head_items();
    int bh = first_head, block = first_block() + q * group;
    if (q >= in_first) {
      const int later = q - in_first;
      bh = first_head + 1 + later / head_items();
      block = later % head_items() * group;
    }
    const int left = blocks - block;
    return {bh, 64 * block, left < group ? left : group};
  }
};

}  // namespace stableflash::attention::cuda
