"""The numbers of a run the page's table shows, with the same definitions as
scripts/experiment-failure.sh and docs/reproducing-the-paper.md."""
import math

# "Diverged": a non-finite loss, or after the warm-up a loss this many nats above the best so far
# (the paper's jump from ~3-4 to ~7-8; ordinary noise at this scale is a few tenths).
DIVERGENCE_NATS = 1.5
DIVERGENCE_AFTER_STEP = 150


def divergence_step(rows):
    best = math.inf
    for r in rows:
        loss = r["loss"]
        if not math.isfinite(loss) or (r["step"] > DIVERGENCE_AFTER_STEP and loss > best + DIVERGENCE_NATS):
            return r["step"]
        best = min(best, loss)
    return None


def summarize(run):
    rows = run.rows
    s = {"steps": rows[-1]["step"] + 1, "final_loss": rows[-1]["loss"], "diverged_at": divergence_step(rows)}
    vals = [(r["val_loss"], r["step"]) for r in rows if "val_loss" in r and math.isfinite(r["val_loss"])]
    s["best_val"] = min(vals) if vals else None  # (loss, step)
    probes = [r for r in rows if r.get("wq_sigma")]
    if probes:
        # The largest over every probe (where the norm peaked) and over the final weights' layers
        # (what docs/reproducing-the-paper.md's tables give).
        s["peak_sigma"] = max(((v, layer, r["step"]) for r in probes for layer, v in enumerate(r["wq_sigma"]) if math.isfinite(v)),
                              default=None)
        last = probes[-1]["wq_sigma"]
        layer = max(range(len(last)), key=lambda i: last[i])
        s["final_sigma"] = (last[layer], layer, probes[-1]["step"])
    return s
