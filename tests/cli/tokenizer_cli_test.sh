#!/usr/bin/env bash
# `stableflash encode`, `decode` and `prepare` end to end: the documented anchors, byte-exact round
# trips through JSON and through shards, and the errors a user sees.
#   tokenizer_cli_test.sh path/to/stableflash
set -euo pipefail
sf=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(printf 'Hello world' | "$sf" encode)" = "[15496, 995]" ] || fail "encode of 'Hello world' is not [15496, 995]"
[ "$(printf ' the' | "$sf" encode)" = "[262]" ] || fail "encode of ' the' is not [262]"
[ "$(printf 'Hello world' | "$sf" encode --visible)" = "$(printf '["Hello", "\xc4\xa0world"]')" ] || fail "--visible shows GPT-2's Ġ for the space"

# Any bytes, including invalid UTF-8 and CRLF, survive encode -> JSON -> decode; file and stdin agree.
printf 'Zo\xc3\xab says: "na\xc3\xafve caf\xc3\xa9" \xe2\x80\x94 42 \xf0\x9f\x8d\xb0\r\n\tend \xff\xfe tail' > "$tmp/a.txt"
"$sf" encode "$tmp/a.txt" > "$tmp/a.json"
"$sf" encode < "$tmp/a.txt" | cmp -s - "$tmp/a.json" || fail "encode FILE and encode < FILE differ"
"$sf" decode < "$tmp/a.json" | cmp -s - "$tmp/a.txt" || fail "decode(encode(x)) != x"

# prepare -> shard -> decode: <|endoftext|> before each document, folder order by path.
mkdir -p "$tmp/in/sub"
printf 'first document\n' > "$tmp/in/1.txt"
printf 'second one' > "$tmp/in/sub/2.txt"
"$sf" prepare "$tmp/in" -o "$tmp/out" --val-fraction 0 2> "$tmp/log" || { cat "$tmp/log"; fail "prepare"; }
grep -q "2 documents" "$tmp/log" || fail "prepare's summary lacks the document count: $(cat "$tmp/log")"
printf '<|endoftext|>first document\n<|endoftext|>second one' > "$tmp/expect"
"$sf" decode --shard "$tmp/out/train_000000.bin" | cmp -s - "$tmp/expect" || fail "decode --shard of prepare's output"
"$sf" decode --shard "$tmp/out/train_000000.bin" --start 0 --count 1 | cmp -s - <(printf '<|endoftext|>') || fail "--start/--count"

# Errors name what is wrong and exit non-zero.
if echo '[15496, 50257]' | "$sf" decode 2> "$tmp/err"; then fail "decode accepted id 50257"; fi
grep -q "not in GPT-2's vocabulary" "$tmp/err" || fail "bad id message: $(cat "$tmp/err")"
if "$sf" encode --ranks "$tmp/nope.tiktoken" "$tmp/a.txt" 2> "$tmp/err"; then fail "encode without a ranks file"; fi
grep -q "$tmp/nope.tiktoken" "$tmp/err" || fail "missing ranks message: $(cat "$tmp/err")"
if "$sf" prepare "$tmp/in" -o "$tmp/out" -q 2> "$tmp/err"; then fail "prepare overwrote earlier shards"; fi
grep -q -- "--overwrite" "$tmp/err" || fail "refusal message: $(cat "$tmp/err")"
printf 'not a shard' > "$tmp/bad.bin"
if "$sf" decode --shard "$tmp/bad.bin" 2> "$tmp/err"; then fail "decode read a corrupt shard"; fi
grep -q "$tmp/bad.bin: short header" "$tmp/err" || fail "corrupt shard message: $(cat "$tmp/err")"
echo "tokenizer CLI: all checks passed"
