#!/usr/bin/env python3
"""The attention sweep's table, summary and plots, from its JSONL (scripts/attention-sweep.sh).

  python3 scripts/attention-sweep-plot.py attention-sweep.jsonl --out DIR [--no-plot] [--against OLD.jsonl]
  here (no matplotlib in the system Python): PYTHONPATH=.deps/python python3 scripts/attention-sweep-plot.py ...

The JSONL: a meta line ({"meta": true, "default_policy", "default_delta_source", ...}), then one object
per measurement: "impl" (stableflash: `stableflash bench attention --json`'s fields; cudnn, flash:
torch_peers.py `attention`'s per-backend fields, or "error"), B, H, T, D, causal, fwd/bwd ms and TFLOP/s.
A sweep of several rounds (`attention-sweep.sh --rounds N`) has N measurements of each: the table takes,
per implementation, shape and pass, the median time over the rounds that measured it (TFLOP/s from that
time), and a failed oracle check in any round.
Writes $DIR/attention-sweep.md (the table, one row per shape, and the summary; also printed) and, if
matplotlib imports, DIR/attention-sweep-{fwd,bwd,vs-cudnn,cure}.png: against T, one panel per
(D, mask), a line per implementation and B·H. The cure's cost: the time of forward + backward with the
default's δ (auto since 2026-12-05: exact up to 128 keys, else compensated) over the same with the
rounded δ, both with the default shift, minus 1.
"""
import argparse, json, math, os, sys

STEM = "attention-sweep"  # the outputs' common name: the table and the attention-sweep-*.png plots
TABLE = STEM + ".md"

BENCH = {(16, 12, 1024, 64, True), (16, 12, 1024, 64, False), (8, 16, 4096, 128, True), (2, 16, 16384, 128, True)}
CURE_BOUND = 3.0  # percent, issue 12
EXACT_BOUND = 0.8  # the exact δ's backward against cuDNN's, issue 12


def load(path):
    meta, rows = {}, []
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            if r.get("meta"):
                meta = r
            else:
                rows.append(r)
    return meta, rows


def key(r):
    return (r["B"], r["H"], r["T"], r["D"], bool(r["causal"]))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def combine(measurements):
    """One record from a slot's rounds: per pass the median time of the rounds that measured it, TFLOP/s
    scaled to that time (the FLOPs are the same in every round), the check FAIL if any round failed."""
    good = [m for m in measurements if ok(m)]
    if len(measurements) == 1 or not good:
        return measurements[0]
    r = dict(good[0], rounds=len(good))
    for p in ("fwd", "bwd"):
        t = median([m[f"{p}_ms"] for m in good])
        r[f"{p}_tflops"] = good[0][f"{p}_tflops"] * good[0][f"{p}_ms"] / t
        r[f"{p}_ms"] = t
    if any(m.get("check") == "FAIL" for m in measurements):
        r["check"] = "FAIL"
    return r


def collect(meta, rows):
    """Per shape: the default (ours), ours with the rounded δ, cuDNN, FA2 (absent or with "error"), each
    combined over the sweep's rounds."""
    policy = meta.get("default_policy", "standard")
    delta = meta.get("default_delta_source", "compensated")
    shapes = {}
    for r in rows:
        s = shapes.setdefault(key(r), {})
        if r["impl"] == "stableflash":
            if r.get("numerics", "fused") != "fused" or r.get("policy") != policy:
                continue
            if r.get("delta_source") == delta:
                s.setdefault("ours", []).append(r)
            elif r.get("delta_source") == "rounded":
                s.setdefault("rounded", []).append(r)
            elif r.get("delta_source") == "exact":  # SWEEP_EXTRA_DELTAS=exact
                s.setdefault("exact", []).append(r)
        else:
            s.setdefault(r["impl"], []).append(r)
    order = sorted(shapes, key=lambda k: (k[3], not k[4], k[0] * k[1], k[2], k[0]))
    return policy, delta, [(k, {slot: combine(ms) for slot, ms in shapes[k].items()}) for k in order]


def ok(m):
    return bool(m) and "fwd_tflops" in m and "bwd_tflops" in m and m["fwd_tflops"] > 0 and m["bwd_tflops"] > 0


def ratio(a, b, field):
    return a[field] / b[field] if ok(a) and ok(b) else None


def cure(s):
    """(fwd+bwd, fwd, bwd) time of the default over the rounded δ, in percent."""
    a, b = s.get("ours"), s.get("rounded")
    if not (ok(a) and ok(b)):
        return None
    return (100 * ((a["fwd_ms"] + a["bwd_ms"]) / (b["fwd_ms"] + b["bwd_ms"]) - 1), 100 * (a["fwd_ms"] / b["fwd_ms"] - 1),
            100 * (a["bwd_ms"] / b["bwd_ms"] - 1))


def label(k):
    return f"{k[0]},{k[1]},{k[2]},{k[3]} {'causal' if k[4] else 'full'}"


def rounds_note(shapes):
    """The rounds behind the times: every shape's count, or, where they differ (two halves of a sweep
    each with the benchmark shapes), which shapes have more than one."""
    counts = {k: max((m.get("rounds", 1) for m in s.values()), default=1) for k, s in shapes}
    n = max(counts.values(), default=1)
    if n <= 1:
        return ""
    if min(counts.values()) == n:
        return f" Times: the median of {n} rounds (each round every shape once, in the sweep's order)."
    more = [k for k, c in counts.items() if c > 1]
    return (f" Times: one measurement a shape, but the median of {n} for {len(more)} shape(s) measured more than once "
            f"({', '.join(label(k) for k in more)}).")


def device_note(meta):
    """nvidia-smi's CSV of the sweep's start (name, driver, SM clock, max SM clock, °C, W), labelled."""
    fields = [f.strip() for f in (meta.get("device") or "").split(",")]
    if len(fields) != 6:
        return meta.get("device") or "device not recorded"
    name, driver, clock, max_clock, temp, power = fields
    return f"{name} (driver {driver}; at the start: SM clock {clock} of {max_clock}, {temp} °C, {power})"


def method_note(meta):
    m = meta.get("method")
    warm = f", {meta['warmup_s']:g} s of warm-up" if "warmup_s" in meta else ""
    return f" Method: {m}{warm}." if m else ""


def table(meta, rows):
    policy, delta, shapes = collect(meta, rows)
    out = []
    p = out.append
    auto = "; auto: the exact δ up to 128 keys, the compensated one above" if delta == "auto" else ""
    p(f"Attention sweep: ours = fused + {policy} shift + {delta} δ (the default{auto}); cure = {delta} vs rounded δ "
      f"({policy} shift), time of forward + backward (forward / backward). TFLOP/s: forward 4·B·H·T²·D (halved when "
      f"causal), backward 2.5x. * = one of the four benchmark shapes. {device_note(meta)}, commit "
      f"{meta.get('commit', '?')[:12]}.{rounds_note(shapes)}{method_note(meta)}")
    p("")
    p("| B,H,T,D | mask | B·H | ours fwd | ours bwd | cuDNN fwd | cuDNN bwd | FA2 fwd | FA2 bwd | fwd/cuDNN | bwd/cuDNN "
      "| fwd/FA2 | bwd/FA2 | rounded δ fwd | rounded δ bwd | cure fwd+bwd (fwd / bwd) | check |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    def v(m, f):
        return f"{m[f]:.0f}" if ok(m) else ("error" if m and "error" in m else "-")
    def rr(x):
        return "-" if x is None else (f"**{x:.2f}**" if x >= 1.0 else f"{x:.2f}")
    for k, s in shapes:
        o, c, f, rd = s.get("ours"), s.get("cudnn"), s.get("flash"), s.get("rounded")
        cc = cure(s)
        cs = "-" if cc is None else f"{cc[0]:+.1f}% ({cc[1]:+.1f} / {cc[2]:+.1f})"
        checks = "/".join(sorted({m.get("check", "-") for m in (o, rd) if m}))
        p(f"| {k[0]},{k[1]},{k[2]},{k[3]}{' *' if k in BENCH else ''} | {'causal' if k[4] else 'full'} | {k[0] * k[1]} | "
          f"{v(o, 'fwd_tflops')} | {v(o, 'bwd_tflops')} | {v(c, 'fwd_tflops')} | {v(c, 'bwd_tflops')} | {v(f, 'fwd_tflops')} | "
          f"{v(f, 'bwd_tflops')} | {rr(ratio(o, c, 'fwd_tflops'))} | {rr(ratio(o, c, 'bwd_tflops'))} | "
          f"{rr(ratio(o, f, 'fwd_tflops'))} | {rr(ratio(o, f, 'bwd_tflops'))} | {v(rd, 'fwd_tflops')} | {v(rd, 'bwd_tflops')} | "
          f"{cs} | {checks or '-'} |")
    p("")
    p(summary(shapes, meta))
    return "\n".join(out) + "\n"


def summary(shapes, meta):
    n = len(shapes)
    fr = [(ratio(s.get("ours"), s.get("cudnn"), "fwd_tflops"), k) for k, s in shapes]
    br = [(ratio(s.get("ours"), s.get("cudnn"), "bwd_tflops"), k) for k, s in shapes]
    fr_ok = [(x, k) for x, k in fr if x is not None]
    br_ok = [(x, k) for x, k in br if x is not None]
    fwd_n, bwd_n = sum(x >= 1.0 for x, _ in fr_ok), sum(x >= 1.0 for x, _ in br_ok)
    both = sum(a is not None and b is not None and a >= 1.0 and b >= 1.0 for (a, _), (b, _) in zip(fr, br))
    bf = sum(x >= 1.0 for x, k in fr_ok if k in BENCH)
    bb = sum(x >= 1.0 for x, k in br_ok if k in BENCH)
    nb = sum(k in BENCH for k, _ in shapes)
    cures = [(cure(s), k) for k, s in shapes if cure(s) is not None]
    def gmean(xs):
        return math.exp(sum(math.log(x) for x, _ in xs) / len(xs)) if xs else float("nan")
    def worst(xs):
        return f"{min(xs)[0]:.2f} at {label(min(xs)[1])}" if xs else "-"
    parts = [f"sweep summary: {n} shapes; ours >= 1.0x cuDNN forward at {fwd_n}/{len(fr_ok)}, backward at "
             f"{bwd_n}/{len(br_ok)}, both at {both}/{len(fr_ok)} (benchmark shapes: forward {bf}/{nb}, backward {bb}/{nb}); "
             f"geometric mean ours/cuDNN forward {gmean(fr_ok):.2f}, backward {gmean(br_ok):.2f}; lowest forward "
             f"{worst(fr_ok)}, backward {worst(br_ok)}"]
    if cures:
        top = max(cures, key=lambda c: c[0][0])
        within = sum(c[0] <= CURE_BOUND for c, _ in cures)
        parts.append(f"cure's cost (fwd+bwd time, {meta.get('default_delta_source', 'compensated')} vs rounded δ): largest "
                     f"{top[0][0]:+.1f}% at {label(top[1])}, <= {CURE_BOUND:.0f}% at {within}/{len(cures)} shapes")
    else:
        parts.append("cure's cost: no shape has both δ sources")
    exact = [(ratio(s.get("exact"), s.get("cudnn"), "bwd_tflops"), k) for k, s in shapes]
    exact = [(x, k) for x, k in exact if x is not None]
    if exact:
        below = ", ".join(f"{label(k)} {x:.3f}" for x, k in sorted(exact) if x < EXACT_BOUND)
        parts.append(f"exact δ backward / cuDNN: {min(exact)[0]:.2f}-{max(exact)[0]:.2f}, >= {EXACT_BOUND} at "
                     f"{sum(x >= EXACT_BOUND for x, _ in exact)}/{len(exact)} shapes" + (f" (below: {below})" if below else ""))
    missing = n - len(fr_ok)
    if missing:
        parts.append(f"{missing} shape(s) without a cuDNN or ours measurement")
    if meta.get("elapsed_s"):
        parts.append(f"run {meta['elapsed_s']:.0f} s (estimated {meta.get('estimate_s', 0):.0f} s)")
    return "; ".join(parts)


def comparison(old, new, min_t=1000, min_change=0.05):
    """Two sweeps side by side (each a (meta, rows) pair): from T = min_t on, ours/cuDNN forward and
    backward (range, geometric mean, shapes at >= 1.0x) and the cure's cost (shapes within the bound,
    largest) in each, then the shapes whose ratio moved by min_change or more."""
    runs = []
    for meta, rows in (old, new):
        _, _, shapes = collect(meta, rows)
        runs.append((meta, {k: s for k, s in shapes if k[2] >= min_t}))
    out = [f"Against the sweep of commit {runs[0][0].get('commit', '?')[:12]} (from T = {min_t} on; old -> new):"]
    for name, field in (("forward", "fwd_tflops"), ("backward", "bwd_tflops")):
        stats = []
        for _, shapes in runs:
            xs = [x for x in (ratio(s.get("ours"), s.get("cudnn"), field) for s in shapes.values()) if x is not None]
            gm = math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
            stats.append(f"{min(xs, default=float('nan')):.2f}-{max(xs, default=float('nan')):.2f}x cuDNN, "
                         f"geometric mean {gm:.3f}, >= 1.0x at {sum(x >= 1.0 for x in xs)}/{len(xs)}")
        out.append(f"- {name}: {stats[0]} -> {stats[1]}")
    cures = []
    for _, shapes in runs:
        cs = [(cure(s)[0], k) for k, s in shapes.items() if cure(s) is not None]
        top = max(cs, default=(float("nan"), None))
        cures.append(f"<= {CURE_BOUND:.0f}% at {sum(c <= CURE_BOUND for c, _ in cs)}/{len(cs)}, largest {top[0]:+.1f}%"
                     + (f" ({label(top[1])})" if top[1] else ""))
    out.append(f"- the cure's cost: {cures[0]} -> {cures[1]}")
    moved = []
    for k in sorted(set(runs[0][1]) & set(runs[1][1]), key=lambda k: (k[3], not k[4], k[0] * k[1], k[2])):
        a, b = runs[0][1][k], runs[1][1][k]
        for name, field in (("fwd", "fwd_tflops"), ("bwd", "bwd_tflops")):
            ra, rb = ratio(a.get("ours"), a.get("cudnn"), field), ratio(b.get("ours"), b.get("cudnn"), field)
            if ra is not None and rb is not None and abs(rb - ra) >= min_change:
                moved.append(f"{label(k)} {name} {ra:.2f} -> {rb:.2f}x (ours {a['ours'][field]:.0f} -> {b['ours'][field]:.0f} TFLOP/s)")
    out.append(f"- moved by {min_change:.2f}x or more: " + ("; ".join(moved) if moved else "none"))
    return "\n".join(out) + "\n"


def plots(meta, rows, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError as e:
        print(f"no plots: matplotlib is not importable here ({e}); plot on another machine from the JSONL:\n"
              f"  PYTHONPATH=.deps/python python3 scripts/attention-sweep-plot.py attention-sweep.jsonl --out DIR", file=sys.stderr)
        return []
    policy, delta, shapes = collect(meta, rows)
    panels = sorted({(k[3], k[4]) for k, _ in shapes}, key=lambda p: (p[0], not p[1]))
    ds = sorted({p[0] for p in panels})
    IMPL = {"ours": ("C0", f"stableflash ({policy}, {delta} δ)"), "cudnn": ("C1", "cuDNN (SDPA)"), "flash": ("C2", "FA2 (SDPA flash)")}
    BH_STYLE = {8: (":", "v"), 32: ("--", "s"), 128: ("-.", "^"), 512: ("-", "o")}
    def style(bh):
        return BH_STYLE.get(bh, ("none", "*"))
    bhs = sorted({k[0] * k[1] for k, _ in shapes})
    ts, tlabels = [], []  # ticks: every T, those within 10% of the previous one sharing its tick ("1000/1024")
    for t in sorted({k[2] for k, _ in shapes}):
        if ts and t <= 1.1 * ts[-1]:
            tlabels[-1] += f"/{t}"
        else:
            ts.append(t)
            tlabels.append(str(t))

    def figure(title, ylabel, series, hline=None, impl_legend=True):
        """series(panel_shapes, bh) -> list of (color, label, xs, ys)."""
        fig, axes = plt.subplots(len(ds), 2, figsize=(13, 4.6 * len(ds)), squeeze=False)
        for i, d in enumerate(ds):
            for j, causal in enumerate((True, False)):
                ax = axes[i][j]
                sub = [(k, s) for k, s in shapes if k[3] == d and k[4] == causal]
                ax.set_title(f"D {d}, {'causal' if causal else 'full'}")
                ax.set_xscale("log", base=2)
                ax.set_xticks(ts)
                ax.set_xticklabels(tlabels, rotation=45)
                ax.set_xlabel("T")
                ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3)
                if hline is not None:
                    ax.axhline(hline, color="k", lw=0.8)
                for bh in bhs:
                    ls, mk = style(bh)
                    for color, _, xs, ys in series([(k, s) for k, s in sub if k[0] * k[1] == bh]):
                        if xs:
                            ax.plot(xs, ys, color=color, linestyle=ls, marker=mk, ms=5)
        handles = []
        if impl_legend:
            handles += [Line2D([], [], color=c, lw=2, label=l) for c, l in IMPL.values()]
        handles += [Line2D([], [], color="gray", linestyle=style(bh)[0], marker=style(bh)[1], label=f"B·H {bh}") for bh in bhs]
        return fig, handles

    written = []
    def save(fig, handles, title, extra=(), name=""):
        fig.suptitle(title)
        fig.tight_layout()
        fig.legend(handles=list(extra) + handles, loc="upper center", ncol=min(5, len(handles) + len(extra)), fontsize=9,
                   bbox_to_anchor=(0.5, 0.0))
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    dev = meta.get("device", "").split(",")[0].strip() or "device not recorded"
    for phase in ("fwd", "bwd"):
        def series(sub, phase=phase):
            res = []
            for impl, (color, lab) in IMPL.items():
                pts = sorted((k[2], s[impl][f"{phase}_tflops"]) for k, s in sub if ok(s.get(impl)))
                res.append((color, lab, [p[0] for p in pts], [p[1] for p in pts]))
            return res
        fig, handles = figure("", "TFLOP/s", series)
        save(fig, handles, f"Attention {'forward' if phase == 'fwd' else 'backward'}, TFLOP/s against T ({dev})",
             name=f"attention-sweep-{phase}.png")

    def vs(sub):
        res = []
        for phase, color in (("fwd", "C0"), ("bwd", "C3")):
            pts = sorted((k[2], ratio(s.get("ours"), s.get("cudnn"), f"{phase}_tflops")) for k, s in sub
                         if ratio(s.get("ours"), s.get("cudnn"), f"{phase}_tflops") is not None)
            res.append((color, phase, [p[0] for p in pts], [p[1] for p in pts]))
        return res
    fig, handles = figure("", "ours / cuDNN (TFLOP/s)", vs, hline=1.0, impl_legend=False)
    save(fig, handles, f"Ours against cuDNN ({dev})", name="attention-sweep-vs-cudnn.png",
         extra=[Line2D([], [], color="C0", lw=2, label="forward"), Line2D([], [], color="C3", lw=2, label="backward")])

    def cures(sub):
        pts = sorted((k[2], cure(s)[0]) for k, s in sub if cure(s) is not None)
        return [("C0", "cure", [p[0] for p in pts], [p[1] for p in pts])]
    fig, handles = figure("", "cure's cost, % of fwd+bwd time", cures, impl_legend=False)
    for ax in fig.axes:
        ax.axhline(CURE_BOUND, color="r", lw=0.8, linestyle="--")
        ax.axhline(0.0, color="k", lw=0.8)
    save(fig, handles, f"The cure's cost: {delta} vs rounded δ, forward + backward time ({dev})", name="attention-sweep-cure.png",
         extra=[Line2D([], [], color="r", lw=0.8, linestyle="--", label=f"{CURE_BOUND:.0f}% bound")])
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl")
    ap.add_argument("--out", default=".", help=f"folder for the table ({TABLE}) and the PNGs")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--against", metavar="OLD_JSONL", help="an earlier sweep's JSONL: the table ends with how the ratios moved")
    a = ap.parse_args()
    meta, rows = load(a.jsonl)
    if not rows:
        sys.exit(f"{a.jsonl}: no measurements")
    os.makedirs(a.out, exist_ok=True)
    text = table(meta, rows)
    if a.against:
        old = load(a.against)
        if not old[1]:
            sys.exit(f"{a.against}: no measurements")
        text += "\n" + comparison(old, (meta, rows))
    with open(os.path.join(a.out, TABLE), "w") as f:
        f.write(text)
    print(text, end="")
    if not a.no_plot:
        for p in plots(meta, rows, a.out):
            print("wrote", p)


if __name__ == "__main__":
    main()
