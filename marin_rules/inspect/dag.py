"""A picture of the experiment as SVG, written directly (no Graphviz needed).

Model: nodes are the experiment's artifacts, labelled `name@version` and the step,
filled by state (`status.py`); edges run from each upstream to its consumer. Layout
is layered: a node's column is the length of the longest dependency path that
reaches it, and nodes of one column are stacked in experiment order, so the picture
reads left (raw data) to right (evaluations). Edges are cubic curves with arrowheads.
"""

from __future__ import annotations

from html import escape

from marin_rules.experiment import Experiment

COLORS = {
    "built": "#b7e1b0", "drifted": "#ffe08a", "upstream rebuilt": "#ffe08a", "missing": "#e6e6e6",
    "failed": "#f4a6a6", "corrupt": "#e06666", "building": "#a9c8f0",
}  # fmt: skip
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 250, 46, 70, 22, 20


def layers(experiment: Experiment) -> dict[str, int]:
    """Column of each artifact: the longest dependency path that reaches it."""
    column: dict[str, int] = {}
    for key, artifact in experiment.artifacts.items():  # dependency order
        column[key] = 1 + max((column[u] for u in artifact.upstream_keys()), default=-1)
    return column


def render_svg(experiment: Experiment, states: dict[str, str]) -> str:
    """The SVG document; `states` maps key -> state (missing when absent)."""
    column = layers(experiment)
    rows: dict[int, int] = {}
    position: dict[str, tuple[int, int]] = {}
    for key in experiment.artifacts:
        c = column[key]
        position[key] = (MARGIN + c * (NODE_W + GAP_X), MARGIN + rows.get(c, 0) * (NODE_H + GAP_Y))
        rows[c] = rows.get(c, 0) + 1
    width = MARGIN * 2 + (max(column.values()) + 1) * (NODE_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max(rows.values()) * (NODE_H + GAP_Y) - GAP_Y + 30
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
            sx, sy, ex, ey = x1 + NODE_W, y1 + NODE_H / 2, x2, y2 + NODE_H / 2
            mid = (sx + ex) / 2
            parts.append(
                f'<path class="edge" data-from="{escape(upstream)}" data-to="{escape(key)}" '
                f'd="M{sx},{sy} C{mid},{sy} {mid},{ey} {ex},{ey}" fill="none" stroke="#555" '
                'stroke-width="1.4" marker-end="url(#arrow)"/>'
            )
    for key, artifact in experiment.artifacts.items():
        x, y = position[key]
        state = states.get(key, "missing")
        fill = COLORS.get(state, "#ffffff")
        parts.append(
            f'<g class="node" data-key="{escape(key)}" data-state="{escape(state)}">'
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="8" fill="{fill}" stroke="#333"/>'
            f'<text x="{x + NODE_W / 2}" y="{y + 19}" text-anchor="middle" font-size="13">{escape(key)}</text>'
            f'<text x="{x + NODE_W / 2}" y="{y + 36}" text-anchor="middle" font-size="11" fill="#444">'
            f"{escape(artifact.step)}: {escape(state)}</text></g>"
        )
    legend_y = height - 14
    x = MARGIN
    for state, fill in COLORS.items():
        parts.append(
            f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{fill}" stroke="#333"/>'
            f'<text x="{x + 16}" y="{legend_y}" font-size="11">{escape(state)}</text>'
        )
        x += 30 + 7 * len(state)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
