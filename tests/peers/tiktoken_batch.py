#!/usr/bin/env python3
"""Many inputs through tiktoken_peer.py's semantics in one process (Python start-up and the ranks
load cost ~0.5 s, which would dominate hundreds of small adversarial cases).

stdin: a sequence of records, each a little-endian uint32 byte count followed by that many bytes.
stdout: one JSON list of token ids per record, one per line, in order.
Exit status 3 (and a message on stderr) when tiktoken cannot be imported, so callers can tell
"peer missing" from "peer broken".

  python3 tiktoken_batch.py --ranks gpt2.tiktoken < records
"""
import argparse, json, os, struct, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import tiktoken_peer  # noqa: E402  (same folder: the peer's exact semantics)
except ImportError as e:
    print(f"tiktoken_batch: cannot import tiktoken ({e}); run scripts/setup-deps.sh", file=sys.stderr)
    sys.exit(3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", required=True)
    a = p.parse_args()
    enc = tiktoken_peer.gpt2(a.ranks)
    data = sys.stdin.buffer.read()
    out, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            sys.exit("tiktoken_batch: truncated record header")
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + n > len(data):
            sys.exit("tiktoken_batch: truncated record")
        out.append(json.dumps(tiktoken_peer.encoder(enc, data[pos:pos + n])()))
        pos += n
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
