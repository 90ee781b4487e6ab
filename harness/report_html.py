"""``python -m harness report-html REPORT -o OUT.html``: one self-contained HTML page (inline SVG, no script, no
dependency) of a run's error against its bounds, for nightly artifacts.

Per check: its outcomes, and one dot per item on a logarithmic axis. A bounded check's dot sits at the item's largest
error over its bound (``ItemRecord.bound_use``; 1 is the bound, where the dashed line is); an exact check's at the
largest ulp distance it saw (0 ulp, exactness, at the left edge: a passed exact item without a recorded distance
differed nowhere). A dot's tooltip names the item; failures are red.
Below, the items closest to their bound.
"""

from __future__ import annotations

import html
import math
from collections import Counter, defaultdict

from harness.report import Report

WIDTH, HEIGHT, PAD = 760, 44, 40  # a strip's size in pixels, and the room at each end of its axis
BOUND_DECADES = (-6, 1)  # error / bound from 1e-6 to 10
ULP_DECADES = (0, 6)  # ulp from 1 to 1e6; 0 ulp at the left edge
COLORS = {"passed": "#2e7d32", "xfailed": "#8d6e63", "failed": "#c62828", "error": "#c62828", "xpassed": "#c62828"}
WORST = 10


def _x(value: float, decades: tuple[int, int]) -> float:
    """Pixel position of ``value`` on a log axis of ``decades``; zero and below at the left edge."""
    low, high = decades
    if value <= 0:
        return PAD / 2
    frac = (math.log10(value) - low) / (high - low)
    return PAD + max(0.0, min(1.0, frac)) * (WIDTH - 2 * PAD)


def _axis(decades: tuple[int, int], label: str, mark_one: bool) -> list[str]:
    parts = [f'<line x1="{PAD}" y1="{HEIGHT - 12}" x2="{WIDTH - PAD}" y2="{HEIGHT - 12}" stroke="#999"/>']
    for d in range(decades[0], decades[1] + 1):
        x = _x(10.0 ** d, decades)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 1}" font-size="9" text-anchor="middle" fill="#666">'
                     f'1e{d}</text>')
    if mark_one:
        x = _x(1.0, decades)
        parts.append(f'<line x1="{x:.1f}" y1="2" x2="{x:.1f}" y2="{HEIGHT - 12}" stroke="#c62828" '
                     f'stroke-dasharray="3,2"><title>the bound</title></line>')
    else:
        parts.append(f'<text x="{PAD / 2:.1f}" y="{HEIGHT - 1}" font-size="9" text-anchor="middle" fill="#666">'
                     f'0</text>')
    parts.append(f'<text x="{WIDTH - PAD + 4}" y="{HEIGHT - 9}" font-size="9" fill="#666">{label}</text>')
    return parts


def _value(record, bounded: bool) -> float | None:
    """Where an item's dot goes: its error over its bound; for an exact check its ulp distance, 0 when it passed
    without recording one (nothing differed); None: nothing measured (skipped, unsupported, an error)."""
    if bounded:
        return record.bound_use
    if record.max_ulp is not None:
        return record.max_ulp
    return 0 if record.outcome in ("passed", "xpassed") else None


def _strip(records, bounded: bool) -> str:
    decades = BOUND_DECADES if bounded else ULP_DECADES
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 40}" height="{HEIGHT}" role="img">']
    parts += _axis(decades, "err/bound" if bounded else "ulp", bounded)
    for k, r in enumerate(records):
        value = _value(r, bounded)
        if value is None:
            continue
        y = 8 + (k * 7919 % 17)  # spread dots vertically so that equal values stay visible
        shown = f"{value:.3g}" if bounded else f"{value} ulp"
        title = html.escape(f"{r.case_id}::{r.check}: {r.outcome}, {shown}")
        parts.append(f'<circle cx="{_x(value, decades):.1f}" cy="{y}" r="3" fill="{COLORS.get(r.outcome, "#777")}" '
                     f'fill-opacity="0.6"><title>{title}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def render(report: Report, title: str = "ssd-harness run") -> str:
    """The page for ``report`` (a ``run --json`` or ``--ssd-report`` file)."""
    by_check: dict[str, list] = defaultdict(list)
    for r in report.items:
        if r.check:
            by_check[r.check].append(r)
    meta = report.meta
    head = ", ".join(f"{k}={meta[k]}" for k in ("device", "provider", "command") if meta.get(k))
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report.counts().items()))
    out = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        "<style>body{font:14px sans-serif;margin:24px;max-width:900px}table{border-collapse:collapse}"
        "td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}code{font-size:12px}</style>",
        "</head><body>", f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(head)}</p>",
        f"<p>items: {html.escape(counts)}</p>",
    ]
    if report.unfinished:  # a run cut short reads as one, whatever its items say
        out.append(f'<p style="color:#b00"><strong>The run did not finish</strong> '
                   f"({html.escape(report.unfinished)}): not a pass.</p>")
    for worker, why in (meta.get("crashed_workers") or {}).items():
        out.append(f'<p style="color:#b00">worker <code>{html.escape(worker)}</code> died: {html.escape(why)}</p>')
    for check in sorted(by_check):
        records = by_check[check]
        bounded = any(r.bound_use is not None for r in records)
        outcomes = Counter(r.outcome for r in records)
        measured = [r for r in records if _value(r, bounded) is not None]
        what = "largest error / bound per item" if bounded else "largest ulp distance per item (exact: 0)"
        out.append(f"<h2><code>{html.escape(check)}</code></h2>")
        out.append(f"<p>{html.escape(', '.join(f'{n} {k}' for k, n in sorted(outcomes.items())))}; "
                   f"{len(measured)} measured, {what}</p>")
        out.append(_strip(measured, bounded))
        if bounded and measured:
            worst = sorted(measured, key=lambda r: -r.bound_use)[:WORST]
            rows = "".join(f"<tr><td><code>{html.escape(r.case_id)}</code></td><td>{r.bound_use:.3g}</td>"
                           f"<td>{'' if r.max_ulp is None else r.max_ulp}</td><td>{html.escape(r.outcome)}</td></tr>"
                           for r in worst)
            out.append("<table><tr><th>closest to the bound</th><th>err/bound</th><th>max ulp</th><th>outcome</th>"
                       f"</tr>{rows}</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
