"""The utterances a manifest names, and the one pack source every manifest kind shares.

A reader of one kind (``from_lhotse``, ``from_nemo``, ``from_hf``, ``from_wenet``) gives an
:class:`Imported`: its :class:`Item` s (id, where the audio is, transcript, speaker, language), what
it could not take and why, and the files a resume is held against.  :class:`ItemsSource` packs them
as ``pack-audio`` packs a ``wav.scp`` and ``segments``: the headers pass reads each recording's
header (a file soundfile reads, or bytes inside a bigger file: a tar member, an Arrow cell,
:class:`Blob`), and the job reads each utterance's samples, a segment cut as Kaldi's
``extract-segments`` cuts one, at the pack's rate.

What is not packed is counted by reason: ``missing_file`` (no such file or tar member),
``bad_audio`` (unreadable), ``bad_segment`` (an offset past the end, a segment too short or
reaching too far), ``too_short``, ``empty_text``, ``duplicate_id``, and what the readers refuse of
a manifest's lines and values (``untrusted.py``); an utterance whose audio lasts other than its
manifest says is packed and flagged ``duration_differs``.
"""

from __future__ import annotations

import io
import os
import tarfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from wdsprep.pack.driver import Headers, Labels
from wdsprep.pack.driver import Item as PackItem
from wdsprep.pack.from_audio import AudioJob, AudioSource
from wdsprep.pack.options import AudioOptions
from wdsprep.prep.audio import (
    INT16_SCALE,
    AudioProblem,
    AudioReadError,
    MissingAudio,
    Recording,
    Utterance,
    channel_problem,
    channels,
    check_rate,
    cut_segment,
    probe_recording,
    resample,
    too_short,
)
from wdsprep.prep.kaldi import Entry
from wdsprep.prep.options import FbankOptions
from wdsprep.report import Report

# A manifest's duration may be rounded; beyond this the audio is not what the manifest describes.
DURATION_TOLERANCE = 0.1  # seconds


class Blob(ABC):
    """An audio file's bytes inside a bigger file (a tar member, a cell of an Arrow table)."""

    key: str  # names it in messages, and among a pack's recordings

    @abstractmethod
    def read(self) -> bytes:
        """Its bytes; :class:`~wdsprep.prep.audio.MissingAudio` when it is not there."""


@dataclass(frozen=True)
class TarMember(Blob):
    """A member of a tar, read at its offset (NeMo's tarred datasets, WeNet's shards, Lhotse Shar)."""

    tar: str
    offset: int
    size: int
    name: str

    @property
    def key(self) -> str:  # type: ignore[override]
        return f"{self.tar}[{self.name}]"

    def read(self) -> bytes:
        try:
            with open(self.tar, "rb") as f:
                f.seek(self.offset)
                data = f.read(self.size)
        except FileNotFoundError:
            raise MissingAudio(f"{self.tar}: no such file") from None
        if len(data) != self.size:
            raise AudioReadError(f"{self.key}: the tar ends inside the member ({self.tar} changed since it was read?)")
        return data


def tar_members(path: str) -> dict[str, TarMember]:
    """The regular members of a tar by name (a later member of the same name wins, as tar extracts)."""
    out: dict[str, TarMember] = {}
    try:
        with tarfile.open(path, "r:") as t:
            for m in t:
                if m.isfile():
                    out[m.name] = TarMember(path, m.offset_data, m.size, m.name)
    except tarfile.TarError as e:
        raise ValueError(f"{path}: not a readable tar ({e}); is it one of the dataset's tars?") from None
    return out


@dataclass(frozen=True)
class Item:
    """One utterance a manifest names."""

    uttid: str
    file: str  # the manifest (or table) it is named in, and the line (or row, 1-based) there
    line: int
    audio: str | Blob  # a file soundfile reads, or its bytes inside a bigger file
    text: str
    speaker: str | None = None
    language: str | None = None
    start: float = 0.0  # seconds into the audio
    end: float = -1.0  # seconds; -1: to the end of the audio
    channel: int | None = None
    duration: float | None = None  # what the manifest says it lasts (checked against the audio)
    fields: dict[str, str] = field(default_factory=dict)  # the fields its line has (name -> value)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def recording(self) -> str:
        return self.audio if isinstance(self.audio, str) else self.audio.key


@dataclass
class Imported:
    """What a reader of one kind made of its input."""

    kind: str
    items: list[Item]
    report: Report = field(default_factory=Report)  # what could not even become an item
    files: dict[str, list[str]] = field(default_factory=dict)  # manifests etc., hashed for a resume
    data: list[str] = field(default_factory=list)  # audio files and tars, digested by size and time
    given: dict[str, Any] = field(default_factory=dict)  # how the input was read (columns): a resume holds it


class ItemsSource(AudioSource):
    """A manifest's utterances, packed from their audio (see the module's doc)."""

    command = "pack-audio"

    def __init__(self, imported: Imported, audio: AudioOptions) -> None:
        self.audio, self.kind = audio, imported.kind
        self.report = report = imported.report
        kept: dict[str, Item] = {}
        for it in imported.items:
            if it.uttid in kept:
                report.drop("duplicate_id", it.uttid, f"{it.where}: the id of {kept[it.uttid].where} too; give each "
                                                      f"utterance an id of its own")
            elif not it.text.strip():
                report.drop("empty_text", it.uttid, f"{it.where}: no transcript")
            else:
                kept[it.uttid] = it
        self.items = list(kept.values())
        self.blobs = {it.audio.key: it.audio for it in self.items if isinstance(it.audio, Blob)}
        self.known = set(kept)
        self.missing = ("missing_audio", "in no manifest")
        self.files = imported.files
        self.data = ("audio", list(dict.fromkeys(imported.data)))
        self.probe = ImportProbe(self.blobs)  # type: ignore[assignment]
        self.given = {"from": imported.kind, **imported.given}
        speakers = {it.uttid: it.speaker for it in self.items if it.speaker is not None}
        languages = {it.uttid: it.language for it in self.items if it.language is not None}
        # A field a line leaves out is left out of its utterance (optional per line, as NeMo reads keys).
        self.fields = {n: {it.uttid: it.fields[n] for it in self.items if n in it.fields}
                       for n in sorted({n for it in self.items for n in it.fields})}
        self.labels = Labels({it.uttid: Entry(it.uttid, it.text, it.file, it.line) for it in self.items},
                             speakers or None, languages or None)

    def entries(self) -> list[tuple[str, str, Any]]:
        return [(it.uttid, it.where, Utterance(it.uttid, it.recording, it.recording, it.where, it.start, it.end,
                                               it.channel)) for it in self.items]

    def headers(self, items: list[PackItem], report: Report, *, nj: int, progress: bool | None) -> Headers:
        """The recordings' headers (see the module's doc); an utterance lasting other than its manifest
        says is flagged."""
        headers = super().headers(items, report, nj=nj, progress=progress)
        said = {it.uttid: it.duration for it in self.items if it.duration is not None}
        for (uttid, _, _), frames in zip(items, headers.frames.tolist()):
            if frames > 0 and uttid in said and abs(frames * 0.01 - said[uttid]) > DURATION_TOLERANCE:
                report.note("duration_differs", uttid)
        return headers

    def job(self, items: list[PackItem], recordings: dict[str, Recording], fbank: FbankOptions) -> AudioJob:
        return ImportJob(items, recordings, fbank, store_audio=self.audio.stores_audio, blobs=self.blobs)


class ImportProbe:
    """A recording's header: a file's (soundfile's ``info``), or a blob's from its bytes."""

    def __init__(self, blobs: dict[str, Blob]) -> None:
        self.blobs = blobs

    def __call__(self, recording: str) -> Recording:
        blob = self.blobs.get(recording)
        if blob is None:
            if not os.path.isfile(recording):
                raise MissingAudio(f"{recording!r}: no such file")
            return probe_recording(recording)
        import soundfile as sf

        try:
            info = sf.info(io.BytesIO(blob.read()))
        except AudioReadError:
            raise
        except Exception as e:  # soundfile raises LibsndfileError, RuntimeError, TypeError... for bad data
            raise AudioReadError(f"{blob.key} is not readable audio: {type(e).__name__}: {e}") from None
        if info.frames <= 0:
            raise AudioReadError(f"{blob.key} has no samples")
        return Recording(int(info.frames), int(info.samplerate), int(info.channels), False)


class ImportJob(AudioJob):
    """Writes a manifest's utterances: a file's as ``pack-audio`` reads a ``wav.scp`` entry, a blob's
    decoded from its bytes (the last one kept: a blob's segments come together)."""

    def __init__(self, items: list[PackItem], recordings: dict[str, Recording], fbank: FbankOptions, *,
                 store_audio: bool, blobs: dict[str, Blob]) -> None:
        super().__init__(items, recordings, fbank, store_audio=store_audio)
        self.blobs = blobs
        self._last: tuple[str, int | None, np.ndarray | AudioProblem] | None = None

    def narrowed(self, items: Sequence[int]) -> ImportJob:
        job = super().narrowed(items)
        assert isinstance(job, ImportJob)
        job.blobs = {u.rxfile: self.blobs[u.rxfile] for _, u, _ in job.items if u.rxfile in self.blobs}
        return job

    def waveform(self, u: Utterance) -> np.ndarray | AudioProblem:
        blob = self.blobs.get(u.rxfile)
        if blob is None:
            return super().waveform(u)
        ch = self.opts.channel if u.channel is None else u.channel
        if self._last is None or self._last[:2] != (u.rxfile, ch):
            self._last = (u.rxfile, ch, self._decode(blob, u, ch))
        whole = self._last[2]
        if isinstance(whole, AudioProblem):
            return whole
        piece = cut_segment(u, whole, self.opts.sample_rate)
        if isinstance(piece, AudioProblem):
            return piece
        assert self.fbank is not None
        window = self.fbank.window_samples
        return too_short(len(piece), self.opts.sample_rate, window) if len(piece) < window else piece

    def _decode(self, blob: Blob, u: Utterance, ch: int | None) -> np.ndarray | AudioProblem:
        """The blob's channel ``ch`` (None: every channel, mixed for features: ``prep.audio.channels``)
        at the pack's rate, in Kaldi's int16 range."""
        import soundfile as sf

        try:
            data, rate = sf.read(io.BytesIO(blob.read()), dtype="float32", always_2d=True)
        except AudioReadError as e:
            return AudioProblem(e.reason, f"recording {u.recid!r}: {e}")
        except Exception as e:
            return AudioProblem("bad_audio", f"recording {u.recid!r} is not readable audio: {type(e).__name__}: {e}")
        problem = channel_problem(u, ch, data.shape[1])
        if problem is not None:
            return problem
        try:
            check_rate(int(rate), f"recording {u.recid!r}")
        except AudioReadError as e:
            return AudioProblem(e.reason, str(e))
        data *= INT16_SCALE
        return resample(channels(data, ch, mix=not self.store_audio), int(rate), self.opts.sample_rate)
