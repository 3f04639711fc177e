"""Gather each artifact's pictures and tables into one local folder for Snakemake's report.

Model: `snakemake --report` embeds only files that a job of the DAG declares as
`report(...)` outputs, and they must be local. Artifact outputs are success records
(the data may live on gs://), so the `marin_report` rule (rules/report.smk) runs
`python -m marin_rules.inspect.gather`, which copies, for every built artifact of the
experiment, what a reader wants to see into `{out}/{category}/{artifact key}/`:

  Training     loss.png (train and validation loss curves)
  Evaluation   results.html (results.md as an HTML table: model vs baseline with stderr),
               results.png when present
  Scaling      scaling.png and table.html of a scaling_fit, check.png of a scaling_check
  Experiment   dag.svg (`marin dag`'s picture, coloured by state) under the experiment's name

The rule declares `{out}` as a report directory with the pattern
`{category}/{artifact}/{file}`, so the report groups files by category, then by
artifact. Reads through `marin_rules.artifacts.storage`, so local and gs:// prefixes
work alike; runs nothing else. Knows no Snakemake.
"""

from __future__ import annotations

import argparse
import html
import os
import shutil
import sys

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import artifact_location
from marin_rules.experiment import Experiment, load_experiment

# step kind -> (category, files of the artifact to show; a .md file is shown as .html)
WANTED: dict[str, tuple[str, list[str]]] = {
    "train": ("Training", ["loss.png"]),
    "evaluate": ("Evaluation", ["results.md", "results.png"]),
    "scaling_fit": ("Scaling", ["scaling.png", "table.md"]),
    "scaling_check": ("Scaling", ["check.png"]),
}


def reported_keys(experiment: Experiment, built: set[str]) -> list[str]:
    """The built artifacts whose step has something to show, in experiment order."""
    return [k for k, a in experiment.artifacts.items() if a.step in WANTED and k in built]


def built_keys(experiment: Experiment, recorded) -> list[str]:
    """The artifacts to show: `recorded(key)` returns the record (None when not built)."""
    return [k for k, a in experiment.artifacts.items() if a.step in WANTED and recorded(k) is not None]


def markdown_to_html(text: str, title: str) -> str:
    """A markdown table (with `#` headings and plain lines around it) as a small HTML page."""
    body: list[str] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            head, *rest = rows
            out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"]
            out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rest]
            body.append("\n".join(out + ["</table>"]))
            rows.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|"):
            cells = [c.strip() for c in stripped.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):  # not the |---| separator
                rows.append(cells)
            continue
        flush()
        if stripped.startswith("#"):
            body.append(f"<h2>{html.escape(stripped.lstrip('#').strip())}</h2>")
        elif stripped:
            body.append(f"<p>{html.escape(stripped)}</p>")
    flush()
    style = "table{border-collapse:collapse}td,th{border:1px solid #999;padding:2px 8px;font-family:sans-serif}"
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def gather(experiment: Experiment, prefix: str, out: str, built: set[str]) -> list[str]:
    """Fill `out` (replaced) with the pictures and tables of the `built` artifacts; the
    files written, relative to `out`."""
    from marin_rules.inspect.dag import render_svg
    from marin_rules.inspect.status import experiment_status

    if os.path.isdir(out):
        shutil.rmtree(out)
    written = []
    for key in reported_keys(experiment, built):
        artifact = experiment[key]
        category, files = WANTED[artifact.step]
        location = artifact_location(prefix, artifact.id)
        folder = os.path.join(out, category, key)
        for name in files:
            source = storage.join(location, name)
            if not storage.exists(source):
                continue
            os.makedirs(folder, exist_ok=True)
            if name.endswith(".md"):
                target = os.path.join(folder, name[:-3] + ".html")
                with open(target, "w", encoding="utf-8") as f:
                    f.write(markdown_to_html(storage.read_text(source), f"{key}: {name}"))
            else:
                target = os.path.join(folder, name)
                with open(target, "wb") as f:
                    f.write(storage.read_bytes(source))
            written.append(os.path.relpath(target, out))
    states = {r.key: r.state for r in experiment_status(experiment, prefix)}
    folder = os.path.join(out, "Experiment", os.path.splitext(os.path.basename(experiment.path))[0])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "dag.svg"), "w", encoding="utf-8") as f:
        f.write(render_svg(experiment, states))
    written.append(os.path.relpath(os.path.join(folder, "dag.svg"), out))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marin_rules.inspect.gather", description=__doc__.split("\n")[0])
    p.add_argument("--experiment", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--built", nargs="*", default=[], help="name@version of the built artifacts to show")
    args = p.parse_args(argv)
    experiment = load_experiment(args.experiment)
    written = gather(experiment, args.prefix, args.out, set(args.built))
    print(f"gathered {len(written)} file(s) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
