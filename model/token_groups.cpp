// Rows of a micro-batch grouped by token id (see token_groups.hpp).
#include "stableflash/model/token_groups.hpp"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace stableflash::model {

int group_rows_by_token(std::span<const int> tokens, int vocab, int* ids, int* offsets, int* rows, std::vector<int>& scratch) {
  // scratch[v + 1] counts id v, then (prefix sums) scratch[v] is where id v's rows start.
  scratch.assign(std::size_t(vocab) + 1, 0);
  for (int t : tokens) {
    if (t < 0 || t >= vocab) throw std::out_of_range("token id " + std::to_string(t) + " outside [0, " + std::to_string(vocab) + ")");
    ++scratch[std::size_t(t) + 1];
  }
  int distinct = 0;
  for (int v = 0; v < vocab; ++v) {
    if (scratch[std::size_t(v) + 1] > 0) {
      ids[distinct] = v;
      offsets[distinct] = scratch[std::size_t(v)];
      ++distinct;
    }
    scratch[std::size_t(v) + 1] += scratch[std::size_t(v)];
  }
  offsets[distinct] = int(tokens.size());
  // Rows in ascending order into their groups: stable.
  for (std::size_t i = 0; i < tokens.size(); ++i) rows[scratch[std::size_t(tokens[i])]++] = int(i);
  return distinct;
}

}  // namespace stableflash::model
