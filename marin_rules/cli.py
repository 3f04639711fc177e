"""The `marin` command: look at an experiment's artifacts without running anything.

  marin status [EXPERIMENT] [KEY ...] [--all] [--json]
                                               each artifact's state, its reason, headline results
  marin show KEY [EXPERIMENT]                  the success record (and the last failure) as JSON
  marin path KEY [EXPERIMENT]                  the record path to give Snakemake as a target or -f
  marin verify [EXPERIMENT] [KEY ...]          are the records' files all there, at their sizes (and digests)?
                                               (default: every built artifact of the experiment)
  marin plan [EXPERIMENT] [--mfu 0.4]          params, tokens, FLOPs and hours of the training to run
  marin diff [EXPERIMENT] A@V B@V [--only-changed]
                                               recipe fields and results of two builds side by side
                                               (one not built yet: the experiment's recipe for it)
  marin history KEY                            every attempt and forced rebuild of one artifact
  marin dag [EXPERIMENT] [-o dag.svg]          a picture of the experiment, coloured by state

Every command takes `--prefix P` (a local folder, file:// or gs:// URL, default `artifacts`;
also as snakemake's `--config prefix=P`, as are `experiment=` and `dev_user=`),
`--configfile X` (the experiment, spelled as for snakemake) and `-d DIR` (the working
directory the run used, as `snakemake -d DIR`: a relative prefix, the default one
included, is read there) and `--dev-user NAME` (whose dev versions to read, as
`--config dev_user=NAME`; default the login name): every command finds a dev version
in that user's folder the same way (`dev_versions.owned`). As for snakemake, the
default experiment lies beside the Snakefile: the one here, else this project's.
These commands only read records: they run no step and need no step module (the
loader's `check_steps=False`). Nothing is run or written on the prefix; status, plan
and dag say on stderr when it does not exist (every artifact reads as never built).
Errors are one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys

from marin_rules.artifacts import storage
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.identity import RECORD_FILE, ArtifactId, artifact_location
from marin_rules.artifacts.records import record_location
from marin_rules.dev_versions import default_dev_user, owned
from marin_rules.experiment import DEFAULT_EXPERIMENT, Experiment, load_experiment
from marin_rules.inspect import reading
from marin_rules.mirror import records_root
from marin_rules.workflow.advisory import PROFILE
from marin_rules.workflow.options import DEFAULT_PREFIX, PROJECT_SNAKEFILE, parse_prefix, rerun_flags

EXPERIMENT_COMMANDS = ("status", "show", "path", "verify", "plan", "dag")


def _load(args, required: bool = True) -> Experiment | None:
    if args.experiment is not None and looks_like_key(args.experiment):
        raise MarinError(_key_as_experiment(args.command, args.experiment))
    if args.experiment is not None and looks_like_unversioned_key(args.experiment):
        text = printable(args.experiment)
        raise MarinError(f"{text}: no such experiment file; an artifact key is name@version ({text}@v1, say)")
    if args.configfile and args.experiment not in (None, args.configfile):
        raise MarinError(f"two experiments given ({args.experiment} and --configfile {args.configfile}); give one")
    chosen = args.configfile or args.experiment
    if chosen is None and not required and not os.path.exists(args.default_experiment):
        return None
    return read_experiment(chosen or args.default_experiment, args.dev_user)


def read_experiment(path: str, dev_user: str | None) -> Experiment:
    """The experiment as these commands read it: validated, its dev versions owned by
    `dev_user` (default the login name), its user steps' modules not looked for: no
    step runs here, so a module the run found from its working directory must not
    refuse them (`marin status` then says "code unknown" for it)."""
    return load_experiment(path, dev_user, check_steps=False)


def looks_like_unversioned_key(text: str) -> bool:
    """Is a positional given where an experiment file goes a key without its `@version`
    (`checkpoints/nano-moe`): no such file, no YAML suffix, no `@`?"""
    return "@" not in text and not text.endswith((".yaml", ".yml")) and not os.path.exists(text)


def looks_like_key(text: str) -> bool:
    """Is a positional given where an experiment file goes a `name@version` instead?"""
    return "@" in text and not text.endswith((".yaml", ".yml")) and not os.path.exists(text)


def _key_as_experiment(command: str, text: str) -> str:
    """The one line for a key given where `marin COMMAND` takes an experiment file."""
    shown = printable(shlex.quote(text))
    if command in ("show", "path", "history"):
        return f"{printable(text)}: marin {command} takes one key, then an optional experiment file; give one key"
    return (f"{printable(text)}: marin {command} takes an experiment file, not a key (name@version); "
            f"see one artifact with marin status {shown} or marin show {shown}")  # fmt: skip


def workflow_snakefile(directory: str | None = None) -> str:
    """The Snakefile a run from here uses, absolute: `./Snakefile`, else the one in the
    working directory `directory` (`-d DIR`: a project run from there with its own), else
    this project's (a run elsewhere names it with -s); "" when there is none."""
    for candidate in ("Snakefile", os.path.join(directory, "Snakefile") if directory else None, PROJECT_SNAKEFILE):
        if candidate and os.path.exists(candidate):
            return os.path.abspath(candidate)
    return ""


def default_experiment(snakefile: str, absolute: bool) -> str:
    """The experiment a run without --configfile loads: DEFAULT_EXPERIMENT beside the
    run's Snakefile (`select_experiment`), as typed when that is here (and `absolute`
    is not asked for), else absolute."""
    folder = os.path.dirname(snakefile) if snakefile else os.getcwd()
    if not absolute and folder == os.getcwd():
        return DEFAULT_EXPERIMENT
    return os.path.join(folder, DEFAULT_EXPERIMENT)


def _anchor(args) -> None:
    """Before moving into `-d DIR`: what names a file where `marin` was started (the
    experiment, `-o`) made absolute, as snakemake reads --configfile; the Snakefile and
    the default experiment found from here. A missing DIR is one line."""
    args.snakefile = workflow_snakefile(args.directory)
    args.default_experiment = default_experiment(args.snakefile, absolute=bool(args.directory))
    if not args.directory:
        return
    if not os.path.isdir(args.directory):
        raise MarinError(f"-d {args.directory}: not a folder; give the working directory the run used (snakemake -d)")
    for name in ("configfile", "experiment"):
        if getattr(args, name, None):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    if getattr(args, "output", "-") not in ("-", None) and not storage.is_remote(args.output):
        args.output = os.path.abspath(args.output)


def record_path(prefix: str, artifact: ArtifactId) -> str:
    """The record as Snakemake sees it: on the prefix, or in the local mirror of a remote one."""
    return f"{records_root(prefix)}/{artifact.path}/{RECORD_FILE}"


def _known_keys(experiment: Experiment | None, prefix: str, name: str) -> list[str]:
    """The experiment's keys and every version of `name` on the prefix (for suggestions)."""
    keys = list(experiment.artifacts) if experiment else []
    found = [a.key for a in reading.builds_on_prefix(prefix, name)]
    return keys + [k for k in dict.fromkeys(found) if k not in keys]


def _stored_id(text: str, experiment: Experiment | None, prefix: str, dev_user: str | None) -> ArtifactId:
    """The artifact a key typed to history or diff names, as stored: the experiment's
    entry (a dev version owned by the dev user, as status, show and verify read it),
    else by the same rule (`dev_versions.owned`)."""
    name = text.rpartition("@")[0] or text
    artifact = reading.resolve_key(text, _known_keys(experiment, prefix, name))
    if experiment is not None and artifact.key in experiment.artifacts:
        return experiment[artifact.key].id
    return owned(artifact, dev_user or default_dev_user())


def _whose(artifact: ArtifactId) -> str:
    """For a dev version, whose folder was read."""
    return f" in user {artifact.owner}'s folder" if artifact.is_dev else ""


def _experiment_key(text: str, experiment: Experiment, command: str) -> str:
    if text in experiment.artifacts:
        return text
    reading.refuse_empty_key(text, experiment.artifacts)
    hint = reading.suggestion(text, experiment.artifacts)
    raise MarinError(
        f"{printable(text)}: not an artifact of {experiment.path}{hint} (name another experiment with "
        f"marin {command} {printable(shlex.quote(text))} --configfile experiments/X.yaml)"
    )


def _recorded_key(text: str, experiment: Experiment, prefix: str, dev_user: str | None, command: str) -> ArtifactId:
    """show, verify: an artifact of the experiment, or one with a record on the prefix
    that the experiment does not define (an older version `marin status --all` lists)."""
    if text not in experiment.artifacts:
        try:
            artifact = _stored_id(text, experiment, prefix, dev_user)
        except MarinError:
            artifact = None
        if artifact is None or not storage.exists(record_location(artifact_location(prefix, artifact))):
            _experiment_key(text, experiment, command)  # one line with the nearest key
        return artifact
    return experiment[text].id


def _diff_side(text: str, experiment: Experiment | None, prefix: str, dev_user: str | None) -> tuple[ArtifactId, dict, str | None]:
    """One side of `marin diff`: an artifact found on the prefix (in the experiment or
    not), its success record, and None; for one of the experiment without a record, its
    recipe now in a record's shape (`diff.recipe_record`, no results) and the line saying
    so (its status and reason). Another key gets the nearest known one."""
    from marin_rules.inspect.diff import recipe_record
    from marin_rules.inspect.status import location_status

    artifact = _stored_id(text, experiment, prefix, dev_user)
    location = artifact_location(prefix, artifact)
    record = reading.record_dict(location, artifact)
    if record is not None:
        return artifact, record, None
    if experiment is not None and artifact.key in experiment.artifacts:
        status = location_status(artifact.key, location, expected=artifact)[0]
        other = "; --dev-user NAME reads another user's" if artifact.is_dev else ""
        why = printable(f"{status.state}: {status.reason}")  # a failure record's error, shown: escaped
        note = f"{artifact.key}: not built yet{_whose(artifact)} ({why}){other}: its recipe in {experiment.path}, no results"
        return artifact, recipe_record(experiment[artifact.key]), note
    others = [k for k in _known_keys(experiment, prefix, artifact.name) if k != artifact.key]
    hint = reading.suggestion(artifact.key, others)
    raise MarinError(f"{artifact.key}: no success record under {prefix}{_whose(artifact)}{hint}")


def _verify_keys(keys: list[str], experiment: Experiment, prefix: str, dev_user: str | None, flags: str) -> int:
    """`marin verify [KEY ...]`: `_verify` each key (every key is resolved first: a typo
    is one line before anything is read), or without keys every artifact of the
    experiment that has a record (the unbuilt ones counted, not checked); 0 when every
    one checked is whole. A record that cannot be read is that artifact's problem line
    (on stderr, with its rebuild command) and the others are still checked."""
    artifacts = [_recorded_key(k, experiment, prefix, dev_user, "verify") for k in keys]
    if not keys:
        every = [experiment[k].id for k in experiment.artifacts]
        artifacts = [a for a in every if storage.exists(record_location(artifact_location(prefix, a)))]
        if not artifacts:
            print(f"marin: nothing to verify: no artifact of {experiment.path} is built on {prefix}", file=sys.stderr)
            return 1
    failed = 0
    for artifact in artifacts:
        hint_flags = flags if artifact.key in experiment.artifacts else None  # an older version's: no command
        try:
            status = _verify(artifact.key, artifact_location(prefix, artifact), prefix, artifact, hint_flags)
        except MarinError as e:
            print(f"marin: {e.with_flags(hint_flags)}", file=sys.stderr)
            status = 1
        failed += status != 0
    if len(artifacts) > 1 or not keys:
        unbuilt = len(experiment.artifacts) - len(artifacts) if not keys else 0
        skipped = f"; {unbuilt} not built, not checked" if unbuilt else ""
        print(f"verified {len(artifacts)} artifact(s): {f'{failed} with problems' if failed else 'all whole'}{skipped}")
    return 1 if failed else 0


def _verify(key: str, location: str, prefix: str, artifact: ArtifactId, flags: str | None) -> int:
    """`marin verify`; `flags`: what the suggested snakemake command needs besides its
    target; None for an artifact the experiment does not define (an older version)."""
    from marin_rules.adopt import (
        recorded_source, recorded_source_content_problems, recorded_source_problems, source_changed,
    )
    from marin_rules.artifacts.files import recorded_digests
    from marin_rules.artifacts.records import read_record, rebuild_hint, verify_files

    record = read_record(location, artifact)
    if record is None:
        print(f"{key}: not built (no record under {location}); build it with: "
              f"{shlex.join(['snakemake', record_path(prefix, artifact), *shlex.split(flags or '')])}", file=sys.stderr)  # fmt: skip
        return 1
    problems = verify_files(location, record, contents=True)
    source = recorded_source(record.step, record.result)  # data adopted in place: its source too
    changed = recorded_source_problems(record.step, record.result)
    changed = changed or recorded_source_content_problems(record.step, record.result)
    problems += [f"adopted source {source}: {p}" for p in changed]
    if problems:
        for problem in problems:
            print(f"{key}: {problem}")
        if changed:  # a rebuild would adopt the changed data under the same version
            hint = source_changed(source, changed)
        else:
            hint = rebuild_hint(location, flags)
        print(f"{key}: {len(problems)} problem(s); {hint}", file=sys.stderr)
        return 1
    adopted = "" if source is None else f"; its adopted source {source} holds its {len(record.result['listing'])} file(s)"
    digests = recorded_digests(record.result)
    checked = f", {len(digests)} of them also by content" if digests else ""
    print(f"{key}: all {len(record.files)} file(s) present at their recorded sizes{checked}{adopted}")
    return 0


def _rerun_flags(experiment: Experiment | None, prefix: str, snakefile: str) -> str:
    """What a `snakemake -f RECORD` these commands suggest needs besides its target
    (`rerun_flags`): the run's Snakefile (`workflow_snakefile`) and working directory
    (here: `-d DIR` or where `marin` runs), so that it runs from anywhere; for a user's
    Snakefile using ours without a `profiles/default` of its own beside it, our workflow
    profile, without which Snakemake refuses the run (`advisory.triggers_refusal`)."""
    if experiment is None:
        return ""
    here = os.getcwd()
    workflow_dir = os.path.dirname(snakefile) if snakefile else here
    profile = ""
    if snakefile and os.path.abspath(snakefile) != PROJECT_SNAKEFILE:
        if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(snakefile)), "profiles", "default")):
            profile = str(PROFILE)
    return rerun_flags(os.path.abspath(experiment.path), prefix, workflow_dir, snakefile, here, profile)


def _run(args) -> int:
    with contextlib.chdir(args.directory or os.curdir):  # a relative prefix is read there, as snakemake -d does
        return _run_here(args)


def _run_here(args) -> int:
    prefix = parse_prefix(args.prefix, "--prefix ")
    if args.command != "path":  # the one command that reads nothing there
        storage.check_bucket(prefix)
    experiment = _load(args, required=args.command not in ("diff", "history"))
    flags = _rerun_flags(experiment, prefix, args.snakefile)
    try:
        return _command(args, experiment, prefix, flags)
    except MarinError as e:  # a corrupt record's rebuild command, completed for this experiment and prefix
        raise e.with_flags(flags) from None


def _command(args, experiment: Experiment | None, prefix: str, flags: str) -> int:
    from marin_rules.inspect import status as st

    if args.command in ("diff", "history"):
        if args.command == "history":
            from marin_rules.inspect.history import artifact_history, format_history

            artifact = _stored_id(args.key, experiment, prefix, args.dev_user)
            location = artifact_location(prefix, artifact)
            other = experiment is not None and artifact.key not in experiment.artifacts  # an older version: no command
            events = artifact_history(location, artifact, None if other else flags)
            if not events and (experiment is None or artifact.key not in experiment.artifacts):
                others = [k for k in _known_keys(experiment, prefix, artifact.name) if k != artifact.key]
                hint = reading.suggestion(artifact.key, others)
                raise MarinError(f"{artifact.key}: nothing recorded under {prefix}{_whose(artifact)}{hint}")
            if args.json:
                print(json.dumps([e.to_json() for e in events], indent=2))
            else:
                entry = experiment.artifacts.get(artifact.key) if experiment is not None else None
                reason = "" if events else st.unbuilt_reason(location, entry, experiment, prefix)
                print(format_history(artifact.key, events, reason))
            return 0
        from marin_rules.inspect.diff import format_diff

        a, record_a, unbuilt_a = _diff_side(args.a, experiment, prefix, args.dev_user)
        b, record_b, unbuilt_b = _diff_side(args.b, experiment, prefix, args.dev_user)
        print(format_diff(a.key, record_a, b.key, record_b, args.only_changed))
        for note in (unbuilt_a, unbuilt_b):
            if note:
                print(f"marin: {note}", file=sys.stderr)
        return 0
    if args.command == "status":
        rows = _only(st.experiment_status(experiment, prefix, every_version=args.all, hint_flags=flags),
                     args.keys, experiment)  # fmt: skip
        _note_missing_prefix(prefix, args.snakefile, bool(args.directory))
        if args.json:
            print(json.dumps([r.to_json() for r in rows], indent=2))
        else:
            print(st.format_table(rows))
        return 0
    if args.command == "plan":
        from marin_rules.inspect.plan import plan_lines

        keys = [_experiment_key(k, experiment, "plan") for k in args.keys] if args.keys else None
        _note_missing_prefix(prefix, args.snakefile, bool(args.directory))
        print("\n".join(plan_lines(experiment, prefix, keys, mfu=args.mfu, named=keys is not None)))
        return 0
    if args.command == "dag":
        from marin_rules.inspect.dag import render_svg

        if args.output != "-" and not args.output.endswith(".svg"):
            raise MarinError(f"-o {args.output}: marin dag writes SVG; give a name ending in .svg, or - for stdout")
        rows = st.experiment_status(experiment, prefix)
        _note_missing_prefix(prefix, args.snakefile, bool(args.directory))
        svg = render_svg(experiment, {r.key: r.state for r in rows})
        if args.output == "-":
            sys.stdout.write(svg)
        elif storage.is_remote(args.output):
            storage.write_text_atomic(args.output, svg)
            print(f"wrote {args.output} ({len(rows)} artifacts)")
        else:
            folder = os.path.dirname(os.path.abspath(args.output))
            if not os.path.isdir(folder):
                raise MarinError(f"-o {args.output}: {folder} is not a folder; give an SVG file in an existing folder")
            try:
                with open(args.output, "w", encoding="utf-8") as f:
                    f.write(svg)
            except OSError as e:
                raise MarinError(f"-o {args.output}: cannot write it ({type(e).__name__}: {e.strerror or e})") from None
            print(f"wrote {args.output} ({len(rows)} artifacts)")
        return 0
    if args.command == "path":
        print(record_path(prefix, experiment[_experiment_key(args.key, experiment, args.command)].id))
        return 0
    if args.command == "verify":
        return _verify_keys(args.keys, experiment, prefix, args.dev_user, flags)
    artifact = _recorded_key(args.key, experiment, prefix, args.dev_user, args.command)
    key, location = artifact.key, artifact_location(prefix, artifact)
    shown = {"record": reading.record_dict(location, artifact)}
    try:
        shown["last_failure"] = reading.last_failure(location)
    except reading.UnreadableRecord as e:  # an older failure is not the last one
        shown["last_failure"] = {"unreadable": str(e)}
        print(f"marin: {key}: last failure unknown: {e}", file=sys.stderr)
    print(reading.dumps(shown))
    return 0


def _note_missing_prefix(prefix: str, snakefile: str, directory_given: bool) -> None:
    """Say on stderr, once, when the prefix does not exist (`status.missing_prefix_note`):
    status, plan and dag show every artifact as never built there. The default
    `artifacts/` beside the run's Snakefile is missing until a first run: nothing to say;
    read from a folder without that Snakefile (`marin` run elsewhere, the project's
    Snakefile found, no `-d`), it is. Also when Snakemake's lock is left in the working
    directory (`status.lock_note`)."""
    from marin_rules.inspect.status import lock_note, missing_prefix_note

    run_here = directory_given or (bool(snakefile) and os.path.dirname(snakefile) == os.getcwd())
    missing = "" if prefix == DEFAULT_PREFIX and run_here else missing_prefix_note(prefix)
    for note in (missing, lock_note()):
        if note:
            print(f"marin: {note}", file=sys.stderr)


def _only(rows: list, keys: list[str], experiment: Experiment) -> list:
    """`marin status KEY ...`: the rows of those keys (with --all, also another user's dev
    version, `x@dev (user bob)`, and an old-layout one, `x@dev (no user: old layout)`); a
    key with no row is one line with the nearest key."""
    if not keys:
        return rows
    for key in keys:
        if not any(row.key.partition(" (")[0] == key for row in rows):
            _experiment_key(key, experiment, "status")
    return [row for row in rows if row.key.partition(" (")[0] in keys]


def _split_targets(args) -> str | None:
    """`marin plan|status|diff|verify [EXPERIMENT] [KEY ...]`: the experiment file among the
    positionals (a YAML file, or any other that is no key) into `args.experiment`, the
    rest into `args.keys`; one line when two experiments are given, else None."""
    if args.command in ("plan", "diff"):
        files = [k for k in args.keys if k.endswith((".yaml", ".yml"))]
    else:
        files = [k for k in args.keys if not looks_like_key(k)]
    args.keys = [k for k in args.keys if k not in files]
    args.experiment = files[0] if len(files) == 1 else args.experiment
    return f"two experiments given ({', '.join(files)}); give one" if len(files) > 1 else None


def _fraction(text: str) -> float:
    """An MFU: a number in (0, 1] (argparse shows the message on one line)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] such as 0.4, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="marin", description=__doc__.splitlines()[0], allow_abbrev=False,
                                  epilog=CONFIG_EPILOG)
    sub = top.add_subparsers(dest="command", required=True)
    helps = {
        "status": "each artifact's state, its reason and headline results",
        "show": "print an artifact's success record (and last failure)",
        "path": "print an artifact's record path (a Snakemake target)",
        "verify": "check that built artifacts' files are all there, at their recorded sizes and digests",
        "plan": "price the training jobs that would run: params, tokens, FLOPs, hours",
        "diff": "recipe fields and results of two builds side by side",
        "history": "every attempt and forced rebuild of one artifact",
        "dag": "draw the experiment as SVG, nodes coloured by state",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text, allow_abbrev=False,  # --config is not --configfile
                           epilog=CONFIG_EPILOG)
        if name in ("show", "path", "history"):
            p.add_argument("key", help="name@version")
        if name == "verify":
            p.add_argument("keys", nargs="*", help="[EXPERIMENT.yaml] the artifacts to check (default: every built one)")
        if name == "diff":
            p.add_argument("keys", nargs="+", metavar="KEY", help="[EXPERIMENT.yaml] A B: the two builds, name@version each")
            p.add_argument("--only-changed", action="store_true", help="leave out results that are equal")
        if name == "status":
            p.add_argument("keys", nargs="*", help="[EXPERIMENT.yaml] the artifacts to show (default: all)")
        if name == "plan":
            p.add_argument("keys", nargs="*", help="[EXPERIMENT.yaml] train artifacts to price (default: not built)")
            p.add_argument("--mfu", type=_fraction, default=0.4, help="model FLOP utilisation on accelerators (0 < mfu <= 1)")
        p.add_argument("--configfile", help="the experiment YAML file, spelled as for snakemake")
        if name not in ("plan", "diff", "status", "verify"):
            p.add_argument("experiment", nargs="?", help=f"experiment YAML (default {DEFAULT_EXPERIMENT})")
        else:
            p.set_defaults(experiment=None)
        p.add_argument("--prefix", default=DEFAULT_PREFIX, help="artifact prefix (local path or gs:// URL)")
        p.add_argument("-d", "--directory",
                       help="the working directory of the run (snakemake -d): a relative prefix is read there")
        p.add_argument("--dev-user", metavar="NAME",
                       help="whose dev versions to read (as snakemake --config dev_user=NAME; default the login name)")
        if name in ("status", "history"):
            p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "status":
            p.add_argument("--all", action="store_true", help="also every other version on the prefix")
        if name == "dag":
            p.add_argument("-o", "--output", default="dag.svg", help="the SVG file (default dag.svg; - for stdout)")
    return top


CONFIG_FLAGS = {"prefix": "--prefix", "experiment": "--configfile", "dev_user": "--dev-user"}
CONFIG_EPILOG = ("As with snakemake, --config prefix=P experiment=X.yaml dev_user=NAME may stand for "
                 "--prefix, --configfile and --dev-user.")


def snakemake_config(argv: list[str]) -> list[str]:
    """`argv` with snakemake's `--config KEY=VALUE ...` (or `--config=KEY=VALUE`) of the
    keys marin reads (`CONFIG_FLAGS`) spelled as marin's own flags, put after the rest
    (so they follow the command's name wherever they were typed); MarinError for another
    key or a `--config` with no setting."""
    out, flags, i = [], [], 0
    while i < len(argv):
        if argv[i] != "--config" and not argv[i].startswith("--config="):
            out.append(argv[i])
            i += 1
            continue
        settings = [argv[i].split("=", 1)[1]] if argv[i].startswith("--config=") else []
        i += 1
        while i < len(argv) and "=" in argv[i] and not argv[i].startswith("-"):
            settings.append(argv[i])
            i += 1
        if not settings:
            raise MarinError("--config: expected KEY=VALUE settings after it, such as --config prefix=gs://bucket/path")
        for setting in settings:
            key, _, value = setting.partition("=")
            if key not in CONFIG_FLAGS:
                raise MarinError(
                    f"--config {printable(key)}=...: marin reads {', '.join(f'{k}=' for k in CONFIG_FLAGS)} "
                    "from --config (as snakemake does); name artifacts as arguments"
                )
            flags += [CONFIG_FLAGS[key], value]
    return out + flags


def main(argv: list[str] | None = None) -> int:
    try:
        argv = snakemake_config(sys.argv[1:] if argv is None else list(argv))
    except MarinError as e:
        print(f"marin: {e}", file=sys.stderr)
        return 1
    args = parser().parse_args(argv)
    problem = _split_targets(args) if args.command in ("plan", "status", "diff", "verify") else None
    if not problem and args.command == "diff":
        if len(args.keys) != 2:
            problem = (f"marin diff takes two keys (name@version), after an optional experiment file; got "
                       f"{len(args.keys)}: {printable(' '.join(map(shlex.quote, args.keys)))}")  # fmt: skip
        else:
            args.a, args.b = args.keys
    if problem:
        print(f"marin: {problem}", file=sys.stderr)
        return 1
    try:
        _anchor(args)
        code = _run(args)
        sys.stdout.flush()
        return code
    except MarinError as e:
        print(f"marin: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `marin status | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:  # an unreachable bucket (gcsfs's connection errors are OSErrors), a disk error
        print(f"marin: {storage.storage_problem(getattr(args, 'prefix', None), e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
