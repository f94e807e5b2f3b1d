"""The report's figures. Each is one small drawing function plus one line in SERIES naming the
metrics.jsonl key it needs: a new probe in the trainer becomes a new picture by adding both."""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt

from runs import finite


@dataclass(frozen=True)
class Series:
    key: str  # the metrics.jsonl field it draws; runs without it are left out of the figure
    file: str  # file name without extension (.png and .svg are written)
    title: str
    caption: str
    draw: Optional[Callable]  # draw(runs) -> matplotlib Figure; None: the trainer does not record it yet


def colors(n):
    # tab10 while it suffices (its colours are the most distinct), tab20 up to 20, then a ramp.
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("viridis")(i / (n - 1)) for i in range(n)]


def overlay(runs, key, ylabel, reduce=None, log=False, marker=None):
    """One line per run over steps, legend = run names; `reduce` turns list values into one number."""
    fig, ax = plt.subplots(figsize=(10, 5.2))
    for run, color in zip(runs, colors(len(runs))):
        steps, values = run.series(key)
        if reduce:
            values = [reduce(v) for v in values]
        ax.plot(steps, values, color=color, lw=1.0, marker=marker, ms=3, label=run.name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(runs) > 7 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig, ax


def panels(runs, layout=None):
    """A grid with one panel per run (shared axes, so the panels compare). layout="constrained" for
    figures with a colour bar: tight_layout() leaves no room for one added afterwards, and its label
    and tick labels fell off the figure's right edge."""
    ncols = min(len(runs), 4)
    nrows = math.ceil(len(runs) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 3.2 * nrows + 0.6), sharex=True, sharey=True, squeeze=False,
                             layout=layout)
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    return fig, list(axes.flat[: len(runs)])


def finish_line_panels(fig, axes, runs, ylabel, log):
    """The common finish of panels() drawn as lines over steps: titles, grid, one legend, axis labels."""
    for run, ax in zip(runs, axes):
        ax.set_title(run.name, fontsize=8)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6, frameon=False)
    fig.supxlabel("step", fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    fig.tight_layout()
    return fig


def draw_loss(runs):
    fig, ax = overlay(runs, "loss", "training loss (nats)")
    # The first steps (ln 50257 ≈ 10.8) would squash everything after them: the y range starts at
    # what the runs reach after their first 10% of steps.
    later = [v for r in runs for s, v in zip(*r.series("loss")) if s >= r.rows[-1]["step"] / 10]
    if finite(later):
        lo, hi = min(finite(later)), max(finite(later))
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    return fig


def draw_val_loss(runs):
    return overlay(runs, "val_loss", "validation loss (nats)", marker="o")[0]


def draw_lr(runs):
    return overlay(runs, "lr", "learning rate")[0]


def draw_grad_norm(runs):
    return overlay(runs, "grad_norm", "gradient norm (before clipping)", log=True)[0]


def draw_wq_sigma_max(runs):
    return overlay(runs, "wq_sigma", "largest W_Q spectral norm over layers", reduce=max, log=True)[0]


def draw_wq_sigma_layers(runs):
    fig, axes = panels(runs)
    for run, ax in zip(runs, axes):
        steps, sigmas = run.series("wq_sigma")
        layers = max(len(s) for s in sigmas)
        for layer, color in zip(range(layers), colors(layers)):
            ax.plot(steps, [s[layer] if layer < len(s) else math.nan for s in sigmas], color=color, lw=1.0, label=f"layer {layer}")
    return finish_line_panels(fig, axes, runs, "W_Q spectral norm", log=True)


def draw_wq_sigma_heatmap(runs):
    fig, axes = panels(runs, layout="constrained")
    # One colour scale for every panel (log: the norms span 1 to 100+), so colours compare across runs.
    everything = [v for r in runs for s in r.series("wq_sigma")[1] for v in finite(s)]
    norm = mcolors.LogNorm(vmin=max(min(everything), 1e-3), vmax=max(everything))
    image = None
    for run, ax in zip(runs, axes):
        steps, sigmas = run.series("wq_sigma")
        layers = max(len(s) for s in sigmas)
        grid = [[s[layer] if layer < len(s) else math.nan for s in sigmas] for layer in range(layers)]  # [layer, probe]
        image = ax.imshow(grid, aspect="auto", origin="lower", norm=norm, cmap="magma", interpolation="nearest",
                          extent=(steps[0], steps[-1], -0.5, layers - 0.5))
        ax.set_title(run.name, fontsize=8)
    fig.supxlabel("probe step", fontsize=9)
    fig.supylabel("layer", fontsize=9)
    fig.colorbar(image, ax=axes, label="W_Q spectral norm", fraction=0.03, pad=0.02)
    return fig


def draw_wq_sigma_heads(runs):
    """Layer x head of each run's last probe: the paper's Fig. 3 picks out the heads that blow up."""
    fig, axes = panels(runs, layout="constrained")
    last = [(r.series("wq_sigma_heads")[0][-1], r.series("wq_sigma_heads")[1][-1]) for r in runs]
    everything = [v for _, grid in last for row in grid for v in finite(row)]
    norm = mcolors.LogNorm(vmin=max(min(everything), 1e-3), vmax=max(everything))
    image = None
    for run, ax, (step, grid) in zip(runs, axes, last):
        image = ax.imshow(grid, aspect="auto", origin="lower", norm=norm, cmap="magma", interpolation="nearest")
        ax.set_xticks(range(len(grid[0])))
        ax.set_yticks(range(len(grid)))
        ax.set_title(f"{run.name} (after step {step})", fontsize=8)
    fig.supxlabel("head", fontsize=9)
    fig.supylabel("layer", fontsize=9)
    fig.colorbar(image, ax=axes, label="W_Q spectral norm of the head", fraction=0.03, pad=0.02, format="%.3g")
    return fig


def _flat(value):
    """Numbers of a [layer][head] grid (null layers are NaN after loading), finite ones only."""
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return finite([value])


def per_layer_panels(runs, key, ylabel, per_layer, log=False):
    """One panel per run, one line per layer; per_layer(layer value) -> number (NaN: a gap)."""
    fig, axes = panels(runs)
    for run, ax in zip(runs, axes):
        steps, grids = run.series(key)
        layers = max(len(g) for g in grids)
        for layer, color in zip(range(layers), colors(layers)):
            values = [per_layer(g[layer]) if layer < len(g) else math.nan for g in grids]
            ax.plot(steps, values, color=color, lw=1.0, marker="." if len(steps) < 40 else None, label=f"layer {layer}")
    return finish_line_panels(fig, axes, runs, ylabel, log)


def mean_or_nan(value):
    v = _flat(value)
    return sum(v) / len(v) if v else math.nan


def draw_sigma_all(runs):
    """Every weight matrix's spectral norm: one panel per run, a line per matrix, coloured by kind."""
    fig, axes = panels(runs)
    kinds = ["wte", "wpe", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    palette = dict(zip(kinds, colors(len(kinds))))
    for run, ax in zip(runs, axes):
        steps, tables = run.series("sigma")
        names = sorted({n for t in tables for n in t})
        seen = set()
        for name in names:
            kind = next((k for k in kinds if name == k or name.endswith("." + k)), name)
            ax.plot(steps, [t.get(name, math.nan) for t in tables], color=palette.get(kind, "grey"), lw=0.8,
                    marker="." if len(steps) < 40 else None, label=None if kind in seen else kind)
            seen.add(kind)
    return finish_line_panels(fig, axes, runs, "spectral norm (a line per matrix)", log=True)


def draw_ties(runs):
    """Fractions of attention rows with a tie event (>= 2 exact P-bar = 1 in a tile, after the shift;
    solid) and with a repeated maximum (dashed), over every counted layer and head: the paper's early
    warning."""
    fig, ax = plt.subplots(figsize=(10, 5.2))
    for run, color in zip(runs, colors(len(runs))):
        for key, style in (("tie_rows", "-"), ("repeated_max_rows", "--")):
            steps, values = [], []
            for row in run.rows:
                if key in row and "attn_rows" in row:
                    counts = _flat(row[key])
                    heads = len(counts)
                    steps.append(row["step"])
                    values.append(sum(counts) / (heads * row["attn_rows"]) if heads and row["attn_rows"] else math.nan)
            ax.plot(steps, values, color=color, ls=style, lw=1.0, label=f"{run.name} ({'tie events' if key == 'tie_rows' else 'repeated maxima'})")
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of attention rows")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


# The δ running sums span 1e-10 (FP32 noise of a compensated δ) to 1e-4 (a rounded δ's drift before
# the loss jumps) to 1e2 (after it): on a linear axis shared by the panels only the last showed. A
# symmetric log axis keeps the sign (the bias is a sum of one sign) and the decades; it is linear
# within ±DELTA_SUM_LINEAR, so sums that small (FP32 noise, early sign changes) lie on the zero line.
DELTA_SUM_LINEAR = 1e-6


def draw_delta_sum(runs):
    fig = per_layer_panels(runs, "delta_shadow_sum", "running sum of Σ(δ_used − δ_FP32 output)", lambda v: v)
    for ax in fig.axes:
        ax.set_yscale("symlog", linthresh=DELTA_SUM_LINEAR)
        ax.axhline(0, color="black", lw=0.5)
    fig.tight_layout()
    return fig


def draw_similarity(runs):
    return per_layer_panels(runs, "rank1_similarity", "rank-1 terms' mean cosine (mean over heads)", mean_or_nan)


def draw_max_logit(runs):
    return overlay(runs, "max_logit", "largest attention logit (sampled rows)", reduce=lambda g: max(_flat(g), default=math.nan))[0]


SERIES = [
    Series("loss", "loss", "Training loss", "Each step's loss before its update; runs overlaid.", draw_loss),
    Series("val_loss", "val_loss", "Validation loss", "The loss on the fixed validation windows.", draw_val_loss),
    Series("lr", "lr", "Learning rate", "The schedule each run followed.", draw_lr),
    Series("grad_norm", "grad_norm", "Gradient norm", "The global gradient norm before clipping (log scale).", draw_grad_norm),
    Series("wq_sigma", "wq_sigma_max", "W_Q spectral norm, largest layer",
           "Per probe step, the largest spectral norm of any layer's W_Q: the paper's symptom grows here before the loss jumps.",
           draw_wq_sigma_max),
    Series("wq_sigma", "wq_sigma_layers", "W_Q spectral norm per layer", "One panel per run, one line per layer.",
           draw_wq_sigma_layers),
    Series("wq_sigma", "wq_sigma_heatmap", "W_Q spectral norm, layer × probe step",
           "One panel per run; one colour scale (log) for all panels.", draw_wq_sigma_heatmap),
    Series("wq_sigma_heads", "wq_sigma_heads", "W_Q spectral norm per head, last probe",
           "Layer × head of each run's last probe; one colour scale (log) for all panels.", draw_wq_sigma_heads),
    Series("sigma", "sigma_all", "Spectral norms of every weight matrix",
           "One panel per run, a line per matrix (probe.sigma_every steps), coloured by kind; log scale.", draw_sigma_all),
    Series("tie_rows", "ties", "Rows with tied maxima over time",
           "The kernels' counters over every row of the probed micro-batch: tie events (solid) and repeated maxima (dashed).",
           draw_ties),
    Series("max_logit", "max_logit", "Largest attention logit", "Over every probed layer and head (sampled rows).", draw_max_logit),
    Series("delta_shadow_sum", "delta_running_sum", "δ running sum (the paper's Fig. 5a)",
           "Per layer, the running sum over probed steps of Σ(δ_used − δ of the unrounded output): a sum that keeps one sign is the bias. "
           f"Symmetric log scale, linear within ±{DELTA_SUM_LINEAR:g}.",
           draw_delta_sum),
    Series("rank1_similarity", "rank1_similarity", "Shared direction of the rank-1 terms (the paper's Fig. 4)",
           "Per layer, the mean pairwise cosine of R_i = X_i (PK)_iᵀ over sampled tokens (mean over heads); 1: one shared direction.",
           draw_similarity),
]
