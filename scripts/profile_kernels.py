#!/usr/bin/env python3
"""Summarize an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`) of a training run:
find the last complete optimizer step (kernels between two launches whose name matches --step-marker),
and print its kernels grouped by name with count and total time, largest first.

    python3 scripts/profile_kernels.py ours.csv [--step-marker adam] [--top 40] [--json out.json]
"""
import argparse, collections, csv, json, re, sys

UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def kernels(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ms = float(r["Metric Value"].replace(",", "")) * UNITS[r["Metric Unit"]]
        rows.append((int(r["ID"]), r["Kernel Name"], ms))
    rows.sort()
    return rows


def short(name):
    name = re.sub(r"\(.*$", "", name)          # drop argument lists
    name = re.sub(r"<.*>", "<>", name)         # and template arguments
    return name[:90]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--step-marker", default="adam")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--json")
    a = p.parse_args()
    rows = kernels(a.csv)
    marker = re.compile(a.step_marker, re.I)
    ends = [i for i, (_, n, _) in enumerate(rows) if marker.search(n)]
    # the last marker run is the end of a step; the previous step's marker run ends before it
    groups = []
    for i in ends:
        if groups and i == groups[-1][-1] + 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) < 2:
        sys.exit(f"{a.csv}: fewer than two optimizer steps ({len(groups)}) among {len(rows)} kernels")
    step = rows[groups[-2][-1] + 1: groups[-1][-1] + 1]
    by = collections.OrderedDict()
    for _, n, ms in step:
        k = short(n)
        c, t = by.get(k, (0, 0.0))
        by[k] = (c + 1, t + ms)
    total = sum(ms for _, _, ms in step)
    print(f"{a.csv}: {len(step)} kernels in one step, {total:.2f} ms of kernel time (serialized by ncu)")
    print(f"{'ms':>8} {'share':>6} {'count':>5}  kernel")
    for k, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{t:8.3f} {100 * t / total:5.1f}% {c:5d}  {k}")
    if a.json:
        json.dump({"total_ms": total, "kernels": [{"name": n, "ms": ms} for _, n, ms in step]}, open(a.json, "w"))


if __name__ == "__main__":
    main()
