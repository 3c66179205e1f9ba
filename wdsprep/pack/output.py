"""A pack's output folder, from the lock to the commit: the transaction every pack runs.

1. :func:`prepare_output` locks the folder for the pack (a second pack into it is refused while
   the lock is held) and makes it ready: a new pack marks it as being packed
   (:func:`wdsprep.format.commit.begin`) before it changes anything there (``overwrite``: it
   removes an earlier pack's output); a resumed pack finds the plan of the pack it finishes.
2. A resume with other inputs or options than that plan records is refused, naming what differs
   (:func:`check_same`); a pack that is complete is only reported (:func:`resumed_report`).
3. :func:`record_plan`: a new pack's whole plan goes into ``DIR/pack_plan.json`` before any shard
   is written.  A resumed pack's plan must be the one it started with; the shards it published are
   checked against their entries (size, mtime and SHA-256 as indexed, utterances and frames as planned) and
   kept untouched, and the rest is written again.
4. :class:`Publisher`: each shard a worker wrote (:mod:`wdsprep.pack.sink`) is *published* in plan
   order within its folder, as soon as it and every one before it are written: it gets its final
   name (``fmt % k``, ``k`` its place among the folder's published shards), the folder is synced,
   and its index entry is published (:func:`wdsprep.format.index.write_entry`).  A loader with
   ``growing=True`` follows the folders.
5. :func:`finish`: each folder's ``index.json`` and ``pack_report.json`` from the published
   entries, then the commit (the marker goes).
6. :func:`stopped`, after an error or Ctrl-C: nothing partial stays, and the published shards stay
   for ``--resume``; a new pack that published nothing removes what it wrote (:func:`abandon`).

A pack spread over machines (``--plan-only``, then ``--part I/N`` on each, then ``--resume``)
runs the same transaction in pieces.  The parts hold the folder's lock *shared* (the plan-only
and the committing run hold it alone), so they run at once; each writes its planned shards,
*stages* each (:func:`stage`: ``FOLDER/.pack.staged/J.tar`` and a record of what it holds, ``J``
its place in the plan), and then, holding the plan file's lock (:func:`plan_lock`: one publisher
at a time), publishes whatever staged shards come next in their folders' plan order
(:meth:`Publisher.advance`), under the names a single run gives them.  The committing run
publishes what is still staged (writing any shard no part wrote), then finishes as any pack does.

Shards and their names depend on the plan alone (the inputs and the seed), not on ``nj``, timing
or interruptions: a resumed pack ends as a pack never interrupted ends.  The marker and the plan
are :mod:`wdsprep.format.commit`'s, since readers look at them too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from wdsprep.errors import DataError
from wdsprep.files import TMP_SUFFIX, file_sha256, make_dir, sync, temp_path, write_text
from wdsprep.format.commit import (
    ENTRIES_DIR,
    PLAN_NAME,
    PackPlan,
    PlannedFolder,
    abandon_marker,
    begin,
    commit,
    marker,
    published_count,
    read_plan,
    write_plan,
)
from wdsprep.format.index import (
    FROM_UTT2SPK,
    INDEX_NAME,
    FolderIndex,
    ShardInfo,
    Speakers,
    index_file_names,
    is_index_file,
    read_entries,
    read_entry_record,
    stale_reason,
    write_entry,
    write_index,
)
from wdsprep.format.keys import decode_key, encode_key, speaker_of
from wdsprep.pack.options import PackOptions, Part, record_differences
from wdsprep.pack.plan import ShardPlan
from wdsprep.pack.sink import STAGED_DIR, WrittenShard, staged_name, staged_record
from wdsprep.report import Report
from wdsprep.units import hours

REPORT_NAME = "pack_report.json"


# -- 1. the lock, and a folder ready for the pack -----------------------------------------------------


@dataclass
class LockedOutput:
    """A pack's output folder, locked for it (no other pack may write there meanwhile), and the plan of
    the stopped pack it resumes (None: a new pack).  The lock goes with :meth:`release`, or at the end
    of a ``with`` block.

    The driver runs the transaction through its methods (the steps of this module), so an output
    elsewhere (a bucket: :mod:`wdsprep.pack.bucket`) is another class with the same methods: ``d``
    is then the local working folder that mirrors the bucket's small files, ``shown`` what messages
    name.
    """

    d: Path
    prior: PackPlan | None
    _lock: int | None = None

    @property
    def shown(self) -> str:
        return str(self.d)

    @property
    def stage_url(self) -> str | None:
        """Where workers stage the shards they write (a bucket's URL); None: they write into ``d``."""
        return None

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> LockedOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- the transaction's steps, on a local folder
    def committed_report(self) -> Report | None:
        """The report of the pack when it has committed, else None."""
        return None if os.path.lexists(marker(self.d)) else Report.read(self.d / REPORT_NAME)

    def resumed_report(self, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> Report | None:
        return resumed_report(self, command, inputs, options)

    def record_plan(self, plan: ShardPlan, record: PackPlan, fmt: str) -> Published:
        return record_plan(self, plan, record, fmt)

    def check_plan(self, record: PackPlan) -> None:
        check_plan(self, record)

    @contextmanager
    def publishing(self) -> Iterator[None]:
        """Held while a part reads or publishes entries: one publisher at a time (:func:`plan_lock`)."""
        with plan_lock(self.d):
            yield

    def published_done(self, plan: ShardPlan, fmt: str) -> set[int]:
        return published_so_far(self.d, plan, fmt).done

    def staged(self, plan: ShardPlan, shards: Sequence[int]) -> dict[int, WrittenShard]:
        return staged(self.d, plan, shards)

    def remove_part_partial(self, plan: ShardPlan, shards: Sequence[int]) -> None:
        remove_part_partial(self.d, plan, shards)

    def stage(self, w: WrittenShard) -> None:
        stage(self.d, w)

    def publisher(self, count: dict[str, int], options: PackOptions, utt2spk: dict[str, str] | None,
                  indexed: dict[str, dict[str, str]] | None) -> Publisher:
        return Publisher(self.d, count, options, utt2spk, indexed)

    def drop_staged(self, folders: Sequence[str]) -> None:
        drop_staged(self.d, folders)

    def finish(self, folders: Sequence[str], report: Report, *, languages: dict[str, str] | None = None) -> Report:
        return finish(self.d, folders, report, languages=languages)

    def stopped(self, shards_total: int, part: tuple[Part, ShardPlan] | None = None) -> str | None:
        return stopped(self, shards_total, part)


def lock_folder(d: Path, *, shared: bool = False) -> int:
    """An exclusive lock on folder ``d`` while the returned descriptor is open (and a killed pack's
    workers are gone): a second pack into ``d`` is refused instead of writing the same files.
    ``shared``: a part of a spread pack's, which other parts share and a whole pack is refused."""
    import fcntl
    import time

    fd = os.open(d, os.O_RDONLY)
    for attempt in range(5):
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if attempt < 4:  # a growing loader's probe (commit.pack_running) holds it for an instant
                time.sleep(0.05)
    os.close(fd)
    raise FileExistsError(f"{d}: another pack is writing there now (a whole pack, or while parts run (--part), the "
                          f"run that plans or commits them); wait for it to end (or stop it) first")


@contextmanager
def plan_lock(d: Path) -> Iterator[None]:
    """The lock of ``d``'s plan file, held while a part publishes: publishing takes the folders'
    next names and entries, so one publisher at a time, whichever machine it runs on (``flock``
    reaches over NFS v4 and Lustre; a file system without it serializes nothing: see docs)."""
    import fcntl

    fd = os.open(d / PLAN_NAME, os.O_RDWR)  # opened for writing (never written): NFS's flock, a POSIX lock, needs it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def prepare_output(d_out: str | os.PathLike, overwrite: bool, resume: bool = False, *,
                   part: Part | None = None) -> LockedOutput:
    """Make ``d_out`` ready for a pack, and lock it: the folder and the plan of the stopped pack to
    resume (None for a new pack).  The caller releases it when the pack ends.

    A new pack: ``d_out`` is created and marked as being packed; a non-empty one is refused unless
    ``overwrite``, which removes earlier pack output: ``*.tar``, partial and hidden worker shards,
    indexes and published entries, ``pack_report.json`` and ``pack_plan.json``, in ``d_out`` and its
    immediate sub-folders, then any sub-folder left empty; other files are kept.  The marker goes in
    first, so a pack killed while it removes the old output leaves no folder that looks complete.

    ``resume``: the pack whose plan ``d_out`` holds goes on (or, complete, is reported); without a
    plan (a pack killed before it planned, or an empty folder) it starts anew.

    ``part``: one part of a spread pack, which needs the plan a ``--plan-only`` run wrote (and
    always goes on from what is there); the lock is shared with the other parts.
    """
    d = Path(d_out)
    if d.exists() and not d.is_dir():
        raise FileExistsError(f"{d} exists and is not a directory")
    if resume and overwrite:
        raise ValueError("--resume keeps what a stopped pack published, --overwrite replaces it: give one")
    if part is not None:
        if overwrite:
            raise ValueError(f"--part {part} writes a share of the planned pack in {d}; --overwrite would remove "
                             f"the other parts' shards: redo the plan with --plan-only --overwrite instead")
        lock = lock_folder(d, shared=True) if d.is_dir() else None
        prior = read_plan(d) if lock is not None else None
        if prior is None:
            if lock is not None:
                os.close(lock)
            raise FileExistsError(f"{d / PLAN_NAME}: missing; a part (--part {part}) writes shards of a planned "
                                  f"pack: run the same command with --plan-only (and no --part) first")
        return LockedOutput(d, prior, lock)
    lock = lock_folder(make_dir(d))
    try:
        return LockedOutput(d, _prepare(d, overwrite, resume), lock)
    except BaseException:
        os.close(lock)
        raise


def _prepare(d: Path, overwrite: bool, resume: bool) -> PackPlan | None:
    """The plan of the pack to resume, or None when a new pack starts (the folder marked, and cleared
    of an earlier pack's output)."""
    refuse_linked_folders(d, removable=not resume)
    # A pack killed while it wrote its marker left only the marker's temporary file: it changed nothing.
    temp_path(marker(d)).unlink(missing_ok=True)
    plan = read_plan(d)
    if resume and plan is not None:
        return plan
    if d.is_dir() and any(d.iterdir()):
        unfinished = os.path.lexists(marker(d))
        if resume and not unfinished:
            raise FileExistsError(f"{d} holds no pack to resume (no {PLAN_NAME}); pick a new output directory or pass "
                                  f"--overwrite (overwrite=True) to replace the shards, indexes and report there")
        if not overwrite and not resume:
            raise FileExistsError(
                f"{d} holds a pack that did not finish; pass --resume to finish it (keeping the shards it published), "
                f"or --overwrite (overwrite=True) to redo it"
                if unfinished and plan is not None else
                f"{d} holds a pack that did not finish; pass --overwrite (overwrite=True) to redo it"
                if unfinished else
                f"{d} is not empty; pick a new output directory or pass --overwrite (overwrite=True) "
                f"to replace the shards, indexes and report an earlier pack wrote there"
            )
        overwrite = True  # resume without a plan: nothing was published in order, so it starts anew
    begin(d)
    if overwrite:
        for folder in [d, *own_folders(d)]:
            remove_path(folder / ENTRIES_DIR)
            remove_path(folder / f"{ENTRIES_DIR}.done")
            remove_path(folder / STAGED_DIR)
            for p in folder.iterdir():
                if (p.is_file() or p.is_symlink()) and (p.name.endswith((".tar", TMP_SUFFIX))
                                    or is_index_file(p.name) or p.name == REPORT_NAME
                                    or (folder == d and p.name == PLAN_NAME)):
                    p.unlink()
            if folder != d and not any(folder.iterdir()):
                folder.rmdir()
        remove_partial(d)
    return None


def own_folders(d: Path) -> list[Path]:
    """``d``'s sub-folders that are folders of its own: a symbolic link is never followed, so
    nothing is removed (or written) in the folder it points to."""
    return [p for p in d.iterdir() if p.is_dir() and not p.is_symlink()]


def refuse_linked_folders(d: Path, removable: bool) -> None:
    """A pack never removes or writes through a symbolic link to a folder inside ``--out`` (it would
    change the files of the folder it points to): such a link is refused, named, before anything
    changes.  ``removable``: links where a pack keeps hidden work (published entries, worker shards)
    are not refused, since a new pack removes them, the links themselves."""
    if not d.is_dir():
        return
    for p in sorted(d.iterdir()):
        hidden_work = p.name in (ENTRIES_DIR, f"{ENTRIES_DIR}.done") or p.name.startswith((".w", "..w"))
        if p.is_symlink() and p.is_dir() and not (removable and hidden_work):
            raise FileExistsError(f"{p} is a symbolic link to the folder {os.path.realpath(p)}; a pack never "
                                  f"removes or writes anything through a link inside its output folder: remove the "
                                  f"link (rm {p}) or pick another output folder")


def remove_path(p: Path) -> None:
    """Remove ``p`` if it is there: a symbolic link itself (never what it points to), a file, or a
    folder of its own with what it holds.  An error names ``p``."""
    try:
        if p.is_symlink() or (os.path.lexists(p) and not p.is_dir()):
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise OSError(e.errno, f"cannot remove {p}: {e.strerror or e}", str(p)) from None


def remove_partial(d_out: str | os.PathLike) -> None:
    """Remove hidden worker shards, so nothing partial is mistaken for output (links removed
    themselves, never followed)."""
    d = Path(d_out)
    # .w000-00000.tar, and ..w000-00000.tar.tmp while it is being written
    for folder in [d, *own_folders(d)]:
        for p in [*folder.glob(".w*"), *folder.glob("..w*")]:
            remove_path(p)


# -- 2. what a pack was made from, and a resume held against it -----------------------------------------


def file_digests(paths: Sequence[str | os.PathLike]) -> list[list[str]]:
    """``[[path, sha256], ...]`` of input files (Kaldi text files: read once, fast)."""
    out = []
    for p in paths:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out.append([str(p), h.hexdigest()])
    return out


def stat_digest(paths: Sequence[str]) -> dict[str, Any]:
    """A digest of files' paths, sizes and modification times: the arks or audio files a pack reads
    (too large to hash; a file rewritten since shows in its size or time).  Missing files count too."""
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(set(paths)):
        try:
            st = os.stat(p)
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        except OSError:
            h.update(f"{p}\0-\n".encode("utf-8", "surrogateescape"))
    return {"files": len(set(paths)), "digest": h.hexdigest()}


def _differences(prior: PackPlan, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """What a resume would change: input by input, option by option, for the message."""
    out = []
    if prior.command != command:
        out.append(f"it was packed by `wdsprep {prior.command}`, not `wdsprep {command}`")
    for name in dict.fromkeys([*prior.inputs, *inputs]):
        was, now = prior.inputs.get(name), inputs.get(name)
        if was == now:
            continue
        if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
            files = [n[0] for w, n in zip(was, now) if w[1] != n[1]]
            if files:
                out.append(f"{name} {files[0]} differs from the one the pack started with (sha256)")
                continue
            if all(_same_path(w[0], n[0]) for w, n in zip(was, now)):
                continue  # the same files, spelled another way (./a for a)
        if isinstance(was, dict) and isinstance(now, dict) and "digest" in was and "digest" in now:
            out.append(f"the {name} ({now.get('files', '?'):,} files) differ in size or modification time from "
                       f"when the pack started ({was.get('files', '?'):,} files)")
            continue
        if isinstance(was, dict) and isinstance(now, dict):  # how the input was read (an import's columns)
            out += [f"{k}={now.get(k)!r} (the pack started with {was.get(k)!r})" for k in dict.fromkeys([*was, *now])
                    if was.get(k) != now.get(k)]
            continue
        out.append(f"{name} is {_brief(now)}, the pack started with {_brief(was)}")
    return out + record_differences(prior.options, options)


def _same_path(a: Any, b: Any) -> bool:
    """Whether two recorded paths name one file however spelled (``./a``, ``a``, ``x/../a``)."""
    return isinstance(a, str) and isinstance(b, str) and os.path.normpath(a) == os.path.normpath(b)


def _brief(value: Any) -> str:
    if value is None:
        return "not given"
    if isinstance(value, list):
        return ", ".join(str(v[0]) if isinstance(v, list) and v else str(v) for v in value) or "none"
    return repr(value)


def check_same(d: Path, prior: PackPlan, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse to resume ``d`` with other inputs or options than its plan records, naming every
    difference."""
    diffs = _differences(prior, command, inputs, options)
    if diffs:
        raise DataError(f"{d}: cannot resume this pack: {'; '.join(diffs)}. Resume it with the inputs and options it "
                        f"started with (see {d / PLAN_NAME}), or pack again with --overwrite")


def resumed_report(out: LockedOutput, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> Report | None:
    """A ``--resume`` (``out.prior``: the plan of the pack it finishes), refused unless the inputs and
    options are the same.  Of a pack that already committed: its report; of one killed after it wrote
    its report, before the commit: commits it (every shard and index is written and synced by then).
    None when there is more to do."""
    d, prior = out.d, out.prior
    assert prior is not None
    check_same(d, prior, command, inputs, options)
    if not os.path.lexists(marker(d)) and not (d / REPORT_NAME).is_file() and _unfinished(d, prior):
        begin(d)  # its marker was removed by hand: the pack did not finish, and goes on
        return None
    if os.path.lexists(marker(d)):
        # The report is written after every folder's index.json, and before the entries go.
        if not (d / REPORT_NAME).is_file():
            return None
        for f in prior.folders:
            drop_parts(d / f)
        sync(d)
        commit(d)
    report = Report.read(d / REPORT_NAME)
    print(report.summary(f"{command}: {d} is complete"))
    return report


def _unfinished(d: Path, prior: PackPlan) -> bool:
    """Whether a pack folder holds a pack that did not commit, marker or not: a planned folder has
    published entries, or no ``index.json`` (a commit leaves every folder an index and no entries)."""
    return any(published_count(d / f) or not (d / f / INDEX_NAME).is_file() for f in prior.folders)


# -- 3. the plan, recorded before any shard is written ---------------------------------------------------


def plan_record(plan: ShardPlan, *, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> PackPlan:
    """What ``pack_plan.json`` keeps of a plan: per folder its shards, utterances and frames, and the
    plan's digest; with the command, the inputs' digests and the options' record."""
    folders: dict[str, PlannedFolder] = {}
    for f in plan.folders:
        mine = [s for s in plan.shards if s.folder == f]
        if mine:
            folders[f] = PlannedFolder(len(mine), sum(len(s.items) for s in mine), sum(s.frames for s in mine))
    return PackPlan(command, inputs, options, plan.digest(), folders)


@dataclass
class Published:
    """What a pack published before it was stopped: per folder the shards' count, and every planned
    shard it has dealt with (published, or written empty), with what each dropped."""

    count: dict[str, int]
    done: set[int]


def record_plan(out: LockedOutput, plan: ShardPlan, record: PackPlan, fmt: str) -> Published:
    """Before any shard is written: a new pack's plan goes beside the marker.  A resumed pack's must be
    the one it started with; what it published is checked and gathered, and what it left unpublished
    removed."""
    d = out.d
    if out.prior is None:
        write_plan(d, record)
        return Published({f: 0 for f in plan.folders}, set())
    check_plan(out, record)
    done = published_so_far(d, plan, fmt)
    _remove_unpublished(d, plan, done.count, fmt)
    return done


def check_plan(out: LockedOutput, record: PackPlan) -> None:
    """Refuse to go on with a plan other than the one ``out``'s pack started with."""
    assert out.prior is not None
    if record.digest != out.prior.digest or record.folders != out.prior.folders:
        raise DataError(f"{out.d}: cannot resume this pack: the shard plan differs from the one it started with "
                        f"(the features' frame counts, or which utterances can be packed, changed); pack "
                        f"again with --overwrite")


def folder_shards(plan: ShardPlan) -> dict[str, list[int]]:
    """Each folder's planned shards, in plan order (their published names follow it)."""
    by_folder: dict[str, list[int]] = defaultdict(list)
    for j, s in enumerate(plan.shards):
        by_folder[s.folder].append(j)
    return by_folder


# Why published shard k of a folder (its name, the folder's index of entries) changed since, or None.
ShardCheck = Callable[[str, str, int, FolderIndex], "str | None"]


def local_change(d: Path) -> ShardCheck:
    """Whether a published shard in ``d`` is missing or changed: its size and mtime, and its bytes'
    SHA-256 against its entry's."""
    def changed(folder: str, name: str, k: int, index: FolderIndex) -> str | None:
        path = d / folder / name
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "it is missing"
        why = stale_reason(index, k, st)
        if why is None and index.checksums[k] is not None and file_sha256(path) != index.checksums[k]:
            why = "its bytes differ from the SHA-256 its entry records: it was changed in place"
        return None if why is None else f"it changed since ({why})"
    return changed


def published_so_far(d: Path, plan: ShardPlan, fmt: str, changed: ShardCheck | None = None,
                     shown: str | None = None) -> Published:
    """Check every published shard against its entry and the plan, and gather what they hold.

    A published shard is never rewritten: one missing, changed since it was published or not what
    the plan puts there is an error (the folder was changed by hand, or the inputs changed in a way
    their digests do not show): pack again with ``--overwrite``.  ``changed``: how a shard is
    checked (default: :func:`local_change`); ``shown``: the output as messages name it.
    """
    changed = changed or local_change(d)
    out = Published({}, set())
    for folder, shard_ids in folder_shards(plan).items():
        where = d / folder
        k_count = published_count(where)
        out.count[folder] = k_count
        if not k_count:
            continue
        index = read_entries(where)
        assert len(index.names) == k_count
        position = {j: n for n, j in enumerate(shard_ids)}
        last = -1
        for k in range(k_count):
            name = fmt % k
            at = f"{shown}/{folder}/{name}".replace("//", "/") if shown else where / name

            def refuse(why: str) -> DataError:
                return DataError(f"{at}: published by the pack being resumed, but {why}; a published shard is "
                                 f"never rewritten: pack again with --overwrite")

            if index.names[k] != name:
                raise refuse(f"its entry names {index.names[k]!r}")
            why = changed(folder, name, k, index)
            if why is not None:
                raise refuse(why)
            record = read_entry_record(where, k)
            j = record.get("plan_shard")
            if type(j) is not int or j not in position or position[j] <= last:
                raise refuse(f"its entry names planned shard {j!r}, not one after the last in {folder or '.'}")
            last = position[j]
            info = index.shard(k)
            if not _as_planned(plan, j, info.keys, info.frames):
                raise refuse("its utterances are not the ones the plan puts there (did the features change?)")
            out.done.add(j)
            out.done.update(s for s, _ in _entry_reports(record, where))
    return out


def _as_planned(plan: ShardPlan, j: int, keys: Sequence[str], frames: Sequence[int]) -> bool:
    """Whether a written shard holds planned shard ``j``'s utterances (those it could pack), in plan
    order, with their planned frames."""
    planned_keys = [encode_key(plan.uttids[i]) for i in plan.shards[j].items.tolist()]
    planned_frames = dict(zip(planned_keys, plan.frames[plan.shards[j].items].tolist()))
    it = iter(planned_keys)
    return len(keys) == len(frames) and all(key in it for key in keys) \
        and all(planned_frames[key] == f for key, f in zip(keys, frames))


def _entry_reports(record: dict[str, Any], where: Path) -> list[tuple[int, Report]]:
    """(planned shard, what it dropped) of a published entry's shard and of the shards written empty
    just before it."""
    at = str(where / ENTRIES_DIR)
    skipped = record.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(x, dict) and type(x.get("plan_shard")) is int
                                                 for x in skipped):
        raise DataError(f"{at}: a published shard's entry is damaged (skipped); pack again with --overwrite")
    return [(record["plan_shard"], Report.from_fragment(record.get("report"), where=at)),
            *((x["plan_shard"], Report.from_fragment(x.get("report"), where=at)) for x in skipped)]


def _remove_unpublished(d: Path, plan: ShardPlan, count: dict[str, int], fmt: str) -> None:
    """Shards of a stopped pack that got their final names but were not published (a kill between
    the rename and the entry), and hidden leftovers: they are written again, byte for byte."""
    remove_partial(d)
    for folder in plan.folders:
        where = d / folder
        for p in where.glob(f"{ENTRIES_DIR}/.tmp-*"):
            remove_path(p)
        published = count.get(folder, 0)
        for p in where.glob(f"{ENTRIES_DIR}/[0-9]*"):
            # entries past a gap (one removed by hand) publish nothing: their shards are written
            # again, and a stale entry in a new one's place would stop its publication for good
            if p.name.isdigit() and len(p.name) == 8 and int(p.name) >= published:
                remove_path(p)
        planned_here = sum(1 for s in plan.shards if s.folder == folder)
        for k in range(count.get(folder, 0), planned_here):
            (where / (fmt % k)).unlink(missing_ok=True)


# -- 4. publishing the shards as they are written ------------------------------------------------------


class Publisher:
    """Publishes each written shard in turn: its final name, the folder synced, its index entry.

    A shard written empty (none of its utterances could be packed) is named in its folder's next
    published entry (``skipped``), with what it dropped; the reports of those after a folder's last
    published shard are kept nowhere else: :meth:`unlisted_reports`.
    """

    def __init__(self, d: Path, count: dict[str, int], options: PackOptions, utt2spk: dict[str, str] | None,
                 indexed: dict[str, dict[str, str]] | None = None):
        self.d, self.count, self.utt2spk = d, dict(count), utt2spk
        self.fields, self.indexed = options.fields, indexed or {}  # indexed: field -> uttid -> value
        self.fmt, self.layout, self.dtype, self.audio = options.fmt, options.layout, options.dtype, options.audio_index
        self.skipped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.empty_reports: dict[str, list[Report]] = defaultdict(list)

    def publish(self, w: WrittenShard) -> None:
        where = self.d / w.folder
        if w.info is None:
            self.skipped[w.folder].append({"plan_shard": w.shard, "report": w.report.fragment()})
            self.empty_reports[w.folder].append(w.report)
            return
        k = self.count.get(w.folder, 0)
        final = self.fmt % k
        size, mtime = self.place(w, final)
        try:
            uttids = [decode_key(k) for k in w.info.keys]
            info = ShardInfo(final, w.info.keys, w.info.frames, w.info.text_lens, w.info.sha256, w.info.samples,
                             {n: [values.get(u) for u in uttids] for n, values in self.indexed.items()})
            speakers = None if self.utt2spk is None else given_speakers([info], self.utt2spk, w.report)
            dims = w.dims if self.audio is None else self.audio.num_mel_bins
            entry = FolderIndex.from_shards(self.layout, dims, self.dtype, [info], sizes=[size], mtimes=[mtime],
                                            speakers=speakers, audio=self.audio, fields=self.fields)
            self.put_entry(where, k, entry, {"plan_shard": w.shard, "report": w.report.fragment(),
                                             "skipped": self.skipped.pop(w.folder, [])})
        except BaseException:
            self.unplace(w, final)  # named but not published (its entry did not fit): written again
            raise
        self.empty_reports.pop(w.folder, None)
        self.count[w.folder] = k + 1

    def place(self, w: WrittenShard, final: str) -> tuple[int, int]:
        """Give a written shard its final name, on disk before its entry says it is there: (size, mtime)."""
        assert w.info is not None
        where = self.d / w.folder
        os.replace(where / w.info.name, where / final)
        sync(where)
        st = os.stat(where / final)
        return st.st_size, st.st_mtime_ns

    def unplace(self, w: WrittenShard, final: str) -> None:
        (self.d / w.folder / final).unlink(missing_ok=True)

    def put_entry(self, where: Path, k: int, entry: FolderIndex, record: dict[str, Any]) -> None:
        """Publish shard ``k`` of ``where`` by its entry."""
        write_entry(where, k, entry, record)

    def read_staged(self, plan: ShardPlan, j: int) -> WrittenShard | None:
        return read_staged(self.d, plan, j)

    def advance(self, plan: ShardPlan, folder: str, shard_ids: Sequence[int]) -> int:
        """A part's, holding :func:`plan_lock`: publish ``folder``'s staged shards that come next in
        plan order (``shard_ids``: the folder's planned shards), whichever part staged them, up to
        the first not staged yet; how many.  What is published is read from the folder, not
        remembered: other parts publish there too."""
        where = self.d / folder
        k = published_count(where)
        start = 0
        if k:
            last = read_entry_record(where, k - 1).get("plan_shard")
            if last not in shard_ids:
                raise DataError(f"{where / ENTRIES_DIR}: entry {k - 1} names planned shard {last!r}, none of this "
                                f"folder's; pack again with --overwrite")
            start = shard_ids.index(last) + 1
        self.count[folder] = k
        self.skipped.pop(folder, None)  # the empty shards before the next one are staged, and read again
        self.empty_reports.pop(folder, None)
        n = 0
        for j in shard_ids[start:]:
            w = self.read_staged(plan, j)
            if w is None:
                break
            self.publish(w)
            n += 1
        return n

    def unlisted_reports(self) -> list[Report]:
        """What the shards written empty after their folder's last published shard dropped."""
        return [r for reports in self.empty_reports.values() for r in reports]


def staged_paths(d: Path, folder: str, shard: int) -> tuple[Path, Path]:
    """Planned shard ``shard``'s staged file and its record (what it holds, what it dropped)."""
    tar = d / folder / staged_name(shard)
    return tar, tar.with_suffix(".json")


def stage(d: Path, w: WrittenShard) -> None:
    """A part's written shard, kept under its place in the plan until its turn to be published:
    the shard under its staged name, then its record (which makes it staged), both synced."""
    tar, rec = staged_paths(d, w.folder, w.shard)
    make_dir(tar.parent)
    size = None
    if w.info is not None:
        os.replace(d / w.folder / w.info.name, tar)
        sync(tar.parent)
        size = os.stat(tar).st_size
    write_text(rec, staged_record(w, size, None).decode("utf-8"))
    sync(rec)
    sync(tar.parent)


def read_staged(d: Path, plan: ShardPlan, j: int) -> WrittenShard | None:
    """Planned shard ``j`` as a part staged it, or None when it is not staged whole (not written yet,
    or a part was killed half-way staging or publishing it: it is written again).  A record that is
    not what the plan puts there counts as not staged."""
    tar, rec = staged_paths(d, plan.shards[j].folder, j)
    try:
        record = rec.read_bytes()
        size = os.stat(tar).st_size if tar.exists() else None
    except OSError:
        return None
    return parse_staged(plan, j, record, size, str(rec))


def parse_staged(plan: ShardPlan, j: int, record: bytes, size: int | None, where: str) -> WrittenShard | None:
    """Planned shard ``j`` from its staged ``record`` and the size its staged file has (None: no
    file), or None when it is not staged whole or not what the plan puts there."""
    folder = plan.shards[j].folder
    try:
        doc = json.loads(record.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("plan_shard") != j:
            return None
        report = Report.from_fragment(doc.get("report"), where=where)
        i = doc.get("info")
        if i is None:
            return WrittenShard(j, folder, None, doc.get("dims"), report)
        if size is None or size != i["size"] or not _as_planned(plan, j, i["keys"], i["frames"]):
            return None
        info = ShardInfo(staged_name(j), list(i["keys"]), list(i["frames"]), list(i["text_lens"]), i["sha256"],
                         list(i["samples"]))
        mtime = i.get("mtime_ns")
        return WrittenShard(j, folder, info, doc.get("dims"), report, size, mtime if type(mtime) is int else None)
    except (ValueError, KeyError, TypeError, DataError):
        return None


def staged(d: Path, plan: ShardPlan, shards: Sequence[int]) -> dict[int, WrittenShard]:
    """Those of ``shards`` that are staged whole."""
    out = {}
    for j in shards:
        w = read_staged(d, plan, j)
        if w is not None:
            out[j] = w
    return out


def remove_part_partial(d: Path, plan: ShardPlan, shards: Sequence[int]) -> None:
    """What a killed part left of ``shards`` (its own, neither published nor staged whole): the
    workers' hidden files and staged halves.  Only these: other parts are writing beside it."""
    for j in shards:
        folder = plan.shards[j].folder
        for p in [*(d / folder).glob(f".w{j:03d}-*"), *(d / folder).glob(f"..w{j:03d}-*"), *staged_paths(d, folder, j)]:
            if p.is_file():
                p.unlink()


def drop_staged(d: Path, folders: Sequence[str]) -> None:
    """Once every staged shard is published: the staging folders go (before the commit)."""
    for folder in folders:
        shutil.rmtree(d / folder / STAGED_DIR, ignore_errors=True)


def given_speakers(infos: Sequence[ShardInfo], utt2spk: dict[str, str], report: Report) -> Speakers:
    """The speakers ``utt2spk`` gives the shards' utterances; one it lacks is flagged ``no_speaker``
    and gets the speaker its id names (the key rule)."""
    names = []
    for key in (k for i in infos for k in i.keys):
        uttid = decode_key(key)
        name = utt2spk.get(uttid)
        if name is None:
            report.note("no_speaker", uttid)
            name = speaker_of(uttid)
        names.append(name)
    return Speakers.of(names, FROM_UTT2SPK)


# -- 5. the end: indexes, report, commit ---------------------------------------------------------------


def finish(d: Path, folders: Sequence[str], report: Report, *, languages: dict[str, str] | None = None) -> Report:
    """Every folder's ``index.json`` from its published entries, the report, then the entries go and
    the pack commits.  The entries go only once the report is on disk: a pack killed in between
    resumes from them.  ``languages`` (each utterance's): the report counts the written utterances of
    each."""
    summary: dict[str, dict[str, Any]] = {}
    written: list[Path] = []
    folders_with_shards = []
    for folder in folders:
        where = d / folder
        index = read_entries(where) if (where / ENTRIES_DIR).is_dir() else None
        infos = len(index.names) if index is not None else 0
        for k in range(infos):
            for _, r in _entry_reports(read_entry_record(where, k), where):
                report.merge(r)
        if index is not None and infos:
            write_index(where, index)
            written.extend(where / name for name in index_file_names(index))
            folders_with_shards.append(where)
        if index is not None and languages is not None:
            for key in index.keys():
                language = languages.get(decode_key(key))
                if language is not None:
                    report.languages[language] = report.languages.get(language, 0) + 1
        frames = index.num_frames if index is not None else 0
        summary[folder or "."] = {"utterances": index.num_utts if index is not None else 0, "frames": frames,
                                  "hours": round(hours(frames), 4), "shards": infos}
    report.groups = summary
    written.append(report.write(d / REPORT_NAME))
    for p in written:
        sync(p)
    for where in folders_with_shards:
        sync(where)
    for folder in folders:
        where = d / folder
        drop_parts(where)
        if where != d and where.is_dir() and not any(where.iterdir()):
            where.rmdir()  # a group whose every utterance failed
    sync(d)
    commit(d)
    return report


def drop_parts(folder: Path) -> None:
    """Remove a folder's published entries once its ``index.json`` holds them: moved away in one
    rename first, so a reader listing them finds all or none (and then the index)."""
    parts = folder / ENTRIES_DIR
    gone = folder / f"{ENTRIES_DIR}.done"
    shutil.rmtree(gone, ignore_errors=True)
    if parts.is_dir():
        os.rename(parts, gone)
    shutil.rmtree(gone, ignore_errors=True)


# -- 6. a pack that stopped -------------------------------------------------------------------------------


def stopped(out: LockedOutput, shards_total: int, part: tuple[Part, ShardPlan] | None = None) -> str | None:
    """After an error or Ctrl-C: nothing partial stays; published shards stay for ``--resume`` (a
    new pack that published nothing removes what it wrote, marker and plan too).  What to tell.
    ``part``: a part of a spread pack and its plan; only what it left half-written goes (the other
    parts write beside it), and what it staged stays."""
    d = out.d
    if part is not None:
        p, plan = part
        try:
            remove_part_partial(d, plan, [j for j in range(len(plan.shards)) if p.mine(j)
                                          and read_staged(d, plan, j) is None])
        except OSError:
            return None
        return (f"part {p} stopped; what it staged or published in {d} is kept: run the same command (--part {p}) "
                f"again to finish it")
    try:
        remove_partial(d)
        for parts in (p for folder in [d, *own_folders(d)] for p in folder.glob(f"{ENTRIES_DIR}/.tmp-*")):
            remove_path(parts)
        published = sum(published_count(p.parent) for p in [*d.glob(ENTRIES_DIR), *d.glob(f"*/{ENTRIES_DIR}")])
    except OSError:
        return None
    if published == 0 and out.prior is None:
        abandon(d)
        return None
    of = f" of {shards_total:,}" if shards_total else ""
    return (f"the pack stopped with {published:,}{of} shards published in {d}, which are kept (growing=True reads "
            f"them): run the same command with --resume to finish it")


def abandon(d_out: Path) -> None:
    """After a pack that published nothing failed: remove what it wrote, marker and plan last."""
    try:
        remove_partial(d_out)
        for p in [d_out, *own_folders(d_out)]:
            remove_path(p / ENTRIES_DIR)
        (d_out / REPORT_NAME).unlink(missing_ok=True)
        for p in own_folders(d_out):
            if not any(p.iterdir()):
                p.rmdir()
    except OSError:
        return
    abandon_marker(d_out)
