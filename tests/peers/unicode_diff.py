#!/usr/bin/env python3
"""Measures the Unicode-version difference between stableflash (PCRE2's tables) and tiktoken
(its regex engine's newer tables), for docs/tokenizer.md.

For every code point that this Python's unicodedata (3.11: Unicode 14.0, the version PCRE2 10.42
knows) leaves unassigned, encodes "a<c>b <c>1 <c>'s x<c><c>" with both tokenizers and counts the code
points where the ids differ. Surrogates are skipped (not valid UTF-8).

  PYTHONPATH=.deps/python python3 tests/peers/unicode_diff.py build/stableflash .deps/gpt2.tiktoken
"""
import json, os, subprocess, sys, unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiktoken_peer  # noqa: E402


def main():
    binary, ranks = sys.argv[1], sys.argv[2]
    enc = tiktoken_peer.gpt2(ranks)
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) == "Cn"]
    lines = [f"a{chr(c)}b {chr(c)}1 {chr(c)}'s x{chr(c)}{chr(c)}" for c in cps]
    text = "\n".join(lines)
    ours = json.loads(subprocess.run([binary, "encode", "--ranks", ranks], input=text.encode(), capture_output=True, check=True).stdout)
    theirs = enc.encode_ordinary(text)

    def split(ids):  # "\n" before a letter is always its own token (198)
        out, cur = [], []
        for i in ids:
            if i == 198:
                out.append(cur)
                cur = []
            else:
                cur.append(i)
        out.append(cur)
        return out

    a, b = split(ours), split(theirs)
    assert len(a) == len(b) == len(cps), (len(a), len(b), len(cps))
    diff = [c for c, x, y in zip(cps, a, b) if x != y]
    planes = {}
    for c in diff:
        planes[c >> 16] = planes.get(c >> 16, 0) + 1
    print(f"Unicode {unicodedata.unidata_version}: {len(cps)} unassigned code points tested, "
          f"{len(diff)} tokenize differently; by plane: {planes}")
    blocks = []
    for c in diff:
        if blocks and c == blocks[-1][1] + 1:
            blocks[-1][1] = c
        else:
            blocks.append([c, c])
    print("ranges:", ", ".join(f"U+{s:04X}" + (f"..U+{e:04X}" if e != s else "") for s, e in blocks[:60]),
          "..." if len(blocks) > 60 else "")


if __name__ == "__main__":
    main()
