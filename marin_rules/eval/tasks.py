"""The local lm-eval tasks, built from held-out plays: YAML files plus JSONL data.

Model: a `download` artifact's `heldout/*.jsonl.gz` holds whole plays that training
never saw (Dolma documents: `text`, `metadata.play`). From them, deterministically
given a seed, we write into one folder (an lm-eval `--include_path`):

- `marin_shakespeare_bpb`: passages of about `passage_chars` characters, cut at blank
  lines, scored with `loglikelihood_rolling` (word_perplexity, byte_perplexity,
  bits_per_byte). Passages are shuffled across plays, so a `limit` samples all plays.
- `marin_shakespeare_cloze`: `multiple_choice`; the question is `context_lines`
  consecutive lines of a play, the choices the true next line and `distractors`
  other lines of the same play (acc; acc_norm, length-normalised; acc_mutual_info,
  each choice's log-likelihood minus its log-likelihood without the context: how
  much the preceding lines help, where a context-blind model such as the unigram
  baseline sits at chance).

Inside an artifact the YAMLs name their JSONL relative to the YAML's folder
(`dataset_path: json`, `data_files: {test: <task>.jsonl}`), so a moved or copied
artifact stays valid; `task_configs(folder)` reads them back as lm-eval task dicts
with the data path resolved at read time (what the evaluate step hands lm-eval).
The command line writes a folder for `lm_eval --include_path` (whose YAML paths lm-eval
reads relative to the working directory), so there they are absolute:
`python -m marin_rules.eval.tasks <download artifact> <out dir> [--seed N]`.
Either way the folder works offline with `HF_DATASETS_OFFLINE=1`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
from dataclasses import dataclass
from typing import Iterable, Sequence

import yaml

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import StepError
from marin_rules.data import dolma
from marin_rules.eval.config import BPB_TASK, CLOZE_TASK, LOCAL_TASKS, BpbOptions, ClozeOptions


@dataclass(frozen=True)
class Play:
    name: str
    text: str


@dataclass(frozen=True)
class BuiltTasks:
    folder: str  # the include_path: one YAML and one JSONL per task
    counts: dict[str, int]  # task -> number of documents
    plays: tuple[str, ...]


def read_heldout(data_location: str) -> list[Play]:
    """The held-out plays of a `download` artifact (its `heldout/*.jsonl.gz`)."""
    folder = storage.join(data_location, "heldout")
    files = storage.list_files(folder, "*.jsonl.gz") if storage.exists(folder) else []
    if not files:
        raise StepError(
            f"deps.data: no held-out documents under {folder}; give the download step "
            "`heldout: [<play>, ...]` so evaluation has plays training never saw"
        )
    plays = []
    for i, doc in enumerate(dolma.read_split(data_location, "heldout", field="deps.data")):  # damage: one line
        meta = doc.get("metadata")
        name = (meta.get("play") if isinstance(meta, dict) else None) or doc.get("id") or f"heldout-{i}"
        if doc["text"].strip():
            plays.append(Play(str(name), doc["text"]))
    if not plays:
        raise StepError(f"deps.data: the held-out files under {folder} hold no text")
    return plays


def passages(play: Play, passage_chars: int) -> list[str]:
    """A play cut at blank lines into passages of at least `passage_chars` characters
    (the last one may be shorter)."""
    out, current = [], []
    size = 0
    for block in play.text.split("\n\n"):
        if not block.strip():
            continue
        current.append(block.strip("\n"))
        size += len(block) + 2
        if size >= passage_chars:
            out.append("\n\n".join(current))
            current, size = [], 0
    if current:
        out.append("\n\n".join(current))
    return out


def bpb_docs(plays: Sequence[Play], options: BpbOptions, seed: int) -> list[dict]:
    docs = [
        {"text": text, "play": play.name, "passage": i}
        for play in plays
        for i, text in enumerate(passages(play, options.passage_chars))
    ]
    random.Random(seed).shuffle(docs)
    return docs


def cloze_docs(plays: Sequence[Play], options: ClozeOptions, seed: int) -> list[dict]:
    """One question per line long enough to be a target, shuffled; each with the true
    line and `distractors` different lines of the same play in a seeded order."""
    rng = random.Random(seed)
    docs = []
    for play in plays:
        lines = [line.rstrip() for line in play.text.splitlines() if line.strip()]
        pool = sorted({line for line in lines if len(line.strip()) >= options.min_chars})
        if len(pool) <= options.distractors:
            continue
        for i in range(options.context_lines, len(lines)):
            target = lines[i]
            if len(target.strip()) < options.min_chars:
                continue
            wrong: list[str] = []
            while len(wrong) < options.distractors:
                candidate = pool[rng.randrange(len(pool))]
                if candidate != target and candidate not in wrong:
                    wrong.append(candidate)
            choices = [target, *wrong]
            rng.shuffle(choices)
            docs.append(
                {
                    "context": "\n".join(lines[i - options.context_lines : i]) + "\n",
                    "choices": choices,
                    "label": choices.index(target),
                    "play": play.name,
                    "line": i,
                }
            )
    rng.shuffle(docs)
    return docs


def task_yaml(name: str, data_file: str) -> dict:
    """The lm-eval task config of a local task reading `data_file` (a path relative to
    the YAML's folder, or absolute)."""
    common = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file}},
        "test_split": "test",
        "metadata": {"version": 1.0},
    }
    if name == BPB_TASK:
        return {
            **common,
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "text",
            "metric_list": [
                {"metric": "word_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
                {"metric": "byte_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
                {"metric": "bits_per_byte", "aggregation": "bits_per_byte", "higher_is_better": False},
            ],
        }
    if name == CLOZE_TASK:
        return {
            **common,
            "output_type": "multiple_choice",
            "fewshot_split": "test",
            "doc_to_text": "context",
            "doc_to_choice": "choices",
            "doc_to_target": "label",
            "target_delimiter": "",
            "fewshot_delimiter": "\n",
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True}
                for m in ("acc", "acc_norm", "acc_mutual_info")
            ],
        }
    raise ValueError(f"{name!r} is not a local task; local tasks: {', '.join(LOCAL_TASKS)}")


def build_local_tasks(
    plays: Sequence[Play],
    folder: str,
    *,
    names: Iterable[str] = LOCAL_TASKS,
    seed: int = 0,
    cloze: ClozeOptions = ClozeOptions(),
    bpb: BpbOptions = BpbOptions(),
    absolute_paths: bool = False,
) -> BuiltTasks:
    """Write `<folder>/<task>.yaml` and `<folder>/<task>.jsonl` for each local task
    in `names` (a local directory) and a `manifest.json`. The YAMLs name their data
    file relative to `folder` unless `absolute_paths` (for `lm_eval --include_path`)."""
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    counts = {}
    for name in names:
        docs = bpb_docs(plays, bpb, seed) if name == BPB_TASK else cloze_docs(plays, cloze, seed)
        if not docs:
            raise StepError(f"deps.data: the held-out plays give no documents for {name}")
        data_file = os.path.join(folder, f"{name}.jsonl")
        _write_jsonl(data_file, docs)
        named = data_file if absolute_paths else os.path.basename(data_file)
        with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(task_yaml(name, named), f, sort_keys=False, allow_unicode=True)
        counts[name] = len(docs)
    manifest = {
        "seed": seed,
        "plays": [p.name for p in plays],
        "counts": counts,
        "cloze": vars(cloze),
        "bpb": vars(bpb),
    }
    storage.write_json_atomic(os.path.join(folder, "manifest.json"), manifest)
    return BuiltTasks(folder, counts, tuple(p.name for p in plays))


def task_configs(folder: str, names: Iterable[str]) -> list[dict]:
    """The tasks `names` of a folder written by `build_local_tasks`, as lm-eval task
    dicts whose data files are absolute paths under `folder` as it is now."""
    configs = []
    for name in names:
        with open(os.path.join(folder, f"{name}.yaml"), encoding="utf-8") as f:
            config = yaml.safe_load(f)
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {
            split: os.path.join(os.path.abspath(folder), path) for split, path in files.items()
        }  # os.path.join keeps a path that is already absolute
        configs.append(config)
    return configs


def _write_jsonl(path: str, docs: list[dict]) -> None:
    buffer = io.StringIO()
    for doc in docs:
        buffer.write(json.dumps(doc, ensure_ascii=False) + "\n")
    storage.write_text_atomic(path, buffer.getvalue())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a download artifact (local or gs://) with heldout/*.jsonl.gz")
    parser.add_argument("out", help="local folder to write the task YAMLs and JSONL into")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    built = build_local_tasks(read_heldout(args.data), args.out, seed=args.seed, absolute_paths=True)
    print(json.dumps({"include_path": built.folder, "counts": built.counts}))


if __name__ == "__main__":
    main()
