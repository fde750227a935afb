"""A line chart as SVG text, with no plotting library: what eval.md links for the per-block
error (`blocks.py`). Plain SVG 1.1, so a browser, an IDE or GitHub shows it."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, MARGIN = 640, 320, 56


def line_svg(points: Sequence[tuple[float, float]], *, title: str, x_label: str,
             y_label: str) -> str:
    """`points` (x, y) joined in order, on axes spanning them, five ticks on each."""
    if not points:
        raise ValueError("a line chart needs at least one point")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    inner_w, inner_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def sx(x: float) -> float:
        return MARGIN + (x - x0) / (x1 - x0) * inner_w

    def sy(y: float) -> float:
        return HEIGHT - MARGIN - (y - y0) / (y1 - y0) * inner_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}'
        "</text>",
        f'<line x1="{MARGIN}" y1="{HEIGHT - MARGIN}" x2="{WIDTH - MARGIN}" '
        f'y2="{HEIGHT - MARGIN}" stroke="black"/>',
        f'<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{HEIGHT - MARGIN}" '
        'stroke="black"/>',
    ]
    for i in range(5):
        tx = x0 + (x1 - x0) * i / 4
        ty = y0 + (y1 - y0) * i / 4
        parts.append(f'<text x="{sx(tx):.1f}" y="{HEIGHT - MARGIN + 16}" '
                     f'text-anchor="middle">{tx:g}</text>')
        parts.append(f'<text x="{MARGIN - 6}" y="{sy(ty) + 4:.1f}" text-anchor="end">'
                     f'{ty:.1f}</text>')
        parts.append(f'<line x1="{MARGIN}" y1="{sy(ty):.1f}" x2="{WIDTH - MARGIN}" '
                     f'y2="{sy(ty):.1f}" stroke="#ddd"/>')
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    parts += [
        f'<polyline points="{path}" fill="none" stroke="#1f5fa8" stroke-width="2"/>',
        *(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="#1f5fa8"/>'
          for x, y in points),
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 12}" text-anchor="middle">{escape(x_label)}'
        "</text>",
        f'<text x="14" y="{HEIGHT / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {HEIGHT / 2})">{escape(y_label)}</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"
