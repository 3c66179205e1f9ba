"""Writing a pack's shard plan: shards written by workers, published one by one, resumable.

A pack decides its whole plan first (``plan.py``: which utterance goes into which shard of which
folder, in which order), from the feature headers (``pack``) or the audio headers (``pack-audio``),
and records it in ``DIR/pack_plan.json`` (:mod:`wdsprep.format.commit`) before any shard is
written.  Then :func:`pack_planned`:

1. workers write the planned shards, each under a hidden name, synced (``nj`` processes, each
   taking the next shard when it is free);
2. the main process *publishes* them in plan order within each folder, as soon as a shard and
   every one before it are written: the shard gets its final name (``fmt % k``, ``k`` its place
   among the folder's published shards), the folder is synced, and its index entry is published
   (:func:`wdsprep.format.index.write_part`).  A loader with ``growing=True`` follows the folders;
3. at the end each folder's ``index.json`` and ``pack_report.json`` are written from the published
   entries, and the pack commits (the marker goes).

Shards and their names depend on the plan alone (the inputs and the seed), not on ``nj``, timing
or interruptions.  The folders' shards are written interleaved, so that each folder has about the
same share of its shards published at any time: a loader following the pack sees every length
group from the start.

``resume``: after a kill, a full disk or Ctrl-C the published shards are checked against their
entries (size and mtime as indexed, utterances and frames as planned) and kept untouched; only the
rest is written, and the result is what a pack never interrupted gives.  A resume with other inputs
or options than the plan records is refused, naming what differs.  A pack that fails before it
published anything removes what it wrote, as it always did.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.files import sync
from wdsprep.format.commit import (
    PARTS_DIR,
    PLAN_NAME,
    PackPlan,
    PlannedFolder,
    abandon_marker,
    commit,
    marker,
    published_count,
    read_plan,
    write_plan,
)
from wdsprep.format.index import (
    AUDIO_INDEX_FILES,
    INDEX_FILES,
    AudioIndex,
    FolderIndex,
    ShardInfo,
    read_part_record,
    read_parts,
    stale_reason,
    write_index,
    write_part,
)
from wdsprep.format.keys import encode_key
from wdsprep.pack.plan import PlannedShard
from wdsprep.pack.sink import REPORT_NAME, GroupedSink, given_speakers, remove_partial
from wdsprep.prep.parallel import imap_ordered
from wdsprep.report import Report, StrictError
from wdsprep.units import hours


@dataclass
class Written:
    """One planned shard as a worker wrote it: under a hidden name, or nothing when none of its
    utterances could be packed (``report`` says why)."""

    shard: int  # its place in the plan
    folder: str
    info: ShardInfo | None  # named by its hidden file
    dims: int | None
    report: Report


class ShardJob(Protocol):
    """What writes planned shards in a worker process: ``pack``'s from arks, ``pack-audio``'s from audio."""

    def open(self) -> None:
        """Take the worker's resources (open arks, an fbank backend)."""

    def write(self, shard: int, tick: Callable[[int], None]) -> Written:
        """Write planned shard ``shard`` under a hidden name (synced); ``tick`` per utterance."""

    def close(self) -> None: ...


@dataclass
class Planned:
    """A pack's plan, ready to be written: its shards, every item's id and planned frames, and the
    job that writes a shard."""

    shards: list[PlannedShard]
    uttids: Sequence[str]  # per item (the positions PlannedShard.items hold)
    frames: np.ndarray  # int64 per item: frames as planned
    folders: list[str]  # every folder of the pack, in order (length groups)
    job: ShardJob


def sink_for(d_out: Path, shard: int, *, layout: str, dtype: str, dims: int | None,
             sample_rate: int | None = None) -> GroupedSink:
    """The sink a job writes planned shard ``shard`` into (hidden name ``.wSHARD-00000.tar``;
    ``sample_rate``: an audio layout's)."""
    return GroupedSink(d_out, None, worker=shard, utts_per_shard=1 << 62, layout=layout, dtype=dtype, dims=dims,
                       sample_rate=sample_rate)


def written(sink: GroupedSink, shard: int, folder: str) -> Written:
    """What ``sink`` wrote of planned shard ``shard``: closes it (the shard is synced)."""
    sink.end_shard(folder)
    result = sink.close()
    infos = result.shards.get(folder, [])
    return Written(shard, folder, infos[0] if infos else None, result.dims, result.report)


# The job of this worker process (set by _open_job in each worker, or in the main process with nj=1).
_job: ShardJob | None = None


def _open_job(job: ShardJob) -> None:
    global _job
    _job = job
    job.open()


def _close_job() -> None:
    global _job
    if _job is not None:
        _job.close()
        _job = None


def _write(shard: int, tick: Callable[[int], None]) -> Written:
    assert _job is not None
    return _job.write(shard, tick)


def plan_digest(planned: Planned) -> str:
    """A digest of every planned shard: its folder, its utterances in order and their frames."""
    h = hashlib.blake2b(digest_size=16)
    for s in planned.shards:
        h.update(s.folder.encode("utf-8") + b"\0")
        h.update("\n".join(planned.uttids[i] for i in s.items.tolist()).encode("utf-8") + b"\0")
        h.update(np.ascontiguousarray(planned.frames[s.items], np.int64).tobytes())
    return h.hexdigest()


def plan_record(planned: Planned, *, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> PackPlan:
    folders: dict[str, PlannedFolder] = {}
    for f in planned.folders:
        mine = [s for s in planned.shards if s.folder == f]
        if mine:
            folders[f] = PlannedFolder(len(mine), sum(len(s.items) for s in mine), sum(s.frames for s in mine))
    return PackPlan(command, inputs, options, plan_digest(planned), folders)


# -- what a pack was made from --------------------------------------------------------------------


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
        if isinstance(was, dict) and isinstance(now, dict):
            out.append(f"the {name} ({now.get('files', '?'):,} files) differ in size or modification time from "
                       f"when the pack started ({was.get('files', '?'):,} files)")
            continue
        out.append(f"{name} is {_brief(now)}, the pack started with {_brief(was)}")
    for name in dict.fromkeys([*prior.options, *options]):
        if prior.options.get(name) != options.get(name):
            out.append(f"{name}={options.get(name)!r} (the pack started with {prior.options.get(name)!r})")
    return out


def _brief(value: Any) -> str:
    if value is None:
        return "not given"
    if isinstance(value, list):
        return ", ".join(str(v[0]) if isinstance(v, list) and v else str(v) for v in value) or "none"
    return repr(value)


def check_same(d: Path, prior: PackPlan, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse to resume ``d`` with other inputs or options than its plan records, naming the first
    difference (and how many more)."""
    diffs = _differences(prior, command, inputs, options)
    if diffs:
        more = f" (and {len(diffs) - 1} more difference(s))" if len(diffs) > 1 else ""
        raise DataError(f"{d}: cannot resume this pack: {diffs[0]}{more}. Resume it with the inputs and options it "
                        f"started with (see {d / PLAN_NAME}), or pack again with --overwrite")


# -- resuming -------------------------------------------------------------------------------------


@dataclass
class Published:
    """What a pack published before it was stopped: per folder the shards' count, and every planned
    shard it has dealt with (published, or written empty), with what each dropped."""

    count: dict[str, int]
    done: set[int]


def published_so_far(d: Path, planned: Planned, fmt: str) -> Published:
    """Check every published shard against its entry and the plan, and gather what they hold.

    A published shard is never rewritten: one missing, changed since it was published or not what
    the plan puts there is an error (the folder was changed by hand, or the inputs changed in a way
    their digests do not show): pack again with ``--overwrite``.
    """
    by_folder: dict[str, list[int]] = defaultdict(list)
    for j, s in enumerate(planned.shards):
        by_folder[s.folder].append(j)
    out = Published({}, set())
    for folder, shard_ids in by_folder.items():
        where = d / folder
        k_count = published_count(where)
        out.count[folder] = k_count
        if not k_count:
            continue
        index = read_parts(where)
        assert len(index.names) == k_count
        position = {j: n for n, j in enumerate(shard_ids)}
        last = -1
        for k in range(k_count):
            name = fmt % k
            path = where / name

            def refuse(why: str) -> DataError:
                return DataError(f"{path}: published by the pack being resumed, but {why}; a published shard is "
                                 f"never rewritten: pack again with --overwrite")

            if index.names[k] != name:
                raise refuse(f"its entry names {index.names[k]!r}")
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise refuse("it is missing") from None
            why = stale_reason(index, k, st)
            if why is not None:
                raise refuse(f"it changed since ({why})")
            record = read_part_record(where, k)
            j = record.get("plan_shard")
            if type(j) is not int or j not in position or position[j] <= last:
                raise refuse(f"its entry names planned shard {j!r}, not one after the last in {folder or '.'}")
            last = position[j]
            info = index.shard(k)
            planned_keys = [encode_key(planned.uttids[i]) for i in planned.shards[j].items.tolist()]
            planned_frames = dict(zip(planned_keys, planned.frames[planned.shards[j].items].tolist()))
            it = iter(planned_keys)
            if not all(key in it for key in info.keys) or any(planned_frames[key] != f
                                                              for key, f in zip(info.keys, info.frames)):
                raise refuse("its utterances are not the ones the plan puts there (did the features change?)")
            out.done.add(j)
            out.done.update(s for s, _ in _entry_reports(record, where))
    return out


def _entry_reports(record: dict[str, Any], where: Path) -> list[tuple[int, Report]]:
    """(planned shard, what it dropped) of a published entry's shard and of the shards written empty
    just before it."""
    at = str(where / PARTS_DIR)
    skipped = record.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(x, dict) and type(x.get("plan_shard")) is int
                                                 for x in skipped):
        raise DataError(f"{at}: a published shard's entry is damaged (skipped); pack again with --overwrite")
    return [(record["plan_shard"], Report.from_fragment(record.get("report"), where=at)),
            *((x["plan_shard"], Report.from_fragment(x.get("report"), where=at)) for x in skipped)]


def _remove_unpublished(d: Path, planned: Planned, count: dict[str, int], fmt: str) -> None:
    """Shards of a stopped pack that got their final names but were not published (a kill between
    the rename and the entry), and hidden leftovers: they are written again, byte for byte."""
    remove_partial(d)
    for folder in planned.folders:
        where = d / folder
        for p in where.glob(f"{PARTS_DIR}/.tmp-*"):
            shutil.rmtree(p, ignore_errors=True)
        planned_here = sum(1 for s in planned.shards if s.folder == folder)
        for k in range(count.get(folder, 0), planned_here):
            (where / (fmt % k)).unlink(missing_ok=True)


# -- the pack ---------------------------------------------------------------------------------------


def write_order(shards: Sequence[PlannedShard], folders: Sequence[str]) -> list[int]:
    """Shard ids in the order they are written: the folders interleaved by how far through each is,
    each folder's own shards in plan order."""
    seen: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for s in shards:
        total[s.folder] += 1
    rank = {f: n for n, f in enumerate(folders)}
    keyed = []
    for j, s in enumerate(shards):
        keyed.append(((seen[s.folder] + 0.5) / total[s.folder], rank.get(s.folder, 0), j))
        seen[s.folder] += 1
    return [j for *_, j in sorted(keyed)]


def pack_planned(d: Path, plan: Callable[[Report], Planned], report: Report, *, command: str, inputs: dict[str, Any],
                 options: dict[str, Any], prior: PackPlan | None, fmt: str, layout: str, dtype: str, nj: int,
                 progress: bool | None, strict: bool, utt2spk: dict[str, str] | None = None,
                 audio: AudioIndex | None = None) -> Report:
    """Plan (``plan``: reads the headers, drops what cannot be packed into ``report``), write and
    publish every planned shard not yet published, then write the indexes and the report and commit.

    ``prior``: the plan of the stopped pack being resumed (its inputs and options are checked by the
    caller before the headers are read); None for a new pack.  ``audio``: the shards hold audio, the
    index says so (and what the loader computes the features with).
    """
    desc = f"{command}"
    shards_total = 0
    try:
        planned = plan(report)
        record = plan_record(planned, command=command, inputs=inputs, options=options)
        shards_total = record.shards
        if prior is None:
            write_plan(d, record)
            done = Published({f: 0 for f in planned.folders}, set())
        else:
            if record.digest != prior.digest or record.folders != prior.folders:
                raise DataError(f"{d}: cannot resume this pack: the shard plan differs from the one it started with "
                                f"(the features' frame counts, or which utterances can be packed, changed); pack "
                                f"again with --overwrite")
            done = published_so_far(d, planned, fmt)
            _remove_unpublished(d, planned, done.count, fmt)
        tasks = [j for j in write_order(planned.shards, planned.folders) if j not in done.done]
        trailing = _publish(d, planned, tasks, done.count, fmt=fmt, layout=layout, dtype=dtype, nj=nj,
                            progress=progress, desc=desc, utt2spk=utt2spk, audio=audio)
        for r in trailing:
            report.merge(r)
        report = _finish(d, planned, report, fmt=fmt)
    except BaseException as e:
        note = _stopped(d, prior is not None, shards_total)
        if note:
            e.add_note(note)  # the CLI prints it on the error's line
        raise
    print(report.summary(f"{desc}: wrote {d}"))
    if strict and (report.num_dropped or report.num_flagged):
        raise StrictError(f"{desc}: {report.counts()} (strict); see {d / REPORT_NAME}")
    return report


def _publish(d: Path, planned: Planned, tasks: list[int], count: dict[str, int], *, fmt: str, layout: str,
             dtype: str, nj: int, progress: bool | None, desc: str, utt2spk: dict[str, str] | None,
             audio: AudioIndex | None = None) -> list[Report]:
    """Write ``tasks`` (planned shard ids, in writing order) and publish each in turn; the reports
    of shards written empty after a folder's last published one (kept nowhere else) are returned."""
    count = dict(count)
    skipped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    empty_reports: dict[str, list[Report]] = defaultdict(list)
    total = sum(len(planned.shards[j].items) for j in tasks)
    for w in imap_ordered(_write, tasks, nj, desc, progress, init=_open_job, init_args=(planned.job,),
                          done=_close_job, total=total):
        where = d / w.folder
        if w.info is None:
            skipped[w.folder].append({"plan_shard": w.shard, "report": w.report.fragment()})
            empty_reports[w.folder].append(w.report)
            continue
        k = count.get(w.folder, 0)
        final = where / (fmt % k)
        os.replace(where / w.info.name, final)
        try:
            sync(where)  # the shard's name is on disk before its entry says it is there
            st = os.stat(final)
            info = ShardInfo(final.name, w.info.keys, w.info.frames, w.info.text_lens, w.info.sha256, w.info.samples)
            speakers = None if utt2spk is None else given_speakers([info], utt2spk, w.report)
            dims = w.dims if audio is None else audio.num_mel_bins
            entry = FolderIndex.from_shards(layout, dims, dtype, [info], sizes=[st.st_size],
                                            mtimes=[st.st_mtime_ns], speakers=speakers, audio=audio)
            write_part(where, k, entry, {"plan_shard": w.shard, "report": w.report.fragment(),
                                         "skipped": skipped.pop(w.folder, [])})
        except BaseException:
            final.unlink(missing_ok=True)  # named but not published (its entry did not fit): written again
            raise
        empty_reports.pop(w.folder, None)
        count[w.folder] = k + 1
    return [r for reports in empty_reports.values() for r in reports]


def _finish(d: Path, planned: Planned, report: Report, *, fmt: str) -> Report:
    """Every folder's ``index.json`` from its published entries, the report, then the entries go and
    the pack commits.  The entries go only once the report is on disk: a pack killed in between
    resumes from them."""
    summary: dict[str, dict[str, Any]] = {}
    written: list[Path] = []
    folders_with_shards = []
    for folder in planned.folders:
        where = d / folder
        index = read_parts(where) if (where / PARTS_DIR).is_dir() else None
        infos = len(index.names) if index is not None else 0
        for k in range(infos):
            for _, r in _entry_reports(read_part_record(where, k), where):
                report.merge(r)
        if index is not None and infos:
            write_index(where, index)
            written.extend(where / name for name in (*INDEX_FILES, *AUDIO_INDEX_FILES) if (where / name).exists())
            folders_with_shards.append(where)
        frames = index.num_frames if index is not None else 0
        summary[folder or "."] = {"utterances": index.num_utts if index is not None else 0, "frames": frames,
                                  "hours": round(hours(frames), 4), "shards": infos}
    report.groups = summary
    written.append(report.write(d / REPORT_NAME))
    for p in written:
        sync(p)
    for where in folders_with_shards:
        sync(where)
    for folder in planned.folders:
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
    parts = folder / PARTS_DIR
    gone = folder / f"{PARTS_DIR}.done"
    shutil.rmtree(gone, ignore_errors=True)
    if parts.is_dir():
        os.rename(parts, gone)
    shutil.rmtree(gone, ignore_errors=True)


def _stopped(d: Path, resumed: bool, shards_total: int) -> str | None:
    """After an error or Ctrl-C: nothing partial stays; published shards stay for ``--resume`` (a
    new pack that published nothing removes what it wrote, marker and plan too).  What to tell."""
    try:
        remove_partial(d)
        for parts in d.glob(f"**/{PARTS_DIR}/.tmp-*"):
            shutil.rmtree(parts, ignore_errors=True)
        published = sum(published_count(p.parent) for p in [*d.glob(PARTS_DIR), *d.glob(f"*/{PARTS_DIR}")])
    except OSError:
        return None
    if published == 0 and not resumed:
        abandon(d)
        return None
    of = f" of {shards_total:,}" if shards_total else ""
    return (f"the pack stopped with {published:,}{of} shards published in {d}, which are kept (growing=True reads "
            f"them): run the same command with --resume to finish it")


def abandon(d_out: Path) -> None:
    """After a pack that published nothing failed: remove what it wrote, marker and plan last."""
    try:
        remove_partial(d_out)
        for p in [d_out, *(q for q in d_out.iterdir() if q.is_dir())]:
            shutil.rmtree(p / PARTS_DIR, ignore_errors=True)
        (d_out / REPORT_NAME).unlink(missing_ok=True)
        for p in d_out.iterdir():
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    except OSError:
        return
    abandon_marker(d_out)


def resume_complete(d: Path, prior: PackPlan, command: str, inputs: dict[str, Any],
                    options: dict[str, Any]) -> Report | None:
    """A ``--resume`` of a pack that already committed (same inputs and options): its report; of one
    killed after it wrote its report, before the commit: commits it (every shard and index is
    written and synced by then).  None when there is more to do."""
    if os.path.lexists(marker(d)):
        # The report is written after every folder's index.json, and before the entries go.
        if not (d / REPORT_NAME).is_file():
            return None
        check_same(d, prior, command, inputs, options)
        for f in prior.folders:
            drop_parts(d / f)
        sync(d)
        commit(d)
    else:
        check_same(d, prior, command, inputs, options)
    report = Report.read(d / REPORT_NAME)
    print(report.summary(f"{command}: {d} is complete"))
    return report


__all__ = ["Planned", "ShardJob", "Written", "pack_planned", "read_plan", "resume_complete", "check_same",
           "file_digests", "stat_digest", "sink_for", "written"]
