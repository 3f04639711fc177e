"""Inputs an outside tester found passing the loader and failing only when the job ran
(or in Snakemake's planning): each is refused when the experiment file is read, so
`snakemake -n`, `marin status` and `marin plan` refuse it too, with one line naming
the artifact and the field. The messages are listed in docs/errors.md ("Limits and
upstream recipes"), word for word."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import REPO
from marin_rules.artifacts.errors import ConfigError, MarinError
from marin_rules.artifacts.identity import MAX_OWNER_BYTES, MAX_SEGMENT_BYTES, path_safe_user, periodic_suffix
from marin_rules.cli import main
from marin_rules.data.checks import check_mixture
from marin_rules.experiment import build_experiment, load_experiment
from test_error_messages import RAW, TOK, TOKENIZED, chain


def with_entries(data: dict, **entries) -> dict:
    """`data` plus entries (key with `_` for `/`: tokenized_b -> tokenized/b@v1)."""
    data["artifacts"].update({k.replace("_", "/") + "@v1": v for k, v in entries.items()})
    return data


def load(tmp_path, data: dict):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_experiment(str(path))


def refusal(tmp_path, data: dict) -> str:
    """The loader's one-line message for an experiment file holding `data`."""
    with pytest.raises(MarinError) as e:
        load(tmp_path, data)
    message = str(e.value).replace(str(tmp_path / "exp.yaml"), "exp.yaml")
    assert "\n" not in message
    return message


LONG = "a" * (MAX_SEGMENT_BYTES + 1)
MIXTURE = {"tokenized/a@v1": 1.0e308, "tokenized/b@v1": 1.0e308}
SWEEP = {"step": "mypkg.steps:make", "deps": {"data": {"tokenized/{a}@v1": 1, "tokenized/{b}@v1": 3}},
         "cases": [{"i": 1, "a": "s", "b": "s"}]}  # fmt: skip

# docs/errors.md row -> (bad input, its message)
CASES: dict[str, tuple[dict, str]] = {
    "evaluation on a download that holds nothing out": (
        chain("raw/a@v1", config__heldout=[]),
        "evaluations/m@v1: deps.data: raw/a@v1 holds out no documents (its config has no heldout:), and the local "
        "tasks (marin_shakespeare_bpb, marin_shakespeare_cloze) score held-out plays; give raw/a@v1 a config.heldout "
        "list of plays (under a new version once it is built), evaluate on a download that has them, or list only "
        "lm-eval tasks in config.tasks",
    ),
    "train seed above 32 bits": (
        chain("checkpoints/m@v1", config__seed=2**64),
        "checkpoints/m@v1: config.seed: expected an integer in [0, 4294967295], got 18446744073709551616",
    ),
    "evaluate seed above 32 bits": (
        chain("evaluations/m@v1", config__seed=2**32),
        "evaluations/m@v1: config.seed: expected an integer in [0, 4294967295], got 4294967296",
    ),
    "step count above int32": (
        chain("checkpoints/m@v1", config__num_train_steps=2**31),
        "checkpoints/m@v1: config.num_train_steps: expected an integer <= 2147483647 (steps and sizes are int32 "
        "in the jitted training step), got 2147483648",
    ),
    "name segment too long for a folder": (
        {"artifacts": {f"raw/{LONG}@v1": RAW}},
        f"exp.yaml: artifacts: name segment '{'a' * 24}...' of 'raw/{'a' * 44}...' is 201 bytes long; each name "
        "segment and the version may be at most 200 bytes in UTF-8 (each becomes a folder name: filesystems "
        "allow 255, and a dev version's folder adds -<user>)",
    ),
    "name and version too long for a path": (
        {"artifacts": {"raw/" + "/".join(["a" * 190] * 3) + "@v1": RAW}},
        f"exp.yaml: artifacts: 'raw/{'a' * 44}...' is 579 bytes long as a folder path (name/version); it may be at "
        "most 512 bytes in UTF-8 (it lies below the prefix and above the artifact's files, within a local path's "
        "4096 bytes and a GCS object name's 1024): shorten the name or version",
    ),
    "version Snakemake takes for a recursion": (
        {"artifacts": {"raw/a@v100000000000000000000": RAW}},
        "raw/a@v100000000000000000000: version: 'raw/a/v100000000000000000000' ends in '0' repeated 20 or more "
        "times, a wildcard value Snakemake refuses (it takes it for an endless recursion); change the name or version",
    ),
    "mixture weights whose sum overflows": (
        with_entries(chain("checkpoints/m@v1", deps__data=MIXTURE), tokenized_b=TOKENIZED),
        "checkpoints/m@v1: deps.data: mixture weights must sum to a finite number, got a sum of inf; scale them "
        "down (only their ratios matter, e.g. 1 and 3)",
    ),
    "train data without a validation split": (
        chain("tokenized/a@v1", config__validation_fraction=0),
        "checkpoints/m@v1: deps.data: tokenized/a@v1 has validation_fraction: 0 (no validation split), but training "
        "always measures the validation loss (at the end, and every eval_every steps); set validation_fraction > 0 "
        "on tokenized/a@v1 (the default is 0.05)",
    ),
    "mixture of two tokenizers": (
        with_entries(
            chain("checkpoints/m@v1", deps__data={"tokenized/a@v1": 1, "tokenized/b@v1": 1}),
            tokenizers_u=TOK, tokenized_b={**TOKENIZED, "deps": {"corpus": "raw/a@v1", "tokenizer": "tokenizers/u@v1"}},
        ),
        "checkpoints/m@v1: deps.data: a mixture needs one tokenizer, but its members are tokenized differently "
        "(tokenized/a@v1 with tokenizers/t@v1, tokenized/b@v1 with tokenizers/u@v1); tokenize every member with "
        "the same tokenizer artifact",
    ),
    "evaluation on documents the model trained on": (
        with_entries(chain("evaluations/m@v1", deps__data="raw/b@v1"),
                     raw_b={"step": "download", "config": {"heldout": ["macbeth", "hamlet"]}}),  # fmt: skip
        "evaluations/m@v1: deps.data: raw/b@v1 holds out macbeth, which checkpoints/m@v1 trained on (its corpus "
        "raw/a@v1 holds out only hamlet): the scores would not be held-out scores; evaluate on raw/a@v1 (its "
        "held-out split), or hold macbeth out of raw/a@v1 too",
    ),
    "model vocabulary below the tokenizer's": (
        chain("checkpoints/m@v1", config__model__vocab_size=300),
        "checkpoints/m@v1: config.model.vocab_size: 300 is smaller than the vocab_size 512 of tokenizer "
        "tokenizers/t@v1 (of tokenized/a@v1, deps.data); set it to at least 512, or leave it out to take the tokenizer's",
    ),
    "batch not divisible by the mesh": (
        chain("checkpoints/m@v1", config__mesh={"data": 3, "expert": 1}),
        "checkpoints/m@v1: config.batch_size: 4 must be divisible by grad_accum_steps (1) x batch shards "
        "(3 = mesh data 3 x expert 1); try 3",
    ),
    "misspelled held-out play": (
        chain("raw/a@v1", config__heldout=["hamlett"]),
        "raw/a@v1: config.heldout: no document with key 'hamlett' in 'package:shakespeare' (did you mean hamlet?); "
        "its keys are play ids such as hamlet, macbeth, tempest",
    ),
    "config-wide few-shot on bits per byte": (
        chain("evaluations/m@v1", config={"limit": 2, "num_fewshot": 5}),
        "evaluations/m@v1: config.num_fewshot: marin_shakespeare_bpb scores whole passages (loglikelihood_rolling); "
        "expected 0, got 5 (every task without its own num_fewshot takes this one: list marin_shakespeare_bpb as "
        "{name: marin_shakespeare_bpb, num_fewshot: 0} in tasks, or set num_fewshot per task)",
    ),
    "empty list as config": (chain("raw/a@v1", config=[]), "raw/a@v1: config: expected a mapping, got list"),
    "sweep case making two keys equal": (
        with_entries(chain("raw/a@v1"), tokenized_s=TOKENIZED) | {"sweeps": {"s/n{i}@v1": SWEEP}},
        "sweep s/n{i}@v1: s/n1@v1: deps.data: keys 'tokenized/{a}@v1' and 'tokenized/{b}@v1' both become "
        "'tokenized/s@v1' (a mapping keeps one of them); give the case values that keep them apart",
    ),
}


@pytest.fixture(autouse=True, scope="module")
def _user_package(user_step_package):
    return user_step_package


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_input_is_refused_at_load_with_its_documented_message(tmp_path, case):
    data, message = CASES[case]
    assert refusal(tmp_path, data) == message


def test_the_doc_lists_exactly_these_messages():
    text = (REPO / "docs" / "errors.md").read_text()
    section = text.split("## Limits and upstream recipes", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (.+?) \| `(.+)` \|$", section, re.M))
    assert rows == {case: message for case, (_, message) in CASES.items()}


# ---- 1, 2: seeds and step counts ----------------------------------------------------


def test_seeds_up_to_2_to_the_32_minus_1_load(tmp_path):
    data = chain("checkpoints/m@v1", config__seed=2**32 - 1)
    data["artifacts"]["evaluations/m@v1"]["config"] = {"seed": 2**32 - 1}
    assert load(tmp_path, data)["checkpoints/m@v1"].config["seed"] == 2**32 - 1


@pytest.mark.parametrize("field", ["batch_size", "seq_len", "grad_accum_steps", "checkpoint_every", "eval_every",
                                   "eval_batches", "log_every"])  # fmt: skip
def test_every_step_count_and_size_above_int32_names_its_field(tmp_path, field):
    message = refusal(tmp_path, chain("checkpoints/m@v1", **{f"config__{field}": 2**31}))
    assert message.startswith(f"checkpoints/m@v1: config.{field}: expected an integer <= 2147483647 (")


@pytest.mark.parametrize("field", ["d_model", "max_seq_len", "n_layers", "d_expert", "moe_every"])
def test_a_model_size_above_int32_is_refused_at_load_not_priced_by_the_plan(tmp_path, field):
    message = refusal(tmp_path, chain("checkpoints/m@v1", **{f"config__model__{field}": 10**23}))
    assert message == (f"checkpoints/m@v1: config.model.{field}: expected an integer <= 2147483647 "
                       f"(model sizes are int32 in jitted code), got {10**23}")  # fmt: skip


def test_step_count_at_int32_max_loads_and_small_ones_keep_their_message(tmp_path):
    assert load(tmp_path, chain("checkpoints/m@v1", config__num_train_steps=2**31 - 1))
    assert refusal(tmp_path, chain("checkpoints/m@v1", config__num_train_steps=0)) == (
        "checkpoints/m@v1: config.num_train_steps: expected an integer >= 1, got 0"
    )


# ---- 3, 4: keys that become folders and Snakemake wildcards ---------------------------


def test_version_longer_than_200_bytes_is_refused_and_200_loads(tmp_path):
    assert refusal(tmp_path, {"artifacts": {"raw/a@v" + "1" * 200: RAW}}).startswith(
        "exp.yaml: artifacts: version 'v11111111111111111111111...' of 'raw/a@v1111"
    )
    assert load(tmp_path, {"artifacts": {"raw/a@v" + "12" * 99 + "3": RAW}})


def test_a_name_and_version_of_at_most_512_bytes_load_and_longer_ones_are_refused_before_any_storage(tmp_path, capsys):
    exactly = "raw/" + "/".join(["a" * 200, "b" * 200, "c" * 103]) + "@v1"  # raw/.../v1: 512 bytes
    assert load(tmp_path, {"artifacts": {exactly: RAW}})
    assert "is 513 bytes long as a folder path" in refusal(tmp_path, {"artifacts": {exactly.replace("@", "x@"): RAW}})
    # 25 segments of 190 bytes: each passes the segment check, the whole would be no path at all
    key = "raw/" + "/".join(["a" * 190] * 25) + "@v1"
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"artifacts": {key: RAW}}))
    assert main(["status", str(tmp_path / "exp.yaml"), "--prefix", str(tmp_path / "artifacts")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bytes long as a folder path (name/version)" in err and "storage" not in err


def test_a_dev_users_folder_suffix_stays_within_a_folder_name():
    owner = path_safe_user("x" * 300)
    assert len(owner) == MAX_OWNER_BYTES and MAX_SEGMENT_BYTES + 1 + len(owner) == 255


def test_a_name_ending_in_20_repeats_is_refused_naming_the_name(tmp_path):
    key = "raw/" + "/".join(["ab"] * 20) + "@ab"
    assert refusal(tmp_path, {"artifacts": {key: RAW}}).startswith(f"{key}: name: ")


def test_periodic_suffix_agrees_with_snakemakes_detector():
    from snakemake.io import PeriodicityDetector

    detector = PeriodicityDetector()
    values = ["raw/a/v1" + "0" * n for n in (18, 19, 20, 21, 150)]
    values += ["x/" + "ab" * n + tail for n in (19, 20, 101) for tail in ("", "a")]
    values += ["x/v1" + "/v1" * n for n in (18, 19)] + ["tokenized/x/dev-al", "checkpoints/nano-moe/v1"]
    for value in values:
        assert (periodic_suffix(value) is not None) == (detector.is_periodic(value) is not None), value


# ---- 5: mixture weights ------------------------------------------------------------------


def test_train_data_check_refuses_weights_whose_sum_overflows():
    with pytest.raises(ConfigError, match=r"^deps\.data: mixture weights must sum to a finite number, got a sum of inf"):
        check_mixture(MIXTURE, "deps.data")


def test_a_mixture_weight_too_small_to_get_a_row_of_a_block_is_refused_and_one_that_does_is_read():
    from marin_rules.data.loader import BLOCK, block_counts

    with pytest.raises(ConfigError) as refused:
        check_mixture({"tokenized/a@v1": 1, "tokenized/b@v1": 0.0001}, "deps.data")
    assert str(refused.value) == (
        "deps.data: weight of tokenized/b@v1 (0.0001) is 0.0001 of the mixture, less than one row in each block of "
        "2048 (the loader keeps proportions to 1/2048), so it would never be read; raise it to at least 0.000488, "
        "or set it to 0")  # fmt: skip
    assert block_counts([1, 0.0001], BLOCK)[1] == 0  # what the loader would have done
    smallest = 1 / (BLOCK - 1)  # 1 / 2048 of the mixture: one row per block
    assert block_counts(list(check_mixture({"a": 1, "b": smallest}, "deps.data").values()), BLOCK) == (BLOCK - 1, 1)
    assert check_mixture({"a": 1, "b": 0}, "deps.data") == {"a": 1.0, "b": 0.0}  # 0: left out on purpose


# ---- 6, 7a: what the upstream recipes settle -----------------------------------------


def test_a_mixture_member_without_a_validation_split_is_refused(tmp_path):
    data = with_entries(chain("checkpoints/m@v1", deps__data={"tokenized/a@v1": 1, "tokenized/b@v1": 1}),
                        tokenized_b={**TOKENIZED, "config": {"validation_fraction": 0.0}})  # fmt: skip
    assert refusal(tmp_path, data).startswith("checkpoints/m@v1: deps.data: tokenized/b@v1 has validation_fraction: 0")


def test_model_vocab_size_at_the_tokenizers_or_a_pretrained_one_loads(tmp_path):
    assert load(tmp_path, chain("checkpoints/m@v1", config__model__vocab_size=512))
    pretrained = chain("checkpoints/m@v1", config__model__vocab_size=300)
    pretrained["artifacts"]["tokenizers/t@v1"]["config"] = {"pretrained": "tokenizer.json"}
    assert load(tmp_path, pretrained)  # its size is known only when it runs


# ---- 7b: the mesh ----------------------------------------------------------------------


def test_batch_not_divisible_by_the_expert_shards_is_refused_without_knowing_the_devices(tmp_path):
    data = chain("checkpoints/m@v1", config__mesh={"expert": 8}, config__model__n_experts=8)
    assert refusal(tmp_path, data) == (
        "checkpoints/m@v1: config.batch_size: 4 must be divisible by grad_accum_steps (1) x batch shards "
        "(mesh expert 8 x the data size the devices give); try 8"
    )
    assert load(tmp_path, chain("checkpoints/m@v1", config__mesh={"data": 2, "expert": 2}))


# ---- 7c: held-out plays -------------------------------------------------------------------


def test_held_out_keys_of_other_sources_are_left_to_the_run(tmp_path):
    assert load(tmp_path, chain("raw/a@v1", config={"source": "data/*.txt", "heldout": ["hamlett"]}))


# ---- 9: config, deps, runtime that are not mappings ------------------------------------------


@pytest.mark.parametrize("field,value,kind", [("config", [], "list"), ("deps", "", "str"), ("runtime", False, "bool"),
                                              ("config", 0, "int")])  # fmt: skip
def test_an_empty_non_mapping_is_refused_like_any_other(tmp_path, field, value, kind):
    assert refusal(tmp_path, chain("raw/a@v1", **{field: value})) == f"raw/a@v1: {field}: expected a mapping, got {kind}"


def test_null_config_deps_and_runtime_still_mean_none(tmp_path):
    data = chain("raw/a@v1", config=None, deps=None, runtime=None)
    del data["artifacts"]["evaluations/m@v1"]  # it would refuse a corpus that holds nothing out
    assert load(tmp_path, data)["raw/a@v1"].config == {}


# ---- 10: sweeps -------------------------------------------------------------------------------


def test_sweep_keys_the_case_keeps_apart_load(tmp_path):
    data = with_entries(chain("raw/a@v1"), tokenized_s=TOKENIZED, tokenized_t=TOKENIZED)
    data["sweeps"] = {"s/n{i}@v1": {**SWEEP, "cases": [{"i": 1, "a": "s", "b": "t"}]}}
    assert load(tmp_path, data)["s/n1@v1"].deps["data"] == {"tokenized/s@v1": 1, "tokenized/t@v1": 3}


def test_an_evaluation_held_out_of_training_too_or_capped_by_sample_count_loads(tmp_path):
    same = with_entries(chain("evaluations/m@v1", deps__data="raw/b@v1"),
                        raw_b={"step": "download", "config": {"heldout": ["hamlet"]}})  # fmt: skip
    assert load(tmp_path, same)  # hamlet is held out of the training corpus as well
    other = with_entries(chain("evaluations/m@v1", deps__data="raw/b@v1"),
                         raw_b={"step": "download", "config": {"source": "/elsewhere", "heldout": ["macbeth"]}})  # fmt: skip
    assert load(tmp_path, other)  # another source: its documents are not the corpus's


def test_an_evaluation_corpus_that_trained_the_tokenizer_only_is_still_checked(tmp_path):
    # raw/a@v1 (holding out hamlet) trains the tokenizer; raw/all@v1 (holding out nothing)
    # is what the model trains on: the check once stopped at the tokenizer's corpus
    data = with_entries(chain("tokenized/a@v1", deps__corpus="raw/all@v1"), raw_all={"step": "download"})
    assert refusal(tmp_path, data).startswith(
        "evaluations/m@v1: deps.data: raw/a@v1 holds out hamlet, which checkpoints/m@v1 trained on (its corpus "
        "raw/all@v1 holds out only nothing)"
    )


def test_a_download_source_spelled_another_way_is_the_same_source_for_the_held_out_check(tmp_path, monkeypatch):
    from marin_rules.eval.config import same_documents

    corpus = tmp_path / "data" / "c1"
    corpus.mkdir(parents=True)
    (tmp_path / "link").symlink_to(corpus)
    monkeypatch.chdir(tmp_path / "data")
    for other in (f"{corpus}/", "c1", "../data/c1", str(tmp_path / "link"), f"{corpus}/*.txt", "c1/doc0?.txt"):
        assert same_documents(str(corpus), other) and same_documents(other, str(corpus)), other
    assert not same_documents(f"{corpus}/train-*.txt", f"{corpus}/test-*.txt")  # a split by file name
    assert not same_documents(str(corpus), str(tmp_path / "data"))  # another folder
    assert same_documents("gs://b/c1/", "gs://b/c1") and not same_documents("gs://b/c1", "gs://b/c2")
    assert same_documents("package:shakespeare", "package:shakespeare")
