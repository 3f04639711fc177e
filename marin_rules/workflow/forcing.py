"""Forcing means rebuilding from scratch; what the old build left is kept, never resumed.

Model: Snakemake decides which jobs are forced (`--forcerun RULE|RECORD`, `-R`, `-f`
on a target record, `-F`), and forcing cascades to consumers as in plain Snakemake;
`forced_directly` reads the same settings so the glue knows it too, and `left_out`
which planned jobs `--until`/`--omit-from` keep from running. The main process saves a
forced job's success record as the marker `{location}/.history/.forced-record`
(`mark_forced`, real runs only, once Snakemake has locked the working directory and
before any job runs: `session.Session.start`), which tells the job to rebuild although
a record is there. The job process, once it holds the lease, sees the marker and moves everything
the old build left (data, checkpoints, the saved record) into `.history/<UTC time>/`
(`move_old_build`): the new build starts from an empty folder with the current recipe,
and nothing is lost (the old record is copied there first, with `.history/.rebuilding`
naming the folder: a move stopped or killed part-way, which on a bucket copies and deletes
object by object, is put back, `_put_back`, and the build stays marked forced). If the
rebuild fails (or is stopped), the old build goes back in
place and what the attempt left moves to `.history/<UTC time>-failed/`
(`restore_old_build`): Snakemake declares records `update()` outputs, so it never
deletes one before a job (another run may have just written it) and puts a failed
job's record back, which then describes the build that is there again. A job without
the marker is a first build, or a stopped one that resumes from what it left (its
checkpoints). `.failures/`, `.history/` and the lease stay where they are. A dev
version (rebuilt on every run) keeps no history: once its rebuild succeeded the old
build is deleted (`files.discard`), so iterating does not pile up copies.

A rebuild whose process is killed outright (SIGKILL, the OOM killer) cannot restore
anything itself, and Snakemake then puts its backup of the old record back on top of
the attempt's partial data. So while a job rebuilds, `.history/.rebuilding` names the
folder the old build went to (`begin_rebuild`; removed when the rebuild succeeds or is
restored); whoever next holds the lease with the pointer still there (the same run's
main process at exit, else the next job of the artifact) completes the restore
(`recover_interrupted`): the old build back in place, the attempt's leftovers under
`<moved>-failed/`, a cascade still owed, and the failure record the killed job could
not write (its recipe and provenance are kept in the pointer). While the pointer is
there, a record beside it is not trusted: planning schedules the artifact's job and
the job serves nothing before the restore (`session.Session._rebuild_unended`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import FAILURES_DIR, RECORD_FILE
from marin_rules.artifacts.lease import LEASE_FILE, LeaseHolder, decode_holder, encode_holder, running_here
from marin_rules.artifacts.files import (
    FORCED_MARKER, FORCING_RUN, HISTORY_DIR, REBUILDING, discard, history_stamp, list_data_files,
)  # fmt: skip
from marin_rules.artifacts.provenance import iso, utc_now

MARKER = FORCED_MARKER  # not *.json: not an earlier record for readers of .history/
CASCADE = ".forced-by-upstream"  # beside MARKER: forced only because an upstream was
KEEP = {HISTORY_DIR, FAILURES_DIR, LEASE_FILE, LEASE_FILE + ".lock"}


def normalized(path: str) -> str:
    """A comparable form of a record path given on the command line."""
    return path if storage.is_remote(path) else os.path.abspath(storage.local_path(path))


def forced_directly(dag_settings: Any, rule: str, records: set[str]) -> bool:
    """Does the command line force this job itself (not through an upstream)?
    `rule` is the job's rule as Snakemake names it (prefixed under a `module` import,
    as `--forcerun` then names it); `records` are the normalized paths its record has
    (mirror and prefix)."""
    if dag_settings is None:
        return False
    names = {str(f) for f in dag_settings.forcerun or ()}
    forcerun = {normalized(f) for f in names}
    targets = {normalized(str(t)) for t in dag_settings.targets or ()}
    return (
        bool(dag_settings.forceall)
        or rule in names
        or bool(records & forcerun)
        or (bool(dag_settings.forcetargets) and bool(records & targets))
    )


def left_out(
    upstreams: Mapping[str, list[str]], named: Callable[[str, set[str]], str | None], until: set[str], omit: set[str]
) -> set[str]:
    """The artifacts (keys of `upstreams`: key -> its upstream keys) whose own job
    Snakemake plans but does not run: with `--until`, all but the ones whose job it names
    and their upstreams (a named shard rule runs the shards' upstreams, not the
    artifact's own job); with `--omit-from`, the named ones and everything downstream.
    `named(key, names)`: which of key's jobs `names` names ("artifact", "shards" or None).
    An `--until` name that names none of these jobs (`all`, a rule of the user's own
    Snakefile, a shard's record) may need any of them: then nothing counts as left out
    (a forced artifact is marked and rebuilt, as without `--until`); such an
    `--omit-from` name leaves none of them out."""
    out: set[str] = set()
    if until and any(not any(named(k, {name}) for k in upstreams) for name in until):
        until = set()  # a name not understood: whatever it needs may run
    if until:
        runs: set[str] = set()
        todo = [u for k in upstreams if (n := named(k, until)) for u in ([k] if n == "artifact" else upstreams[k])]
        while todo:
            key = todo.pop()
            if key not in runs:
                runs.add(key)
                todo.extend(upstreams[key])
        out |= set(upstreams) - runs
    if omit:
        omitted = {k for k in upstreams if named(k, omit)}
        for key in upstreams:  # in dependency order: an upstream is decided before its consumers
            if key in omitted or any(u in omitted for u in upstreams[key]):
                omitted.add(key)
        out |= omitted
    return out


def marker_of(location: str) -> str:
    """Where `mark_forced` saves the record of the artifact at `location`."""
    return storage.join(location, HISTORY_DIR, MARKER)


def mark_forced(location: str, by_upstream: bool = False, run: LeaseHolder | None = None) -> None:
    """Before Snakemake deletes a forced job's record: save it as the marker (a marker
    with `null` when only data of an unfinished build is there; nothing when empty).
    `by_upstream`: forced only because an upstream is (a cascade), which a failed
    rebuild still owes (`restore_old_build`); a direct force is the user's to repeat.
    `run`: the main process of the run that marks it (`forcing_run_alive`); a job
    marking its cascade owed again leaves none."""
    record_file = storage.join(location, RECORD_FILE)
    try:
        data = storage.read_bytes(record_file)
    except FileNotFoundError:
        if not storage.exists(location):
            return
        data = b"null"
    forcing_run = storage.join(location, HISTORY_DIR, FORCING_RUN)  # first: no reader sees the marker without it
    if run is not None:
        storage.write_bytes_atomic(forcing_run, encode_holder(run))
    else:
        _remove(forcing_run)
    storage.write_bytes_atomic(marker_of(location), data)
    cascade = storage.join(location, HISTORY_DIR, CASCADE)
    if by_upstream:
        storage.write_bytes_atomic(cascade, b"")
    else:
        _remove(cascade)


def forcing_run_alive(location: str) -> str | None:
    """The run that marked `location` forced (`mark_forced`), described, while it is known
    to be running (`lease.running_here`: its process, on this host), else None: a
    rebuild it owes is then under way, not stopped. From another host nobody can tell."""
    try:
        holder = decode_holder(storage.read_bytes(storage.join(location, HISTORY_DIR, FORCING_RUN)))
    except OSError:  # none (or unreadable: then nobody can tell it runs)
        return None
    return holder.describe() if holder is not None and running_here(holder) else None


def unmark_forced(location: str) -> None:
    """Take back `mark_forced` before the job ran (a cascade its run never began); a
    `.history/` that held nothing else goes too."""
    _remove(marker_of(location))
    _remove_companions(location)
    if not storage.is_remote(location):  # on GCS an emptied folder is gone already
        try:
            os.rmdir(os.path.join(storage.local_path(location), HISTORY_DIR))
        except OSError:  # not empty: earlier builds are kept there
            pass


def forced_by_upstream(location: str) -> bool:
    """Was the pending forced build of `location` marked as a cascade (`mark_forced`)?"""
    return storage.exists(storage.join(location, HISTORY_DIR, CASCADE))


def _remove_companions(location: str) -> None:
    """What `mark_forced` writes beside the marker: the cascade flag and the run's name."""
    _remove(storage.join(location, HISTORY_DIR, CASCADE))
    _remove(storage.join(location, HISTORY_DIR, FORCING_RUN))


def forced_phrase(run: str | None) -> str:
    """How a rebuild owed by a forced run (its marker still there) is said; `run`: that
    run while it is known to be running (`forcing_run_alive`), else None."""
    return "a forced run stopped before rebuilding it" if run is None else f"a forced run ({run}) has not rebuilt it yet"


def move_old_build(location: str, keep_pointer: bool = False) -> str | None:
    """In the job, under the lease: if the main process marked this build forced, move
    what the old build left into `.history/<UTC time>/`; returns that folder, or None
    when there was nothing to move. The folder holds the old record when a build had
    finished (`holds_build`), else only what an unfinished attempt left. `keep_pointer`:
    the "moving" pointer stays until the caller's `begin_rebuild` replaces it (a stop in
    between still puts the old build back: `recover_interrupted`)."""
    marker = marker_of(location)
    try:
        saved = storage.read_bytes(marker)
    except FileNotFoundError:
        return None
    target = storage.join(location, HISTORY_DIR, history_stamp())
    storage.makedirs(target)
    finished = saved.strip() not in (b"", b"null")
    if finished:  # the pointer, then the record: a move cut short is put back (`_put_back`)
        _write_pointer(location, {"moved": _name(target), "moving": True, "owed": forced_by_upstream(location)})
        storage.write_bytes_atomic(storage.join(target, RECORD_FILE), saved)
    try:
        _move_entries(location, target)  # on a bucket a copy and a delete per object: it can take a while
    except BaseException:
        if finished:  # stopped part-way: the old build goes back in place, still marked forced
            _put_back(location, target)
        raise
    if not keep_pointer:
        end_rebuild(location)  # moved whole
    _remove(marker)
    _remove_companions(location)
    if not holds_build(target) and not list_data_files(target):  # an unfinished attempt that left no data
        discard(target)  # (at most its .attempt.json)
        return None
    return target


def holds_build(moved: str) -> bool:
    """Did `move_old_build` set a finished build aside (its record is there), or only
    what an unfinished attempt left (nothing to put back if the rebuild fails)?"""
    return storage.exists(storage.join(moved, RECORD_FILE))


def moved_note(moved: str) -> str:
    """How a forced job tells where `move_old_build` put things."""
    if holds_build(moved):
        return f"the old build moved to {moved}"
    return f"what an unfinished attempt left moved to {moved} (kept, not resumed)"


def _remove(path: str) -> None:
    fs, inner = storage.filesystem(path)
    if fs.exists(inner):
        fs.rm(inner)


def set_aside(location: str, why: str = "", part: str = "") -> str:
    """Move everything in the artifact folder `location` (or in its subfolder `part`, a
    shard's `shards/<name>`) but `.history/`, `.failures/` and the lease into
    `.history/<UTC time>[-why][/part]/`; returns that folder."""
    target = storage.join(location, HISTORY_DIR, history_stamp(why), *([part] if part else []))
    storage.makedirs(target)
    _move_entries(storage.join(location, part) if part else location, target)
    return target


def rebuilding_pointer(location: str) -> str:
    """Where `begin_rebuild` notes a forced rebuild under way."""
    return storage.join(location, HISTORY_DIR, REBUILDING)


class RebuildKilled(Exception):
    """The error of the failure record `recover_interrupted` writes for a killed rebuild."""


def begin_rebuild(
    location: str, moved: str, owed: bool, entry: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None
) -> None:
    """In the job, after `move_old_build`: note where the old build went and whether the
    rebuild is owed (a cascade), until `end_rebuild` or `restore_old_build`; with the
    record entry and provenance (as of its start) of the attempt, for the failure record
    of a killed one."""
    _write_pointer(location, {"moved": _name(moved), "owed": owed, "entry": entry, "provenance": provenance})


def _name(folder: str) -> str:
    return folder.rstrip("/").rsplit("/", 1)[-1]


def _write_pointer(location: str, pointer: dict[str, Any]) -> None:
    """`.history/.rebuilding`: while `moving` (`move_old_build` under way), the old build
    is split between its place and the folder named; after it, a rebuild is under way."""
    storage.write_json_atomic(rebuilding_pointer(location), pointer)


def _put_back(location: str, moved: str) -> None:
    """A move of the old build into `moved` cut short: every file there goes back to its
    place (replacing the copy a bucket's move left behind, the same file), `moved` and
    the pointer go; the marker stays, so the forced rebuild is still to do."""
    root = moved.rstrip("/")
    fs_root = storage.filesystem(root)[1].rstrip("/")
    for path in storage.walk_files(root):
        target = storage.join(location, storage.filesystem(path)[1][len(fs_root) + 1:])
        storage.makedirs(storage.parent(target))  # (a folder moved whole is gone from its place)
        storage.move(path, target)
    discard(moved)
    end_rebuild(location)


def end_rebuild(location: str) -> None:
    """The forced rebuild succeeded: nothing to restore."""
    _remove(rebuilding_pointer(location))


def interrupted_rebuild(location: str) -> tuple[str, bool] | None:
    """(the folder holding the old build, owed) of a forced rebuild that neither
    succeeded nor was restored (its process was killed, or is still running: hold the
    lease before acting on it); None when there is none."""
    found = _read_pointer(location)
    return None if found is None else (found[0], bool(found[1].get("owed")))


def _read_pointer(location: str) -> tuple[str, dict] | None:
    try:
        pointer = storage.read_json(rebuilding_pointer(location))
        name = pointer["moved"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError):  # a torn pointer: nothing to act on
        end_rebuild(location)
        return None
    moved = storage.join(location, HISTORY_DIR, str(name))
    if "/" in str(name) or not storage.exists(moved):
        end_rebuild(location)
        return None
    return moved, pointer


def recover_interrupted(location: str) -> str | None:
    """Under the lease: complete the restore a killed forced rebuild could not do (see
    the module docstring) and write the failure record it could not write; returns where
    the attempt's leftovers went, or None when no rebuild was interrupted. A copy of the
    old record Snakemake put back is dropped."""
    from marin_rules.artifacts.records import write_failure

    found = _read_pointer(location)
    if found is None:
        return None
    moved, pointer = found
    if pointer.get("moving"):  # killed while the old build was being set aside: put it back, still forced
        _put_back(location, moved)
        if not storage.exists(marker_of(location)):  # it had moved whole, its marker gone since
            mark_forced(location, by_upstream=bool(pointer.get("owed")))
        return None
    record = storage.join(location, RECORD_FILE)
    try:
        if storage.read_bytes(record) == storage.read_bytes(storage.join(moved, RECORD_FILE)):
            _remove(record)  # Snakemake's backup of the old record: the old build has its own
    except FileNotFoundError:
        pass
    failed = restore_old_build(location, moved, owed=bool(pointer.get("owed")))
    entry, provenance = pointer.get("entry"), pointer.get("provenance")
    if isinstance(entry, dict) and isinstance(provenance, dict):
        found_at = iso(utc_now())
        error = RebuildKilled(
            f"the forced rebuild was killed before it ended (no exit status: SIGKILL, the OOM killer?), found at "
            f"{found_at}; the previous build is back in place, what the attempt left is in {failed}"
        )
        try:
            write_failure(location, entry, error, {**provenance, "ended": found_at, "duration_s": None}, "killed")
        except (KeyError, TypeError):  # a pointer of another shape: the restore is what matters
            pass
    return failed


def restore_old_build(location: str, moved: str, owed: bool = False) -> str:
    """A forced rebuild failed: move what it left to `<moved>-failed/` and the old build
    (in `moved`, from `move_old_build`) back in place; returns where the attempt went.
    `owed` (a cascade's rebuild, `forced_by_upstream`): marked forced again, so a later
    run finishes the cascade (`session.Session._left_pending`); a direct force is not
    (the old build serves until the user forces it again)."""
    failed = moved.rstrip("/") + "-failed"
    storage.makedirs(failed)
    _move_entries(location, failed)
    _move_entries(moved, location)
    discard(moved)
    if owed:
        mark_forced(location, by_upstream=True)
    end_rebuild(location)
    return failed


def _move_entries(source: str, target: str) -> None:
    """Move every entry of folder `source` but `.history/`, `.failures/` and the lease into `target`."""
    fs, root = storage.filesystem(source)
    root = root.rstrip("/")
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        entries = []
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name in KEEP or name.startswith(LEASE_FILE):
            continue
        storage.move(storage.join(source, name), storage.join(target, name))


def retire_now(location: str, keep: bool = True, stale_s: float | None = None) -> str | None:
    """A forced sharded artifact, from the main process at the start of a real run
    (`session.Session.start`, after Snakemake's lock): its shard jobs run before its own
    job, so the old build moves to `.history/` before any job runs, under the artifact's
    lease. A live holder of it or of one of its shards (another run building it) is
    refused: forcing a build in progress would wreck it."""
    from marin_rules.artifacts import lease as leases
    from marin_rules.artifacts.shards import SHARDS_DIR

    if not storage.exists(location):
        return None  # never built: nothing to keep
    stale_s = leases.STALE_S if stale_s is None else stale_s
    held = leases.acquire(location, is_done=lambda: False, wait=False, stale_s=stale_s)
    try:
        shards = storage.join(location, SHARDS_DIR)
        if storage.exists(shards):
            fs, root = storage.filesystem(shards)
            for folder in fs.ls(root.rstrip("/"), detail=False):
                shard = storage.join(shards, folder.rstrip("/").rsplit("/", 1)[-1])
                holder = leases.read_lease(shard)
                if leases.held_live(holder, stale_s):
                    raise leases.LeaseHeld(folder, holder, "; force it once that run has finished")
                unreadable = leases.fresh_unreadable_lease(shard, stale_s)
                if unreadable is not None:  # a run may be building that shard under it
                    raise leases.LeaseHeld(folder, None, "; force it once that run has finished", unreadable=unreadable)
        recover_interrupted(location)  # a retire killed part-way (its "moving" pointer): the old build back whole first
        mark_forced(location)
        moved = move_old_build(location)
        if moved and not keep:
            discard(moved)
        return moved if keep else None
    finally:
        held.release()
