"""The built-in step kinds and how a step name becomes a function.

Model: a step kind is either a built-in name (`BUILTIN_STEPS`: `download`, `dedup`,
`train_tokenizer`, `tokenize`, `train`, `evaluate`, `export_hf`, `scaling_fit`,
`scaling_check`) or a user step `pkg.module:function`. Each built-in
names its run function, a config checker and its config dataclass (whose
`marin_rules.validation` rules give the JSON Schema) by dotted path, imported lazily: loading
an experiment (dry runs, `--dag`) never imports JAX. A checker is
`check(config: dict, deps: dict) -> None` raising `ConfigError(field, message)` with
`field` relative to the artifact entry (`config.vocab_size`, `deps.corpus`).

`adopt` is the step of adopted data (an entry's `adopt:`, marin_rules/adopt.py);
its artifacts count as the kind of step whose output they hold.

Each built-in also declares, per dependency role, the step kinds its upstream may be
(`BuiltinStep.deps`): the loader refuses a `download` artifact wired in as a train
step's `data`; a corpus may be a `download` or a `dedup` artifact (same layout). An upstream that is a user step is accepted for any role (what it
writes is the user's business). A user step is checked at load without importing
its module (it may import JAX): the module must be findable and its source must
define the function (`check_user_step` reads it with `ast`). User step modules are
searched as jobs import them (`use_job_path`): sys.path first, the working folder
last; a working-folder module whose name the standard library or an installed package
already has is refused at load, naming the file to rename (`find_user_module`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any, Callable, Iterator, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.validation import suggest_key


@dataclass(frozen=True)
class BuiltinStep:
    run: str  # "module:function" called as function(ctx)
    check: str  # "module:function" called as check(config, deps) before anything runs
    settings: str  # "module:Class": the config dataclass whose rules give its JSON Schema
    # role -> the built-in step kind(s) its upstream may be (each member of a mixture too);
    # the roles are the ones the checker accepts. A user-step upstream fits any role.
    deps: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict, hash=False)
    # "module:function" called as f(config, {role: the upstream entry (`Upstream`)}) at load
    check_upstream: str = ""
    # "module:function" called as f(ctx, Shard) by each shard job of a sharded step
    # (marin_rules.artifacts.shards); `run` is then the gather that writes the record
    shard: str = ""
    # the step judges what an unfinished attempt of another recipe left itself (train
    # compares its checkpoints' recipe.json: marin_rules/train/recipe.py), so the job
    # sets such leftovers aside only when made from other upstream builds (job/attempt.py)
    own_recipe: bool = False
    # top-level config keys that only decide when the step writes its progress (metrics,
    # checkpoints, validation losses), never what it builds: drift in them alone needs
    # no version bump (`drift.no_bump_needed`), and train resumes across them
    progress: tuple[str, ...] = ()

    def kinds(self, role: str) -> tuple[str, ...]:
        expected = self.deps.get(role, ())
        return (expected,) if isinstance(expected, str) else tuple(expected)


CORPUS = ("download", "dedup")  # a corpus: Dolma shards + manifest.json (marin_rules.data.dolma)


BUILTIN_STEPS: dict[str, BuiltinStep] = {
    "download": BuiltinStep(
        "marin_rules.data.download:download", "marin_rules.data.checks:check_download", "marin_rules.data.checks:DownloadConfig"
    ),
    "dedup": BuiltinStep(
        "marin_rules.data.dedup:gather_dedup",
        "marin_rules.data.dedup_config:check_dedup",
        "marin_rules.data.dedup_config:DedupConfig",
        {"corpus": CORPUS},
        shard="marin_rules.data.dedup:sign_shard",
    ),
    "train_tokenizer": BuiltinStep(
        "marin_rules.data.tokenizer:train_tokenizer",
        "marin_rules.data.checks:check_train_tokenizer",
        "marin_rules.data.checks:TrainTokenizerConfig",
        {"corpus": CORPUS},
    ),
    "tokenize": BuiltinStep(
        "marin_rules.data.tokenize:gather_tokens",
        "marin_rules.data.checks:check_tokenize",
        "marin_rules.data.checks:TokenizeConfig",
        {"corpus": CORPUS, "tokenizer": "train_tokenizer"},
        check_upstream="marin_rules.data.checks:check_tokenize_upstream",
        shard="marin_rules.data.tokenize:tokenize_shard",
    ),
    "train": BuiltinStep(
        "marin_rules.train.step:train",
        "marin_rules.train.config:check_train",
        "marin_rules.train.config:TrainConfig",
        {"data": "tokenize"},
        check_upstream="marin_rules.train.config:check_train_upstream",
        own_recipe=True,
        progress=("log_every", "checkpoint_every", "eval_every"),
    ),
    "evaluate": BuiltinStep(
        "marin_rules.eval.step:evaluate",
        "marin_rules.eval.config:check_evaluate",
        "marin_rules.eval.config:EvaluateSettings",
        {"model": "train", "data": "download"},
        check_upstream="marin_rules.eval.config:check_evaluate_upstream",
    ),
    "export_hf": BuiltinStep(
        "marin_rules.export.hf:export_hf",
        "marin_rules.export.layout:check_export_hf",
        "marin_rules.export.layout:ExportHfConfig",
        {"model": "train"},
        "marin_rules.export.layout:check_export_hf_upstream",
    ),
    "scaling_fit": BuiltinStep(
        "marin_rules.scaling.step:scaling_fit", "marin_rules.scaling.checks:check_scaling_fit",
        "marin_rules.scaling.checks:ScalingFitConfig",
        {"runs": "train"},
        check_upstream="marin_rules.scaling.checks:check_scaling_fit_upstream",
    ),
    "adopt": BuiltinStep(  # written as `adopt: {source, kind}` in an entry (marin_rules.adopt)
        "marin_rules.adopt:adopt", "marin_rules.adopt:check_adopt", "marin_rules.adopt:AdoptConfig"
    ),
    "scaling_check": BuiltinStep(
        "marin_rules.scaling.step:scaling_check", "marin_rules.scaling.checks:check_scaling_check",
        "marin_rules.scaling.checks:ScalingCheckConfig",
        {"fit": "scaling_fit", "run": "train"},
        check_upstream="marin_rules.scaling.checks:check_scaling_check_upstream",
    ),
}

USER_STEP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_valid_step(step: Any) -> bool:
    return isinstance(step, str) and (step in BUILTIN_STEPS or bool(USER_STEP.fullmatch(step)))


def check_user_step(step: str) -> None:
    """Refuse a user step whose module cannot be found, or is shadowed
    (`find_user_module`), without importing it (it may import JAX); `find_spec` does
    import a dotted module's parent packages."""
    module_name = step.partition(":")[0]
    try:
        spec = find_user_module(module_name, step)
    except ModuleNotFoundError as e:
        spec, reason = None, str(e)
    except ConfigError:
        raise
    except Exception as e:  # a parent package that fails to import
        first = (str(e).splitlines() or [""])[0]
        raise ConfigError(
            "step", f"cannot import the package of module {module_name!r} ({type(e).__name__}: {first})"
        ) from None
    else:
        reason = f"No module named {module_name!r}"
    if spec is not None:
        return _check_defines_callable(step, spec.origin)
    raise ConfigError(
            "step",
            f"cannot find module {module_name!r} ({reason}); looked in the current directory "
            f"{os.getcwd()} and on sys.path (PYTHONPATH, installed packages): check the spelling, "
            "or install the package / add its folder to PYTHONPATH",
    )


def use_job_path(workflow_dir: str) -> None:
    """The module search path of a job (`python -P -m marin_rules.job`, so the working
    folder is not first): the workflow's (the Snakefile's) folder first, as Snakemake
    puts it while planning, unless it is the working folder; the working folder last,
    after the standard library and installed packages, so that a project file named
    like one of them (`logging.py`, `tokenizers.py`) replaces nothing in the job.
    `find_user_module` searches user step modules in this order everywhere."""
    cwd = os.getcwd()
    if workflow_dir and os.path.abspath(workflow_dir) != cwd and workflow_dir not in sys.path:
        sys.path.insert(0, workflow_dir)
    if cwd not in sys.path:
        sys.path.append(cwd)
        importlib.invalidate_caches()


def find_user_module(module_name: str, step: str = "") -> ModuleSpec | None:
    """The spec of a user step's module as jobs import it (`use_job_path`): from sys.path
    (the Snakefile's folder, PYTHONPATH, the standard library, installed packages), else
    from the working folder; None when neither has it. A module in the working folder
    whose top-level name sys.path already provides (`./tokenize.py`, `./yaml/`) is
    refused, since jobs would import the other: a ConfigError on the `step` field whose
    fix names `step` (the entry's value) renamed."""
    top = module_name.partition(".")[0]
    cwd = os.getcwd()
    sys.path_importer_cache.pop(cwd, None)  # a fresh look at the working folder: files come and go
    own = PathFinder.find_spec(top, [cwd])
    real_cwd = os.path.realpath(cwd)  # the same folder reached through a symlink is not another one
    other = _found_on_path(top, [p for p in sys.path if os.path.realpath(p or os.curdir) != real_cwd])
    if own is not None and other is not None and not _namespace(other) and not _same_file(own, other):
        raise ConfigError("step", _shadowed_message(step or f"{module_name}:...", own, other))
    if "." not in module_name:
        return own if other is None or (_namespace(other) and own is not None) else other
    with _working_folder_last(cwd):
        return importlib.util.find_spec(module_name)  # (imports the parents: ModuleNotFoundError when one is nowhere)


def _same_file(a: ModuleSpec, b: ModuleSpec) -> bool:
    """Do two specs load the same file (through symlinks or not)?"""
    if a.origin == b.origin:
        return True
    try:
        return bool(a.origin and b.origin) and os.path.samefile(a.origin, b.origin)
    except OSError:  # "built-in", "frozen" or a file gone: not a file both name
        return False


def _found_on_path(top: str, path: list[str]) -> ModuleSpec | None:
    """What Python's finders give for the top-level module `top` with `path` as sys.path
    (built-in and frozen modules, editable installs' finders, then the path's folders),
    not what an earlier import left in sys.modules."""
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(top, path) if finder is PathFinder else finder.find_spec(top, None)
        except Exception:  # noqa: BLE001 - a third-party finder that cannot answer has not found it
            spec = None
        if spec is not None:
            return spec
    return None


def _namespace(spec: ModuleSpec) -> bool:
    """A namespace package (a folder without `__init__.py`): a module or regular package of
    the same name found anywhere else takes precedence over it."""
    return spec.origin is None or spec.origin == "namespace"


def _shadowed_message(step: str, own: ModuleSpec, other: ModuleSpec) -> str:
    """The refusal of a working-folder module that a module of the same name on sys.path hides."""
    module_name, _, function = step.partition(":")
    top = module_name.partition(".")[0]
    mine = "./" + (f"{top}/" if own.submodule_search_locations is not None else os.path.basename(str(own.origin)))
    taken = f"the standard library's {top!r}" if top in sys.stdlib_module_names else f"the {top!r} found on sys.path"
    renamed = f"my_{top}{module_name[len(top):]}:{function}"
    return (
        f"module {top!r} in the working folder ({mine}) has the name of {taken} ({other.origin or 'built in'}), "
        f"which jobs import instead; rename {mine} and the step (e.g. {mine.replace(top, f'my_{top}', 1)} and "
        f"step: {renamed})"
    )


def _check_defines_callable(step: str, origin: str | None) -> None:
    """Read the module's source (without running it) and refuse a step function it
    does not define, or binds to a literal (`count = 3`). Names it may get in ways
    the source does not show (a star import, a module `__getattr__`) are accepted;
    `import_function` checks them when the step runs."""
    module_name, _, attr = step.partition(":")
    if not origin or not origin.endswith(".py"):
        return
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise ConfigError("step", f"cannot read module {module_name!r} at {origin} ({type(e).__name__}: {e})") from None
    functions: list[str] = []
    literal_line = None
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in (attr, "__getattr__"):
                return
            functions.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" or (a.asname or a.name.split(".")[0]) == attr for a in node.names):
                return
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(attr in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} for t in targets):
                if not isinstance(node.value, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr)):
                    return  # bound to an expression: may well be callable
                literal_line = node.lineno
    if literal_line is not None:
        raise ConfigError(
            "step", f"{step!r} is not callable: {origin}:{literal_line} binds {attr} to a literal; point step at a function"
        )
    raise ConfigError(
        "step", f"module {module_name!r} ({origin}) defines no function {attr!r}{suggest_key(attr, functions)}"
    )


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking inside if/try/with blocks (conditional definitions)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With)) and hasattr(node, block):
                yield from _top_level(getattr(node, block))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                yield from _top_level(handler.body)


@contextmanager
def _working_folder_last(cwd: str) -> Iterator[None]:
    """The working folder on sys.path, where jobs have it (last: `use_job_path`), while inside."""
    added = not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path)
    if added:
        sys.path.append(cwd)
        importlib.invalidate_caches()
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def check_dep_kinds(step: str, deps: Mapping[str, Any], step_of: Mapping[str, str]) -> None:
    """Refuse a role a built-in step does not take, and an upstream of the wrong kind
    for one it takes. `step_of` maps
    each upstream key to its step kind; user steps upstream fit any role."""
    builtin = BUILTIN_STEPS.get(step)
    if builtin is None:
        return
    for role, dep in deps.items():
        expected = builtin.kinds(role)
        if not expected:
            takes = ", ".join(sorted(builtin.deps)) or "no dependencies"
            raise ConfigError(f"deps.{role}", f"unknown role{suggest_key(role, builtin.deps)}; {step} takes: {takes}")
        for upstream in [dep] if isinstance(dep, str) else list(dep):
            kind = step_of.get(upstream)
            if kind in BUILTIN_STEPS and kind not in expected:
                wanted = " or ".join(map(repr, expected))
                raise ConfigError(f"deps.{role}", f"expected a {wanted} artifact, got {upstream} (a {kind!r} artifact)")


def import_function(dotted: str) -> Callable[..., Any]:
    """Import `pkg.module:function`, with an error that says what is missing."""
    module_name, _, attr = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("step", f"cannot import module {module_name!r} ({e})") from e
    try:
        function = getattr(module, attr)
    except AttributeError:
        raise ConfigError("step", f"module {module_name!r} has no function {attr!r}") from None
    if not callable(function):
        raise ConfigError("step", f"{dotted!r} is not callable ({type(function).__name__}); point step at a function")
    return function


def step_function(step: str) -> Callable[..., Any]:
    """The function that runs a step kind (for a sharded one: its gather)."""
    builtin = BUILTIN_STEPS.get(step)
    return import_function(builtin.run if builtin else step)


SHARDED_STEPS = tuple(name for name, builtin in BUILTIN_STEPS.items() if builtin.shard)
OWN_RECIPE_STEPS = tuple(name for name, builtin in BUILTIN_STEPS.items() if builtin.own_recipe)


def shard_function(step: str) -> Callable[..., Any]:
    """The function each shard job of a sharded step calls as f(ctx, shard)."""
    return import_function(BUILTIN_STEPS[step].shard)


class Upstream(Mapping[str, Any]):
    """What a `check_upstream` hook sees of one upstream entry: a mapping of its config
    (`upstream["tokenizer"].get("vocab_size")`), plus its `key`, its `step` as written
    (`adopt` for adopted data: its config is then {source, kind, copy}) and
    `upstreams(role)`, its own upstream entries (a mixture's members in order), for
    checks that look two steps up. `recipes`: every entry's key -> (step, config, deps)."""

    def __init__(self, key: str, recipes: Mapping[str, tuple[str, Mapping[str, Any], Mapping[str, Any]]]):
        self.key = key
        self.step, self.config, self.deps = recipes[key]
        self._recipes = recipes

    def __getitem__(self, name: str) -> Any:
        return self.config[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.config)

    def __len__(self) -> int:
        return len(self.config)

    def upstreams(self, role: str) -> list["Upstream"]:
        dep = self.deps.get(role)
        keys = [] if dep is None else [dep] if isinstance(dep, str) else list(dep)
        return [Upstream(key, self._recipes) for key in keys]


def check_upstream_configs(
    step: str, config: dict, deps: Mapping[str, Any], recipes: Mapping[str, tuple[str, Mapping[str, Any], Mapping[str, Any]]]
) -> None:
    """Run a built-in's check of its upstreams' recipes (`recipes`: key -> (step as
    written, config, deps)). The hook gets `deps` with an `Upstream` in place of each
    key: role -> Upstream, or for a mixture role -> {key: Upstream}."""
    builtin = BUILTIN_STEPS.get(step)
    if builtin is not None and builtin.check_upstream:
        upstream = {
            role: Upstream(dep, recipes) if isinstance(dep, str) else {key: Upstream(key, recipes) for key in dep}
            for role, dep in deps.items()
        }
        import_function(builtin.check_upstream)(config, upstream)


def check_step_config(step: str, config: dict, deps: dict) -> None:
    """Run the built-in checker for a step kind (user steps have none)."""
    builtin = BUILTIN_STEPS.get(step)
    if builtin is not None:
        import_function(builtin.check)(config, deps)
