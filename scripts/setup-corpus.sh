#!/usr/bin/env bash
# Builds the default corpus: English documentation and a dictionary from Debian packages, cleaned
# (scripts/corpus_clean.py) and tokenized by `stableflash prepare` into .deps/corpus/shards
# (train_NNNNNN.bin, val_NNNNNN.bin), which `stableflash train` reads by default.
# What it holds, licences, size and cleaning: docs/default-corpus.md. The tests never need it.
# Runs again only when its inputs change (packages, this script, the cleaner, the ranks file).
set -euo pipefail
cd "$(dirname "$0")/.."
stableflash=${STABLEFLASH_BIN:-./build/stableflash}
corpus=.deps/corpus

packages=(linux-doc-6.1 python3.11-doc debian-handbook dict-gcide perl-doc git-doc gnu-standards)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "corpus: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp=$({
  dpkg-query -W -f='${Package} ${Version}\n' "${packages[@]}"
  sha256sum scripts/setup-corpus.sh scripts/corpus_clean.py .deps/gpt2.tiktoken
} | sha256sum | cut -d' ' -f1)
if [ -f "$corpus/shards/prepare.json" ] && [ "$(cat "$corpus/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "corpus: $corpus/shards is up to date"
  exit 0
fi

start=$(date +%s)
rm -f "$corpus/stamp"
echo "corpus: extracting and cleaning text into $corpus/text"
python3 scripts/corpus_clean.py "$corpus/text" "$corpus/sources.json"
echo "corpus: tokenizing into $corpus/shards"
"$stableflash" prepare "$corpus/text" -o "$corpus/shards" --val-fraction 0.01 --seed 1337 --shard-tokens 10000000 --overwrite
echo "$stamp" > "$corpus/stamp"
echo "corpus: built in $(( $(date +%s) - start )) s"
