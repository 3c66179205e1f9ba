"""Lhotse's manifests, read with lhotse: ``--from lhotse`` (audio or, for ``pack``, precomputed features)
and ``--from lhotse-shar``.

- A ``CutSet`` manifest (``.jsonl``, ``.jsonl.gz``, ``.json``): each cut is an utterance, its id the
  cut's, its audio the cut's part of its recording (``start``, ``duration``; a part is cut as Kaldi
  cuts a segment: lhotse rounds a time to samples, Kaldi truncates, so a segment's edge may differ
  by a sample), its transcript its supervisions' texts in order, its speaker and language the first
  supervision's.  A ``RecordingSet`` manifest instead: its ``SupervisionSet`` is the file named alike
  (``..._recordings_...`` -> ``..._supervisions_...``, lhotse's recipes' names), and each
  supervision is an utterance of its recording.  Audio sources: a file (as written, from where the
  pack runs, as lhotse opens it) or bytes in the manifest; a command is not run (a manifest is
  input from strangers: ``untrusted.py``), nor a URL fetched: ``unsupported_cut``.
- A Shar directory (``CutSet.to_shar``, ``lhotse shar export``): ``cuts.NNNNNN.jsonl.gz`` with
  ``recording.NNNNNN.tar`` beside, each cut's audio the tar's member named by the cut's id.
- ``pack --from lhotse``: cuts with features (``compute_and_store_features``), each packed as
  ``cut.load_features()`` gives them (lhotse reads every storage type it writes).

Cuts lhotse would transform when loading (speed or volume perturbation, mixes, padding) are not
packed: ``unsupported_cut``, saying why; a resampling transform is fine, the pack resamples.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.format.audio import MAX_MEL_BINS, MAX_RATE, MAX_SAMPLES, MIN_RATE
from wdsprep.pack.driver import Headers, Labels, PackSource
from wdsprep.pack.driver import Item as PackItem
from wdsprep.pack.from_feats import check_one_dimension
from wdsprep.pack.sink import ShardSink
from wdsprep.pack.sources.items import Blob, Imported, Item, TarMember, tar_members
from wdsprep.pack.sources.untrusted import MAX_JSON_BYTES, Bad, item, json_lines, name, open_input, seconds
from wdsprep.prep.kaldi import Entry
from wdsprep.report import Report

_SHAR_INDEX = re.compile(r"\.(\d+)\.(?:jsonl\.gz|jsonl|tar)$")


@dataclass(frozen=True)
class Bytes(Blob):
    """Audio bytes carried in the manifest itself (an ``AudioSource`` of type ``memory``)."""

    key: str  # type: ignore[misc]
    data: bytes

    def read(self) -> bytes:
        return self.data


def _objects(path: str, report: Report) -> Iterator[tuple[int, Any]]:
    """(line, lhotse object) of a manifest's items: JSON lines read a bounded line at a time (or a
    ``.json`` document, read whole up to a bound), each made an object by lhotse; an item lhotse
    cannot make one of is counted as ``bad_line`` (see ``untrusted.py``)."""
    from lhotse.serialization import deserialize_item

    for line, entry in _dicts(path, report):
        try:
            obj = deserialize_item(entry)
        except RecursionError:
            report.drop("bad_line", f"{path}:{line}", f"{path}:{line}: nested deeper than a manifest's item is")
            continue
        except Exception as e:  # lhotse raises TypeError, ValueError, KeyError... for what it cannot read
            report.drop("bad_line", f"{path}:{line}", f"{path}:{line}: not an item lhotse reads "
                                                      f"({type(e).__name__}: {_short(e)})")
            continue
        yield line, obj


def _dicts(path: str, report: Report) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) of a manifest: of JSON lines, each line's; of a JSON list, each item's (numbered)."""
    suffixes = Path(path).suffixes
    if ".jsonl" in suffixes:
        yield from json_lines(path, report, "Lhotse")
        return
    if ".json" not in suffixes:
        raise DataError(f"{path}: give a Lhotse manifest as JSON lines (.jsonl, .jsonl.gz) or JSON (.json)")
    with open_input(path) as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise DataError(f"{path}: more than {MAX_JSON_BYTES:,} bytes of JSON; write it as JSON lines "
                        f"(cuts.to_file('cuts.jsonl.gz')), which are read a line at a time")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path}: not a Lhotse JSON manifest ({type(e).__name__}: {_short(e)})") from None
    if not isinstance(doc, list):
        raise DataError(f"{path}: a JSON {type(doc).__name__}; a Lhotse JSON manifest is a list of items")
    for i, entry in enumerate(doc, 1):
        if isinstance(entry, dict):
            yield i, entry
        else:
            report.drop("bad_line", f"{path}:{i}", f"{path}: item {i} is a JSON {type(entry).__name__}, not an object")


def _short(e: BaseException) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:197] + "..."


def _cuts(path: str, report: Report) -> tuple[list[str], Iterator[tuple[str, int, Any]]]:
    """The manifests read, and (manifest, line, cut) of a CutSet manifest; of a RecordingSet manifest,
    one cut per supervision (lhotse's ``trim_to_supervisions``: the cut takes the supervision's id),
    and each supervision whose recording the set lacks as (manifest, line, the supervision)."""
    from lhotse import Recording, RecordingSet
    from lhotse.cut import Cut

    objects = _objects(path, report)
    first = next(objects, None)
    if first is None:
        return [path], iter(())
    everything = itertools.chain([first], objects)
    if isinstance(first[1], Cut):
        return [path], ((path, line, cut) for line, cut in _only(Cut, "a cut", everything, path, report))
    if not isinstance(first[1], Recording):
        raise DataError(f"{path}: a manifest of {type(first[1]).__name__}s; give a CutSet manifest, or a RecordingSet "
                        f"one with its SupervisionSet beside it")
    recordings: dict[str, Any] = {}
    for line, rec in _only(Recording, "a recording", everything, path, report):
        problem = _recording_problem(rec, f"{path}:{line}")
        if problem is not None:
            report.drop(problem[0], f"{path}:{line}", problem[1])
        elif rec.id in recordings:
            report.drop("bad_line", f"{path}:{line}", f"{path}:{line}: recording {rec.id!r} again")
        else:
            recordings[rec.id] = rec
    sups_path = supervisions_beside(path)
    return [path, sups_path], _supervision_cuts(RecordingSet.from_recordings(recordings.values()),
                                                _supervisions(sups_path, report), sups_path)


def _only(kind: type, what: str, objects: Iterator[tuple[int, Any]], path: str,
          report: Report) -> Iterator[tuple[int, Any]]:
    """The (line, object) of one kind; each other object is a ``bad_line``."""
    for line, obj in objects:
        if isinstance(obj, kind):
            yield line, obj
        else:
            report.drop("bad_line", f"{path}:{line}", f"{path}:{line}: a {type(obj).__name__}, not {what}")


def _supervisions(path: str, report: Report) -> list[tuple[int, Any]]:
    """(line, supervision) of a SupervisionSet manifest whose id and times are usable."""
    from lhotse import SupervisionSegment

    out = []
    for line, sup in _only(SupervisionSegment, "a supervision", _objects(path, report), path, report):
        where = f"{path}:{line}"
        try:
            name(sup.id, "the supervision id", where, "bad_id")
            name(sup.recording_id, "the recording id", where, "bad_line")
            seconds(sup.start, "start", where, required=True)
            seconds(sup.duration, "duration", where, required=True)
        except Bad as e:
            e.count(report, where)
            continue
        out.append((line, sup))
    return out


def _recording_problem(rec: Any, where: str) -> tuple[str, str] | None:
    """(reason, why) a recording's fields are unusable (its id, duration or rate), or None."""
    try:
        name(rec.id, "the recording id", where, "bad_line")
        seconds(rec.duration, "the recording's duration", where, required=True)
    except Bad as e:
        return e.reason, e.why
    rate = rec.sampling_rate
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        return "bad_audio", f"{where}: recording {rec.id!r} has sampling_rate {rate!r}, no speech recording's"
    return None


def _supervision_cuts(recordings: Any, supervisions: list[tuple[int, Any]], where: str
                      ) -> Iterator[tuple[str, int, Any]]:
    from lhotse import CutSet, SupervisionSet

    lines = {}
    for line, sup in supervisions:
        if sup.recording_id in recordings:
            lines[sup.id] = line
        else:
            yield where, line, sup
    kept = SupervisionSet.from_segments([s for _, s in supervisions if s.id in lines])
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=kept).trim_to_supervisions(keep_overlapping=False)
    for cut in cuts:
        yield where, lines.get(cut.id, 0), cut


def supervisions_beside(recordings: str) -> str:
    """The SupervisionSet manifest of a RecordingSet one, by lhotse recipes' names."""
    name = os.path.basename(recordings)
    if "recordings" not in name:
        raise DataError(f"{recordings}: a RecordingSet manifest; its SupervisionSet is found by name "
                        f"(..._recordings_... -> ..._supervisions_...), and this name has no 'recordings': give the "
                        f"cuts (CutSet.from_manifests(...).to_file(...)) instead")
    sups = os.path.join(os.path.dirname(recordings), name.replace("recordings", "supervisions"))
    if not os.path.isfile(sups):
        raise FileNotFoundError(f"{sups}: no such file: the SupervisionSet of {recordings} (lhotse recipes write them "
                                f"side by side)")
    return sups


def read_cuts(path: str | Any) -> Imported:
    """The utterances of a Lhotse manifest (see the module's doc), or of a ``CutSet`` itself."""
    if not isinstance(path, str):
        return _read_cutset(path)
    report = Report()
    items = []
    manifests, cuts = _cuts(path, report)
    for where, line, cut in cuts:
        try:
            if not hasattr(cut, "supervisions"):  # a supervision whose recording the RecordingSet lacks
                raise Bad("missing_file", f"{where}:{line}: recording {cut.recording_id!r} is not in {path}", cut.id)
            items.append(_cut_item(cut, where, line))
        except Bad as e:
            e.count(report, f"{where}:{line}")
    data = [it.audio for it in items if isinstance(it.audio, str)]
    return Imported("lhotse", items, report, files={"manifest": manifests}, data=data)


def _span(cut: Any, where: str, uttid: str) -> tuple[float, float]:
    """A cut's start and duration in seconds; :class:`Bad`, naming the cut, where one is missing or not a number."""
    try:
        start = seconds(cut.start, "start", where, required=True)
        duration = seconds(cut.duration, "duration", where, required=True)
    except Bad as e:
        e.uttid = uttid
        raise
    assert start is not None and duration is not None
    return start, duration


# How a CutSet given in memory is named in the report: IN_MEMORY:N for its Nth cut.
IN_MEMORY = "CutSet"


def _read_cutset(cuts: Any) -> Imported:
    """The utterances of a ``CutSet`` in memory, each cut as :func:`read_cuts` takes one of its manifest
    (the same items in the same order, so the same shards); a resume is held to the cuts' digest."""
    import hashlib

    report = Report()
    items = []
    digest = hashlib.sha256()
    for line, cut in enumerate(cuts, 1):
        digest.update(json.dumps(cut.to_dict(), sort_keys=True, default=repr).encode() + b"\n")
        try:
            items.append(_cut_item(cut, IN_MEMORY, line))
        except Bad as e:
            e.count(report, f"{IN_MEMORY}:{line}")
        except AttributeError as e:  # an item of the set that is no cut lhotse makes
            report.drop("bad_line", f"{IN_MEMORY}:{line}", f"{IN_MEMORY}:{line}: not a cut ({_short(e)})")
    data = [it.audio for it in items if isinstance(it.audio, str)]
    return Imported("lhotse", items, report, data=data, given={"cuts_sha256": digest.hexdigest()})


def _labels_of(cut: Any, where: str, uttid: str) -> tuple[str, Any, Any]:
    """(transcript, speaker, language) of a cut: its supervisions' texts in order, the first's speaker
    and language (checked by ``untrusted.item``); :class:`Bad` for a text or time of no use."""
    sups = list(cut.supervisions or ())
    for s in sups:
        if isinstance(s.start, bool) or not isinstance(s.start, (int, float)) or not math.isfinite(s.start):
            raise Bad("bad_segment", f"{where}: supervision {s.id!r} starts at {s.start!r}", uttid)
        if s.text is not None and not isinstance(s.text, str):
            raise Bad("bad_text", f"{where}: supervision {s.id!r} has a text of type {type(s.text).__name__}, not a "
                                  f"string", uttid)
    sups.sort(key=lambda s: s.start)
    text = " ".join(s.text.strip() for s in sups if s.text and s.text.strip())
    first = sups[0] if sups else None
    return text, None if first is None else first.speaker, None if first is None else first.language


def _unsupported(cut: Any) -> str | None:
    """Why lhotse would not hand this cut's audio over as a part of one recording, or None."""
    kind = type(cut).__name__
    if kind in ("MixedCut", "PaddingCut", "MultiCut"):
        return f"a {kind} (audio lhotse mixes, pads or stacks from several sources); pack the cuts it is made of"
    if getattr(cut, "recording", None) is None:
        return "a cut without a recording (features only? pack them with wdsprep pack --from lhotse)"
    transforms = [t for t in (cut.recording.transforms or []) if _transform_name(t) != "Resample"]
    if transforms:
        names = ", ".join(sorted({_transform_name(t) for t in transforms}))
        return (f"its recording has transforms lhotse applies when loading ({names}); pack the cuts before "
                f"perturbing them and let the loader augment (docs/audio.md)")
    if isinstance(cut.channel, bool) or not isinstance(cut.channel, int):
        return f"channels {cut.channel!r}: a cut of several channels"
    return None


def _transform_name(t: Any) -> str:
    return str(t.get("name", "?")) if isinstance(t, dict) else type(t).__name__


def _cut_item(cut: Any, path: str, line: int) -> Item:
    """The item of a cut; :class:`Bad` saying why it cannot be packed."""
    where = f"{path}:{line}"
    uttid = name(cut.id, "the cut id", where, "bad_id")
    why = _unsupported(cut)
    if why is not None:
        raise Bad("unsupported_cut", f"{where}: {why}", uttid)
    rec = cut.recording
    problem = _recording_problem(rec, where)
    if problem is not None:
        raise Bad(*problem, uttid)
    start, duration = _span(cut, where, uttid)
    source = next((s for s in rec.sources if isinstance(s.channels, list) and cut.channel in s.channels), None)
    if source is None:
        raise Bad("unsupported_cut", f"{where}: no audio source of recording {rec.id!r} has channel {cut.channel}",
                  uttid)
    audio: str | Blob
    if source.type == "file" and isinstance(source.source, str):
        audio = source.source
    elif source.type == "memory" and isinstance(source.source, bytes):
        audio = Bytes(f"{where}:{rec.id}", source.source)
    elif source.type == "command":
        raise Bad("unsupported_cut", f"{where}: recording {rec.id!r} is made by a command; wdsprep runs no command a "
                                     f"manifest names: run it yourself into audio files (or pass it as a wav.scp "
                                     f"pipe: pack-audio --wav-scp), then pack", uttid)
    else:
        raise Bad("unsupported_cut", f"{where}: recording {rec.id!r} is read from a {source.type!r} source; download "
                                     f"it (or export the cuts with their audio: lhotse shar export) first", uttid)
    text, speaker, language = _labels_of(cut, where, uttid)
    whole = start == 0 and abs(duration - rec.duration) < 0.5 / rec.sampling_rate
    return item(path, line, uttid=uttid, audio=audio, text_value=text, speaker=speaker, language=language,
                start=None if whole else start, end=None if whole else start + duration,
                channel=source.channels.index(cut.channel))


def read_shar(path: str) -> Imported:
    """The utterances of a Lhotse Shar directory: its cuts and their ``recording`` members."""
    folder = Path(path)
    cut_files = {_shard_index(p): p for p in folder.glob("cuts.*.jsonl*")}
    tars = {_shard_index(p): p for p in folder.glob("recording.*.tar")}
    if not cut_files:
        raise FileNotFoundError(f"{path}: no cuts.NNNNNN.jsonl.gz there; give a Lhotse Shar directory")
    if not tars:
        raise DataError(f"{path}: the Shar directory has no recording field (recording.NNNNNN.tar); export the audio "
                        f"with it: cuts.to_shar(..., fields={{'recording': 'flac'}})")
    from lhotse.cut import Cut

    report = Report()
    items = []
    for k in sorted(cut_files):
        cuts_path = str(cut_files[k])
        members: dict[str, TarMember] = {}
        if k in tars:
            for name, m in tar_members(str(tars[k])).items():
                stem, _, ext = name.rpartition(".")
                if ext != "json":
                    members[stem] = m
        for line, cut in _only(Cut, "a cut", _objects(cuts_path, report), cuts_path, report):
            where = f"{cuts_path}:{line}"
            try:
                items.append(_shar_item(cut, cuts_path, line, members, tars.get(k, folder / f"recording.{k:06d}.tar")))
            except Bad as e:
                e.count(report, where)
    return Imported("lhotse-shar", items, report, files={"cuts": [str(cut_files[k]) for k in sorted(cut_files)]},
                    data=[str(tars[k]) for k in sorted(tars)])


def _shar_item(cut: Any, path: str, line: int, members: dict[str, TarMember], tar: Path | str) -> Item:
    """The item of a Shar cut: its audio the member its id names; :class:`Bad` saying why not."""
    where = f"{path}:{line}"
    uttid = name(cut.id, "the cut id", where, "bad_id")
    member = members.get(uttid)
    if member is None:
        raise Bad("missing_file", f"{where}: no member {uttid}.* in {tar}", uttid)
    start, duration = _span(cut, where, uttid)
    text, speaker, language = _labels_of(cut, where, uttid)
    return item(path, line, uttid=uttid, audio=member, text_value=text, speaker=speaker, language=language,
                start=start, end=None if start == 0 else start + duration)


def _shard_index(p: Path) -> int:
    m = _SHAR_INDEX.search(p.name)
    if m is None:
        raise DataError(f"{p}: not a Shar file name (FIELD.NNNNNN.jsonl.gz or FIELD.NNNNNN.tar)")
    return int(m.group(1))


# -- pack --from lhotse: precomputed features ---------------------------------------------------------------


class FeatureCutsSource(PackSource):
    """Cuts with features (``pack --from lhotse``): frames and dims from the manifest, features from
    ``cut.load_features()`` in the workers."""

    command = "pack"
    missing = ("missing_features", "in no cut")

    def __init__(self, path: str, dims: int | None) -> None:
        self.dims = dims
        self.report = report = Report()
        self.cuts: list[tuple[str, int, Any]] = []  # (manifest, line, cut)
        seen: set[str] = set()
        manifests, cuts = _cuts(path, report)
        labels: dict[str, Item] = {}
        for where, line, cut in cuts:
            try:
                if not hasattr(cut, "supervisions"):
                    raise Bad("missing_file", f"{where}:{line}: recording {cut.recording_id!r} is not in {path}",
                              cut.id)
                it = _feature_cut(cut, where, line)
            except Bad as e:
                e.count(report, f"{where}:{line}")
                continue
            if it.uttid in seen:
                report.drop("duplicate_id", it.uttid, f"{where}:{line}: the id of an earlier cut too")
            elif not it.text:
                report.drop("empty_text", it.uttid, f"{where}:{line}: no transcript")
            else:
                self.cuts.append((where, line, cut))
                labels[it.uttid] = it
            seen.add(it.uttid)
        self.known = set(labels)
        self.files = {"manifest": manifests}
        self.data = ("features", sorted({_feature_file(c.features) for _, _, c in self.cuts}))
        self.labels = Labels({u: Entry(u, it.text, it.file, it.line) for u, it in labels.items()},
                             {u: it.speaker for u, it in labels.items() if it.speaker is not None} or None,
                             {u: it.language for u, it in labels.items() if it.language is not None} or None)

    def entries(self) -> list[tuple[str, str, Any]]:
        return [(cut.id, f"{where}:{line}", cut) for where, line, cut in self.cuts]

    def headers(self, items: list[PackItem], report: Report, *, nj: int, progress: bool | None) -> Headers:
        """Each cut's frames and dims, from the manifest (features of several dims fail the pack, as
        ``pack`` fails, unless ``dims`` picks one)."""
        frames = np.array([cut.num_frames for _, cut, _ in items], np.int64)
        cols = np.array([cut.num_features for _, cut, _ in items], np.int64)
        if self.dims is None:
            check_one_dimension([u for u, _, _ in items], cols)
        unpackable = {i: ("other_dims", f"{c} feature dims; only {self.dims}-dim features are packed (dims)")
                      for i, c in enumerate(cols.tolist()) if self.dims is not None and c != self.dims}
        return Headers(frames, unpackable, CutFeaturesJob(items, cols))


def _feature_cut(cut: Any, path: str, line: int) -> Item:
    """A cut with features as an item (its labels, no audio); :class:`Bad` saying why it is of no use."""
    where = f"{path}:{line}"
    uttid = name(cut.id, "the cut id", where, "bad_id")
    if not getattr(cut, "has_features", False):
        raise Bad("no_features", f"{where}: the cut has no features; compute them (cuts.compute_and_store_features) "
                                 f"or pack its audio with wdsprep pack-audio --from lhotse", uttid)
    for what, value, most in (("num_frames", cut.num_frames, MAX_SAMPLES), ("num_features", cut.num_features,
                                                                           MAX_MEL_BINS)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise Bad("bad_features", f"{where}: {what} {value!r} is not a whole number in [1, {most:,}]", uttid)
    if not isinstance(cut.features.storage_path, str) or not isinstance(cut.features.storage_key, str):
        raise Bad("bad_features", f"{where}: the features' storage_path and storage_key must be strings", uttid)
    text, speaker, language = _labels_of(cut, where, uttid)
    return item(path, line, uttid=uttid, audio="", text_value=text, speaker=speaker, language=language)


def _feature_file(features: Any) -> str:
    """The file a cut's features are in: a chunked archive, or one file in a folder of them."""
    path = features.storage_path
    return path if os.path.isfile(path) else os.path.join(path, features.storage_key)


class CutFeaturesJob:
    """Writes cuts' features, in a worker: ``cut.load_features()``, checked against the manifest's shape."""

    def __init__(self, items: Sequence[PackItem], cols: np.ndarray) -> None:
        self.items, self.cols = items, cols

    def narrowed(self, items: Sequence[int]) -> CutFeaturesJob:
        return CutFeaturesJob([self.items[i] for i in items], self.cols[np.asarray(items, np.int64)])

    def open(self) -> None:
        import lhotse  # noqa: F401  (in the worker: fails here, not per cut)

    def close(self) -> None:
        pass

    def add(self, sink: ShardSink, item: int, frames: int) -> None:
        uttid, cut, text = self.items[item]
        try:
            feats = cut.load_features()
        except FileNotFoundError as e:
            sink.drop("missing_file", uttid, f"features of cut {uttid}: {e}")
            return
        except Exception as e:  # lhotse's readers raise what their storage library raises
            sink.drop("bad_features", uttid, f"features of cut {uttid} cannot be read: {type(e).__name__}: {e}")
            return
        if not isinstance(feats, np.ndarray) or feats.shape != (frames, int(self.cols[item])):
            shape = getattr(feats, "shape", type(feats).__name__)
            sink.drop("bad_features", uttid, f"features of cut {uttid}: shape {shape}, the manifest says "
                                             f"({frames}, {int(self.cols[item])})")
            return
        sink.add(uttid, np.asarray(feats, np.float32), text)

