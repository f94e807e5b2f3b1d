#!/usr/bin/env bash
# Single-thread GPT-2 encode throughput, stableflash vs tiktoken, side by side on the same text
# with the same protocol (tests/peers/tiktoken_peer.py bench: text in memory -> ids, median of 5
# runs after a warm-up), and a check that both produce the same ids. Prints one line per text.
#
#   scripts/bench-tokenizer.sh [TEXT...]
#
# Without arguments: the default corpus's text (.deps/corpus/text, built by scripts/setup-corpus.sh)
# when present, and this machine's licence and copyright texts (English prose, always present).
# Needs the set-up (scripts/setup-deps.sh) and a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
stableflash=${STABLEFLASH_BIN:-./build/stableflash}
ranks=${STABLEFLASH_GPT2_RANKS:-.deps/gpt2.tiktoken}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

texts=("$@")
if ((${#texts[@]} == 0)); then
  if compgen -G ".deps/corpus/text/*.jsonl" >/dev/null; then
    python3 -c 'import json, sys
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        for line in f: sys.stdout.write(json.loads(line)["text"])' .deps/corpus/text/*.jsonl > "$tmp/default-corpus.txt"
    texts+=("$tmp/default-corpus.txt")
  fi
  find /usr/share/common-licenses /usr/share/doc -name copyright -o -path '/usr/share/common-licenses/*' -type f |
    LC_ALL=C sort | xargs cat > "$tmp/licences-and-copyrights.txt"
  texts+=("$tmp/licences-and-copyrights.txt")
fi

for text in "${texts[@]}"; do
  ours=$("$stableflash" encode --bench --ranks "$ranks" "$text")
  theirs=$(PYTHONPATH=.deps/python python3 tests/peers/tiktoken_peer.py bench --ranks "$ranks" < "$text")
  "$stableflash" encode --ranks "$ranks" "$text" > "$tmp/ours.json"
  PYTHONPATH=.deps/python python3 tests/peers/tiktoken_peer.py encode --ranks "$ranks" < "$text" > "$tmp/theirs.json"
  same=$(python3 -c 'import json, sys; print("identical" if json.load(open(sys.argv[1])) == json.load(open(sys.argv[2])) else "DIFFERENT")' \
    "$tmp/ours.json" "$tmp/theirs.json")
  python3 -c 'import json, sys
o, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
mb, n, ours, theirs = o["bytes"] / 1e6, o["tokens"], o["MB_per_s"], t["MB_per_s"]
print(f"{sys.argv[3]}: {mb:.1f} MB, {n} tokens ({sys.argv[4]}); "
      f"stableflash {ours:.1f} MB/s, tiktoken {theirs:.1f} MB/s, ratio {ours / theirs:.2f}x")' \
    "$ours" "$theirs" "$(basename "$text")" "$same"
  [ "$same" = identical ] || exit 1
done
