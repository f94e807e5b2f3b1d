#!/usr/bin/env python3
"""Manual check that a stableflash checkpoint loads into Hugging Face transformers unchanged.

    python3 tests/golden/check_hf_checkpoint.py RUN/checkpoints/step_NNNNNNNN "50256 11 13" 20 "IDS"

Loads the folder with GPT2LMHeadModel.from_pretrained (no missing or unexpected weights allowed),
continues the prompt greedily for N tokens and prints the ids; compare with
`stableflash sample CKPT --prompt-tokens "..." --tokens N --temperature 0` (a run trained with
`attention.default.numerics=standard` computes the same function as transformers' FP32 attention,
so the greedy ids agree except at near-ties). With a fourth argument (the ids stableflash printed)
it reports the first position where they differ.
"""
import sys

import torch
from transformers import GPT2LMHeadModel


def main():
    path, prompt, n = sys.argv[1], [int(t) for t in sys.argv[2].split()], int(sys.argv[3])
    model, info = GPT2LMHeadModel.from_pretrained(path, output_loading_info=True)
    # transformers lists the causal-mask buffers and the tied head as "missing" in some versions.
    missing = [k for k in info.get("missing_keys", []) if not k.endswith(("attn.bias", "attn.masked_bias", "lm_head.weight"))]
    if missing or info.get("unexpected_keys") or info.get("mismatched_keys"):
        sys.exit(f"weights not loaded as written: missing {missing}, unexpected {info.get('unexpected_keys')}, "
                 f"mismatched {info.get('mismatched_keys')}")
    model.eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            logits = model(ids[:, -model.config.n_positions:]).logits[0, -1]
            ids = torch.cat([ids, logits[: 50257].argmax().view(1, 1)], dim=1)
    out = ids[0].tolist()
    print(" ".join(map(str, out)))
    if len(sys.argv) > 4:
        theirs = [int(t) for t in sys.argv[4].split()]
        same = next((i for i, (a, b) in enumerate(zip(out, theirs)) if a != b), None)
        print("identical" if same is None and len(out) == len(theirs) else f"first difference at position {same}")


if __name__ == "__main__":
    main()
