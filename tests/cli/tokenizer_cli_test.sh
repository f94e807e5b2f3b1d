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

# Hostile input to decode (#13): deep nesting is an error, not a stack overflow; an offending
# element is quoted in at most ~80 characters; a negative --count is refused.
set +e
python3 -c "print('[' * 100000 + ']' * 100000)" | "$sf" decode 2> "$tmp/err"; rc=$?
set -e
[ "$rc" = 1 ] || fail "decode of 10^5 nested arrays exited $rc (expected 1): $(head -c 300 "$tmp/err")"
grep -q "nested deeper than 128 levels" "$tmp/err" || fail "deep nesting message: $(head -c 300 "$tmp/err")"
python3 -c "print('[1, \"' + 'x' * 1000000 + '\"]')" > "$tmp/long.json"
if "$sf" decode < "$tmp/long.json" 2> "$tmp/err"; then fail "decode accepted a string as a token id"; fi
[ "$(wc -c < "$tmp/err")" -lt 400 ] || fail "error message of $(wc -c < "$tmp/err") bytes for a 1 MB element"
grep -q "element 1 is not a token id" "$tmp/err" || fail "long element message: $(head -c 300 "$tmp/err")"
if "$sf" decode --shard "$tmp/out/train_000000.bin" --count -5 > /dev/null 2> "$tmp/err"; then fail "decode --count -5 was accepted"; fi
grep -q -- "--count: must be 0 or more" "$tmp/err" || fail "--count -5 message: $(cat "$tmp/err")"

# File errors name the path and the reason; a folder is called a folder.
if "$sf" encode "$tmp/missing.txt" 2> "$tmp/err"; then fail "encode of a missing file"; fi
grep -q "$tmp/missing.txt: cannot open text file: No such file or directory" "$tmp/err" || fail "missing file message: $(cat "$tmp/err")"
if "$sf" encode "$tmp/in" 2> "$tmp/err"; then fail "encode of a folder"; fi
grep -q "$tmp/in: is a folder, not a text file" "$tmp/err" || fail "folder message: $(cat "$tmp/err")"
if "$sf" decode --shard "$tmp/in" 2> "$tmp/err"; then fail "decode --shard of a folder"; fi
grep -q "$tmp/in: is a folder" "$tmp/err" || fail "folder shard message: $(cat "$tmp/err")"

# A shard holding an id past GPT-2's vocabulary is refused when opened, with file and offset.
python3 - "$tmp/out/train_000000.bin" "$tmp/badid.bin" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[1024 + 2 * 3: 1024 + 2 * 3 + 2] = (50300).to_bytes(2, "little")
open(sys.argv[2], "wb").write(b)
PY
if "$sf" decode --shard "$tmp/badid.bin" 2> "$tmp/err"; then fail "decode read a shard with id 50300"; fi
grep -q "$tmp/badid.bin: token id 50300 at token offset 3" "$tmp/err" || fail "bad id message: $(cat "$tmp/err")"

# prepare's -o: not a file, not inside an input folder.
if "$sf" prepare "$tmp/in" -o "$tmp/a.txt" -q 2> "$tmp/err"; then fail "prepare -o onto a file"; fi
grep -q "exists and is not a folder" "$tmp/err" || fail "prepare -o file message: $(cat "$tmp/err")"
if "$sf" prepare "$tmp/in" -o "$tmp/in/sub/shards" -q 2> "$tmp/err"; then fail "prepare -o inside its input"; fi
grep -q "lies inside, the input" "$tmp/err" || fail "prepare -o inside input message: $(cat "$tmp/err")"
[ ! -e "$tmp/in/sub/shards" ] || fail "prepare created its output inside the input before refusing"
echo "tokenizer CLI: all checks passed"
