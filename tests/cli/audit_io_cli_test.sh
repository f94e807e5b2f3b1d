#!/usr/bin/env bash
# `stableflash audit --export` / `--import` end to end: our own CPU outputs, written in the import
# layout, give the audit's own numbers (the same strings in --json); --fail-above gates; broken
# files are named.
#   audit_io_cli_test.sh path/to/stableflash path/to/audit_outputs_helper
set -euo pipefail
sf=$1
helper=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

grid=(--ties 1,2 --remainder 1e-4,1e-2 --logit-scale 8,60 --T 64 --D 16 --tile 64,32 --heads 2
      --numerics fused --policy standard --delta-source rounded)
"$sf" audit "${grid[@]}" --export "$tmp/x" > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "export"; }
grep -q "16 cases" "$tmp/log" || fail "export's summary lacks the case count: $(cat "$tmp/log")"
[ -f "$tmp/x/manifest.json" ] || fail "no manifest.json"
[ "$(ls "$tmp/x"/*.inputs.safetensors | wc -l)" = 16 ] || fail "not 16 input files"
"$helper" "$tmp/x" mine fused standard || fail "helper"

"$sf" audit "${grid[@]}" --json > "$tmp/own.jsonl"
"$sf" audit --import "$tmp/x" --name mine --json > "$tmp/imp.jsonl" || fail "import --json"
[ "$(wc -l < "$tmp/imp.jsonl")" = 16 ] || fail "import --json: not one line per case"
[ "$(grep -c '"o_bias":[-0-9]' "$tmp/own.jsonl")" = 16 ] || fail "the audit's --json lacks 16 numeric o_bias"
for field in o_bias o_bias_se o_bias_count mean_err_ulp rel_l2 nonfinite zeroed_rows; do
  diff <(grep -o "\"$field\":[^,}]*" "$tmp/own.jsonl") <(grep -o "\"$field\":[^,}]*" "$tmp/imp.jsonl") > /dev/null ||
    fail "$field of the import differs from the audit's"
done
"$sf" audit --import "$tmp/x" --name mine > "$tmp/table" || fail "import table"
[ "$(grep -c '^  mine ' "$tmp/table")" = 16 ] || fail "the table lacks a line per case: $(cat "$tmp/table")"

# --fail-above: every |bias| <= 1 by construction; the standard shift's O bias is not 0
"$sf" audit --import "$tmp/x" --name mine --fail-above 1 > /dev/null || fail "--fail-above 1 must pass"
set +e
"$sf" audit --import "$tmp/x" --name mine --fail-above 0 > /dev/null 2> "$tmp/err"
rc=$?
set -e
[ $rc = 3 ] || fail "--fail-above 0: exit $rc, expected 3"
grep -q "mine case-0000: O bias" "$tmp/err" || fail "--fail-above names no case: $(cat "$tmp/err")"

# errors name the file
expect_error() {  # expect_error TEXT ARGS...: exit 1 and TEXT in the message
  local text=$1; shift
  if "$sf" audit "$@" > /dev/null 2> "$tmp/err"; then fail "$* succeeded"; fi
  grep -qF -- "$text" "$tmp/err" || fail "$*: message lacks '$text': $(cat "$tmp/err")"
}
expect_error "$tmp/x/other/case-0000.safetensors: missing" --import "$tmp/x" --name other
expect_error "--import needs --name" --import "$tmp/x"
expect_error "--fail-above: bad value" --import "$tmp/x" --name mine --fail-above abc
truncate -s -7 "$tmp/x/mine/case-0003.safetensors"
expect_error "$tmp/x/mine/case-0003.safetensors" --import "$tmp/x" --name mine
expect_error "$tmp/nowhere/manifest.json: cannot open" --import "$tmp/nowhere" --name mine
echo "audit --export/--import: all checks passed"
