// The BPE merge loop. Semantics are tiktoken's byte_pair_encode: among adjacent pairs whose
// concatenation is a token, merge the one of lowest rank (leftmost on ties) until none is left.
#include <algorithm>
#include <functional>

#include "bpe_internal.hpp"

namespace stableflash::data {
namespace {

// Up to this many bytes a flat array with a linear minimum scan beats a heap (cache-friendly,
// no pointer chasing); pieces of ordinary text are far shorter.
constexpr std::size_t kSmallPiece = 96;

void merge_small(const BpeTables& t, std::string_view piece, std::vector<std::uint32_t>& out, MergeScratch& s) {
  std::size_t n = piece.size();
  s.tok.resize(n);
  s.rank.resize(n);
  std::uint32_t* tok = s.tok.data();
  std::uint32_t* rank = s.rank.data();  // rank[i]: token made by merging tok[i] and tok[i+1]
  for (std::size_t i = 0; i < n; ++i) tok[i] = t.byte_token[static_cast<unsigned char>(piece[i])];
  for (std::size_t i = 0; i + 1 < n; ++i) rank[i] = t.pair(tok[i], tok[i + 1]);
  rank[n - 1] = kNoRank;
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;  // strict: the leftmost of equal ranks wins
    if (rank[best] == kNoRank) break;
    tok[best] = rank[best];
    std::copy(tok + best + 2, tok + n, tok + best + 1);
    std::copy(rank + best + 2, rank + n, rank + best + 1);
    --n;
    rank[best] = best + 1 < n ? t.pair(tok[best], tok[best + 1]) : kNoRank;
    if (best > 0) rank[best - 1] = t.pair(tok[best - 1], tok[best]);
  }
  out.insert(out.end(), tok, tok + n);
}

// Long pieces (whitespace runs, the tail after invalid UTF-8): a doubly linked list of parts
// and a min-heap of candidate merges keyed (rank, start), stale entries skipped when popped.
void merge_large(const BpeTables& t, std::string_view piece, std::vector<std::uint32_t>& out, MergeScratch& s) {
  const std::size_t n = piece.size();
  constexpr std::uint32_t kEnd = UINT32_MAX;
  s.tok.resize(n), s.rank.resize(n), s.prev.resize(n), s.next.resize(n);
  auto& heap = s.heap;
  heap.clear();
  // A heap entry packs (rank, start) so that comparing the integers orders by rank, then start.
  auto key = [](std::uint32_t rank, std::uint32_t start) { return std::uint64_t(rank) << 32 | start; };
  for (std::size_t i = 0; i < n; ++i) {
    s.tok[i] = t.byte_token[static_cast<unsigned char>(piece[i])];
    s.prev[i] = i == 0 ? kEnd : std::uint32_t(i - 1);
    s.next[i] = i + 1 == n ? kEnd : std::uint32_t(i + 1);
  }
  for (std::size_t i = 0; i < n; ++i) {
    s.rank[i] = i + 1 < n ? t.pair(s.tok[i], s.tok[i + 1]) : kNoRank;
    if (s.rank[i] != kNoRank) heap.push_back(key(s.rank[i], std::uint32_t(i)));
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  auto push = [&](std::uint32_t rank, std::uint32_t start) {
    heap.push_back(key(rank, start));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const std::uint64_t top = heap.back();
    heap.pop_back();
    const auto rank = std::uint32_t(top >> 32), left = std::uint32_t(top);
    // Valid iff the pair starting at `left` still makes this token: ranks name unique tokens,
    // so an equal rank means the same two parts.
    if (s.rank[left] != rank) continue;
    const std::uint32_t right = s.next[left];
    s.tok[left] = rank;
    s.rank[right] = kNoRank;  // `right` is gone; its queued merges become stale
    s.next[left] = s.next[right];
    if (s.next[left] != kEnd) s.prev[s.next[left]] = left;
    s.rank[left] = s.next[left] != kEnd ? t.pair(s.tok[left], s.tok[s.next[left]]) : kNoRank;
    if (s.rank[left] != kNoRank) push(s.rank[left], left);
    if (const std::uint32_t p = s.prev[left]; p != kEnd) {
      s.rank[p] = t.pair(s.tok[p], s.tok[left]);
      if (s.rank[p] != kNoRank) push(s.rank[p], p);
    }
  }
  for (std::uint32_t i = 0; i != kEnd; i = s.next[i]) out.push_back(s.tok[i]);
}

}  // namespace

void bpe_merge(const BpeTables& t, std::string_view piece, std::vector<std::uint32_t>& out, MergeScratch& s) {
  if (piece.size() <= kSmallPiece)
    merge_small(t, piece, out, s);
  else
    merge_large(t, piece, out, s);
}

}  // namespace stableflash::data
