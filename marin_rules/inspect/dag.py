"""A picture of the experiment as SVG, written directly (no Graphviz needed).

Model: nodes are the experiment's artifacts, labelled `name@version` and the step,
filled by state (`status.py`); edges run from each upstream to its consumer. Layout
is layered: a node's column is the length of the longest dependency path that
reaches it, and nodes of one column are stacked in experiment order, so the picture
reads left (raw data) to right (evaluations). Nodes are as wide as the longest
label. Edges are cubic curves with arrowheads; one that skips columns arcs above
the boxes between (top to top) instead of running behind them.
"""

from __future__ import annotations

from html import escape

from marin_rules.experiment import Experiment

COLORS = {
    "built": "#b7e1b0", "drifted": "#ffe08a", "upstream rebuilt": "#ffe08a", "code changed": "#d8ecb0",
    "missing": "#e6e6e6",
    "failed": "#f4a6a6", "corrupt": "#e06666", "damaged": "#e06666", "building": "#a9c8f0", "source changed": "#f6b26b",
}  # fmt: skip
NODE_H, GAP_X, GAP_Y, MARGIN = 46, 70, 22, 20
ARC, ARC_STEP = 20, 12  # how far an edge that skips columns arcs above the boxes
CHAR_W = 7.5  # width of one 13 px sans-serif character, generously


def layers(experiment: Experiment) -> dict[str, int]:
    """Column of each artifact: the longest dependency path that reaches it."""
    column: dict[str, int] = {}
    for key, artifact in experiment.artifacts.items():  # dependency order
        column[key] = 1 + max((column[u] for u in artifact.upstream_keys()), default=-1)
    return column


def render_svg(experiment: Experiment, states: dict[str, str]) -> str:
    """The SVG document; `states` maps key -> state (missing when absent)."""
    column = layers(experiment)
    node_w = max(200, int(CHAR_W * max(len(k) for k in experiment.artifacts)) + 24)
    spans = [column[k] - column[u] for k, a in experiment.artifacts.items() for u in a.upstream_keys()]
    top = MARGIN + (ARC + ARC_STEP * max(spans) if any(span > 1 for span in spans) else 0)
    rows: dict[int, int] = {}
    position: dict[str, tuple[int, int]] = {}
    for key in experiment.artifacts:
        c = column[key]
        position[key] = (MARGIN + c * (node_w + GAP_X), top + rows.get(c, 0) * (NODE_H + GAP_Y))
        rows[c] = rows.get(c, 0) + 1
    legend_w = sum(_legend_step(state) for state in COLORS)
    width = max(MARGIN * 2 + (max(column.values()) + 1) * (node_w + GAP_X) - GAP_X, MARGIN * 2 + legend_w)
    height = top + MARGIN + max(rows.values()) * (NODE_H + GAP_Y) - GAP_Y + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        f"<title>{escape(experiment.path)}</title>",
    ]
    for key, artifact in experiment.artifacts.items():
        x2, y2 = position[key]
        for upstream in artifact.upstream_keys():
            x1, y1 = position[upstream]
            span = column[key] - column[upstream]
            if span > 1:  # over the columns between: top of one box to the top of the other
                sx, sy, ex, ey = x1 + node_w / 2, y1, x2 + node_w / 3, y2
                lift = ARC + ARC_STEP * span
                curve = f"M{sx},{sy} C{sx},{sy - lift} {ex},{ey - lift} {ex},{ey}"
            else:
                sx, sy, ex, ey = x1 + node_w, y1 + NODE_H / 2, x2, y2 + NODE_H / 2
                mid = (sx + ex) / 2
                curve = f"M{sx},{sy} C{mid},{sy} {mid},{ey} {ex},{ey}"
            parts.append(
                f'<path class="edge" data-from="{escape(upstream)}" data-to="{escape(key)}" '
                f'd="{curve}" fill="none" stroke="#555" stroke-width="1.4" marker-end="url(#arrow)"/>'
            )
    for key, artifact in experiment.artifacts.items():
        x, y = position[key]
        state = states.get(key, "missing")
        fill = COLORS.get(state, "#ffffff")
        parts.append(
            f'<g class="node" data-key="{escape(key)}" data-state="{escape(state)}">'
            f'<rect x="{x}" y="{y}" width="{node_w}" height="{NODE_H}" rx="8" fill="{fill}" stroke="#333"/>'
            f'<text x="{x + node_w / 2}" y="{y + 19}" text-anchor="middle" font-size="13">{escape(key)}</text>'
            f'<text x="{x + node_w / 2}" y="{y + 36}" text-anchor="middle" font-size="11" fill="#444">'
            f"{escape(artifact.step)}: {escape(state)}</text></g>"
        )
    legend_y = height - 14
    x = MARGIN
    for state, fill in COLORS.items():
        parts.append(
            f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{fill}" stroke="#333"/>'
            f'<text x="{x + 16}" y="{legend_y}" font-size="11">{escape(state)}</text>'
        )
        x += _legend_step(state)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _legend_step(state: str) -> int:
    """Width of one legend entry (swatch, label, gap): the picture is at least as wide as all of them."""
    return 30 + 7 * len(state)
