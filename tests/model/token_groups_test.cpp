// The batch staging's grouping of rows by token id (stableflash/model/token_groups.hpp): a counting
// sort that must give exactly what std::stable_sort of the row indices by token gave (the CUDA
// model's embedding backward sums each token's rows in this order, so the bits depend on it).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "stableflash/model/token_groups.hpp"

namespace stableflash::model {
namespace {

struct Groups {
  std::vector<int> ids, offsets, rows;
  bool operator==(const Groups&) const = default;
};

// The previous implementation: stable_sort of 0..n-1 by token, then the distinct ids and starts.
Groups by_stable_sort(const std::vector<int>& tokens) {
  Groups g;
  g.rows.resize(tokens.size());
  std::iota(g.rows.begin(), g.rows.end(), 0);
  std::stable_sort(g.rows.begin(), g.rows.end(), [&](int a, int b) { return tokens[std::size_t(a)] < tokens[std::size_t(b)]; });
  for (std::size_t i = 0; i < g.rows.size(); ++i) {
    const int t = tokens[std::size_t(g.rows[i])];
    if (g.ids.empty() || g.ids.back() != t) g.ids.push_back(t), g.offsets.push_back(int(i));
  }
  g.offsets.push_back(int(tokens.size()));
  return g;
}

Groups by_counting(const std::vector<int>& tokens, int vocab) {
  const std::size_t n = tokens.size();
  Groups g;
  g.ids.assign(n, -7), g.offsets.assign(n + 1, -7), g.rows.assign(n, -7);
  std::vector<int> scratch;
  const int distinct = group_rows_by_token(tokens, vocab, g.ids.data(), g.offsets.data(), g.rows.data(), scratch);
  g.ids.resize(std::size_t(distinct));
  g.offsets.resize(std::size_t(distinct) + 1);
  return g;
}

TEST(TokenGroups, CountingSortEqualsStableSort) {
  std::mt19937 rng(5);
  for (const int vocab : {1, 2, 17, 50304})
    for (const int n : {1, 2, 31, 1000, 16384}) {
      std::uniform_int_distribution<int> all(0, vocab - 1), few(0, std::min(vocab, 3) - 1);
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<int> tokens(static_cast<std::size_t>(n));
        // Uniform ids, then a few ids repeated many times (text-like), then the extremes only.
        for (auto& t : tokens) t = trial == 0 ? all(rng) : trial == 1 ? few(rng) : (rng() % 2 ? 0 : vocab - 1);
        EXPECT_EQ(by_counting(tokens, vocab), by_stable_sort(tokens)) << "vocab " << vocab << ", n " << n << ", trial " << trial;
      }
    }
}

TEST(TokenGroups, RefusesIdsOutsideTheVocabulary) {
  std::vector<int> ids(2), offsets(3), rows(2), scratch;
  EXPECT_THROW(group_rows_by_token(std::vector<int>{0, 5}, 5, ids.data(), offsets.data(), rows.data(), scratch), std::out_of_range);
  EXPECT_THROW(group_rows_by_token(std::vector<int>{-1, 0}, 5, ids.data(), offsets.data(), rows.data(), scratch), std::out_of_range);
}

}  // namespace
}  // namespace stableflash::model
