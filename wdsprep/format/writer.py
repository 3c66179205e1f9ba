"""Writing one tar shard in a layout, under a temporary name until it is complete.

A features layout (``cat``, ``cat-v3``) takes each utterance's feature matrix (:meth:`ShardWriter.write`);
an audio layout (``flac``, ``wav``, ``opus``) its 16-bit samples (1 to 8 channels) at the corpus's rate
(:meth:`ShardWriter.write_audio`).  The :class:`~wdsprep.format.index.ShardInfo` the writer
returns is the shard's index entry either way (an audio shard's with its sample counts: for Opus
the count each member decodes to, which the plan then uses); a folder
of audio shards is indexed with ``FolderIndex.from_shards(..., audio=AudioIndex(...))``
(:func:`write_audio_shard` shows the whole path for one shard).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from pathlib import Path
from typing import BinaryIO, Iterable, Mapping

import numpy as np

from wdsprep.files import open_new, temp_path
from wdsprep.format.audio import AUDIO_FORMATS, LOSSY_FORMATS, encode_audio
from wdsprep.format.index import ShardInfo
from wdsprep.format.keys import AUDIO_LAYOUTS, encode_key, layout_exts
from wdsprep.format.npy import npy_bytes
from wdsprep.units import fbank_frames, frame_samples


class _Hashing:
    """A file written through, hashing (SHA-256) every byte on the way: a shard's checksum, for its
    index, at no extra read (0.8 s per GB of CPU)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.hash = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()


class ShardWriter:
    """Writes one tar shard under a temporary name; ``close()`` renames it to its final name.

    An interrupted job therefore never leaves a half-written file under a final name.  The tar
    is what webdataset's ``TarWriter`` writes (POSIX tar via the standard library), without
    importing webdataset, which imports torch: seconds per worker process for no gain.

    ``sample_rate``: an audio layout's, the rate every utterance written is at; ``bitrate``: a lossy
    audio layout's, in bit/s (None: the format's default, :data:`~wdsprep.format.audio.OPUS_BITRATE`).
    """

    def __init__(self, path: str | os.PathLike, layout: str = "cat", mtime: float | None = None, *,
                 sample_rate: int | None = None, bitrate: int | None = None):
        self.path = Path(path)
        self.feat_ext, self.text_ext = layout_exts(layout)
        self.audio = layout in AUDIO_LAYOUTS
        if self.audio and sample_rate is None:
            raise ValueError(f"layout {layout!r} stores audio: give the sample rate it is at")
        if bitrate is not None and (not self.audio or AUDIO_FORMATS[layout].lossless):
            raise ValueError(f"a bitrate applies to the lossy audio layouts ({', '.join(LOSSY_FORMATS)}), not to "
                             f"{layout!r}")
        self.layout, self.sample_rate, self.bitrate = layout, sample_rate, bitrate
        self.tmp_path = temp_path(self.path)
        self.info = ShardInfo(self.path.name)
        # A fixed mtime makes shards byte-for-byte reproducible from the same inputs.
        self.mtime = time.time() if mtime is None else mtime
        # A large buffer: tarfile copies members in 16 KiB pieces, one write() syscall each otherwise.
        self._file = open_new(self.tmp_path, "wb", buffering=4 << 20)
        self._hashing = _Hashing(self._file)
        self._tar = tarfile.open(fileobj=self._hashing, mode="w", format=tarfile.PAX_FORMAT)

    def _add(self, name: str, data: bytes) -> None:
        member = tarfile.TarInfo(name)
        member.size, member.mtime, member.mode = len(data), self.mtime, 0o444
        self._tar.addfile(member, io.BytesIO(data))

    def _add_fields(self, key: str, fields: Mapping[str, str] | None) -> None:
        """The utterance's fields, one member ``KEY.NAME`` each (names checked by the caller), by name."""
        for name in sorted(fields or ()):
            self._add(f"{key}.{name}", fields[name].encode("utf-8"))  # type: ignore[index]

    def write(self, uttid: str, feats: np.ndarray, text: str, fields: Mapping[str, str] | None = None) -> None:
        """One utterance's features (a features layout), and its ``fields`` (name -> value) after them."""
        if self.audio:
            raise ValueError(f"layout {self.layout!r} stores audio, not features: use write_audio")
        key = encode_key(uttid)
        text_bytes = text.encode("utf-8")
        self._add(f"{key}.{self.feat_ext}", npy_bytes(feats))
        self._add(f"{key}.{self.text_ext}", text_bytes)
        self._add_fields(key, fields)
        self.info.keys.append(key)
        self.info.frames.append(int(feats.shape[0]))
        self.info.text_lens.append(len(text))

    def write_audio(self, uttid: str, pcm: np.ndarray, text: str, fields: Mapping[str, str] | None = None) -> None:
        """One utterance's audio (an audio layout): int16 samples at the writer's sample rate, [n]
        or [n, channels] (the readers downmix by the mean),
        at least one 25 ms frame of them once stored (ValueError otherwise: the loader could make no
        feature).  The index entry records the samples the member decodes to (a lossy codec's may
        differ from ``len(pcm)``: they are what the loader gets)."""
        if not self.audio:
            raise ValueError(f"layout {self.layout!r} stores features, not audio: use write")
        assert self.sample_rate is not None
        window = frame_samples(self.sample_rate)[0]
        if len(pcm) < window:
            raise ValueError(f"utterance {uttid!r}: {len(pcm)} samples at {self.sample_rate} Hz, fewer than one "
                             f"frame's {window}")
        try:
            data, samples = encode_audio(pcm, self.sample_rate, self.layout, bitrate=self.bitrate)
        except ValueError as e:
            raise ValueError(f"utterance {uttid!r}: {e}") from None
        frames = int(fbank_frames(samples, self.sample_rate))
        if not frames:
            raise ValueError(f"utterance {uttid!r}: {len(pcm)} samples decode to {samples} from {self.layout}, "
                             f"fewer than one frame's {window}")
        key = encode_key(uttid)
        self._add(f"{key}.{self.feat_ext}", data)
        self._add(f"{key}.{self.text_ext}", text.encode("utf-8"))
        self._add_fields(key, fields)
        self.info.keys.append(key)
        self.info.frames.append(frames)
        self.info.text_lens.append(len(text))
        self.info.samples.append(samples)

    def __len__(self) -> int:
        return self.info.num_utts

    def close(self) -> ShardInfo:
        """Finish the tar and give it its final name."""
        self._tar.close()  # writes the end-of-archive blocks; the file is ours to close
        self._file.close()
        os.replace(self.tmp_path, self.path)
        self.info.sha256 = self._hashing.hash.hexdigest()
        return self.info

    def abort(self) -> None:
        """Drop the partial shard."""
        try:
            self._tar.close()
            self._file.close()
        finally:
            self.tmp_path.unlink(missing_ok=True)


def write_audio_shard(path: str | os.PathLike, utterances: Iterable[tuple[str, np.ndarray, str]], *,
                      layout: str, sample_rate: int, mtime: float | None = None,
                      bitrate: int | None = None) -> ShardInfo:
    """One audio shard at ``path`` from ``(uttid, int16 samples, transcript)`` in order; its index entry.

    What ``pack-audio --store flac|wav|opus`` calls per shard: the audio of each utterance as
    16-bit samples ([n] or [n, channels], 1 to 8 channels) at the corpus's ``sample_rate``
    (resampled already), its transcript and id.  The folder's index then comes from the shards' entries::

        infos = [write_audio_shard(d / name, utts, layout="flac", sample_rate=16000) for name, utts in shards]
        audio = AudioIndex("flac", 16000, num_mel_bins=80, dither=0.0, backend="numpy")  # what the loader computes
        write_index(d, FolderIndex.from_shards("flac", audio.num_mel_bins, "float32", infos, sizes=..., mtimes=...,
                                               speakers=..., audio=audio))

    (sizes and mtimes as ``os.stat`` gives them for each final shard, as ``pack`` records them.)
    ``layout="opus"`` stores Ogg Opus at ``bitrate`` bit/s (8, 12, 16, 24 or 48 kHz audio only).
    A failure leaves no file at ``path``.
    """
    writer = ShardWriter(path, layout, mtime, sample_rate=sample_rate, bitrate=bitrate)
    try:
        for uttid, pcm, text in utterances:
            writer.write_audio(uttid, pcm, text)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
