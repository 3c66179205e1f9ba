"""The features stage: what a reader makes of a planned batch's rows before they are filtered and collated.

An audio shard's row is decoded, played at the speed factor the plan drew for it, reverberated and
noised as its draws say, and turned into Kaldi fbank with the options its folder's index records
(or those the loader was given); SpecAugment then masks these features and, for feature shards,
the features read from the shard.  Every draw is the batch's corpus's (its seed and the corpus
epoch of the batch id) for the row's place in that corpus (``augment.py``), so the result is the
same whichever reader of whichever rank makes it.  It runs in the reader: a DataLoader worker with
``num_workers > 0``.  numpy only, unless the fbank backend asked for is torchaudio's.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from wdsprep.format.audio import FileAudio
from wdsprep.format.index import AudioIndex
from wdsprep.format.keys import uttid_for_message
from wdsprep.format.shardfile import FileFeats, ShardError, ShardFile
from wdsprep.loading.augment import (
    Augment,
    Draws,
    add_noise,
    add_reverb,
    spec_augment,
    speed_prefix,
    speed_resample,
    utterance_draws,
)
from wdsprep.loading.corpus import Corpus
from wdsprep.loading.plan import BatchId
from wdsprep.loading.records import AUDIO, IN_MEMORY, Records
from wdsprep.loading.stats import WorkerTally
from wdsprep.prep.audio import AudioReadError, load_recording, resample
from wdsprep.prep.fbank import Fbank, FbankOptions

Rows = tuple[BatchId, Records]
# Settings of the loader's fbank= that may differ from the index's (the audio's rate may not).
FBANK_KEYS = ("num_mel_bins", "dither", "backend")


def fbank_options(audio: AudioIndex, override: Mapping[str, Any] | None = None) -> FbankOptions:
    """What the features of audio shards are computed with: their index's fbank options, with
    ``override``'s (``num_mel_bins``, ``dither``, ``backend``) in their place.  A dither drawn by a
    backend's own unseedable generator is refused: the features would differ run to run."""
    given = dict(override or {})
    unknown = sorted(set(given) - set(FBANK_KEYS))
    if unknown:
        raise ValueError(f"fbank has {unknown}; the loader's fbank options are {list(FBANK_KEYS)} (the audio stays "
                         f"at its {audio.sample_rate} Hz)")
    opts = FbankOptions(num_mel_bins=given.get("num_mel_bins", audio.num_mel_bins), sample_rate=audio.sample_rate,
                        dither=given.get("dither", audio.dither), backend=given.get("backend", audio.backend))
    if opts.dither and opts.backend != "numpy":
        raise ValueError(f"fbank dither {opts.dither} with backend {opts.backend!r}: its dither comes from a "
                         f"generator that cannot be seeded, so batches would differ run to run; use backend "
                         f"'numpy' (seeded per utterance) or dither 0")
    return opts


def bank_files(folder: str) -> list[Path]:
    """The audio files of a noise or impulse-response folder (what soundfile reads), sorted; an
    error naming the folder when there are none."""
    import soundfile as sf

    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"augment: {folder} is not a folder of recordings")
    exts = {f".{k.lower()}" for k in sf.available_formats()}
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in exts and p.is_file())
    if not files:
        raise ValueError(f"augment: {folder} holds no audio file soundfile reads ({', '.join(sorted(exts)[:6])}, ...)")
    return files


def bank_listing(folder: str) -> list[tuple[str, int]]:
    """(name, bytes) of a bank's files: what the loader's fingerprint holds of it."""
    return [(p.name, p.stat().st_size) for p in bank_files(folder)]


def load_bank(folder: str, sample_rate: int, what: str) -> list[np.ndarray]:
    """Every recording of ``folder``, channel 0, at ``sample_rate`` (int16-range float32, as speech is
    read); an error naming a file that cannot be read or is silent."""
    out = []
    for p in bank_files(folder):
        try:
            data, rate = load_recording(str(p))
        except AudioReadError as e:
            raise ValueError(f"augment {what}: {e}") from None
        wave = resample(np.ascontiguousarray(data[:, 0]), rate, sample_rate)
        if not np.any(wave):
            raise ValueError(f"augment {what}: {p} is silent; remove it from {folder}")
        out.append(wave.astype(np.float32, copy=False))
    return out


@dataclass(frozen=True)
class FeatureOptions:
    """What the features stage does: ``fbank`` for audio shards (None: feature shards), and the
    augmentation (its speed part is the plan's, applied as drawn)."""

    fbank: FbankOptions | None = None
    augment: Augment | None = None

    @property
    def needed(self) -> bool:
        """Whether the stage has anything to do (feature shards without augmentation: nothing)."""
        return self.fbank is not None or (self.augment is not None and self.augment.features_part() is not None)

    def to_json(self) -> dict[str, Any]:
        """For the loader's fingerprint: every setting the features depend on, and the banks' files."""
        a = self.augment
        banks = {name: bank_listing(part.dir) for name, part in (("noise", a and a.noise), ("reverb", a and a.reverb))
                 if part is not None}
        return {"fbank": None if self.fbank is None else {f.name: getattr(self.fbank, f.name)
                                                           for f in fields(self.fbank) if f.name != "channel"},
                "augment": None if a is None else a.to_json(), "banks": banks}


class FeatureMaker:
    """The features stage of one reader process.  The noise and impulse-response recordings are
    loaded by :meth:`load` in the main process (a folder that cannot be used fails there, naming
    the file, and forked DataLoader workers share those pages); the fbank on first use."""

    def __init__(self, opts: FeatureOptions, unit: Callable[[int], Corpus], *, on_error: str = "warn") -> None:
        self.opts = opts
        self.unit = unit  # a batch id's corpus -> its Corpus unit (seed, first row, speed draws)
        self.on_error = on_error
        aug = opts.augment
        self.speed = aug.speed if aug is not None else None
        self.noise = aug.noise if aug is not None else None
        self.reverb = aug.reverb if aug is not None else None
        self.spec = aug.specaugment if aug is not None else None
        self.ndraws = utterance_draws(aug) if aug is not None and aug.features_part() is not None else 0
        self._fbank: Fbank | None = None
        self._banks: dict[str, list[np.ndarray]] = {}
        self._draws: OrderedDict[tuple[int, int], Draws] = OrderedDict()

    def __call__(self, batches: Iterator[Rows], counts: WorkerTally) -> Iterator[Rows]:
        for bid, rows in batches:
            yield bid, self.batch(bid, rows, counts)

    def load(self) -> FeatureMaker:
        """Load the noise and impulse-response recordings now (ValueError naming a file that cannot be used)."""
        for what, part in (("noise", self.noise), ("reverb", self.reverb)):
            if part is not None:
                self._bank(what, part.dir)
        return self

    def _bank(self, what: str, folder: str) -> list[np.ndarray]:
        if what not in self._banks:
            assert self.opts.fbank is not None
            self._banks[what] = load_bank(folder, self.opts.fbank.sample_rate, what)
        return self._banks[what]

    def draws(self, seed: int, epoch: int) -> Draws:
        """The per-utterance draws of a corpus epoch (the last few kept)."""
        key = (seed, epoch)
        if key not in self._draws:
            self._draws[key] = Draws(seed, epoch)
            while len(self._draws) > 4:
                self._draws.popitem(last=False)
        return self._draws[key]

    def batch(self, bid: BatchId, rows: Records, counts: WorkerTally) -> Records:
        """The batch's rows with their features in memory (audio rows computed, masks applied)."""
        if not len(rows):
            return rows
        self.load()  # outside the per-utterance handling: a folder that cannot be read is no utterance's fault
        unit = self.unit(bid[0])
        epoch = bid[1]
        local = rows.rows - unit.row0
        choices = unit.speeds(epoch)
        planned = unit.frames(epoch)[local]
        draws = self.draws(unit.seed, epoch) if self.ndraws or (self.opts.fbank and self.opts.fbank.dither) else None
        out = Records(rows.num.copy(), rows.obj.copy())
        keep = np.ones(len(rows), bool)
        uttids = out.uttids
        for i in range(len(rows)):
            row = int(local[i])
            u = draws.uniforms(row, self.ndraws) if draws is not None and self.ndraws else None
            try:
                if out.offsets[i] == AUDIO:
                    feats, factor = self._from_audio(out.sources[i], row, u, choices, draws)
                    if feats.shape[0] != planned[i]:
                        raise ValueError(f"its features have {feats.shape[0]} frames, the plan {planned[i]}: the "
                                         f"audio does not decode to the samples its header says")
                    if factor != 1.0:
                        uttids[i] = speed_prefix(factor) + uttids[i]
                else:
                    feats = _read(out, i)
            except (ValueError, ShardError) as e:
                keep[i] = False
                self._bad(out, i, e, counts)
                continue
            if self.spec is not None:
                feats = spec_augment(feats, self.spec, u)
            out.sources[i] = feats
            out.num[i, :4] = (IN_MEMORY, feats.shape[0], feats.shape[1], feats.dtype.itemsize)
        return out if keep.all() else out[keep]

    def _from_audio(self, audio: FileAudio, row: int, u: np.ndarray | None, choices: np.ndarray | None,
                    draws: Draws | None) -> tuple[np.ndarray, float]:
        """An audio row's fbank and the speed factor it was played at."""
        wave, factor = self.waveform(audio, row, u, choices)
        fb = self.opts.fbank
        assert fb is not None
        if self._fbank is None:
            self._fbank = Fbank(fb)
        return self._fbank(wave, draws.dither(row) if fb.dither and draws is not None else None), factor

    def waveform(self, audio: FileAudio, row: int, u: np.ndarray | None,
                 choices: np.ndarray | None) -> tuple[np.ndarray, float]:
        """The waveform an audio row's features are computed from: decoded, at its speed factor,
        reverberated and noised as its uniforms ``u`` say; and the factor.  ``row``: its place in
        its corpus; ``choices``: the corpus epoch's speed factors."""
        fb = self.opts.fbank
        assert fb is not None
        if audio.header.sample_rate != fb.sample_rate:
            raise ValueError(f"audio at {audio.header.sample_rate} Hz in a shard set at {fb.sample_rate} Hz")
        wave = audio.pcm().astype(np.float32)
        factor = 1.0
        if self.speed is not None and choices is not None:
            k = int(choices[row])
            factor = self.speed.factors[k]
            wave = speed_resample(wave, self.speed, k)
        if self.reverb is not None:
            assert u is not None
            wave = add_reverb(wave, self._bank("reverb", self.reverb.dir), self.reverb, u)
        if self.noise is not None:
            assert u is not None
            wave, _ = add_noise(wave, self._bank("noise", self.noise.dir), self.noise, u)
        return wave, factor

    def _bad(self, rows: Records, i: int, e: Exception, counts: WorkerTally) -> None:
        """An utterance whose features cannot be made: raised, or left out of its batch with a warning, counted."""
        src = rows.sources[i]
        file = src.file if isinstance(src, (FileAudio, FileFeats)) else src
        where = file.url if isinstance(file, ShardFile) else "an in-memory shard"
        msg = f"shard {where}: utterance {uttid_for_message(rows.uttids[i])!r}: {e}"
        if self.on_error == "raise":
            raise ShardError(f"{msg}. Re-create the shard (wdsprep pack) or remove it from the shard list") from e
        warnings.warn(f"{msg}; left out of its batch (counted as bad_audio)", RuntimeWarning, stacklevel=3)
        counts.dropped["bad_audio"] += 1


def _read(rows: Records, i: int) -> np.ndarray:
    """Row ``i``'s features as a float32 array in memory (read from its shard when still there)."""
    src, offset = rows.sources[i], int(rows.offsets[i])
    if offset == IN_MEMORY:
        return np.asarray(src, np.float32)
    dtype = np.dtype("<f4") if rows.itemsizes[i] == 4 else np.dtype("<f2")
    feats = FileFeats(src, offset, (int(rows.frames[i]), int(rows.dims[i])), dtype, rows.uttids[i]).read()
    return feats.astype(np.float32, copy=False)


def with_fbank(audio: AudioIndex | None, override: Mapping[str, Any] | None) -> FbankOptions | None:
    """The fbank options a shard set's features are computed with (None: it holds features;
    ``override`` then must be None)."""
    if audio is None:
        if override:
            raise ValueError("fbank options apply to audio shards; these hold features computed at pack time")
        return None
    return fbank_options(audio, override)

