#!/usr/bin/env python3
"""Draws `stableflash report`: PNG and SVG plots and index.html from run directories.

    make_report.py --out OUT_DIR [--title T] RUN_DIR...

Normally started by `stableflash report`, which checks the run directories first and puts the
project's .deps/python (matplotlib, installed by scripts/setup-deps.sh) on PYTHONPATH."""
import argparse
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"report: error: cannot import matplotlib ({e}); scripts/setup-deps.sh installs it into .deps/python")

import page
import series as series_module
import summary
from runs import load_run, run_names


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--title")
    parser.add_argument("run_dirs", nargs="+")
    args = parser.parse_args()

    names = run_names(args.run_dirs)
    runs = []
    for path, name in zip(args.run_dirs, names):
        runs.append(load_run(path, name))
    os.makedirs(args.out, exist_ok=True)
    summaries = [summary.summarize(r) for r in runs]

    drawn, skipped = [], []
    todo = []
    for s in series_module.SERIES:
        having = [r for r in runs if r.has(s.key)]
        if not having:
            skipped.append((s, "not recorded in these runs' metrics.jsonl" + ("" if s.draw else " (the trainer does not write it yet)")))
        elif s.draw is None:
            skipped.append((s, "recorded, but the report has no drawing for it yet"))
        else:
            todo.append((s, having))
    for i, (s, having) in enumerate(todo, 1):
        print(f"report: [{i}/{len(todo)}] {s.file}.png/.svg ({len(having)} run(s))", flush=True)
        fig = s.draw(having)
        fig.savefig(os.path.join(args.out, s.file + ".png"), dpi=100)
        fig.savefig(os.path.join(args.out, s.file + ".svg"))
        plt.close(fig)
        drawn.append((s, [r.name for r in runs if all(r is not h for h in having)]))

    title = args.title or ("stableflash report: " + ", ".join(names) if len(names) <= 3 else f"stableflash report: {len(names)} runs")
    rule = (f"the first step whose loss is not finite, or after step {summary.DIVERGENCE_AFTER_STEP} is "
            f"{summary.DIVERGENCE_NATS} nats above the best loss so far")
    path = page.write_page(args.out, title, runs, summaries, drawn, skipped, rule)
    print(f"report: wrote {path}", flush=True)


if __name__ == "__main__":
    main()
