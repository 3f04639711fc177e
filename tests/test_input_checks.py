"""What a user types is checked before anything runs: an entry's whole `runtime:`
(whose `tpu` and `zone` reach the TPU executor's shell commands), sweep ranges and
sizes, the `--config` values (text keys, lease timings, experiment sections), and the
prefix, read in one place for snakemake and `marin`. Each refusal is one line naming
the artifact or option and the field; nothing is written."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import jsonschema
import pytest

from conftest import REPO
from marin_rules.artifacts.errors import MarinError
from marin_rules.cli import main as marin
from marin_rules.experiment import build_experiment
from marin_rules.sweeps import MAX_SWEEP_ARTIFACTS
from marin_rules.steps import SHARDED_STEPS
from marin_rules.workflow.options import check_config, checked_prefix, lease_options, parse_prefix, target_keys
from marin_rules.workflow.session import Session

TOK = {"step": "tokenize", "deps": {"corpus": "raw/a@v1", "tokenizer": "tok/t@v1"}}
CHAIN = {"raw/a@v1": {"step": "download"}, "tok/t@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/a@v1"},
         "config": {"vocab_size": 512}}}  # fmt: skip


def with_runtime(key: str, runtime: dict) -> dict:
    """The chain plus a tokenize entry, `key`'s runtime set."""
    artifacts = {**CHAIN, "data/x@v1": dict(TOK)}
    artifacts[key] = {**artifacts[key], "runtime": runtime}
    return {"artifacts": artifacts}


def refusal(data: dict) -> str:
    with pytest.raises(MarinError) as e:
        build_experiment(data, "exp.yaml")
    message = str(e.value)
    assert "\n" not in message
    return message


# ---- runtime ---------------------------------------------------------------------------


def test_runtime_tpu_with_a_newline_is_refused_at_load():
    message = refusal(with_runtime("data/x@v1", {"tpu": "v5p-8\ntouch /tmp/pwned #"}))
    assert message.startswith("data/x@v1: runtime.tpu: expected an accelerator type such as v5p-8")


def test_runtime_zone_with_a_command_substitution_is_refused_at_load():
    message = refusal(with_runtime("data/x@v1", {"zone": "us-east5-a$(touch /tmp/pwned)"}))
    assert message.startswith("data/x@v1: runtime.zone: expected a zone such as us-east5-a")


@pytest.mark.parametrize("runtime", [{"tpu": 8}, {"tpu": "V5P-8"}, {"tpu": "v5p-8 "}, {"tpu": ""}, {"zone": "us-east5"},
                                     {"zone": ["us-east5-a"]}, {"num_workers": 0}, {"num_workers": True},
                                     {"batch_size": 1.5}, {"peak_flops": -1}, {"accelerator": "h100 x8"},
                                     {"distributed": {"num_processes": 2}}, {"shards": 0}])  # fmt: skip
def test_runtime_values_not_of_their_form_are_refused_naming_the_field(runtime):
    (field,) = runtime
    assert refusal(with_runtime("data/x@v1", runtime)).startswith(f"data/x@v1: runtime.{field}")


def test_runtime_key_nothing_reads_is_refused_with_the_nearest_known_one():
    message = refusal(with_runtime("data/x@v1", {"zoen": "us-east5-a"}))
    assert message.startswith("data/x@v1: runtime.zoen: unknown setting (did you mean zone?); known: ")


def test_runtime_num_workers_lots_is_refused_at_load_not_in_shard_threads():
    assert refusal(with_runtime("data/x@v1", {"num_workers": "lots"})) == (
        "data/x@v1: runtime.num_workers: expected an integer >= 1, got 'lots'"
    )


def test_runtime_of_every_documented_form_loads_and_is_kept_as_given():
    runtime = {"tpu": "v5litepod-16", "zone": "europe-west4-b", "shards": 2, "num_workers": 2, "batch_size": 64,
               "accelerator": "h100-8"}  # fmt: skip
    experiment = build_experiment(with_runtime("data/x@v1", runtime))
    assert experiment["data/x@v1"].runtime == runtime
    train = {"tpu": "v5p-8", "peak_flops": 1.0e11, "distributed": "auto"}
    artifacts = {**with_runtime("data/x@v1", {})["artifacts"], "ckpt/m@v1": {"step": "train", "deps": {"data": "data/x@v1"},
                 "config": {"model": {"d_model": 32, "n_heads": 2}, "num_train_steps": 2, "batch_size": 2, "seq_len": 8},
                 "runtime": train}}  # fmt: skip
    assert build_experiment({"artifacts": artifacts})["ckpt/m@v1"].runtime == train
    for tpu in ("v5p-8", "v6e-8", "default"):
        assert build_experiment(with_runtime("raw/a@v1", {"tpu": tpu}))["raw/a@v1"].runtime == {"tpu": tpu}


def test_session_resources_are_the_checked_runtime_values():
    runtime = {"tpu": "v6e-8", "zone": "us-east5-a", "shards": 2, "num_workers": 3}
    experiment = build_experiment(with_runtime("data/x@v1", runtime))
    session = SimpleNamespace(experiment=experiment)
    wildcards = SimpleNamespace(artifact="data/x/v1")
    assert Session.tpu(session, wildcards) == ""  # a tokenize job runs here: its rules declare no `tpu`
    assert Session.tpu_zone(session, wildcards) == "us-east5-a"
    assert Session.shard_threads(session, wildcards) == 3
    plain = SimpleNamespace(artifact="raw/a/v1")
    assert (Session.tpu(session, plain), Session.tpu_zone(session, plain), Session.shard_threads(session, plain)) == ("", "", 1)
    pods = {"artifacts": {"pods/p@v1": {"step": "podsteps_zz:run", "runtime": {"tpu": "v6e-8"}}}}
    custom = SimpleNamespace(experiment=build_experiment(pods, check_steps=False))  # a user step: its rule declares `tpu`
    assert Session.tpu(custom, SimpleNamespace(artifact="pods/p/v1")) == "v6e-8"


def test_schema_and_loader_agree_on_runtime():
    validator = jsonschema.Draft7Validator(json.loads((REPO / "schema" / "experiment.schema.json").read_text()))
    good = {"tpu": "v5p-8", "zone": "us-east5-a", "num_workers": 2}
    assert not list(validator.iter_errors(with_runtime("data/x@v1", good)))
    build_experiment(with_runtime("data/x@v1", good))
    for bad in ({"tpu": "v5p-8\ntouch x"}, {"zone": "us-east5-a$(x)"}, {"num_workers": "lots"}, {"region": "us"},
                {"num_workers": 2}, {"distributed": "auto"}, {"shards": 2}):  # the last three: a download never reads them
        assert list(validator.iter_errors(with_runtime("raw/a@v1", bad))), bad
        refusal(with_runtime("raw/a@v1", bad))


@pytest.mark.parametrize("step_key, name", [("raw/a@v1", "num_workers"), ("tok/t@v1", "batch_size"), ("data/x@v1", "peak_flops")])
def test_a_runtime_key_the_step_never_reads_is_refused_naming_the_steps_that_do(step_key, name):
    message = refusal(with_runtime(step_key, {name: 2}))
    readers = {"num_workers": "tokenize and dedup", "batch_size": "tokenize", "peak_flops": "train"}[name]
    step = build_experiment(with_runtime(step_key, {}))[step_key].step
    assert message.endswith(f"{step_key}: runtime.{name}: read only by {readers}, so it would do nothing in this "
                            f"{step} step; remove it")  # fmt: skip


def test_runtime_batch_size_on_an_evaluation_points_to_its_config_batch_size():
    artifacts = {"raw/a@v1": {"step": "download"}, "tok/t@v1": CHAIN["tok/t@v1"], "data/x@v1": TOK,
                 "ckpt/m@v1": {"step": "train", "deps": {"data": "data/x@v1"}, "config": {"model": {"d_model": 32, "n_heads": 2},
                               "num_train_steps": 2, "batch_size": 2, "seq_len": 8}},
                 "evals/m@v1": {"step": "evaluate", "deps": {"model": "ckpt/m@v1", "data": "raw/a@v1"}, "runtime": {"batch_size": 8}}}  # fmt: skip
    assert refusal({"artifacts": artifacts}) == (
        "evals/m@v1: runtime.batch_size: read only by tokenize, so it would do nothing in this evaluate step "
        "(evaluate's batch_size is config.batch_size); remove it"
    )


# ---- sweeps ----------------------------------------------------------------------------


def test_an_artifact_whose_folder_lies_inside_anothers_is_refused_at_load():
    nested = {"raw/a@v1": {"step": "download"}, "raw/a/v1@v2": {"step": "download"}}
    message = refusal({"artifacts": nested})
    assert message == (
        "exp.yaml: raw/a/v1@v2 would be stored inside raw/a@v1's folder (raw/a/v1/v2/ in raw/a/v1/); rename one of them"
    )
    build_experiment({"artifacts": {"raw/a@v1": {"step": "download"}, "raw/a/v2@v1": {"step": "download"}}}, "exp.yaml")


def test_a_uint16_dtype_below_the_tokenizers_vocab_is_refused_at_load():
    chain = {**CHAIN, "tok/t@v1": {**CHAIN["tok/t@v1"], "config": {"vocab_size": 70000}}}
    message = refusal({"artifacts": {**chain, "data/x@v1": {**TOK, "config": {"dtype": "uint16"}}}})
    assert message == (
        "data/x@v1: config.dtype: uint16 holds ids below 65,536 but the tokenizer's vocab_size is 70,000; "
        "use uint32, or leave dtype out"
    )
    build_experiment({"artifacts": {**chain, "data/x@v1": {**TOK, "config": {"dtype": "uint32"}}}}, "exp.yaml")


def test_an_expert_mesh_axis_that_does_not_divide_the_experts_is_refused_at_load():
    train = {"step": "train", "deps": {"data": "data/x@v1"}, "config": {
        "model": {"d_model": 64, "n_heads": 4, "n_experts": 4}, "num_train_steps": 10, "batch_size": 4, "seq_len": 32}}  # fmt: skip
    artifacts = {**CHAIN, "data/x@v1": dict(TOK)}
    build_experiment({"artifacts": {**artifacts, "ck/m@v1": {**train, "config": {**train["config"], "mesh": {"expert": 2}}}}})
    bad = {**train, "config": {**train["config"], "mesh": {"expert": 3}}}
    assert refusal({"artifacts": {**artifacts, "ck/m@v1": bad}}) == (
        "ck/m@v1: config.mesh.expert: must divide model.n_experts=4 (each device holds whole experts), got 3"
    )


def sweep(grid: dict, template: str = "s/n{i}@v1") -> dict:
    return {"sweeps": {template: {"step": "download", "grid": grid}}}


@pytest.mark.parametrize("bounds", [[0.5, 3], "1-5", [0, 6, 2], [1], [True, 3], None])
def test_sweep_range_that_is_not_two_integers_is_one_line_not_a_traceback(bounds):
    message = refusal(sweep({"i": {"range": bounds}}))
    assert message.startswith(f"sweep s/n{{i}}@v1: grid.i.range: expected two integers [start, stop] (giving start .. stop - 1), got {bounds!r}")


def test_sweep_range_with_start_not_below_stop_is_refused():
    assert "start 5 must be below stop 2" in refusal(sweep({"i": {"range": [5, 2]}}))


def test_sweep_range_of_ten_million_is_refused_at_once_naming_the_cap():
    started = time.monotonic()
    message = refusal(sweep({"i": {"range": [0, 10_000_000]}}))
    assert time.monotonic() - started < 1.0
    assert f"at most {MAX_SWEEP_ARTIFACTS} artifacts" in message and "grid.i.range" in message


def test_sweep_grid_whose_product_passes_the_cap_is_refused_before_expanding():
    message = refusal(sweep({"i": {"range": [0, 101]}, "j": list(range(100))}, "s/n{i}-{j}@v1"))
    assert message.startswith("sweep s/n{i}-{j}@v1: grid: expands to 10100 artifacts (101 i x 100 j)")


def test_sweep_range_gives_start_to_stop_minus_one():
    assert list(build_experiment(sweep({"i": {"range": [2, 5]}})).artifacts) == ["s/n2@v1", "s/n3@v1", "s/n4@v1"]


# ---- --config target= ------------------------------------------------------------------


def target_refusal(target: str) -> str:
    experiment = build_experiment({"artifacts": {**CHAIN, "data/x@v1": dict(TOK)}}, "exp.yaml")
    with pytest.raises(MarinError) as e:
        target_keys(experiment, target)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_target_of_a_step_kind_without_artifacts_says_so_and_lists_the_kinds_that_have_some():
    assert target_refusal("export_hf") == (
        "--config target=export_hf: the step kind export_hf has no artifact in exp.yaml; "
        "kinds that do: download, train_tokenizer, tokenize"
    )


@pytest.mark.parametrize("target", ["raw/a@v1,,tok/t@v1", "raw/a@v1,", ",", " , tokenize"])
def test_target_list_with_an_empty_item_says_so_instead_of_suggesting_keys(target):
    assert target_refusal(target) == (
        f"--config target={target}: the list has an empty item; separate name@version "
        "or step kinds such as train by single commas"
    )


@pytest.mark.parametrize("step", SHARDED_STEPS)
def test_target_of_a_shard_rule_says_it_is_a_rule_and_names_the_step_kind_that_builds_all_shards(step):
    assert f"rule {step}_shard:" in "".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    assert target_refusal(f"{step}_shard") == (
        f"--config target={step}_shard: {step}_shard is a rule (one shard of a {step} artifact), not a step kind; "
        f"target={step} builds every {step} artifact (all shards)"
    )


def test_target_that_is_no_key_and_no_kind_still_suggests_the_nearest_key():
    assert target_refusal("raw/a") == (
        "--config target=raw/a: not an artifact of exp.yaml (did you mean raw/a@v1?) "
        "(use name@version, or a step kind such as train)"
    )


def test_target_of_a_misspelled_step_kind_suggests_the_kind():
    assert target_refusal("tokenise") == (
        "--config target=tokenise: not an artifact of exp.yaml (did you mean tokenize?) "
        "(use name@version, or a step kind such as train)"
    )


@pytest.mark.parametrize("value", [-5, 256, 4096.5])
def test_vocab_size_below_the_least_the_tokens_allow_names_that_bound_first(value):
    # the field's own bound (any special tokens) would say a smaller number than this entry allows
    entry = {**CHAIN["tok/t@v1"], "config": {"vocab_size": value}}
    assert refusal({"artifacts": {**CHAIN, "tok/t@v1": entry}}) == (
        f"tok/t@v1: config.vocab_size: expected an integer >= 323 (256 byte symbols + 3 special tokens + "
        f"64 merges), got {value}"
    )


# ---- --config values -------------------------------------------------------------------


def config_refusal(config: dict, configfiles: list[str] | None = None) -> str:
    with pytest.raises(MarinError) as e:
        check_config(config, configfiles or [])
    assert "\n" not in str(e.value)
    return str(e.value)


def test_config_prefix_given_nothing_is_refused_instead_of_building_into_None():
    assert config_refusal({"prefix": None}) == (
        "--config prefix=: expected a local folder, file:///path or gs://bucket/path, got nothing "
        "(leave the key out for the default)"
    )


def test_config_prefix_given_a_list_says_a_string_is_expected():
    message = config_refusal({"prefix": ["a", "b"]})
    assert message == "--config prefix=['a', 'b']: expected a local folder, file:///path or gs://bucket/path, got a list"


@pytest.mark.parametrize("key", ["experiment", "prefix", "target", "dev_user"])
@pytest.mark.parametrize("value", [None, "", "  ", 5, True, {"a": "b"}])
def test_config_text_keys_refuse_nothing_and_non_strings(key, value):
    assert config_refusal({key: value}).startswith(f"--config {key}=")


def test_config_artifacts_and_sweeps_are_refused_not_ignored():
    assert config_refusal({"artifacts": {"raw/a@v1": {"step": "download"}}}).startswith(
        "--config artifacts=...: an experiment's 'artifacts:' is read from its file only"
    )
    assert config_refusal({"sweeps": 5}).startswith("--config sweeps=...: an experiment's 'sweeps:' is read from its file only")


def test_config_keys_of_an_experiment_configfile_pass_but_overriding_them_is_refused(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("artifacts:\n  raw/a@v1: {step: download}\n")
    from_file = {"artifacts": {"raw/a@v1": {"step": "download"}}}
    check_config(from_file, [str(exp)])
    overridden = {"artifacts": {"raw/a@v1": {"step": "download"}, "raw/b@v1": {"step": "download"}}}
    assert config_refusal(overridden, [str(exp)]).startswith("--config artifacts=...")


# ---- lease settings ----------------------------------------------------------------------


def test_lease_stale_at_or_below_twice_the_heartbeat_is_refused_stating_the_rule():
    assert config_refusal({"lease_stale_s": 30}) == (
        "--config lease_stale_s=30: lease_stale_s (30 s) must be more than twice lease_heartbeat_s (30 s), or a "
        "lease is lost whenever one renewal is late; raise lease_stale_s or lower lease_heartbeat_s"
    )
    assert "must be more than twice" in config_refusal({"lease_heartbeat_s": 0.5, "lease_stale_s": 1.0})
    assert "must be more than twice" in config_refusal({"lease_heartbeat_s": 45})  # against the default 90 s


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.001, 0, -1, "soon", True, 86401])
@pytest.mark.parametrize("key", ["lease_heartbeat_s", "lease_stale_s", "lease_poll_s"])
def test_lease_timings_outside_a_hundredth_of_a_second_to_a_day_are_refused(key, value):
    assert config_refusal({key: value}).endswith("expected a finite number of seconds from 0.01 to 86400")


def test_lease_defaults_and_the_documented_and_tested_timings_pass():
    for config in ({}, {"lease_heartbeat_s": 30, "lease_stale_s": 90, "lease_poll_s": 5},
                   {"lease_heartbeat_s": 0.3, "lease_stale_s": 1.5, "lease_poll_s": 0.1}, {"lease_poll_s": 0.01}):  # fmt: skip
        check_config(config, [])
    assert lease_options({"lease_heartbeat_s": 0.3, "lease_stale_s": 1.5}) == "wait=1,heartbeat_s=0.3,stale_s=1.5,poll_s=5.0"


# ---- the prefix ------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["s3://bucket/x", "memory://x", "http://host/x"])
def test_prefix_with_an_unsupported_scheme_is_refused_in_one_line(url):
    scheme = url.split("://")[0]
    with pytest.raises(MarinError, match=rf"^--config prefix={url}: {scheme}:// is not supported; give a local folder"):
        checked_prefix({"prefix": url})


def test_prefix_forms_that_are_supported_are_read_the_same_everywhere(tmp_path):
    assert parse_prefix("gs://bucket/marin/", "--prefix ") == "gs://bucket/marin"
    assert parse_prefix("gs://bucket//marin///p/", "--prefix ") == "gs://bucket/marin/p"  # one prefix, one spelling
    assert parse_prefix(f"file://{tmp_path}/art/", "--prefix ") == f"{tmp_path}/art"
    assert checked_prefix({"prefix": "art/"}) == "art" and checked_prefix({}) == "artifacts"
    with pytest.raises(MarinError, match=r"^--prefix gs://: expected gs://bucket"):
        parse_prefix("gs://", "--prefix ")


def test_marin_prefix_with_an_unsupported_scheme_or_naming_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text("artifacts:\n  raw/a@v1: {step: download}\n")
    (tmp_path / "afile").write_text("x")
    assert marin(["status", "exp.yaml", "--prefix", "s3://bucket/x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("marin: --prefix s3://bucket/x: s3:// is not supported") and err.count("\n") == 1
    assert marin(["status", "exp.yaml", "--prefix", str(tmp_path / "afile")]) == 1
    err = capsys.readouterr().err
    assert "afile is a file, not a folder" in err and "Traceback" not in err and err.count("\n") == 1
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("prefix,message", [("", "--config prefix=: expected a local folder"),
                                            ("s3://bucket/x", "--config prefix=s3://bucket/x: s3:// is not supported")])  # fmt: skip
def test_snakemake_with_an_empty_or_unsupported_prefix_stops_in_one_line_writing_nothing(tmp_path, snakemake_cmd, prefix, message):
    (tmp_path / "exp.yaml").write_text("artifacts:\n  raw/a@v1: {step: download}\n")
    proc = snakemake_cmd("-n", "--configfile", "exp.yaml", "--config", f"prefix={prefix}", cwd=tmp_path, check=False)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"marin-rules: {message}"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "None").exists() and not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("value", ["/tmp/runs/{date}", "/tmp/a}b", "/tmp/{x"])
def test_a_prefix_with_braces_is_refused_in_one_line_not_read_as_a_wildcard(value):
    brace = "{" if "{" in value else "}"
    assert config_refusal({"prefix": value}) == (
        f"--config prefix={value!r}: holds {brace!r}; quotes, $, backticks, backslashes, braces and line breaks "
        "are refused in paths and names (Snakemake passes them on to job command lines, and reads braces as wildcards)"
    )


def test_a_gs_record_given_to_snakemake_as_a_target_names_its_mirror_path(tmp_path):
    # Snakemake alone says "MissingRuleException: No rule to produce gs:/bucket/..."
    import subprocess

    from conftest import SNAKEMAKE

    (tmp_path / "exp.yaml").write_text("artifacts:\n  raw/a@v1: {step: download}\n")
    url = "gs://marin-test/p/raw/a/v1/.artifact.json"
    for flag in ("-f", "-R"):
        proc = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "-n", flag, url],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode != 0 and "MissingRuleException" not in proc.stderr, proc.stderr[-2000:]
        assert (
            f"marin-rules: {url}: Snakemake reaches records on gs:// through their local mirror; give "
            ".snakemake/marin-mirror/gs/marin-test/p/raw/a/v1/.artifact.json instead (`marin path KEY` prints it)"
        ) in proc.stderr, proc.stderr[-2000:]


def test_marin_takes_snakemakes_config_settings_and_no_abbreviated_flag(tmp_path, capsys):
    experiment = str(REPO / "experiments/default.yaml")
    assert marin(["path", "raw/shakespeare@v1", "--config", f"prefix={tmp_path}/p", f"experiment={experiment}"]) == 0
    assert capsys.readouterr().out == f"{tmp_path}/p/raw/shakespeare/v1/.artifact.json\n"
    assert marin(["path", "--config", "prefix=gs://b/p", "raw/shakespeare@v1", experiment]) == 0
    assert capsys.readouterr().out == ".snakemake/marin-mirror/gs/b/p/raw/shakespeare/v1/.artifact.json\n"
    assert marin(["path", "raw/shakespeare@v1", "--config", "target=x"]) == 1
    assert capsys.readouterr().err == (
        "marin: --config target=...: marin reads prefix=, experiment=, dev_user= from --config (as snakemake does); "
        "name artifacts as arguments\n"
    )
    with pytest.raises(SystemExit):  # --conf is not taken for --configfile
        marin(["path", "raw/shakespeare@v1", "--conf", experiment])
    capsys.readouterr()
    for argv in (["--config", f"prefix={tmp_path}/q", "path"], ["path", f"--config=prefix={tmp_path}/q"]):
        assert marin([*argv, "raw/shakespeare@v1", experiment]) == 0  # before the command, or with =
        assert capsys.readouterr().out == f"{tmp_path}/q/raw/shakespeare/v1/.artifact.json\n"
    assert marin(["path", "raw/shakespeare@v1", experiment, "--config"]) == 1
    assert capsys.readouterr().err == (
        "marin: --config: expected KEY=VALUE settings after it, such as --config prefix=gs://bucket/path\n"
    )


def test_a_seq_len_longer_than_a_built_split_is_refused_while_planning_and_nothing_is_written(tmp_path, snakemake_cmd):
    # the job's loader refused it at start, after a plan had priced it and the job had
    # begun its attempt (a failure record, a lease): the tokenize record gives the counts
    from test_inspect_status import EXPERIMENT, build
    from marin_rules.experiment import load_experiment

    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    experiment = load_experiment(str(tmp_path / "exp.yaml"))
    prefix = str(tmp_path / "artifacts")
    for key in ("raw/s@v1", "tokenizers/bpe@v1"):
        build(prefix, experiment, key)
    seq_len = experiment["checkpoints/nano@v1"].config["seq_len"]
    build(prefix, experiment, "tokenized/s@v1", result={"train_tokens": 10**6, "validation_tokens": seq_len})
    proc = snakemake_cmd("-n", "--configfile", "exp.yaml", "--config", f"prefix={prefix}", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert (f"marin-rules: checkpoints/nano@v1: config.seq_len: {seq_len} needs seq_len + 1 = {seq_len + 1} tokens "
            f"in each split of deps.data, but the validation split of tokenized/s@v1 has {seq_len}; lower seq_len, "
            "or give it more data (under a new version)") in proc.stderr  # fmt: skip
    assert not (tmp_path / "artifacts/checkpoints").exists()
    build(prefix, experiment, "tokenized/s@v1", result={"train_tokens": 10**6, "validation_tokens": seq_len + 1})
    proc = snakemake_cmd("-n", "--configfile", "exp.yaml", "--config", f"prefix={prefix}", cwd=tmp_path)
    # one sequence of validation data: its evaluations read it again and again, which a note says
    config = experiment["checkpoints/nano@v1"].config
    assert (f"checkpoints/nano@v1: deps.data: the validation split of tokenized/s@v1 holds 1 sequence(s) of {seq_len} "
            f"tokens, fewer than one validation batch of {config['batch_size']}: each validation loss averages "
            "repeats") in proc.stderr  # fmt: skip
    one_batch = seq_len * config["batch_size"] + 1  # a batch's sequences: the default 4 batches read them 4 times
    build(prefix, experiment, "tokenized/s@v1", result={"train_tokens": 10**6, "validation_tokens": one_batch})
    proc = snakemake_cmd("-n", "--configfile", "exp.yaml", "--config", f"prefix={prefix}", cwd=tmp_path)
    batches = config.get("eval_batches", 4)
    assert (f"checkpoints/nano@v1: config.eval_batches: {batches} batches of {config['batch_size']} sequences "
            f"({batches * config['batch_size']}) is more than the {config['batch_size']} sequence(s) of {seq_len} tokens "
            "the validation split of tokenized/s@v1 holds: each validation loss averages repeats (slower, no more exact); "
            "at most 1 batch(es) read each once") in proc.stderr  # fmt: skip
    build(prefix, experiment, "tokenized/s@v1", result={"train_tokens": 10**6, "validation_tokens": 10**6})
    assert "config.eval_batches" not in snakemake_cmd("-n", "--configfile", "exp.yaml", "--config", f"prefix={prefix}",
                                                      cwd=tmp_path).stderr  # fmt: skip
