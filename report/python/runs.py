"""A run directory's metrics.jsonl, read into per-key series (the C++ side has checked it already)."""
import json
import math
import os
from dataclasses import dataclass, field


@dataclass
class Run:
    dir: str
    name: str  # what legends and tables call the run
    rows: list = field(default_factory=list)

    def has(self, key):
        return any(key in r for r in self.rows)

    def series(self, key):
        """(steps, values) of the rows that have `key`; values may be lists (one per layer)."""
        pairs = [(r["step"], r[key]) for r in self.rows if key in r]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def load_run(path, name):
    rows = []
    metrics = os.path.join(path, "metrics.jsonl")
    with open(metrics) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(_nulls_to_nan(json.loads(line)))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{metrics}:{number}: malformed JSON ({e})")
    return Run(dir=path, name=name, rows=rows)


def _nulls_to_nan(value):
    """The trainer writes a non-finite number (a NaN validation loss, an infinite norm) as null; plots
    draw NaN as a gap, and the tables skip it (finite())."""
    if value is None:
        return math.nan
    if isinstance(value, list):
        return [_nulls_to_nan(v) for v in value]
    if isinstance(value, dict):
        return {k: _nulls_to_nan(v) for k, v in value.items()}
    return value


def run_names(paths):
    """The directories' own names; where two are equal, their parent folder's name goes first."""
    names = [os.path.basename(os.path.normpath(p)) for p in paths]
    for i, p in enumerate(paths):
        if names.count(names[i]) > 1:
            parent = os.path.basename(os.path.dirname(os.path.abspath(os.path.normpath(p))))
            names[i] = f"{parent}/{names[i]}"
    return names


def finite(values):
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
