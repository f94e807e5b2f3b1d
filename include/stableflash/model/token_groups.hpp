// The rows of a micro-batch grouped by token id: what the deterministic embedding backward needs
// (each distinct token's gradient row summed over its rows in a fixed order, without atomics).
// Host code, shared by the CUDA model's batch staging and its tests.
#pragma once

#include <span>
#include <vector>

namespace stableflash::model {

// Groups the rows 0..n-1 of `tokens` (n = tokens.size(), every id in [0, vocab)) by token id:
//   ids[0, distinct)       the distinct token ids, ascending;
//   offsets[0, distinct]   where each id's rows start in `rows` (offsets[distinct] = n);
//   rows[0, n)             the row indices, grouped by id and ascending within a group.
// Exactly the order of std::stable_sort of 0..n-1 by token id, by a counting sort: O(n + vocab)
// (for N = 16384 rows of GPT-2's 50304 ids, about 0.04 ms against 0.6-0.9 ms for the sort).
// `scratch` is resized to vocab + 1. Returns distinct. Throws std::out_of_range for an id outside
// [0, vocab).
int group_rows_by_token(std::span<const int> tokens, int vocab, int* ids, int* offsets, int* rows, std::vector<int>& scratch);

}  // namespace stableflash::model
