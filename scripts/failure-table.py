#!/usr/bin/env python3
"""The table of scripts/experiment-failure.sh from its run folders: per variant and seed, the steps
run, the step the loss diverged at, the final losses and the W_Q spectral norms.

    python3 scripts/failure-table.py OUT PREFIX      # PREFIX: rb3, rb2, muon-rb3, ...
"""
import glob, json, math, os, sys
out, prefix = sys.argv[1], sys.argv[2]
print(f"| variant ({prefix}; control: round_bits 7) | seed | steps run | diverged at | final loss | final val loss | largest W_Q sigma (layer) | peak W_Q sigma |")
print("|---|---|---|---|---|---|---|---|")
for run in sorted(glob.glob(f"{out}/{prefix}-*-seed*")):
    if not os.path.isdir(run):
        continue
    name = os.path.basename(run)[len(f"{prefix}-"):]
    variant, seed = name.rsplit("-seed", 1)
    rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if l.strip()]
    if not rows:
        print(f"| {variant} | {seed} | 0 | - | - | - | - | - |")
        continue
    # Diverged: a non-finite loss (the trainer stops there) or, after the warm-up, a loss 1.5 nats
    # above the best so far (the paper's jump from ~3-4 to ~7-8).
    best, diverged = math.inf, None
    for r in rows:
        loss = r["loss"] if r["loss"] is not None else math.nan  # metrics.jsonl writes non-finite as null
        if not math.isfinite(loss) or (r["step"] > 150 and loss > best + 1.5):
            diverged = r["step"]
            break
        best = min(best, loss)
    err = open(f"{run}.err").read() if os.path.exists(f"{run}.err") else ""
    stopped = "is nan" in err or "is inf" in err
    if diverged is None and stopped:
        diverged = rows[-1]["step"] + 1
    sig = [r for r in rows if "wq_sigma" in r]
    last = sig[-1]["wq_sigma"] if sig else []
    peak = max((max(r["wq_sigma"]) for r in sig), default=float("nan"))
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    lay = max(range(len(last)), key=lambda i: last[i]) if last else -1
    last_loss = rows[-1]["loss"] if rows[-1]["loss"] is not None else math.nan
    print(f"| {variant} | {seed} | {rows[-1]['step'] + 1} | {diverged if diverged is not None else 'no'} | {last_loss:.3f} | "
          f"{vals[-1] if vals else float('nan'):.3f} | {max(last) if last else float('nan'):.1f} ({lay}) | {peak:.1f} |")
