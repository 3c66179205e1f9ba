"""The features stage: what a reader makes of a planned batch's rows before they are filtered and collated.

An audio shard's row is decoded, played at the speed factor the plan drew for it, reverberated and
noised as its draws say, and turned into Kaldi fbank with the options its folder's index records
(or those the loader was given); SpecAugment then masks these features and, for feature shards,
the features read from the shard.  Every draw is the row's corpus's (its seed and the corpus
epoch the row was planned in) for the row's place in that corpus (``augment.py``), so the result is the
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

from wdsprep.files import file_sha256
from wdsprep.format.audio import FileAudio
from wdsprep.format.keys import uttid_for_message
from wdsprep.format.records import AUDIO, IN_MEMORY, Records
from wdsprep.format.shardfile import FileFeats, ShardError, ShardFile
from wdsprep.plan.augment import NO_UNIFORMS, Augment, Draw, Draws, Effect
from wdsprep.plan.corpus import Corpus
from wdsprep.plan.stats import WorkerTally
from wdsprep.plan.streams import BatchId
from wdsprep.prep.audio import AudioReadError, downmix, load_recording, resample
from wdsprep.prep.fbank import Fbank, FbankOptions
from wdsprep.units import fbank_frames

Rows = tuple[BatchId, Records]
# The longest utterance the reader decodes: a 210 KB FLAC may hold 70 minutes, whose waveform and
# fbank take ~90 MB a minute; a longer one is left out of its batch, counted (bad_audio).
MAX_DECODE_SECONDS = 20 * 60
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


# SHA-256 of bank files by their identity (path, size, mtime, inode): a fingerprint taken again
# (every state_dict) reads nothing; a file rewritten in place has a new mtime and is read again.
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def bank_listing(folder: str) -> list[tuple[str, int, str]]:
    """(name, bytes, SHA-256) of a bank's files: what the loader's fingerprint holds of it.  By
    content: a file rewritten in place with its size kept changes the noise every draw adds, so a
    resume must see it; a copy of the folder (new times, same bytes) resumes."""
    out = []
    for p in bank_files(folder):
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if key not in _DIGESTS:
            _DIGESTS[key] = file_sha256(p)
        out.append((p.name, st.st_size, _DIGESTS[key]))
    return out


def load_bank(folder: str, sample_rate: int, what: str) -> list[np.ndarray]:
    """Every recording of ``folder``, channel 0, at ``sample_rate`` (int16-range float32, as speech is
    read); an error naming a file that cannot be read or is silent."""
    out = []
    for p in bank_files(folder):
        try:
            data, rate = load_recording(str(p))
        except AudioReadError as e:
            raise ValueError(f"augment {what}: {e}") from None
        if not np.isfinite(data[:, 0]).all():  # it would make every utterance it is drawn for NaN, each dropped
            raise ValueError(f"augment {what}: {p} holds NaN or Inf samples; remove it from {folder}")
        wave = resample(np.ascontiguousarray(data[:, 0]), rate, sample_rate)
        if not np.isfinite(wave).all():
            raise ValueError(f"augment {what}: {p} holds samples too large to use (Inf once resampled); remove it "
                             f"from {folder}")
        if not np.any(wave):
            raise ValueError(f"augment {what}: {p} is silent; remove it from {folder}")
        out.append(wave.astype(np.float32, copy=False))
    return out


@dataclass(frozen=True)
class FeatureOptions:
    """What the features stage does: ``fbank`` for audio shards (None: feature shards), and the
    augmentation (its speed effect is the plan's, applied as drawn); ``augments``: each named
    corpus's, where corpora augment differently (``transforms.py``)."""

    fbank: FbankOptions | None = None
    augment: Augment | None = None
    augments: tuple[Augment | None, ...] | None = None
    waveform: bool = False  # audio rows stay waveforms (features="waveform"): no fbank, the collate pads them

    @property
    def each(self) -> tuple[Augment | None, ...]:
        """The augmentation of each named corpus (one for all when ``augments`` is None)."""
        return self.augments if self.augments is not None else (self.augment,)

    @property
    def needed(self) -> bool:
        """Whether the stage has anything to do (feature shards without augmentation: nothing)."""
        return self.fbank is not None or any(a is not None and a.feature_effects() is not None for a in self.each)

    def to_json(self) -> dict[str, Any]:
        """For the loader's fingerprint: every setting the features depend on, and the banks' files."""
        a = self.augment
        banks = {p.name: bank_listing(p.bank) for p in (a.effects if a is not None else ()) if p.bank is not None}
        doc = {"fbank": None if self.fbank is None else {f.name: getattr(self.fbank, f.name)
                                                          for f in fields(self.fbank) if f.name != "channel"},
               "augment": None if a is None else a.to_json(), "banks": banks}
        if self.waveform:
            doc["waveform"] = True
        if self.augments is not None:
            doc["corpora"] = [None if x is None else {"augment": x.to_json(), "banks": {
                p.name: bank_listing(p.bank) for p in x.effects if p.bank is not None}} for x in self.augments]
        return doc


class _Chain:
    """One augmentation as the reader applies it: the effects on the waveform and on the features,
    in order, and where each effect's uniforms sit in a row's draws."""

    def __init__(self, augment: Augment | None) -> None:
        aug = augment or Augment()
        self.effects = aug.effects
        self.on_wave, self.on_features = aug.chain(on_audio=True), aug.chain(on_audio=False)
        self.layout = aug.layout()
        self.reads = any(s.stop > s.start for s in self.layout.values())  # whether any effect reads uniforms


class FeatureMaker:
    """The features stage of one reader process.  The noise and impulse-response recordings are
    loaded by :meth:`load` in the main process (a folder that cannot be used fails there, naming
    the file, and forked DataLoader workers share those pages); the fbank on first use."""

    def __init__(self, opts: FeatureOptions, unit: Callable[[int], Corpus], *, on_error: str = "warn") -> None:
        self.opts = opts
        self.unit = unit  # a batch id's corpus -> its Corpus unit (seed, first row, speed draws)
        self.on_error = on_error
        self.chains = [_Chain(a) for a in opts.each]  # per named corpus (one for all)
        first = self.chains[0]
        self.effects, self.on_wave, self.on_features = first.effects, first.on_wave, first.on_features
        self.layout, self.reads = first.layout, first.reads  # where each effect's uniforms sit in a row's draws
        self._fbank: Fbank | None = None
        self._banks: dict[str, list[np.ndarray]] = {}
        self._draws: OrderedDict[tuple[int, int], Draws] = OrderedDict()

    def __call__(self, batches: Iterator[Rows], counts: WorkerTally) -> Iterator[Rows]:
        for bid, rows in batches:
            yield bid, self.batch(bid, rows, counts)

    def load(self) -> FeatureMaker:
        """Load the effects' recordings now (ValueError naming a file that cannot be used)."""
        for chain in self.chains:
            for effect in chain.effects:
                self._bank(effect)
        return self

    def _bank(self, effect: Effect) -> list[np.ndarray]:
        """The recordings of ``effect``'s folder (none when it has no folder)."""
        if effect.bank is None:
            return []
        if effect.bank not in self._banks:  # by folder: two corpora may draw noise from two
            assert self.opts.fbank is not None
            self._banks[effect.bank] = load_bank(effect.bank, self.opts.fbank.sample_rate, effect.name)
        return self._banks[effect.bank]

    def draws(self, seed: int, epoch: int) -> Draws:
        """The per-utterance draws of a corpus epoch (the last few kept)."""
        key = (seed, epoch)
        if key not in self._draws:
            self._draws[key] = Draws(seed, epoch)
            while len(self._draws) > 64:  # a batch of a mixture of utterances draws from many
                self._draws.popitem(last=False)
        return self._draws[key]

    def batch(self, bid: BatchId, rows: Records, counts: WorkerTally) -> Records:
        """The batch's rows with their features in memory (audio rows computed, masks applied)."""
        if not len(rows):
            return rows
        self.load()  # outside the per-utterance handling: a folder that cannot be read is no utterance's fault
        out = Records(rows.num.copy(), rows.obj.copy())
        keep = np.ones(len(rows), bool)
        uttids = out.uttids
        # Each row as its corpus planned it in its corpus epoch (a batch of a mixture of utterances
        # holds several): its place in the corpus, speed factor, planned frames and draws.
        corpora, epochs = rows.corpora, rows.epochs
        local = np.empty(len(rows), np.int64)
        for c, e in {(int(c), int(e)) for c, e in zip(corpora.tolist(), epochs.tolist())}:
            mine = (corpora == c) & (epochs == e)
            local[mine] = self.unit(c).local(rows.rows[mine])
        for i in range(len(rows)):
            unit, epoch, row = self.unit(int(corpora[i])), int(epochs[i]), int(local[i])
            chain = self.chains[unit.parent if len(self.chains) > 1 else 0]
            choices = unit.speeds(epoch)
            planned = unit.frames(epoch)[row]
            dithers = self.opts.fbank is not None and self.opts.fbank.dither
            draws = self.draws(unit.seed, epoch) if chain.reads or dithers else None
            u = draws.read(row, chain.layout) if draws is not None and chain.reads else {}
            try:
                if out.offsets[i] == AUDIO and self.opts.waveform:
                    wave, prefix = self.waveform(out.sources[i], row, u, choices, chain)
                    frames = int(fbank_frames(len(wave), self.opts.fbank.sample_rate))
                    if frames != planned:
                        raise ValueError(f"its waveform gives {frames} frames, the plan {planned}: the audio "
                                         f"does not decode to the samples its header says")
                    uttids[i] = prefix + uttids[i]
                    # A 1-D row of dims 0: the collate pads it into batch.audio (feats stay [B, T, 0]).
                    out.sources[i] = np.ascontiguousarray(wave, np.float32)
                    out.num[i, :4] = (IN_MEMORY, frames, 0, 4)
                    continue
                if out.offsets[i] == AUDIO:
                    feats, prefix = self._from_audio(out.sources[i], row, u, choices, draws, chain)
                    if feats.shape[0] != planned:
                        raise ValueError(f"its features have {feats.shape[0]} frames, the plan {planned}: the "
                                         f"audio does not decode to the samples its header says")
                    uttids[i] = prefix + uttids[i]
                else:
                    feats = _read(out, i)
            except (ValueError, ShardError) as e:
                keep[i] = False
                self._bad(out, i, e, counts)
                continue
            for effect in chain.on_features:
                feats = effect.apply(feats, Draw(u.get(effect.name, NO_UNIFORMS), self._bank(effect)))
            out.sources[i] = feats
            out.num[i, :4] = (IN_MEMORY, feats.shape[0], feats.shape[1], feats.dtype.itemsize)
        return out if keep.all() else out[keep]

    def _from_audio(self, audio: FileAudio, row: int, u: Mapping[str, np.ndarray], choices: np.ndarray | None,
                    draws: Draws | None, chain: _Chain) -> tuple[np.ndarray, str]:
        """An audio row's fbank and the prefix of its name (``sp0.9-`` when played at 0.9)."""
        wave, prefix = self.waveform(audio, row, u, choices, chain)
        fb = self.opts.fbank
        assert fb is not None
        if self._fbank is None:
            self._fbank = Fbank(fb)
        return self._fbank(wave, draws.dither(row) if fb.dither and draws is not None else None), prefix

    def waveform(self, audio: FileAudio, row: int, u: Mapping[str, np.ndarray],
                 choices: np.ndarray | None, chain: _Chain | None = None) -> tuple[np.ndarray, str]:
        """The waveform an audio row's features are computed from: decoded, downmixed (the mean of its
        channels), resampled to the fbank's rate (exactly the length the plan counted), then each
        waveform effect applied in turn (speed,
        reverb, noise, clip, lowpass, codec) as the row's draws say; and the prefix of its name.
        ``row``: its place in its corpus; ``u``: its uniforms of each effect (:meth:`Draws.read`);
        ``choices``: the corpus epoch's speed factors, as the plan drew them; ``chain``: the corpus's
        augmentation (the loader's when None)."""
        fb = self.opts.fbank
        assert fb is not None
        seconds = audio.header.samples / audio.header.sample_rate
        if seconds > MAX_DECODE_SECONDS:  # from the header, before a byte is decoded
            raise ValueError(f"{seconds / 60:.1f} min of audio, more than the {MAX_DECODE_SECONDS / 60:g} min the "
                             f"reader decodes (its fbank takes ~90 MB a minute); drop such utterances with "
                             f"max_utt_frames, or cut them into segments and repack")
        wave = downmix(audio.pcm().astype(np.float32))  # the one channel rule: the pack's features follow it too
        if audio.header.sample_rate != fb.sample_rate:  # exact rational resampling: the plan counted its length
            wave = resample(wave, audio.header.sample_rate, fb.sample_rate)
        prefix = ""
        for effect in (chain or self.chains[0]).on_wave:
            draw = Draw(u.get(effect.name, NO_UNIFORMS), self._bank(effect),
                        int(choices[row]) if effect.planned and choices is not None else None, fb.sample_rate)
            wave = effect.apply(wave, draw)
            prefix = effect.prefix(draw) + prefix
        return wave, prefix

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
