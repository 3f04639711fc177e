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

A file is copied only when it is what its artifact's record lists (`files.size_problems`:
there, with its recorded size; `files.content_problems`: with its recorded digest,
where the record's result gives one) and reads as what it claims to be (a .md file UTF-8
text, a .png file a PNG whose chunks' checksums hold: `damage`); a damaged one is left
out with one stderr line naming it and the rebuild command, and the report still builds.

The rule declares `{out}` as a report directory with the pattern
`{category}/{artifact}/{file}`, so the report groups files by category, then by
artifact. Reads through `marin_rules.artifacts.storage`, so local and gs:// prefixes
work alike; runs nothing else. Knows no Snakemake.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import struct
import sys
import zlib

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.files import content_problems, recorded_digests, size_problems
from marin_rules.artifacts.identity import artifact_location
from marin_rules.artifacts.records import read_record, rebuild_hint
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


def gathered_stamp(path: str, experiment: Experiment, prefix: str, built: list[str]) -> str:
    """Write `path` (a small local JSON file: the experiment file, its artifacts, the
    prefix and the built ones `built`) unless it already says the same; returns `path`.
    An input of the `marin_report` rule: under Snakemake's mtime trigger, a newer record
    gathers again, and so, through this file, does another experiment or prefix, or an
    artifact built or gone."""
    stamp = json.dumps({"experiment": os.path.abspath(experiment.path), "artifacts": sorted(experiment.artifacts),
                        "prefix": prefix, "built": sorted(built)}, indent=1)  # fmt: skip
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == stamp:
                return path
    except (OSError, UnicodeDecodeError):
        pass
    storage.write_text_atomic(path, stamp)
    return path


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


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_problem(data: bytes) -> str | None:
    """Why `data` is not a whole PNG (its signature, each chunk's length and CRC, an
    IEND at the end); None when it is one."""
    if not data.startswith(PNG_SIGNATURE):
        return "not a PNG file"
    at = len(PNG_SIGNATURE)
    while at + 12 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if len(body) < length or at + 12 + length > len(data):
            break
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            return f"its {kind.decode('latin-1')!r} chunk fails its checksum"
        if kind == b"IEND":
            return None
        at += 12 + length
    return "cut off before its end (no IEND chunk)"


def damage(name: str, data: bytes) -> str | None:
    """Why the bytes of a file to show do not read as what its name says; None when they do."""
    if name.endswith(".png"):
        return png_problem(data)
    if name.endswith(".md"):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"not UTF-8 text ({e.reason} at byte {e.start})"
    return None


def recorded_problems(location: str, names: list[str]) -> dict[str, str]:
    """name -> what is wrong with it, for the `names` (files of the built artifact at
    `location`) that are not as its record lists them; a record that cannot be read
    makes every name a problem."""
    try:
        record = read_record(location)
    except MarinError as e:  # CorruptRecord
        return {name: f"its artifact's record cannot be read ({getattr(e, 'problem', e)})" for name in names}
    if record is None:
        return {}
    wanted = {name: record.files[name] for name in names if name in record.files}
    problems = size_problems(location, wanted) if wanted else {}
    digests = {name: digest for name, digest in recorded_digests(record.result).items()
               if name in names and name not in problems}  # fmt: skip
    return {**problems, **content_problems(location, digests)} if digests else problems


def _left_out(source: str, problem: str, location: str, flags: str) -> None:
    print(f"marin report: {source}: {problem}; left out of the report; {rebuild_hint(location, flags)}",
          file=sys.stderr, flush=True)  # fmt: skip


def gather(experiment: Experiment, prefix: str, out: str, built: set[str], flags: str = "") -> list[str]:
    """Fill `out` (replaced) with the pictures and tables of the `built` artifacts; the
    files written, relative to `out`. A damaged file is left out with one stderr line,
    whose rebuild command ends with `flags` (`workflow.options.rerun_flags`)."""
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
        problems = recorded_problems(location, files)
        for name in files:
            source = storage.join(location, name)
            if name in problems:
                _left_out(source, problems[name], location, flags)
                continue
            try:
                data = storage.read_bytes(source)
            except FileNotFoundError:
                continue
            problem = damage(name, data)
            if problem:
                _left_out(source, problem, location, flags)
                continue
            os.makedirs(folder, exist_ok=True)
            if name.endswith(".md"):
                target = os.path.join(folder, name[:-3] + ".html")
                with open(target, "w", encoding="utf-8") as f:
                    f.write(markdown_to_html(data.decode("utf-8"), f"{key}: {name}"))
            else:
                target = os.path.join(folder, name)
                with open(target, "wb") as f:
                    f.write(data)
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
    from marin_rules.workflow.options import PROJECT_SNAKEFILE, rerun_flags

    experiment = load_experiment(args.experiment)
    here = os.getcwd()  # the rule runs in the workflow's working directory, where a relative prefix is read
    flags = rerun_flags(args.experiment, args.prefix, os.path.dirname(PROJECT_SNAKEFILE), PROJECT_SNAKEFILE, here)
    written = gather(experiment, args.prefix, args.out, set(args.built), flags)
    print(f"gathered {len(written)} file(s) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
