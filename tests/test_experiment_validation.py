"""Experiment-load validation: dep kinds, findable user steps, sweep key collisions,
numbers YAML read as text, and errors about defaults the user never wrote."""

from __future__ import annotations

import copy
import sys
import textwrap

import pytest
import yaml

from marin_rules.artifacts.errors import ConfigError, MarinError
from marin_rules.experiment import build_experiment, load_experiment
from marin_rules.steps import BUILTIN_STEPS

USER = "mypkg.steps:make"

CHAIN = {
    "raw/tiny@v1": {"step": "download", "config": {"heldout": ["hamlet"]}},
    "dedup/tiny@v1": {"step": "dedup", "deps": {"corpus": "raw/tiny@v1"}},
    "tokenizers/tiny@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/tiny@v1"}, "config": {"vocab_size": 512}},
    "tokenized/tiny@v1": {"step": "tokenize", "deps": {"tokenizer": "tokenizers/tiny@v1", "corpus": "raw/tiny@v1"}},
    "checkpoints/x@v1": {
        "step": "train",
        "deps": {"data": "tokenized/tiny@v1"},
        "config": {"model": {"d_model": 64, "n_heads": 4}, "num_train_steps": 10, "batch_size": 4, "seq_len": 32},
    },
    "evaluations/x@v1": {"step": "evaluate", "deps": {"model": "checkpoints/x@v1", "data": "raw/tiny@v1"}},
    "hf/x@v1": {"step": "export_hf", "deps": {"model": "checkpoints/x@v1"}},
    "scaling/fit@v1": {
        "step": "scaling_fit",
        "deps": {"runs": {"checkpoints/x@v1": 1, **{f"checkpoints/s{i}@v1": 1 for i in range(5)}}},
        "config": {"budgets": [3.8e9, 1e10, 3e10, 1e11], "predict_budget": 1e12},
    },
    "scaling/check@v1": {"step": "scaling_check", "deps": {"fit": "scaling/fit@v1", "run": "checkpoints/v@v1"}},
}
# the scaling fit needs six runs and a run on every budget: five more like checkpoints/x
# (3.79e9 FLOPs in 10 steps), at 10, 26, 79, 264 and 264 steps; the check's run at the
# predicted budget (2640 steps); all placed before the scaling entries
CHAIN = {
    **{k: v for k, v in CHAIN.items() if not k.startswith("scaling/")},
    **{f"checkpoints/s{i}@v1": {**CHAIN["checkpoints/x@v1"], "config": {**CHAIN["checkpoints/x@v1"]["config"],
                                                                        "num_train_steps": steps}}
       for i, steps in enumerate((10, 26, 79, 264, 264))},
    "checkpoints/v@v1": {**CHAIN["checkpoints/x@v1"], "config": {**CHAIN["checkpoints/x@v1"]["config"],
                                                                 "num_train_steps": 2640}},
    **{k: v for k, v in CHAIN.items() if k.startswith("scaling/")},
}  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def _user_package(user_step_package):
    return user_step_package


def chain(**changes) -> dict:
    """The built-in chain with some entries' fields replaced (key -> {field: value})."""
    artifacts = copy.deepcopy(CHAIN)
    for key, fields in changes.items():
        artifacts.setdefault(key, {}).update(fields)
    return {"artifacts": artifacts}


def load_error(data) -> str:
    with pytest.raises(MarinError) as e:
        build_experiment(data)
    message = str(e.value)
    assert "\n" not in message
    return message


def load_yaml_error(tmp_path, text: str) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(MarinError) as e:
        load_experiment(str(path))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_valid_builtin_chain_loads():
    assert list(build_experiment(chain()).artifacts) == list(CHAIN)


# ---- 1. deps of the wrong kind ------------------------------------------------------


def test_train_data_from_a_download_artifact_is_refused_at_load():
    message = load_error(chain(**{"checkpoints/x@v1": {"deps": {"data": "raw/tiny@v1"}}}))
    assert message == "checkpoints/x@v1: deps.data: expected a 'tokenize' artifact, got raw/tiny@v1 (a 'download' artifact)"


def test_wrong_kind_inside_a_train_mixture_is_refused():
    deps = {"data": {"tokenized/tiny@v1": 0.5, "raw/tiny@v1": 0.5}}
    message = load_error(chain(**{"checkpoints/x@v1": {"deps": deps}}))
    assert message == "checkpoints/x@v1: deps.data: expected a 'tokenize' artifact, got raw/tiny@v1 (a 'download' artifact)"


@pytest.mark.parametrize(
    "key,role,upstream,expected,got",
    [
        ("tokenized/tiny@v1", "tokenizer", "raw/tiny@v1", "train_tokenizer", "download"),
        ("tokenized/tiny@v1", "corpus", "tokenizers/tiny@v1", "'download' or 'dedup'", "train_tokenizer"),
        ("tokenizers/tiny@v1", "corpus", "tokenized/tiny@v1", "'download' or 'dedup'", "tokenize"),
        ("evaluations/x@v1", "model", "tokenized/tiny@v1", "train", "tokenize"),
        ("evaluations/x@v1", "data", "tokenized/tiny@v1", "download", "tokenize"),
    ],
)  # fmt: skip
def test_every_builtin_role_refuses_an_upstream_of_the_wrong_kind(key, role, upstream, expected, got):
    data = chain()
    data["artifacts"][key]["deps"][role] = upstream
    if key == "tokenizers/tiny@v1":  # avoid a cycle: tokenized/tiny needs tokenizers/tiny
        data["artifacts"]["tokenized/tiny@v1"]["deps"]["tokenizer"] = "tokenizers/other@v1"
        data["artifacts"]["tokenizers/other@v1"] = copy.deepcopy(CHAIN["tokenizers/tiny@v1"])
    message = load_error(data)
    wanted = expected if " or " in expected else repr(expected)
    assert message == f"{key}: deps.{role}: expected a {wanted} artifact, got {upstream} (a {got!r} artifact)"


def test_user_step_upstream_is_accepted_for_any_role():
    data = chain(**{"features/tokens@v1": {"step": USER, "deps": {"corpus": "raw/tiny@v1"}}})
    data["artifacts"]["checkpoints/x@v1"]["deps"] = {"data": {"tokenized/tiny@v1": 1, "features/tokens@v1": 1}}
    data["artifacts"]["evaluations/x@v1"]["deps"]["model"] = "features/tokens@v1"
    assert "evaluations/x@v1" in build_experiment(data).artifacts


@pytest.mark.parametrize("step", sorted(set(BUILTIN_STEPS) - {"adopt"}))  # adopt: written `adopt:`, tests/test_adopt.py
def test_each_builtin_checker_accepts_exactly_the_roles_its_kind_table_declares(step):
    """The kind table and the checkers agree: the declared roles load, any other is refused."""
    key = next(k for k, entry in CHAIN.items() if entry["step"] == step)
    data = chain()
    roles = {role: data["artifacts"][key].get("deps", {}).get(role) for role in BUILTIN_STEPS[step].deps}
    assert set(roles) == set(data["artifacts"][key].get("deps", {}))
    assert build_experiment(data)[key].deps == roles
    data["artifacts"][key].setdefault("deps", {})["extra"] = "raw/tiny@v1"
    assert load_error(data).startswith(f"{key}: deps")


@pytest.mark.parametrize("heldout", [None, []])
def test_evaluate_with_local_tasks_on_a_download_that_holds_nothing_out_is_refused_at_load(heldout):
    data = chain(**{"raw/tiny@v1": {"config": {} if heldout is None else {"heldout": heldout}}})
    assert load_error(data) == (
        "evaluations/x@v1: deps.data: raw/tiny@v1 holds out no documents (its config has no heldout:), and the local "
        "tasks (marin_shakespeare_bpb, marin_shakespeare_cloze) score held-out plays; give raw/tiny@v1 a config.heldout "
        "list of plays (under a new version once it is built), evaluate on a download that has them, or list only "
        "lm-eval tasks in config.tasks"
    )
    data["artifacts"]["evaluations/x@v1"]["config"] = {"tasks": ["marin_shakespeare_cloze"]}
    assert "the local tasks (marin_shakespeare_cloze)" in load_error(data)
    data["artifacts"]["evaluations/x@v1"]["config"] = {"tasks": ["hellaswag"]}  # lm-eval's own data: no heldout needed
    assert "evaluations/x@v1" in build_experiment(data).artifacts


# ---- 2. user steps whose module cannot be found -------------------------------------


def test_user_step_with_unfindable_module_fails_at_load_naming_step():
    message = load_error({"artifacts": {"features/x@v1": {"step": "no_such_pkg_zz.steps:count"}}})
    assert message.startswith("features/x@v1: step: cannot find module 'no_such_pkg_zz.steps' (No module named 'no_such_pkg_zz')")


def test_user_step_missing_submodule_of_a_found_package_fails_at_load():
    message = load_error({"artifacts": {"features/x@v1": {"step": "mypkg.nope:count"}}})
    assert message.startswith("features/x@v1: step: cannot find module 'mypkg.nope'")


def test_user_step_module_in_the_current_directory_is_found_without_importing_it(tmp_path, monkeypatch):
    (tmp_path / "cwd_only_steps_zz.py").write_text("raise RuntimeError('imported at load')\ndef count(ctx):\n    return {}\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    exp = build_experiment({"artifacts": {"features/x@v1": {"step": "cwd_only_steps_zz:count"}}})
    assert "features/x@v1" in exp.artifacts
    assert "cwd_only_steps_zz" not in sys.modules
    assert sys.path == before


def test_user_step_check_runs_once_per_step_across_a_sweep(monkeypatch):
    import marin_rules.experiment as experiment

    calls = []
    monkeypatch.setattr(experiment, "check_user_step", lambda step: calls.append(step))
    build_experiment({"sweeps": {"s/n{i}@v1": {"step": USER, "config": {"i": "{i}"}, "grid": {"i": {"range": [0, 50]}}}}})
    assert calls == [USER]


# ---- 3. sweep keys that leave out a variable ----------------------------------------


def test_sweep_key_without_a_grid_variable_names_the_variable():
    message = load_error({"sweeps": {"features/x@v1": {"step": USER, "config": {"a": "{a}"}, "grid": {"a": [1, 2]}}}})
    assert message == (
        "sweeps.features/x@v1: grid variable 'a' does not appear in the key, so its expansions would share "
        "one name; add {a} to the name or version"
    )


def test_sweep_key_without_one_of_two_grid_variables_names_that_one():
    sweep = {"step": USER, "grid": {"lr": [0.1, 0.2], "seed": [0, 1]}}
    message = load_error({"sweeps": {"ck/lr{lr}@v1": sweep}})
    assert message.startswith("sweeps.ck/lr{lr}@v1: grid variable 'seed' does not appear in the key")


def test_sweep_key_without_a_cases_variable_names_it_but_distinct_keys_are_fine():
    cases = [{"size": "s", "d": 64}, {"size": "s", "d": 128}]
    message = load_error({"sweeps": {"ck/{size}@v1": {"step": USER, "cases": cases}}})
    assert message.startswith("sweeps.ck/{size}@v1: cases variable 'd' does not appear in the key")
    cases = [{"size": "s", "d": 64}, {"size": "l", "d": 128}]  # `d` rides along with a named case
    assert list(build_experiment({"sweeps": {"ck/{size}@v1": {"step": USER, "cases": cases}}}).artifacts) == ["ck/s@v1", "ck/l@v1"]


def test_sweep_values_that_print_alike_are_reported_as_such():
    message = load_error({"sweeps": {"ck/a{a}@v1": {"step": USER, "grid": {"a": [1, "1"]}}}})
    assert message.startswith("sweeps.ck/a{a}@v1: two expansions both give ck/a1@v1")


def test_sweep_key_colliding_with_another_entry_is_still_defined_twice():
    data = {"artifacts": {"ck/a1@v1": {"step": USER}}, "sweeps": {"ck/a{a}@v1": {"step": USER, "grid": {"a": [1]}}}}
    assert "ck/a1@v1 is defined twice" in load_error(data)


# ---- 4. numbers YAML 1.1 reads as text ----------------------------------------------

TRAIN_YAML = """\
artifacts:
  raw/tiny@v1: {step: download}
  tokenizers/tiny@v1: {step: train_tokenizer, deps: {corpus: raw/tiny@v1}, config: {vocab_size: 512}}
  tokenized/tiny@v1: {step: tokenize, deps: {tokenizer: tokenizers/tiny@v1, corpus: raw/tiny@v1}%s}
  checkpoints/x@v1:
    step: train
    deps: {data: tokenized/tiny@v1}
    config:
      model: {d_model: 64, n_heads: 4%s}
      optimizer: {learning_rate: %s}
      num_train_steps: 10
      batch_size: 4
      seq_len: 32
"""


def test_learning_rate_written_3e_minus_4_gets_a_yaml_hint(tmp_path):
    message = load_yaml_error(tmp_path, TRAIN_YAML % ("", "", "3e-4"))
    assert message == (
        "checkpoints/x@v1: config.optimizer.learning_rate: expected a number > 0, "
        "got '3e-4' (a string: YAML reads 3e-4 as text; write 3.0e-4)"
    )


def test_suggested_yaml_number_form_loads_as_that_number(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(TRAIN_YAML % ("", "", "3.0e-4"))
    assert load_experiment(str(path))["checkpoints/x@v1"].config["optimizer"]["learning_rate"] == 3e-4
    assert yaml.safe_load("x: 1.0e+5")["x"] == 1e5


def test_a_whole_number_in_e_notation_is_suggested_as_an_integer_that_an_integer_field_takes(tmp_path):
    text = TRAIN_YAML % ("", "", "0.001")
    message = load_yaml_error(tmp_path, text.replace("num_train_steps: 10", "num_train_steps: 1e3"))
    assert message == (
        "checkpoints/x@v1: config.num_train_steps: expected an integer >= 1, "
        "got '1e3' (a string: YAML reads 1e3 as text; write 1000)"
    )
    path = tmp_path / "exp.yaml"
    path.write_text(text.replace("num_train_steps: 10", "num_train_steps: 1000"))
    assert load_experiment(str(path))["checkpoints/x@v1"].config["num_train_steps"] == 1000


def test_quoted_number_hint_says_drop_the_quotes(tmp_path):
    message = load_yaml_error(tmp_path, TRAIN_YAML % ("", "", "'0.001'"))
    assert message.endswith("got '0.001' (a string; write 0.001 without quotes)")


def test_model_and_data_number_fields_share_the_hint(tmp_path):
    message = load_yaml_error(tmp_path, TRAIN_YAML % ("", ", norm_eps: 1e-6", "0.001"))
    assert message == (
        "checkpoints/x@v1: config.model.norm_eps: expected a number > 0, "
        "got '1e-6' (a string: YAML reads 1e-6 as text; write 1.0e-6)"
    )
    message = load_yaml_error(tmp_path, TRAIN_YAML % (", config: {validation_fraction: 5e-2}", "", "0.001"))
    assert message == (
        "tokenized/tiny@v1: config.validation_fraction: expected a number in [0, 1), "
        "got '5e-2' (a string: YAML reads 5e-2 as text; write 5.0e-2)"
    )


def test_text_that_is_not_a_number_gets_no_hint(tmp_path):
    message = load_yaml_error(tmp_path, TRAIN_YAML % ("", "", "fast"))
    assert message.endswith("expected a number > 0, got 'fast'")


FALSE_HINT = "(YAML reads no and off as false: quote it, 'no' or 'off')"
TRUE_HINT = "(YAML reads yes and on as true: quote it, 'yes' or 'on')"
DOWNLOAD_YAML = """
artifacts:
  raw/tiny@v1:
    step: download
%s"""


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("    config: {heldout: [no, hamlet]}",
         "raw/tiny@v1: config.heldout: expected a list of document keys (e.g. [hamlet, macbeth]), "
         f"got [False, 'hamlet'] {FALSE_HINT}"),
        ("    config: {source: off}", f"raw/tiny@v1: config.source: expected a non-empty string, got False {FALSE_HINT}"),
        ("    on: true", f"raw/tiny@v1: True: unknown field {TRUE_HINT}; expected one of adopt, config, deps, "
         "description, expect_fingerprint, runtime, step"),
        ("    config: {on: true}", f"raw/tiny@v1: config: mapping key True is not a string {TRUE_HINT}"),
        ("    runtime: {tpu: no}", "raw/tiny@v1: runtime.tpu: expected an accelerator type such as v5p-8, v5litepod-16 "
         f"or v6e-8, or 'default' (the executor's --tpu-type), got False {FALSE_HINT}"),
        ("    description: no", f"raw/tiny@v1: description: expected text, got False {FALSE_HINT}"),
    ],
)  # fmt: skip
def test_a_yaml_boolean_where_text_or_a_key_was_expected_says_yaml_read_it_so(tmp_path, entry, expected):
    assert load_yaml_error(tmp_path, DOWNLOAD_YAML % entry) == expected


def test_a_yaml_boolean_as_a_dep_or_role_or_top_level_key_says_yaml_read_it_so(tmp_path):
    tokenizer = "  tokenizers/t@v1:\n    step: train_tokenizer\n    deps: %s\n"
    message = load_yaml_error(tmp_path, DOWNLOAD_YAML % "" + tokenizer % "{corpus: off}")
    assert message == f"tokenizers/t@v1: deps.corpus: expected 'name@version', got False {FALSE_HINT}"
    message = load_yaml_error(tmp_path, DOWNLOAD_YAML % "" + tokenizer % "{on: raw/tiny@v1}")
    assert message == f"tokenizers/t@v1: deps.True: a role is an identifier such as 'data' or 'tokenizer' {TRUE_HINT}"
    message = load_yaml_error(tmp_path, "on: 1\n" + DOWNLOAD_YAML % "")
    assert message.endswith(f"exp.yaml: unknown top-level key True {TRUE_HINT}; expected one of artifacts, description, sweeps (or x-NAME, for YAML anchors)")


def test_a_yaml_boolean_where_a_number_is_expected_says_how_yaml_read_it_without_saying_to_quote_it(tmp_path):
    message = load_yaml_error(tmp_path, TRAIN_YAML % ("", "", "no"))
    assert message.endswith("expected a number > 0, got False (YAML reads no and off as false)")
    assert yaml.safe_load("[y, n]") == ["y", "n"]  # PyYAML keeps y and n as text: the hint leaves them out


# ---- 5. errors about a default the user did not write --------------------------------


def test_n_heads_error_says_when_the_value_is_the_unwritten_default():
    message = load_error(chain(**{"checkpoints/x@v1": {"config": {**CHAIN["checkpoints/x@v1"]["config"], "model": {"d_model": 32}}}}))
    assert message == "checkpoints/x@v1: config.model.n_heads: must divide d_model=32, got 6 (the default; set n_heads)"


def test_n_heads_error_written_by_the_user_has_no_default_note():
    model = {"d_model": 32, "n_heads": 6}
    message = load_error(chain(**{"checkpoints/x@v1": {"config": {**CHAIN["checkpoints/x@v1"]["config"], "model": model}}}))
    assert message == "checkpoints/x@v1: config.model.n_heads: must divide d_model=32, got 6"


def test_n_kv_heads_and_top_k_errors_name_their_unwritten_defaults():
    from marin_rules.model.config import ModelConfig

    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict({"d_model": 96, "n_heads": 3})
    assert str(e.value) == "n_kv_heads: must divide n_heads=3, got 2 (the default; set n_kv_heads)"
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict({"n_experts": 1})
    assert str(e.value) == "top_k: expected at most n_experts=1, got 2 (the default; set top_k)"
    with pytest.raises(ConfigError) as e:  # built in code: every value counts as given
        ModelConfig(d_model=32)
    assert str(e.value) == "n_heads: must divide d_model=32, got 6"


def test_seq_len_error_says_when_max_seq_len_is_the_model_default():
    config = {**CHAIN["checkpoints/x@v1"]["config"], "seq_len": 512}
    message = load_error(chain(**{"checkpoints/x@v1": {"config": config}}))
    assert message == (
        "checkpoints/x@v1: config.seq_len: expected at most model.max_seq_len=256 "
        "(the model's default; set model.max_seq_len), got 512"
    )


# ---- 6. bad input, part two: duplicate keys, YAML errors, steps, dep references ------


@pytest.mark.parametrize(
    "text,line,key,first",
    [
        ("artifacts:\n  raw/a@v1: {step: download}\n  raw/a@v1: {step: download}\n", 3, "raw/a@v1", 2),
        ("artifacts:\n  raw/a@v1:\n    step: download\n    config: {heldout: [x]}\n    config: {}\n", 5, "config", 4),
        ("artifacts:\n  raw/a@v1:\n    step: download\n    config:\n      heldout: [x]\n      sample_count: 1\n"
         "      heldout: [y]\n", 7, "heldout", 5),
        ("artifacts: {}\nsweeps:\n  s/n{i}@v1: {step: download, grid: {i: [1]}, grid: {i: [2]}}\n", 3, "grid", 3),
        ("description: a\nartifacts: {}\ndescription: b\n", 3, "description", 1),
    ],
)  # fmt: skip
def test_duplicate_keys_at_any_depth_are_refused_naming_file_and_line(tmp_path, monkeypatch, text, line, key, first):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(text)
    with pytest.raises(MarinError) as e:
        load_experiment("exp.yaml")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"exp.yaml:{line}:")
    assert f"duplicate key {key!r} (first at line {first})" in message


def test_merge_keys_may_still_override_a_merged_value():
    text = """\
    base: &base {step: download, config: {heldout: [hamlet]}}
    artifacts:
      raw/a@v1: {<<: *base, description: one}
      raw/b@v1:
        <<: *base
        config: {heldout: [tempest]}
    """
    from marin_rules.yaml_file import load_yaml_text

    data = load_yaml_text(textwrap.dedent(text), "exp.yaml")
    assert data["artifacts"]["raw/b@v1"]["config"] == {"heldout": ["tempest"]}


def test_a_merge_list_takes_each_key_from_its_earliest_mapping_whatever_the_key():
    """The YAML spec's order (PyYAML 6.0.4 alone kept the LAST mapping's `d_model`: it
    told merged keys apart by string identity, and only short keys such as `x` are shared)."""
    from marin_rules.yaml_file import load_yaml_text

    text = """    small: &small {d_model: 24, n_layers: 2, x: 1}
    wide: &wide {d_model: 32, d_ff: 128, x: 2}
    model: {<<: [*small, *wide], n_layers: 4}
    """
    assert load_yaml_text(textwrap.dedent(text), "exp.yaml")["model"] == {"d_model": 24, "n_layers": 4, "x": 1, "d_ff": 128}
    # a merged mapping that merges and overrides itself: its override, in a list or alone
    text = """\
    small: &small {d_model: 24}
    wide: &wide {<<: *small, d_model: 32}
    alone: {<<: *wide}
    listed: {<<: [*wide, *small]}
    """
    data = load_yaml_text(textwrap.dedent(text), "exp.yaml")
    assert data["alone"] == data["listed"] == {"d_model": 32}


@pytest.mark.parametrize(
    "text,where,problem",
    [
        ("artifacts:\n  raw/a@v1: {step: download\n", "exp.yaml:3:1", "expected ',' or '}', but got '<stream end>'"),
        ("artifacts:\n  raw/a@v1:\n    step: download\n   config: {}\n", "exp.yaml:4:4", "expected <block end>, but found '<block mapping start>'"),
        ("artifacts:\n\traw/a@v1: {step: download}\n", "exp.yaml:2:1", "found character '\\t' that cannot start any token"),
        ("artifacts: [a, b\nsweeps: {}\n", "exp.yaml:2:7", "expected ',' or ']', but got ':'"),
    ],
)  # fmt: skip
def test_yaml_syntax_errors_name_file_line_and_column(tmp_path, monkeypatch, text, where, problem):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(text)
    with pytest.raises(MarinError) as e:
        load_experiment("exp.yaml")
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{where}: not valid YAML: {problem}")


RECURSIVE = "artifacts:\n  raw/a@v1:\n    step: download\n    config:\n"


@pytest.mark.parametrize(
    "body,where,key,anchor",
    [
        ("      heldout: &x [*x]\n", "exp.yaml:5:20", "artifacts.raw/a@v1.config.heldout[0]", "artifacts.raw/a@v1.config.heldout"),
        ("      heldout: &x [[a, [*x]]]\n", "exp.yaml:5:25", "artifacts.raw/a@v1.config.heldout[0][1][0]", "artifacts.raw/a@v1.config.heldout"),
        ("      extra: &m\n        self: *m\n", "exp.yaml:6:15", "artifacts.raw/a@v1.config.extra.self", "artifacts.raw/a@v1.config.extra"),
        ("      extra: &m\n        x: 1\n        <<: *m\n", "exp.yaml:7:13", "artifacts.raw/a@v1.config.extra.<<", "artifacts.raw/a@v1.config.extra"),
    ],
)  # fmt: skip
def test_a_value_holding_itself_through_an_alias_is_refused_naming_file_and_key(tmp_path, monkeypatch, body, where,
                                                                                  key, anchor):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(RECURSIVE + body)
    with pytest.raises(MarinError) as e:  # was a RecursionError (a list) or "unconstructable recursive node"
        load_experiment("exp.yaml")
    assert str(e.value) == (f"{where}: {key}: an alias of {anchor}, inside it: a value that holds itself has no "
                            "end; write it out, or alias a value defined elsewhere")  # fmt: skip


def test_aliases_of_values_defined_elsewhere_still_load(tmp_path):
    from marin_rules.yaml_file import load_yaml_text

    text = "h: &h [hamlet]\nc: &c {heldout: *h}\nx: [*c, *c, {a: *h}]\nd: &d [[*h]]\ne: *d\n"
    data = load_yaml_text(text, "exp.yaml")
    assert data["x"] == [{"heldout": ["hamlet"]}] * 2 + [{"a": ["hamlet"]}] and data["e"] == [[["hamlet"]]]


def _laughs(levels: int) -> str:
    """An anchor of 10 strings, then `levels` anchors each a list of 10 aliases of the one
    before: a few lines whose last value expands to 10^(levels + 1) strings."""
    lines = ['x-a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    names = "abcdefghijklmnop"
    for before, name in zip(names, names[1 : levels + 1]):
        lines.append(f"x-{name}: &{name} [{', '.join([f'*{before}'] * 10)}]")
    return "\n".join(lines) + f"\nartifacts:\n  raw/a@v1:\n    step: download\n    config: {{junk: *{names[levels]}}}\n"


def test_aliases_expanding_to_a_million_values_are_refused_at_once_naming_the_value():
    """"Billion laughs": nine lines that expand to 10^10 values would stall every reader
    for hours; the loader counts each value once (with its aliases' sizes) and refuses
    the first that passes MAX_EXPANDED_VALUES, at its place in the file."""
    from marin_rules.yaml_file import MAX_EXPANDED_VALUES, load_yaml_text

    assert MAX_EXPANDED_VALUES == 1_000_000
    with pytest.raises(MarinError) as e:
        load_yaml_text(_laughs(9), "exp.yaml")
    assert str(e.value) == ("exp.yaml:6:6: x-f: its aliases expand it to more than 1,000,000 values (each alias is "
                            "a whole copy for every reader); write a smaller value")  # 10^6 strings + 111,111 lists
    assert len(load_yaml_text(_laughs(4), "exp.yaml")["x-e"]) == 10  # 10^5 strings: loads


@pytest.mark.parametrize("depth, message", [
    (150, "exp.yaml:4:116: artifacts.f/a@v1.config.junk[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][...: nested "
          "more than 100 levels deep; flatten it"),
    (2000, "exp.yaml: values nested too deeply to read (more than 100 levels are refused); flatten them"),
])  # fmt: skip
def test_a_value_nested_too_deeply_is_one_line(depth, message):
    """Deeper than MAX_DEPTH: one line (PyYAML's own recursion gave a RecursionError traceback)."""
    from marin_rules.yaml_file import load_yaml_text

    text = "artifacts:\n  f/a@v1:\n    step: download\n    config: {junk: " + "[" * depth + "]" * depth + "}\n"
    with pytest.raises(MarinError) as e:
        load_yaml_text(text, "exp.yaml")
    assert str(e.value) == message
    assert load_yaml_text(text.replace("[" * depth + "]" * depth, "[" * 90 + "]" * 90), "exp.yaml")


def test_an_integer_of_more_digits_than_python_reads_is_one_line_at_its_place():
    """PyYAML lets int()'s ValueError escape for more than sys.get_int_max_str_digits()."""
    from marin_rules.yaml_file import load_yaml_text

    text = "artifacts:\n  f/a@v1:\n    step: download\n    config: {sample_count: 1" + "0" * 5000 + "}\n"
    with pytest.raises(MarinError) as e:
        load_yaml_text(text, "exp.yaml")
    assert str(e.value) == ("exp.yaml:4:28: not valid YAML: an integer of 5001 characters, more than Python reads "
                            "(4300 digits); no setting needs one")  # fmt: skip
    assert load_yaml_text(text.replace("0" * 5000, "0" * 400), "exp.yaml")  # a long one that reads: the checks judge it


@pytest.fixture
def steps_module(tmp_path, monkeypatch):
    (tmp_path / "badsteps_zz.py").write_text(
        "import json\n"
        "raise RuntimeError('imported at load')\n"
        "count = 3\n"
        "def count_words(ctx):\n    return {}\n"
        "if json:\n    def conditional(ctx):\n        return {}\n"
        "made = json.loads\n"
    )
    monkeypatch.chdir(tmp_path)
    yield "badsteps_zz"
    sys.modules.pop("badsteps_zz", None)


def test_user_step_bound_to_a_literal_is_not_callable_at_load(steps_module):
    message = load_error({"artifacts": {"features/x@v1": {"step": "badsteps_zz:count"}}})
    assert message.startswith("features/x@v1: step: 'badsteps_zz:count' is not callable: ")
    assert message.endswith("badsteps_zz.py:3 binds count to a literal; point step at a function")
    assert "badsteps_zz" not in sys.modules  # read, not imported


def test_user_step_naming_a_missing_function_suggests_the_nearest(steps_module):
    message = load_error({"artifacts": {"features/x@v1": {"step": "badsteps_zz:count_word"}}})
    assert message.startswith("features/x@v1: step: module 'badsteps_zz' (")
    assert message.endswith("defines no function 'count_word' (did you mean count_words?)")


def test_user_step_functions_defined_in_blocks_or_bound_to_expressions_are_accepted(steps_module):
    for function in ("count_words", "conditional", "made", "json"):
        build_experiment({"artifacts": {"features/x@v1": {"step": f"badsteps_zz:{function}"}}})
    assert "badsteps_zz" not in sys.modules


def test_dep_without_version_suggests_the_experiments_key():
    data = chain(**{"checkpoints/x@v1": {"deps": {"data": "tokenized/tiny"}}})
    assert load_error(data) == (
        "checkpoints/x@v1: deps.data: expected 'name@version', got 'tokenized/tiny' (did you mean tokenized/tiny@v1?)"
    )


def test_misspelled_dep_suggests_the_nearest_key():
    data = chain(**{"evaluations/x@v1": {"deps": {"model": "checkpoints/y@v1", "data": "raw/tiny@v1"}}})
    assert load_error(data) == (
        "evaluations/x@v1: deps.model: checkpoints/y@v1 is not defined in this experiment "
        "(did you mean checkpoints/x@v1?); add an entry for it or fix the name@version"
    )
    data = chain(**{"evaluations/x@v1": {"deps": {"model": "checkpoints/x@v1", "data": "raw/tiny@v1"}, "confg": {}}})
    assert load_error(data).startswith("evaluations/x@v1: confg: unknown field (did you mean config?); expected one of ")


def test_suggest_key_is_empty_when_nothing_is_close():
    from marin_rules.experiment import suggest_key

    assert suggest_key("checkpoints/nano-moe", ["checkpoints/nano-moe@v1", "raw/x@v1"]) == (
        " (did you mean checkpoints/nano-moe@v1?)"
    )
    assert suggest_key("zzz", ["checkpoints/nano-moe@v1"]) == ""


def test_suggest_key_never_suggests_the_key_as_typed():
    from marin_rules.experiment import suggest_key

    assert suggest_key("raw/x@v1", ["raw/x@v1", "raw/x@v2"]) == " (did you mean raw/x@v2?)"
    assert suggest_key("raw/x@v1", ["raw/x@v1"]) == ""
    assert suggest_key("MID/B@v1", ["mid/b@v1", "top/c@v1"]) == " (did you mean mid/b@v1?)"


def test_a_top_level_x_key_holds_yaml_anchors_and_is_otherwise_ignored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(
        "x-raw: &raw\n  step: download\n  config: {heldout: [hamlet]}\n"
        "artifacts:\n  raw/a@v1: *raw\n  raw/b@v1: {<<: *raw, config: {heldout: [macbeth]}}\n"
    )
    experiment = load_experiment("exp.yaml")
    assert sorted(experiment.artifacts) == ["raw/a@v1", "raw/b@v1"]
    assert experiment["raw/b@v1"].config == {"heldout": ["macbeth"]}

