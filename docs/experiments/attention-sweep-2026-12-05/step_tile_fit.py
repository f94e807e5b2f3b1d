"""Splits each implementation's D = 128 forward time into a cost per 128 x 128 step and a cost per
128-row tile: least squares of time = a * steps / SMs + b * tiles / SMs over the sweep's full
(non-causal) D = 128 shapes from T = 1000 on, where steps = B*H*ceil(T/128)^2 and tiles =
B*H*ceil(T/128). For ours (128-row tiles of 128-key steps) a and b are the kernel's own step and
tile costs (the epilogue, the first step's unhidden latency); for the peers, whose tiles may differ,
they are what the same model says.

    PYTHONPATH=.deps/python python3 step_tile_fit.py attention-sweep.jsonl [SMS=132]
"""
import json
import math
import sys

import numpy as np


def main() -> None:
    path = sys.argv[1]
    sms = int(sys.argv[2]) if len(sys.argv) > 2 else 132
    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if not r.get("meta")]
    groups = sorted({(r["impl"], r.get("delta_source") or "") for r in rows})
    print(f"D = 128 full forward, T >= 1000: time = a * steps / {sms} + b * tiles / {sms}")
    for impl, delta in groups:
        rs = [r for r in rows if r["impl"] == impl and (r.get("delta_source") or "") == delta
              and r["D"] == 128 and not r["causal"] and r["T"] >= 1000]
        if len(rs) < 3:
            continue
        x = np.array([[r["B"] * r["H"] * math.ceil(r["T"] / 128) ** 2 / sms,
                       r["B"] * r["H"] * math.ceil(r["T"] / 128) / sms] for r in rs])
        y = np.array([r["fwd_ms"] * 1e3 for r in rs])
        (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
        worst = max(abs(x @ np.array([a, b]) / y - 1))
        label = impl + (f" ({delta} δ)" if delta else "")
        print(f"{label:32s} a = {a:.3f} us a step, b = {b:.2f} us a tile ({len(rs)} shapes, worst fit {worst:.1%})")


if __name__ == "__main__":
    main()
