"""The phase shares of a whole prefill as a picture: one stacked bar per prompt length.

    python3 bench/plot_phases.py prefill.log phases.svg

Reads the phase tables that bench/bench_prefill_cuda.py prints ("N tokens: ..." then
"phase  ms  share" rows) and writes an SVG with no dependency beyond the standard library.
A bar's length is the phase's share of the prefill, so lengths of different prompt sizes
compare directly; the label gives tokens/s.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


def parse(text: str) -> list[tuple[int, float, dict]]:
    """[(tokens, tokens/s, {phase: ms})] in the order printed."""
    runs = []
    for block in re.split(r"\n(?=\d+ tokens: )", text):
        head = re.match(r"(\d+) tokens: [\d.]+ ms median of \d+, ([\d,]+) tokens/s", block)
        if not head:
            continue
        phases = {}
        for name, ms in re.findall(r"^(\S[^\n]*?)\s+([\d.]+)\s+[\d.]+%$", block, re.M):
            phases[name.strip()] = float(ms)
        runs.append((int(head.group(1)), float(head.group(2).replace(",", "")), phases))
    return runs


def svg(runs, title: str) -> str:
    names = []
    for _, _, ph in runs:
        for k in sorted(ph, key=lambda k: -ph[k]):
            if k not in names:
                names.append(k)
    color = {k: COLORS[i % len(COLORS)] for i, k in enumerate(names)}
    left, width, bar_h, gap, top = 150, 560, 34, 18, 50
    height = top + len(runs) * (bar_h + gap) + 30 + 22 * ((len(names) + 2) // 3)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height}" '
           f'font-family="sans-serif" font-size="13">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="24" font-size="15" font-weight="bold">{title}</text>']
    y = top
    for tokens, rate, ph in runs:
        total = sum(ph.values()) or 1.0
        out.append(f'<text x="{left - 10}" y="{y + bar_h / 2 + 5}" text-anchor="end">{tokens:,} tokens</text>')
        x = float(left)
        for k in names:
            w = width * ph.get(k, 0.0) / total
            if w <= 0:
                continue
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color[k]}">'
                       f'<title>{k}: {ph[k]:.1f} ms ({100 * ph[k] / total:.0f}%)</title></rect>')
            if w > 38:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + bar_h / 2 + 5}" text-anchor="middle" '
                           f'fill="white">{100 * ph[k] / total:.0f}%</text>')
            x += w
        out.append(f'<text x="{left}" y="{y + bar_h + 13}" font-size="11" fill="#555">'
                   f'{rate:,.0f} tokens/s, {total:.0f} ms of phases</text>')
        y += bar_h + gap
    y += 10
    for i, k in enumerate(names):
        cx, cy = left + (i % 3) * 190, y + (i // 3) * 22
        out.append(f'<rect x="{cx}" y="{cy}" width="14" height="14" fill="{color[k]}"/>')
        out.append(f'<text x="{cx + 20}" y="{cy + 12}">{k}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    runs = parse(Path(argv[0]).read_text())
    if not runs:
        print(f"{argv[0]}: no phase tables found", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(svg(runs, "Whole prefill: share of time per phase"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
