"""Lhotse's manifests, read with lhotse: ``--from lhotse`` (audio or, for ``pack``, precomputed features)
and ``--from lhotse-shar``.

- A ``CutSet`` manifest (``.jsonl``, ``.jsonl.gz``, ``.json``): each cut is an utterance, its id the
  cut's, its audio the cut's part of its recording (``start``, ``duration``; a part is cut as Kaldi
  cuts a segment: lhotse rounds a time to samples, Kaldi truncates, so a segment's edge may differ
  by a sample), its transcript its supervisions' texts in order, its speaker and language the first
  supervision's.  A ``RecordingSet`` manifest instead: its ``SupervisionSet`` is the file named alike
  (``..._recordings_...`` -> ``..._supervisions_...``, lhotse's recipes' names), and each
  supervision is an utterance of its recording.  Audio sources: a file (as written, from where the
  pack runs, as lhotse opens it), a command (run, as a ``wav.scp`` pipe), or bytes in the manifest.
- A Shar directory (``CutSet.to_shar``, ``lhotse shar export``): ``cuts.NNNNNN.jsonl.gz`` with
  ``recording.NNNNNN.tar`` beside, each cut's audio the tar's member named by the cut's id.
- ``pack --from lhotse``: cuts with features (``compute_and_store_features``), each packed as
  ``cut.load_features()`` gives them (lhotse reads every storage type it writes).

Cuts lhotse would transform when loading (speed or volume perturbation, mixes, padding) are not
packed: ``unsupported_cut``, saying why; a resampling transform is fine, the pack resamples.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.pack.driver import Headers, Labels, PackSource
from wdsprep.pack.driver import Item as PackItem
from wdsprep.pack.from_feats import check_one_dimension
from wdsprep.pack.sink import ShardSink
from wdsprep.pack.sources.items import Blob, Imported, Item, TarMember, tar_members
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


def _manifest(path: str) -> Any:
    import lhotse

    try:
        return lhotse.load_manifest_lazy(path) or lhotse.load_manifest(path)
    except Exception as e:  # lhotse raises ValueError, KeyError, JSONDecodeError... for what it cannot read
        raise DataError(f"{path}: not a Lhotse manifest lhotse can read ({type(e).__name__}: {e})") from None


def _cuts(path: str) -> tuple[list[str], Iterator[tuple[str, int, Any]]]:
    """The manifests read, and (manifest, line, cut) of a CutSet manifest; of a RecordingSet manifest,
    one cut per supervision (lhotse's ``trim_to_supervisions``: the cut takes the supervision's id),
    and each supervision whose recording the set lacks as (manifest, line, the supervision)."""
    from lhotse import CutSet, RecordingSet, SupervisionSet

    manifest = _manifest(path)
    if isinstance(manifest, CutSet):
        return [path], ((path, line, cut) for line, cut in enumerate(manifest, 1))
    if not isinstance(manifest, RecordingSet):
        raise DataError(f"{path}: a {type(manifest).__name__}; give a CutSet manifest, or a RecordingSet one with its "
                        f"SupervisionSet beside it")
    sups_path = supervisions_beside(path)
    supervisions = _manifest(sups_path)
    if not isinstance(supervisions, SupervisionSet):
        raise DataError(f"{sups_path}: a {type(supervisions).__name__}, not the SupervisionSet of {path}")
    return [path, sups_path], _supervision_cuts(manifest.to_eager(), supervisions, sups_path)


def _supervision_cuts(recordings: Any, supervisions: Any, where: str) -> Iterator[tuple[str, int, Any]]:
    from lhotse import CutSet, SupervisionSet

    lines = {}
    for line, sup in enumerate(supervisions, 1):
        if sup.recording_id in recordings:
            lines[sup.id] = line
        else:
            yield where, line, sup
    kept = SupervisionSet.from_segments([s for s in supervisions if s.id in lines])
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


def read_cuts(path: str) -> Imported:
    """The utterances of a Lhotse manifest (see the module's doc)."""
    report = Report()
    items = []
    manifests, cuts = _cuts(path)
    for where, line, cut in cuts:
        if not hasattr(cut, "supervisions"):  # a supervision whose recording the RecordingSet lacks
            report.drop("missing_file", cut.id, f"{where}:{line}: recording {cut.recording_id!r} is not in {path}")
            continue
        made = _cut_item(cut, where, line)
        if isinstance(made, Item):
            items.append(made)
        else:
            report.drop(made[0], cut.id, made[1])
    data = [it.audio for it in items if isinstance(it.audio, str) and not it.audio.endswith("|")]
    return Imported("lhotse", items, report, files={"manifest": manifests}, data=data)


def _labels_of(cut: Any) -> tuple[str, str | None, str | None]:
    """(transcript, speaker, language) of a cut: its supervisions' texts in order, the first's speaker and language."""
    sups = sorted(cut.supervisions, key=lambda s: s.start)
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
    if not isinstance(cut.channel, int):
        return f"channels {cut.channel}: a cut of several channels"
    return None


def _transform_name(t: Any) -> str:
    return t.get("name", "?") if isinstance(t, dict) else type(t).__name__


def _cut_item(cut: Any, path: str, line: int) -> Item | tuple[str, str]:
    """The item of a cut, or (reason, why) it cannot be packed."""
    why = _unsupported(cut)
    if why is not None:
        return "unsupported_cut", f"{path}:{line}: {why}"
    rec = cut.recording
    source = next((s for s in rec.sources if cut.channel in s.channels), None)
    if source is None:
        return "unsupported_cut", f"{path}:{line}: no audio source of recording {rec.id!r} has channel {cut.channel}"
    audio: str | Blob
    if source.type == "file":
        audio = source.source
    elif source.type == "command":
        audio = f"{source.source} |"  # a pipe, as a wav.scp writes one
    elif source.type == "memory":
        audio = Bytes(f"{path}:{line}:{rec.id}", source.source)
    else:
        return "unsupported_cut", (f"{path}:{line}: recording {rec.id!r} is read from a {source.type} source; "
                                   f"download it (or export the cuts with their audio: lhotse shar export) first")
    text, speaker, language = _labels_of(cut)
    whole = cut.start == 0 and abs(cut.duration - rec.duration) < 0.5 / rec.sampling_rate
    return Item(cut.id, path, line, audio, text, speaker=speaker, language=language,
                start=0.0 if whole else cut.start, end=-1.0 if whole else cut.start + cut.duration,
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
        for line, cut in enumerate(_manifest(cuts_path), 1):
            text, speaker, language = _labels_of(cut)
            member = members.get(cut.id)
            if member is None:
                tar = tars.get(k, folder / f"recording.{k:06d}.tar")
                report.drop("missing_file", cut.id, f"{cuts_path}:{line}: no member {cut.id}.* in {tar}")
                continue
            items.append(Item(cut.id, cuts_path, line, member, text, speaker=speaker, language=language,
                              start=cut.start, end=-1.0 if cut.start == 0 else cut.start + cut.duration))
    return Imported("lhotse-shar", items, report, files={"cuts": [str(cut_files[k]) for k in sorted(cut_files)]},
                    data=[str(tars[k]) for k in sorted(tars)])


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
        manifests, cuts = _cuts(path)
        for where, line, cut in cuts:
            if not hasattr(cut, "supervisions"):
                report.drop("missing_file", cut.id, f"{where}:{line}: recording {cut.recording_id!r} is not in {path}")
                continue
            if cut.id in seen:
                report.drop("duplicate_id", cut.id, f"{where}:{line}: the id of an earlier cut too")
                continue
            seen.add(cut.id)
            if not getattr(cut, "has_features", False):
                report.drop("no_features", cut.id, f"{where}:{line}: the cut has no features; compute them "
                                                   f"(cuts.compute_and_store_features) or pack its audio with "
                                                   f"wdsprep pack-audio --from lhotse")
            elif not _labels_of(cut)[0]:
                report.drop("empty_text", cut.id, f"{where}:{line}: no transcript")
            else:
                self.cuts.append((where, line, cut))
        self.known = {c.id for _, _, c in self.cuts}
        self.files = {"manifest": manifests}
        self.data = ("features", sorted({_feature_file(c.features) for _, _, c in self.cuts}))
        texts, speakers, languages = {}, {}, {}
        for where, line, cut in self.cuts:
            text, speaker, language = _labels_of(cut)
            texts[cut.id] = Entry(cut.id, text, where, line)
            if speaker is not None:
                speakers[cut.id] = speaker
            if language is not None:
                languages[cut.id] = language
        self.labels = Labels(texts, speakers or None, languages or None)

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


def _feature_file(features: Any) -> str:
    """The file a cut's features are in: a chunked archive, or one file in a folder of them."""
    path = features.storage_path
    return path if os.path.isfile(path) else os.path.join(path, features.storage_key)


class CutFeaturesJob:
    """Writes cuts' features, in a worker: ``cut.load_features()``, checked against the manifest's shape."""

    def __init__(self, items: Sequence[PackItem], cols: np.ndarray) -> None:
        self.items, self.cols = items, cols

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

