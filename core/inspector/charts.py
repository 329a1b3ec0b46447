"""Small inline SVG charts, drawn on the server (no script, no external asset).

Every chart is an `<svg role="img">` with a <title> and a <desc> that says in words what the
picture shows, and the pages print the same numbers in a table beside it. Colours come from
presentation attributes and CSS classes, never `style=` (the pages' CSP allows no inline
style)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Mapping

from markupsafe import Markup, escape

from ..lifecycle import SECONDS_PER_DAY, decay_score
from ..models import MemoryCell

# The parts of an `explain` breakdown worth a bar (all in 0..1), in reading order.
EXPLAIN_BARS = (
    ("relevance", "relevance (probability)"),
    ("decay", "decay score now"),
    ("entity", "entity match"),
    ("wilson", "playbook Wilson bound"),
    ("score", "final score"),
)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def explain_chart(explain: Mapping[str, float], weights: Mapping[str, float], label: str) -> Markup:
    """Horizontal bars for the 0..1 parts of a search hit's score, and the final score split
    into its shares: relevance x (1 - w) and relevance x w x decay (w: `weights["decay"]`)."""
    rows = [(key, name, float(explain[key])) for key, name in EXPLAIN_BARS if key in explain]
    width, bar_x, bar_w, row_h = 460, 90, 220, 18
    height = row_h * (len(rows) + 1) + 6
    parts = [f'<svg class="chart explain" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'aria-labelledby="t-{escape(label)} d-{escape(label)}">',
             f'<title id="t-{escape(label)}">Score breakdown</title>',
             f'<desc id="d-{escape(label)}">' + escape("; ".join(f"{name}: {value:.3f}" for _, name, value in rows))
             + "</desc>"]
    for n, (key, name, value) in enumerate(rows):
        y = 4 + n * row_h
        w = max(0.0, min(1.0, value)) * bar_w
        parts.append(f'<text x="0" y="{y + 12}" class="label">{escape(key)}</text>')
        parts.append(f'<rect x="{bar_x}" y="{y + 2}" width="{bar_w}" height="12" class="track"/>')
        parts.append(f'<rect x="{bar_x}" y="{y + 2}" width="{w:.1f}" height="12" class="bar bar-{escape(key)}"/>')
        parts.append(f'<text x="{bar_x + bar_w + 6}" y="{y + 12}" class="value">{value:.3f}</text>')
    # The final score as its two weighted shares.
    w = weights.get("decay", 0.0)
    rel = (1.0 - w) * float(explain.get("relevance", 0.0))
    dec = w * float(explain.get("relevance", 0.0)) * float(explain.get("decay", 0.0))
    y = 4 + len(rows) * row_h
    parts.append(f'<text x="0" y="{y + 12}" class="label">score =</text>')
    x = float(bar_x)
    for cls, share in (("share-relevance", rel), ("share-decay", dec)):
        w = max(0.0, min(1.0, share)) * bar_w
        parts.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="12" class="{cls}"/>')
        x += w
    parts.append(f'<text x="{bar_x + bar_w + 6}" y="{y + 12}" class="value">'
                 f'rel·({_num(1 - w)} + {_num(w)}·decay)</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def decay_points(cell: MemoryCell, now: datetime, threshold: float, samples: int = 48) -> tuple[list[tuple[float, float]], float, float, float]:
    """The cell's decay score from its last access (or creation) forward: (points as (days,
    score)), the span in days, where `now` falls, and the day it crosses `threshold` (inf if
    it never does). The score restarts at every read, so the past before the last access is
    not drawn: it is what the score *will* do if nobody reads the cell."""
    start = cell.lifecycle.last_accessed_at or cell.lifecycle.created_at
    s = cell.scoring
    peak = s.importance * s.confidence
    now_day = max(0.0, (now - start).total_seconds() / SECONDS_PER_DAY)
    if peak < threshold:
        cross = 0.0
    elif s.decay_rate <= 0:
        cross = math.inf
    else:
        cross = math.log(peak / threshold) / s.decay_rate
    span = max(now_day * 1.25, 30.0, min(cross * 1.2, 730.0) if math.isfinite(cross) else 30.0)
    span = min(span, max(730.0, now_day * 1.25))
    points = []
    for i in range(samples + 1):
        day = span * i / samples
        points.append((day, decay_score(cell, start + timedelta(days=day))))
    return points, span, now_day, cross


def decay_chart(cell: MemoryCell, now: datetime, threshold: float) -> Markup:
    points, span, now_day, cross = decay_points(cell, now, threshold)
    width, height, left, bottom, top, right = 480, 170, 36, 24, 8, 12
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(day: float) -> float:
        return left + plot_w * day / span

    def y(score: float) -> float:
        return top + plot_h * (1.0 - max(0.0, min(1.0, score)))

    line = " ".join(f"{x(d):.1f},{y(v):.1f}" for d, v in points)
    now_score = decay_score(cell, now)
    desc = (f"Decay score from {_score(points[0][1], threshold)} at the last access (day 0) over {span:.0f} days. "
            + decay_sentence(cell, now, threshold))
    parts = [f'<svg class="chart decay" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'aria-labelledby="decay-title decay-desc">',
             '<title id="decay-title">Decay score over time</title>',
             f'<desc id="decay-desc">{escape(desc)}</desc>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>']
    for tick in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{left - 4}" y="{y(tick) + 4:.1f}" class="tick" text-anchor="end">{_num(tick)}</text>')
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        parts.append(f'<text x="{x(span * frac):.1f}" y="{height - 6}" class="tick" text-anchor="{anchor}">'
                     f'{"day " if frac == 0 else ""}{span * frac:.0f}</text>')
    parts.append(f'<line x1="{left}" y1="{y(threshold):.1f}" x2="{left + plot_w}" y2="{y(threshold):.1f}" '
                 f'class="threshold"/>')
    parts.append(f'<text x="{left + plot_w}" y="{y(threshold) - 3:.1f}" class="tick" text-anchor="end">'
                 f'stale below {threshold:g}</text>')
    parts.append(f'<polyline points="{line}" class="curve" fill="none"/>')
    parts.append(f'<line x1="{x(now_day):.1f}" y1="{top}" x2="{x(now_day):.1f}" y2="{top + plot_h}" class="now"/>')
    parts.append(f'<circle cx="{x(now_day):.1f}" cy="{y(now_score):.1f}" r="3" class="now-dot"/>')
    parts.append(f'<text x="{x(now_day) + 4:.1f}" y="{top + 10}" class="tick">now</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _score(value: float, threshold: float) -> str:
    """A score with three decimals, or more where three would make it look equal to the
    threshold it is not equal to (0.2996 is below 0.3, not "0.300")."""
    text = f"{value:.3f}"
    if value != threshold and float(text) == threshold:
        text = f"{value:.6f}".rstrip("0")
    return text


def decay_sentence(cell: MemoryCell, now: datetime, threshold: float) -> str:
    """The decay score now and what it will do, in words that agree with the numbers: the
    lifecycle marks a cell stale when its score is below (strictly) the threshold."""
    _, _, now_day, cross = decay_points(cell, now, threshold)
    score, peak, rate = decay_score(cell, now), cell.scoring.importance * cell.scoring.confidence, cell.scoring.decay_rate
    where = "below" if score < threshold else "at" if score == threshold else "above"
    days = f"{now_day:.0f} day{'' if f'{now_day:.0f}' == '1' else 's'}"
    first = (f"Decay score now {_score(score, threshold)}, {where} the stale threshold {threshold:g} "
             f"({days} since its last use).")
    if peak < threshold:
        then = (f"Even right after a use its score is only {_score(peak, threshold)} (importance × confidence), "
                "below the threshold, so lifecycle runs mark it stale.")
    elif rate <= 0:
        then = "Its decay rate is 0: the score never falls, so it never goes stale."
    elif cross == 0:
        then = "Right after a use its score is exactly the threshold; it falls below as soon as time passes."
    else:
        then = (f"After a use it falls below the threshold in {cross:.0f} day{'' if f'{cross:.0f}' == '1' else 's'}; "
                "a read restarts the clock.")
    return f"{first} {then}"

