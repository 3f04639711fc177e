"""`marin` on real runs of small user steps: what it says of a record deleted while the
data stays (`snakemake --delete-all-output`), of an artifact of the experiment that is
not built yet, and of a run whose step module is not importable from where `marin`
runs (these commands only read records).
"""

from __future__ import annotations

import contextlib
import json

import pytest

from marin_rules.cli import main
from marin_rules.experiment import load_experiment
from marin_rules.inspect.status import experiment_status

STEPS = '''
from marin_rules.artifacts import storage


def write(ctx):
    storage.write_text_atomic(storage.join(ctx.output, "x.txt"), "x")
    return {}


def boom(ctx):
    raise RuntimeError("boom\\x1b[31m")  # an escape in the error: shown escaped
'''

EXPERIMENT = """
artifacts:
  feat/a@v1: {step: MODULE:write}
  feat/b@v1: {step: MODULE:write, deps: {src: feat/a@v1}}
  feat/bad@v1: {step: MODULE:boom}
"""


@pytest.fixture
def run(tmp_path, snakemake_cmd, request):
    """A run folder with its step module (named after the test: the code hash is cached
    per step for the process) and experiment; `run(*args)` runs snakemake there."""
    module = f"steps_{request.node.name[5:40]}"
    (tmp_path / f"{module}.py").write_text(STEPS)
    (tmp_path / "exp.yaml").write_text(EXPERIMENT.replace("MODULE", module))

    def snakemake(*args: str):
        return snakemake_cmd("--configfile", "exp.yaml", "--cores", "1", "-k", *args,
                             "--config", "prefix=art", cwd=tmp_path, check=False)  # fmt: skip

    snakemake.root, snakemake.module = tmp_path, module
    return snakemake


def marin(run, capsys, *args: str, here: bool = True) -> tuple[int, str, str]:
    """`marin ARGS` on the run (`here`: with -d, else naming its experiment and prefix only)."""
    where = ["-d", str(run.root), "--prefix", "art"] if here else ["--prefix", str(run.root / "art")]
    code = main([*args, "--configfile", str(run.root / "exp.yaml"), *where])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_deleted_record_whose_data_stays_is_not_never_built_and_an_unbuilt_key_is_not_built_yet(run, capsys):
    run()  # feat/a and feat/b built, feat/bad failed
    run("--delete-all-output")  # the records go, the data stays
    code, out, _ = marin(run, capsys, "status", "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    deleted = ("record deleted, data still there: no success record, yet its folder holds 1 data file(s) "
               "(snakemake --delete-all-output?); the next run builds it")  # fmt: skip
    assert rows["feat/a@v1"] == {**rows["feat/a@v1"], "state": "missing", "reason": deleted}
    assert marin(run, capsys, "history", "feat/a@v1")[1] == f"feat/a@v1: no attempts recorded ({deleted})\n"
    code, out, err = marin(run, capsys, "diff", "feat/a@v1", "feat/bad@v1")  # neither built: their recipes
    assert code == 0 and out.startswith("recipe: feat/a@v1 -> feat/bad@v1: ")
    recipe = f"its recipe in {run.root / 'exp.yaml'}, no results"
    assert err.splitlines()[0] == f"marin: feat/a@v1: not built yet (missing: {deleted}): {recipe}"

    run()
    code, out, err = marin(run, capsys, "diff", "feat/a@v1", "feat/bad@v1")  # a valid key: no "did you mean"
    assert code == 0 and out.startswith("recipe: feat/a@v1 -> feat/bad@v1: ")
    assert err.startswith("marin: feat/bad@v1: not built yet (failed: last attempt")
    assert err.endswith(f"RuntimeError: boom\\x1b[31m): {recipe}\n")  # escaped, not a colour change
    code, _, err = marin(run, capsys, "diff", "feat/a@v1", "feat/bd@v1")
    assert code == 1 and err == "marin: feat/bd@v1: no success record under art (did you mean feat/bad@v1?)\n"


def test_status_of_a_user_step_whose_module_is_not_found_from_here_says_its_code_is_unknown(run, tmp_path, capsys):
    run()
    with contextlib.chdir(run.root):  # the loader looks for the module here, as the run did
        experiment = load_experiment("exp.yaml")
    (tmp_path / "elsewhere").mkdir()
    with contextlib.chdir(tmp_path / "elsewhere"):
        rows = {r.key: r for r in experiment_status(experiment, str(run.root / "art"))}
    assert rows["feat/a@v1"].state == "built"
    assert rows["feat/a@v1"].reason == (
        f"matches the recipe; code unknown (module {run.module!r} not importable from here: run marin in the run's "
        "working directory, or give it with -d DIR)"
    )


def test_a_user_step_in_a_package_not_found_from_here_is_not_found_rather_than_an_import_error(tmp_path):
    """`pkg.steps:fn` run elsewhere: find_spec imports `pkg` to look inside it, and raised
    ModuleNotFoundError through `marin status` and `marin dag` (a traceback)."""
    from marin_rules.inspect.status import _why_code_unknown

    with contextlib.chdir(tmp_path):
        assert _why_code_unknown("mypkg_nowhere.steps:fn") == (
            "module 'mypkg_nowhere.steps' not importable from here: run marin in the run's working directory, or "
            "give it with -d DIR"
        )


def test_status_of_a_user_step_whose_module_another_of_its_name_now_hides_says_why(run, tmp_path, monkeypatch):
    """The run's module is in its working folder; a module of the same name that came
    onto sys.path since is what jobs would import: status gives the loader's refusal."""
    run()
    with contextlib.chdir(run.root):
        experiment = load_experiment("exp.yaml")
    (tmp_path / "installed").mkdir()
    (tmp_path / "installed" / f"{run.module}.py").write_text("def other(ctx):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "installed"))
    with contextlib.chdir(run.root):
        reason = {r.key: r for r in experiment_status(experiment, str(run.root / "art"))}["feat/a@v1"].reason
    assert reason.startswith(
        f"matches the recipe; code unknown (module {run.module!r} in the working folder (./{run.module}.py) has the "
        f"name of the {run.module!r} found on sys.path ({tmp_path / 'installed' / run.module}.py), which jobs import"
    ), reason


def test_reading_commands_need_no_step_module_importable_from_where_marin_runs(run, tmp_path, capsys):
    run()
    (tmp_path / "elsewhere").mkdir()
    with contextlib.chdir(tmp_path / "elsewhere"):
        code, out, err = marin(run, capsys, "status", "--json", here=False)
        assert code == 0, err
        assert {r["key"]: r["state"] for r in json.loads(out)}["feat/a@v1"] == "built"
        code, out, err = marin(run, capsys, "show", "feat/a@v1", here=False)
        assert code == 0 and json.loads(out)["record"]["name"] == "feat/a", err
        code, out, err = marin(run, capsys, "history", "feat/a@v1", here=False)
        assert code == 0 and out.startswith("feat/a@v1: 1 attempt"), err
