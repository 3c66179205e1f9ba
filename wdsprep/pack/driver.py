"""One pack, whatever it reads: the steps ``pack`` and ``pack-audio`` share (:func:`run_pack`).

A pack plans every shard before it writes one, so that the shards can be published one by one
as they are written, and a stopped pack resumes to the bytes an uninterrupted one gives:

1. the options are checked (:class:`~wdsprep.pack.options.PackOptions`) and the source reads its
   inputs (:class:`PackSource`), then the transcripts, speakers and languages (:class:`Labels`: from
   Kaldi files, :func:`kaldi_labels`, or from the manifest the source read) and the fields
   (:mod:`wdsprep.pack.fields`) are read;
2. the output folder is locked and made ready (:mod:`wdsprep.pack.output`); a resume is held
   against the inputs' digests and the options' record, and a complete pack only reported;
3. each utterance is paired with its transcript and its fields (one left without either is reported);
4. the source's headers pass gives every utterance's frames without reading its data, each goes to
   its length group's folder (:func:`~wdsprep.pack.groups.assign_folders`), and the shards are
   planned (:mod:`wdsprep.pack.plan`);
5. the plan is recorded, workers write the shards (:mod:`wdsprep.pack.sink`, with the source's
   job), each is published as it is done, and the pack finishes and commits; a pack that stops
   keeps what it published, for ``--resume``.

A pack spread over machines (:class:`~wdsprep.pack.options.Spread`) stops after step 5's plan
(``plan_only``), or writes, stages and publishes only its part's shards (``part``), and is
committed by a last ``resume`` run, which publishes what the parts staged: step 5 in pieces.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from concurrent.futures import Executor
from contextlib import ExitStack, closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

import numpy as np

from wdsprep.errors import DataError, LostError, StrictError
from wdsprep.format.keys import LANG
from wdsprep.pack.bucket import open_output
from wdsprep.pack.fields import ItemFields
from wdsprep.pack.groups import assign_folders
from wdsprep.pack.options import Engine, OutputOptions, PackOptions, Part, PathOrPaths, Spread, as_list
from wdsprep.pack.output import (
    REPORT_NAME,
    LockedOutput,
    Publisher,
    check_same,
    file_digests,
    folder_shards,
    plan_record,
    stat_digest,
)
from wdsprep.pack.plan import ShardPlan, plan_shards, write_order
from wdsprep.pack.sink import ShardJob, ShardWork, WrittenShard, write_shards
from wdsprep.prep.kaldi import Entry, read_text, read_utt2spk
from wdsprep.prep.options import JobOptions
from wdsprep.prep.parallel import dask_executor
from wdsprep.report import Report

# One utterance to pack: (uttid, what the source's job reads of it, its transcript).
Item = tuple[str, Any, str]


@dataclass
class Labels:
    """What goes beside each utterance's data: its transcript (with the line it was read from), its
    speaker and its language, and the files they were read from (hashed into the resume record; a
    manifest a source read is among the source's files already)."""

    texts: dict[str, Entry]
    speakers: dict[str, str] | None = None  # None: each id's own speaker (the key rule)
    languages: dict[str, str] | None = None
    files: dict[str, list[str]] = field(default_factory=dict)


def kaldi_labels(f_labels: PathOrPaths, utt2spk: PathOrPaths | None = None) -> Labels:
    """The labels of a Kaldi data dir: ``text`` file(s), and ``utt2spk`` file(s) if given."""
    texts = as_list(f_labels)
    spk_files = [] if utt2spk is None else as_list(utt2spk)
    return Labels(read_text(texts), None if utt2spk is None else read_utt2spk(spk_files),
                  files={"text": texts, "utt2spk": spk_files})


@dataclass
class Headers:
    """What a source's headers pass found, before anything is written."""

    frames: np.ndarray  # int64 per item; < 0: not packed, the reason reported already
    unpackable: Mapping[int, tuple[str, str]]  # item -> (reason, detail): found unpackable, not reported yet
    job: ShardJob  # writes the items into shards, in a worker


class PackSource(ABC):
    """Where a pack's utterances come from: made by the pack's public function, which reads the
    inputs there (a bad input fails before the output folder is touched).

    A source provides what the shared steps cannot know:

    - ``command``: the pack's name in messages and in its plan (``pack``, ``pack-audio``);
    - ``report``: what reading the inputs dropped already;
    - :meth:`entries`: ``(uttid, where, data)`` per utterance, in input order (``where``: the
      line that names it; ``data``: what its job reads, e.g. an ark's rxfilename);
    - ``known``: every id the inputs name, packable or not, and ``missing``: the reason and the
      words for a transcript whose id is none of them;
    - ``files`` and ``data``: what the pack is made from, which a resume must find unchanged (small
      files hashed, large ones by size and time);
    - :meth:`headers`: each item's frames, read cheaply before any shard is written, and the job
      that writes the items (:class:`~wdsprep.pack.sink.ShardJob`: open, add one utterance to a
      shard's sink, close);
    - ``fields`` (optional): the values its inputs carry per utterance, ``{name: {uttid: value}}``,
      e.g. a manifest's columns (its languages come as ``labels.languages``: the field ``lang``).  The shared
      steps do the rest, as for the ``--utt2lang`` and ``--field`` tables: an utterance without a
      value is reported (``missing_lang``, ``missing_field``), each value becomes a member
      ``KEY.NAME`` of its utterance (the sink writes them with whatever the job adds), the language
      and the pack's ``index_fields`` become columns of the index, and the resume record names
      them.  The job needs nothing for it.

    A new kind of input (a Lhotse or NeMo manifest, shards to re-pack) is one of these, its headers
    pass and its job.
    """

    command: str
    report: Report
    known: Collection[str]
    missing: tuple[str, str]  # (reason, words after "in FILE:LINE, ")
    files: dict[str, list[str]]  # input name -> files, hashed (sha256)
    data: tuple[str, list[str]]  # (name, files) too large to hash: digested by size and modification time
    given: dict[str, Any] = {}  # how the inputs are read (an import's kind and columns): held like the files
    labels: Labels | None = None  # the transcripts, speakers and languages, when the inputs carry them (a manifest)
    fields: Mapping[str, Mapping[str, str]] = {}  # name -> uttid -> value, from the source's own inputs

    @abstractmethod
    def entries(self) -> list[tuple[str, str, Any]]:
        """``(uttid, where, data)`` per utterance, in input order."""

    @abstractmethod
    def headers(self, items: list[Item], report: Report, *, nj: int, progress: bool | None) -> Headers:
        """The headers pass over ``items`` (those with a transcript): what it drops goes to ``report``."""


def run_pack(source: PackSource, labels: Labels, d_out: str | os.PathLike, options: PackOptions, job: JobOptions,
             output: OutputOptions, *, fields: Mapping[str, list[str]] | None = None,
             spread: Spread = Spread(), engine: Engine = Engine()) -> Report:
    """Pack ``source``'s utterances with their ``labels`` into ``d_out``; the arguments are
    :func:`wdsprep.pack_data`'s.  ``fields``: each field's tables by name
    (:func:`wdsprep.pack.fields.field_files`), besides the source's own ``fields``; the labels'
    languages are the field ``lang``.  ``spread``: this run's share of a pack spread over machines;
    ``engine``: who writes the shards (None of it: ``job.nj`` local workers)."""
    nj, strict, progress, max_lost = job.nj, job.strict, job.progress, output.max_lost
    own = {**source.fields, **({LANG: labels.languages} if labels.languages else {})}
    item_fields = ItemFields(fields or {}, own)
    options = replace(options, fields=item_fields.names)
    item_fields.check_indexed(options.index_fields)
    with open_output(d_out, output.overwrite, output.resume, part=spread.part) as out:
        name, data = source.data
        inputs = {**{k: file_digests(paths) for k, paths in {**source.files, **labels.files}.items()},
                  name: stat_digest(data), **({"read": source.given} if source.given else {}),
                  **{k: file_digests(paths) for k, paths in item_fields.inputs().items()}}
        record = options.record()
        if spread.part is not None:
            assert out.prior is not None
            check_same(out.shown, out.prior, source.command, inputs, record)
            report = out.committed_report()
            if report is not None:
                print(report.summary(f"{source.command}: {out.shown} is complete (committed): part {spread.part} "
                                     f"has nothing to do"))
                return report
        elif out.prior is not None:
            done = out.resumed_report(source.command, inputs, record)
            if done is not None:
                check_lost(done, source.command, out.shown, max_lost)
                return done
        report = source.report
        items, values = _labelled(source, labels.texts, item_fields, report)
        with ExitStack() as stack:
            executor = engine.executor if engine.dask is None else stack.enter_context(dask_executor(engine.dask))
            return _pack(out, source, items, report, options, inputs, record, speakers=labels.speakers, nj=nj,
                         strict=strict, progress=progress, values=values,
                         indexed=item_fields.indexed(options.index_fields), spread=spread,
                         max_lost=max_lost, executor=executor)


def _plan_only(out: LockedOutput, plan: ShardPlan, pack_plan: Any, report: Report, command: str) -> Report:
    """``--plan-only``: the plan recorded (or, resumed, found to be the one recorded), nothing written."""
    if out.prior is None:
        out.record_plan(plan, pack_plan, "")
    else:
        out.check_plan(pack_plan)
    print(report.summary(f"{command}: planned {pack_plan.shards:,} shards in {out.shown} ({out.shown}/pack_plan.json); "
                         f"now run the same command with --part I/N for each I in 0..N-1 (any order, any machine), "
                         f"then once with --resume to commit"))
    return report


def _pack_part(out: LockedOutput, plan: ShardPlan, pack_plan: Any, part: Part, report: Report, options: PackOptions,
               work: ShardWork, publisher: Publisher, command: str, *, nj: int, progress: bool | None,
               executor: Executor | None) -> Report:
    """``--part I/N``: write this part's planned shards not yet staged or published (a part goes on
    from what it did before it was stopped), staging each and publishing what comes next in every
    folder; nothing is committed.  The report: what the shards it wrote dropped."""
    out.check_plan(pack_plan)
    by_folder = folder_shards(plan)
    mine = [j for j in write_order(plan) if part.mine(j)]
    with out.publishing():  # the entries are read whole: no part publishes meanwhile
        done = out.published_done(plan, options.fmt)
    ready = out.staged(plan, [j for j in mine if j not in done])
    tasks = [j for j in mine if j not in done and j not in ready]
    out.remove_part_partial(plan, tasks)
    # Closed on an error too: its workers stop before what they left half-written is removed.
    with closing(write_shards(work, tasks, nj=nj, desc=f"{command} part {part}", progress=progress,
                              executor=executor)) as shards:
        for w in shards:
            report.merge(w.report)
            out.stage(w)
            with out.publishing():
                publisher.advance(plan, w.folder, by_folder[w.folder])
    print(report.summary(f"{command}: part {part} wrote {len(tasks):,} of its {len(mine):,} shards into {out.shown} "
                         f"({len(mine) - len(tasks):,} were there already); once every part is done, run the same "
                         f"command without --part, with --resume, to commit"))
    return report


def _labelled(source: PackSource, labels: dict[str, Entry], fields: ItemFields,
              report: Report) -> tuple[list[Item], list[dict[str, str]] | None]:
    """The source's utterances that have a transcript and every field, with their fields' values
    (None: the pack has no fields); each without one, and each transcript of no utterance, is reported."""
    reason, words = source.missing
    for uttid in labels.keys() - source.known:
        report.drop(reason, uttid, f"in {labels[uttid].where}, {words}")
    items: list[Item] = []
    values: list[dict[str, str]] = []
    for uttid, where, data in source.entries():
        label = labels.get(uttid)
        if label is None:
            report.drop("missing_label", uttid, f"in {where}, in no text file")
            continue
        got, missing = fields.of(uttid)
        if missing is not None:
            report.drop(missing[0], uttid, f"{missing[1]} ({where})")
            continue
        items.append((uttid, data, label.value))
        if got is not None:
            values.append(got)
    return items, (values if fields.names else None)


def _pack(out: LockedOutput, source: PackSource, items: list[Item], report: Report, options: PackOptions,
          inputs: dict[str, Any], record: dict[str, Any], *, speakers: dict[str, str] | None, nj: int,
          strict: bool, progress: bool | None, values: list[dict[str, str]] | None,
          indexed: dict[str, dict[str, str]], spread: Spread, max_lost: float,
          executor: Executor | None) -> Report:
    """Plan, record the plan, write and publish every planned shard not published yet, finish and
    commit; on an error or Ctrl-C, keep what was published (:func:`~wdsprep.pack.output.stopped`).
    ``strict``: raise :class:`StrictError` (after the report is written) if anything was dropped or
    flagged; :func:`check_lost` then holds the pack to ``max_lost``.
    ``spread``: stop once the plan is recorded, or write one part (:func:`_pack_part`)."""
    d, command = out.d, source.command
    shown = out.shown
    shards_total = 0
    part: tuple[Part, ShardPlan] | None = None
    written: Iterator[WrittenShard] | None = None
    resumable = True
    try:
        headers = source.headers(items, report, nj=nj, progress=progress)
        uttids = [uttid for uttid, _, _ in items]
        folders = assign_folders(uttids, headers.frames, options.groups, report, headers.unpackable)
        plan = plan_shards(uttids, folders, headers.frames, options.folders, utts_per_shard=options.utts_per_shard,
                           shuffle=options.shuffle, seed=options.seed)
        pack_plan = plan_record(plan, command=command, inputs=inputs, options=record)
        shards_total = pack_plan.shards
        work = ShardWork(d, options.layout, options.dtype, options.audio_rate, plan.shards, plan.frames, headers.job,
                         values, bitrate=options.audio_bitrate, stage_url=out.stage_url)
        if spread.plan_only:
            return _plan_only(out, plan, pack_plan, report, command)
        if spread.part is not None:
            part = (spread.part, plan)
            return _pack_part(out, plan, pack_plan, spread.part, report, options, work,
                              out.publisher({}, options, speakers, indexed), command, nj=nj, progress=progress,
                              executor=executor)
        try:
            done = out.record_plan(plan, pack_plan, options.fmt)
        except DataError:
            resumable = False  # the resume itself was refused: "run it with --resume" would send the user round
            raise
        tasks = [j for j in write_order(plan) if j not in done.done]
        ready = out.staged(plan, tasks)  # what parts of a spread pack wrote: published here, in turn
        written = write_shards(work, [j for j in tasks if j not in ready], nj=nj, desc=command, progress=progress,
                               executor=executor)
        if ready and len(ready) < len(tasks):
            print(f"{command}: {len(tasks) - len(ready):,} of the {shards_total:,} planned shards were not written by "
                  f"a part (--part) and are not published: writing them here")
        publisher = out.publisher(done.count, options, speakers, indexed)
        for j in tasks:
            w = ready.pop(j) if j in ready else next(written)
            assert w.shard == j
            publisher.publish(w)
        assert next(written, None) is None  # run to its end: the workers are closed now
        for r in publisher.unlisted_reports():
            report.merge(r)
        out.drop_staged(plan.folders)
        report = out.finish(plan.folders, report, languages=indexed.get(LANG))
    except BaseException as e:
        if written is not None:
            written.close()  # its workers stop before what they left half-written is removed
        note = out.stopped(shards_total, part)
        if note and resumable:
            e.add_note(note)  # the CLI prints it on the error's line
        raise
    print(report.summary(f"{command}: wrote {shown}"))
    if strict and (report.num_dropped or report.num_flagged):
        raise StrictError(f"{command}: {report.counts()} (strict); see {shown}/{REPORT_NAME}")
    check_lost(report, command, shown, max_lost)
    return report


# Reasons that are the options' choice, not a loss: utterances outside the length groups asked for.
LEFT_OUT = frozenset({"outside_groups"})


def check_lost(report: Report, command: str, d: str | Path, max_lost: float) -> None:
    """:class:`LostError` when the pack wrote no utterance, or lost more than ``max_lost`` of them
    (a share): a pack run from the wrong folder, or with the wrong transcripts, must not pass as done."""
    written = sum(int(g.get("utterances", 0)) for g in report.groups.values())
    lost = sum(len(items) for reason, items in report.dropped.items() if reason not in LEFT_OUT)
    if written and lost <= max_lost * (written + lost):
        return
    top = sorted(report.dropped.items(), key=lambda kv: -len(kv[1]))[:3]
    lost = lost if written else report.num_dropped
    reasons = ", ".join(f"{reason} {len(items):,} (e.g. {_example(items[0])})" for reason, items in top)
    head = (f"wrote none of its {lost:,} utterances" if not written
            else f"lost {lost:,} of {written + lost:,} utterances ({lost / (written + lost):.1%}), more than "
                 f"max_lost={max_lost:g} allows")
    raise LostError(f"{command}: {head}: {reasons}; every one is named in {d}/{REPORT_NAME}"
                    + ("" if not written else "; if that is expected, raise --max-lost"))


def _example(item: dict) -> str:
    return f"{item['uttid']}: {item['why']}" if item.get("why") else item["uttid"]
