"""`stableflash report` as a user runs it, on recorded runs of the failure experiment
(docs/experiments/failure-2026-11-30), plus the divergence rule on made-up losses.

    STABLEFLASH_BINARY=build/stableflash PYTHONPATH=.deps/python:report/python python3 report_test.py [Case.test]"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import matplotlib.image
import matplotlib.pyplot as plt

import series
import summary
from runs import load_run

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECORDED = os.path.join(SOURCE, "docs", "experiments", "failure-2026-11-30")
PNGS = ["loss", "val_loss", "lr", "grad_norm", "wq_sigma_max", "wq_sigma_layers", "wq_sigma_heatmap"]


def stableflash(*args):
    return subprocess.run([os.environ["STABLEFLASH_BINARY"], *args], capture_output=True, text=True, timeout=120)


def copy_run(src, dst, lines=None):
    """A run directory holding the first `lines` lines of `src`'s metrics (fewer lines: faster plots)."""
    os.makedirs(dst)
    with open(os.path.join(RECORDED, src, "metrics.jsonl")) as f:
        rows = f.readlines()
    with open(os.path.join(dst, "metrics.jsonl"), "w") as f:
        f.writelines(rows[:lines] if lines else rows)
    return dst


def png_size(path):
    """(width, height) from the PNG signature and IHDR chunk; fails on anything that is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def distinct_colours(path):
    pixels = matplotlib.image.imread(path)  # [H, W, channels] floats in [0, 1]
    rgb = (pixels[..., :3] * 255).round().astype("uint8").reshape(-1, 3)
    non_white = float((rgb.min(axis=1) < 240).mean())
    return len({tuple(p) for p in rgb[:: max(1, len(rgb) // 200000)]}), non_white


def saturated_colours(path):
    """(distinct colours, fraction of pixels) among the saturated pixels: plot lines and heatmaps
    are; the page's text, grey captions and pale table rows are not."""
    rgb = (matplotlib.image.imread(path)[..., :3] * 255).round().astype("int16").reshape(-1, 3)
    saturated = rgb[(rgb.max(axis=1) - rgb.min(axis=1)) > 60]
    return len({tuple(p) for p in saturated}), len(saturated) / len(rgb)


class Report(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stableflash_report_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_renders_recorded_runs(self):
        runs = ["rb3-standard_rounded-seed1", "rb3-hashed_rounded-seed1", "rb3-hashed_compensated-seed1"]
        out = os.path.join(self.tmp, "out")
        r = stableflash("report", *[os.path.join(RECORDED, n) for n in runs], "-o", out, "--title", "three recorded runs")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for name in runs:  # a progress line per run and per plot
            self.assertIn(f"{name}: 1700 steps", r.stdout)
        self.assertIn("[7/7] wq_sigma_heatmap", r.stdout)
        with open(os.path.join(out, "index.html")) as f:
            page = f.read()
        self.assertIn("<title>three recorded runs</title>", page)
        for name in PNGS:
            png = os.path.join(out, name + ".png")
            width, height = png_size(png)
            self.assertGreaterEqual(width, 600, name)
            self.assertGreaterEqual(height, 300, name)
            colours, non_white = distinct_colours(png)
            self.assertGreater(colours, 50, f"{name}.png looks empty")
            self.assertGreater(non_white, 0.02, f"{name}.png looks empty")
            with open(os.path.join(out, name + ".svg")) as f:
                self.assertIn("<svg", f.read(2000))
            self.assertIn(f'<img src="{name}.png"', page)
            self.assertIn(f'<a href="{name}.svg">', page)
        for name in runs:
            self.assertIn(f">{name}</a>", page)
        # The table agrees with docs/reproducing-the-paper.md (seed 1, round_bits 3): diverged at
        # 969 with sigma 71.4 in layer 1; hashed_offset at 1447 with 90.4 in layer 1; the cure: no.
        self.assertRegex(page, r"rb3-standard_rounded-seed1</a></td><td>1700</td><td>6\.747</td>.*<td>71\.4 \(1\)</td><td>969</td>")
        self.assertRegex(page, r"rb3-hashed_rounded-seed1</a>.*<td>90\.4 \(1\)</td><td>1447</td>")
        self.assertRegex(page, r"rb3-hashed_compensated-seed1</a>.*<td>no</td></tr>")
        # Series the trainer does not record yet are named, not silently missing.
        self.assertIn("Not shown", page)
        for key in ["wq_sigma_heads", "tie_rows", "delta_shadow_sum", "rank1_similarity", "sigma"]:
            self.assertIn(f"<code>{key}</code>", page)

    def test_renders_the_probes(self):
        # A recorded run with every probe (tests/report/probe-run), overlaid on itself under another
        # name, as two runs are compared.
        probe_run = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe-run")
        other = os.path.join(self.tmp, "probe-run-copy")
        shutil.copytree(probe_run, other)
        out = os.path.join(self.tmp, "out")
        r = stableflash("report", probe_run, other, "-o", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(out, "index.html")) as f:
            page = f.read()
        for name in ["wq_sigma_heads", "sigma_all", "ties", "max_logit", "delta_running_sum", "rank1_similarity"]:
            png = os.path.join(out, name + ".png")
            self.assertTrue(os.path.exists(png), f"{name}.png not drawn\n{r.stdout}")
            colours, non_white = distinct_colours(png)
            self.assertGreater(colours, 50, f"{name}.png looks empty")
            self.assertGreater(non_white, 0.02, f"{name}.png looks empty")
            self.assertIn(f'<img src="{name}.png"', page)
        self.assertNotIn("recorded, but the report has no drawing", page)

    def test_default_out_dir_and_missing_series(self):
        # Without wq_sigma and val_loss, those plots are skipped with a note.
        run = os.path.join(self.tmp, "bare")
        os.makedirs(run)
        with open(os.path.join(RECORDED, "rb3-bf16_control-seed1", "metrics.jsonl")) as f, open(os.path.join(run, "metrics.jsonl"), "w") as g:
            for line in f.readlines()[:200]:
                row = json.loads(line)
                row.pop("wq_sigma", None), row.pop("val_loss", None)
                g.write(json.dumps(row) + "\n")
        r = stableflash("report", run)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = os.path.join(run, "report")
        self.assertEqual(sorted(f for f in os.listdir(out) if f.endswith(".png")), ["grad_norm.png", "loss.png", "lr.png"])
        with open(os.path.join(out, "index.html")) as f:
            page = f.read()
        self.assertIn("<code>wq_sigma</code>): not recorded", page)
        self.assertIn("<code>val_loss</code>): not recorded", page)

    def test_malformed_json_names_file_and_line(self):
        run = copy_run("rb3-bf16_control-seed1", os.path.join(self.tmp, "broken"), lines=30)
        metrics = os.path.join(run, "metrics.jsonl")
        with open(metrics) as f:
            rows = f.readlines()
        rows[6] = rows[6][: len(rows[6]) // 2] + "\n"  # line 7 cut in half, as a crash mid-write would
        with open(metrics, "w") as f:
            f.writelines(rows)
        good = copy_run("rb3-bf16_control-seed2", os.path.join(self.tmp, "good"), lines=30)
        out = os.path.join(self.tmp, "out")
        r = stableflash("report", good, run, "-o", out)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"{metrics}:7: malformed JSON", r.stderr)
        self.assertFalse(os.path.exists(out), "nothing is drawn when an input is bad")

    def test_other_bad_inputs_are_named(self):
        missing = os.path.join(self.tmp, "nope")
        r = stableflash("report", missing)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"{missing}: no such run directory", r.stderr)
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        r = stableflash("report", empty)
        self.assertIn(f"{empty}/metrics.jsonl: not found", r.stderr)
        with open(os.path.join(empty, "metrics.jsonl"), "w") as f:
            f.write('{"step": 0, "loss": 10.8}\n\n{"step": 1}\n')
        r = stableflash("report", empty)
        self.assertIn(f"{empty}/metrics.jsonl:3: no numeric \"loss\"", r.stderr)
        with open(os.path.join(empty, "metrics.jsonl"), "w") as f:
            f.write("[1, 2]\n")
        r = stableflash("report", empty)
        self.assertIn(f"{empty}/metrics.jsonl:1: not a JSON object", r.stderr)


class Divergence(unittest.TestCase):
    @staticmethod
    def rows(losses):
        return [{"step": s, "loss": l} for s, l in enumerate(losses)]

    def test_rule(self):
        flat = [4.0] * 400
        self.assertIsNone(summary.divergence_step(self.rows(flat)))
        # A jump during the warm-up (step <= 150) does not count; the same jump later does.
        self.assertIsNone(summary.divergence_step(self.rows([10.0, 4.0] + [5.6] * 148 + [4.0] * 100)))
        self.assertEqual(summary.divergence_step(self.rows(flat[:300] + [5.6] + flat[:10])), 300)
        # 1.5 nats above the best so far, not above the previous step: a slow climb counts too.
        climb = [3.0] * 200 + [3.0 + 0.01 * i for i in range(200)]
        self.assertEqual(summary.divergence_step(self.rows(climb)), 351)
        self.assertIsNone(summary.divergence_step(self.rows(flat[:300] + [5.5])), "exactly 1.5 nats is not above")
        self.assertEqual(summary.divergence_step(self.rows([10.0, float("nan")])), 1)
        self.assertEqual(summary.divergence_step(self.rows([10.0, float("inf")])), 1)


class Figures(unittest.TestCase):
    """The drawing functions on recorded runs, in this process: what a reader must be able to see."""

    @staticmethod
    def load(*names):
        return [load_run(os.path.join(RECORDED, n), n) for n in names]

    def test_delta_sum_shows_the_drift_before_the_divergence(self):
        # rb2 seed 3: the rounded delta's layer-0 sum is 2.2e-4 at step 499 (the loss jumps at 842, the
        # sum reaches 51 at 1699); the compensated one's is 6.2e-11. On the shared linear axis they
        # were drawn with first, 2.2e-4 lay on the zero line with the 1e-10 noise.
        runs = self.load("rb2-standard_rounded-seed3", "rb2-standard_compensated-seed3")
        fig = series.draw_delta_sum(runs)
        fig.canvas.draw()
        rounded, compensated = fig.axes[0], fig.axes[1]
        step = 499
        value = dict(zip(*runs[0].series("delta_shadow_sum")))[step][0]
        self.assertAlmostEqual(value, 2.2e-4, delta=0.1e-4)
        pixels = lambda ax, v: ax.transData.transform((step, v))[1] - ax.transData.transform((step, 0.0))[1]
        self.assertGreater(pixels(rounded, value), 40, "the drift before the divergence is not visible")
        # The sign is kept (a sum of one sign is the bias) and FP32 noise stays on the zero line.
        self.assertLess(pixels(rounded, -value), -40)
        noise = dict(zip(*runs[1].series("delta_shadow_sum")))[step][0]
        self.assertLess(abs(pixels(compensated, noise)), 1)
        plt.close(fig)

    def test_colour_bars_fit_in_the_figure(self):
        # Panels and a colour bar: tight_layout() ran before the bar was added, and its label and
        # tick labels fell off the right edge of the saved PNG.
        rb3 = self.load(*[f"rb3-{v}-seed1" for v in ["bf16_control", "hashed_compensated", "hashed_rounded", "paper_rounded",
                                                     "standard_compensated", "standard_rounded"]])
        rb2 = self.load(*[f"rb2-{v}-seed3" for v in ["standard_rounded", "paper_rounded", "standard_compensated", "hashed_compensated"]])
        for draw, runs in ((series.draw_wq_sigma_heatmap, rb3), (series.draw_wq_sigma_heads, rb2)):
            fig = draw(runs)
            fig.canvas.draw()
            bar = fig.axes[-1]
            self.assertEqual(bar.get_label(), "<colorbar>")
            box = bar.get_tightbbox(fig.canvas.get_renderer())
            self.assertLessEqual(box.x1, fig.bbox.x1, f"{draw.__name__}: the colour bar's labels are cut off")
            self.assertIn("W_Q spectral norm", bar.get_ylabel())
            plt.close(fig)


class Browser(unittest.TestCase):
    def test_page_shows_the_plots_in_chromium(self):
        chromium = shutil.which("chromium")
        self.assertIsNotNone(chromium, "Debian's chromium is not installed: scripts/setup-deps.sh installs it")
        with tempfile.TemporaryDirectory(prefix="stableflash_report_browser_") as tmp:
            runs = [copy_run(n, os.path.join(tmp, n), lines=900) for n in ["rb3-standard_rounded-seed1", "rb3-paper_rounded-seed1"]]
            out = os.path.join(tmp, "out")
            r = stableflash("report", *runs, "-o", out)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            shot = os.path.join(tmp, "screenshot.png")
            # --no-sandbox: tests run as root in containers, where Chromium's sandbox cannot start.
            subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                            f"--user-data-dir={os.path.join(tmp, 'profile')}", f"--screenshot={shot}",
                            "--window-size=1200,2400", "file://" + os.path.join(out, "index.html")],
                           capture_output=True, timeout=90)
            self.assertTrue(os.path.exists(shot), "chromium wrote no screenshot")
            self.assertEqual(png_size(shot), (1200, 2400))
            colours, fraction = saturated_colours(shot)
            # Measured on this page (2 runs): with the plots 4,427 saturated colours on 1.3% of the
            # pixels; the same page with its PNGs deleted 195 colours (link text) on 0.28%.
            self.assertGreater(colours, 1000, "the screenshot has few saturated colours: are the plots missing?")
            self.assertGreater(fraction, 0.006, "the screenshot has little colour: are the plots missing?")
            keep = os.environ.get("STABLEFLASH_KEEP_SCREENSHOT")
            if keep:
                shutil.copy(shot, keep)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:], verbosity=2)
