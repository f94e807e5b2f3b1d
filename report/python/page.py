"""The report's one HTML page: self-contained (inline style, no scripts, no network), images by
relative path so the folder can be moved, zipped or served as it is."""
import html
import os

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.diverged td { background: #fde8e8; }
img { max-width: 100%; border: 1px solid #eee; }
.caption, .note { color: #555; font-size: 13px; }
"""


def fmt(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def table(runs, summaries, out_dir):
    head = ("<tr><th>run</th><th>steps</th><th>final loss</th><th>best val loss (step)</th>"
            "<th>largest W_Q σ (layer, step)</th><th>final W_Q σ (layer)</th><th>diverged at</th></tr>")
    rows = []
    for run, s in zip(runs, summaries):
        link = os.path.relpath(run.dir, out_dir)
        val = f"{fmt(s['best_val'][0])} ({s['best_val'][1]})" if s["best_val"] else "–"
        peak = f"{s['peak_sigma'][0]:.1f} ({s['peak_sigma'][1]}, {s['peak_sigma'][2]})" if s.get("peak_sigma") else "–"
        final = f"{s['final_sigma'][0]:.1f} ({s['final_sigma'][1]})" if s.get("final_sigma") else "–"
        diverged = "no" if s["diverged_at"] is None else str(s["diverged_at"])
        rows.append(f"<tr class=\"{'diverged' if s['diverged_at'] is not None else ''}\">"
                    f"<td><a href=\"{html.escape(link)}\">{html.escape(run.name)}</a></td><td>{s['steps']}</td>"
                    f"<td>{fmt(s['final_loss'])}</td><td>{val}</td><td>{peak}</td><td>{final}</td><td>{diverged}</td></tr>")
    return f"<table>\n{head}\n" + "\n".join(rows) + "\n</table>"


def write_page(out_dir, title, runs, summaries, drawn, skipped, divergence_rule):
    """drawn: [(Series, runs_without_it)]; skipped: [(Series, why)]."""
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p class=\"note\">{len(runs)} run(s). Diverged: {html.escape(divergence_rule)}. "
             "Layers are 0-based. Click a plot for its SVG.</p>", table(runs, summaries, out_dir)]
    for series, missing in drawn:
        parts.append(f"<h2>{html.escape(series.title)}</h2><p class=\"caption\">{html.escape(series.caption)}</p>")
        if missing:
            parts.append(f"<p class=\"note\">Not in these runs' metrics: {html.escape(', '.join(missing))}.</p>")
        parts.append(f"<a href=\"{series.file}.svg\"><img src=\"{series.file}.png\" alt=\"{html.escape(series.title)}\"></a>")
    if skipped:
        parts.append("<h2>Not shown</h2><ul class=\"note\">")
        parts += [f"<li>{html.escape(series.title)} (<code>{series.key}</code>): {html.escape(why)}</li>" for series, why in skipped]
        parts.append("</ul>")
    parts.append("</body></html>\n")
    path = os.path.join(out_dir, "index.html")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(parts))
    os.replace(path + ".tmp", path)
    return path
