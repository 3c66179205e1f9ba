"""Audio members of a shard: 16-bit mono FLAC or WAV, their headers read without decoding, and the codec.

An audio shard stores each utterance's samples instead of its features (``KEY.flac`` or ``KEY.wav``
beside ``KEY.txt``); the loader computes the features while training.  What the plan needs of an
utterance, its sample count (and so its frame count), comes from the member's header alone: FLAC's
STREAMINFO block or WAV's ``fmt `` and ``data`` chunks, parsed here without a decoder.  A member is
usable when that header parses, says 16-bit PCM, one channel and at least one sample, and its data is
all there; decoding it (:meth:`FileAudio.pcm`) must then give exactly the samples the header says.

Only lossless formats: the features of a stored utterance then equal those computed from the
original audio, and every sample count the plan uses is exact.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import numpy as np

from wdsprep.format.keys import uttid_for_message
from wdsprep.format.native import untrack
from wdsprep.format.shardfile import ShardError, ShardFile, Source

# format (the member's extension) -> soundfile's name for it
AUDIO_FORMATS = {"flac": "FLAC", "wav": "WAV"}
AUDIO_BITS = 16  # what the writer stores and the readers accept
# The fbank backends an audio folder's index may name for the loader (wdsprep.prep.fbank implements them).
FBANK_BACKENDS = ("torchaudio", "kaldi-native-fbank", "numpy")
_WAVE_PCM, _WAVE_EXTENSIBLE = 1, 0xFFFE
_PCM_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_PCM after its first 2 bytes


@dataclass(frozen=True)
class AudioHeader:
    """What an audio member's header says: its format, rate, channels, bits per sample and samples;
    ``data`` is where a WAV's samples start within the member (-1 for FLAC, which needs decoding)."""

    format: str
    sample_rate: int
    channels: int
    bits: int
    samples: int
    data: int = -1


Read = Callable[[int, int], bytes]  # (start, stop) within the member -> its bytes


def audio_header(fmt: str, head: bytes, size: int, read: Read | None = None) -> AudioHeader:
    """The header of a ``size``-byte audio member of format ``fmt`` whose first bytes are ``head``
    (``read`` fetches more of it when the header is longer); ValueError saying why the readers
    refuse it (not that format, not 16-bit mono PCM, no samples, data cut short)."""
    if fmt not in AUDIO_FORMATS:
        raise ValueError(f"unknown audio format {fmt!r}; audio shards hold {', '.join(AUDIO_FORMATS)}")

    def more(start: int, stop: int) -> bytes:
        if stop <= len(head):
            return head[start:stop]
        if read is None or stop > size:
            raise ValueError(f"header cut short: needs {stop} bytes, the member has {size}")
        return read(start, stop)

    header = _flac_header(more) if fmt == "flac" else _wav_header(more, size)
    if header.channels != 1:
        raise ValueError(f"{header.channels} channels; audio shards hold one channel (pack picks it)")
    if header.bits != AUDIO_BITS:
        raise ValueError(f"{header.bits}-bit samples; audio shards hold {AUDIO_BITS}-bit PCM")
    if header.samples < 1:
        raise ValueError("no samples")
    return header


def _flac_header(more: Read) -> AudioHeader:
    if more(0, 4) != b"fLaC":
        raise ValueError("not a FLAC stream (bad magic)")
    block = more(4, 8)
    if block[0] & 0x7F != 0 or int.from_bytes(block[1:4], "big") != 34:
        raise ValueError("FLAC stream without a STREAMINFO block first")
    si = more(8, 42)
    rate = (si[10] << 12) | (si[11] << 4) | (si[12] >> 4)
    channels = ((si[12] >> 1) & 7) + 1
    bits = (((si[12] & 1) << 4) | (si[13] >> 4)) + 1
    samples = ((si[13] & 0x0F) << 32) | int.from_bytes(si[14:18], "big")
    if not rate:
        raise ValueError("FLAC stream with sample rate 0")
    if not samples:
        raise ValueError("FLAC stream whose STREAMINFO gives no sample count (written as a stream?); repack it")
    return AudioHeader("flac", rate, channels, bits, samples)


def _wav_header(more: Read, size: int) -> AudioHeader:
    riff = more(0, 12)
    if riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
        raise ValueError("not a WAV file (no RIFF/WAVE header)")
    pos, fmt = 12, None
    while True:
        if pos + 8 > size:
            raise ValueError("WAV file without a data chunk")
        chunk = more(pos, pos + 8)
        name, length = chunk[:4], int.from_bytes(chunk[4:8], "little")
        body = pos + 8
        if name == b"fmt ":
            if length < 16:
                raise ValueError(f"WAV fmt chunk of {length} bytes")
            fmt = more(body, body + min(length, 40))
        elif name == b"data":
            if fmt is None:
                raise ValueError("WAV data chunk before its fmt chunk")
            tag, channels = int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little")
            rate, align = int.from_bytes(fmt[4:8], "little"), int.from_bytes(fmt[12:14], "little")
            bits = int.from_bytes(fmt[14:16], "little")
            if tag == _WAVE_EXTENSIBLE and len(fmt) >= 40 and fmt[26:40] == _PCM_GUID_TAIL:
                tag = int.from_bytes(fmt[24:26], "little")
            if tag != _WAVE_PCM:
                raise ValueError(f"WAV format tag {tag:#x}; audio shards hold PCM")
            if not rate or align != channels * bits // 8 or not align:
                raise ValueError(f"WAV fmt chunk says {rate} Hz, {channels} channel(s), {bits} bits, block align "
                                 f"{align}")
            if body + length > size:
                raise ValueError(f"WAV data chunk of {length} bytes, {size - body} present (truncated)")
            return AudioHeader("wav", rate, channels, bits, length // align, body)
        pos = body + length + (length & 1)  # chunks are padded to an even size


def encode_audio(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """16-bit mono samples as the bytes of an audio member of format ``fmt``."""
    import soundfile as sf

    pcm = np.asarray(pcm)
    if pcm.dtype != np.int16 or pcm.ndim != 1 or not len(pcm):
        raise ValueError(f"audio to store must be 1-D int16 samples (16-bit, one channel), got {pcm.dtype} "
                         f"{pcm.shape}")
    buf = io.BytesIO()
    sf.write(buf, pcm, sample_rate, format=AUDIO_FORMATS[fmt], subtype="PCM_16")
    return buf.getvalue()


def decode_audio(data: bytes | memoryview, header: AudioHeader) -> np.ndarray:
    """The int16 samples of an audio member's bytes; ValueError when they are not what ``header`` says."""
    if header.format == "wav":  # plain PCM: no decoder needed
        end = header.data + 2 * header.samples
        if end > len(data):
            raise ValueError(f"WAV data cut short: {header.samples} samples need {end} bytes, {len(data)} present")
        return np.frombuffer(data, "<i2", header.samples, header.data).astype(np.int16, copy=False)
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels = f.samplerate, f.channels
            # The raw samples, without soundfile's array handling: ~20% of the decode's time (measured).
            raw = f.buffer_read(dtype="int16")
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError... for damaged data
        raise ValueError(f"FLAC data does not decode ({type(e).__name__}: {e})") from None
    pcm = np.frombuffer(raw, np.int16)
    if channels != 1 or rate != header.sample_rate or len(pcm) != header.samples:
        raise ValueError(f"FLAC data decodes to {len(pcm) // max(channels, 1)} samples x {channels} channel(s) at "
                         f"{rate} Hz, its header says {header.samples} x 1 at {header.sample_rate} Hz")
    return pcm


class FileAudio:
    """An audio member left in its shard (a local file, a fetched copy or bytes) until decoded.

    ``frames`` is what the plan counts it as: the fbank frames of its samples at its rate.
    """

    __slots__ = ("file", "offset", "size", "header", "key")

    def __init__(self, file: Source, offset: int, size: int, header: AudioHeader, key: str) -> None:
        self.file, self.offset, self.size, self.header, self.key = file, offset, size, header, key
        untrack(self)  # as FileFeats: it holds no container that could close a cycle

    def data(self) -> bytes:
        """The member's bytes (one positional read from a shard file)."""
        out = bytes(self.file[self.offset:self.offset + self.size])
        if len(out) != self.size:
            where = self.file.url if isinstance(self.file, ShardFile) else "an in-memory shard"
            raise ShardError(f"shard {where}: utterance {uttid_for_message(self.key)!r}: its audio needs "
                             f"{self.size} bytes at byte {self.offset}, the file ends before: was it changed or "
                             f"truncated while training read it?")
        return out

    def pcm(self) -> np.ndarray:
        """The int16 samples; ValueError when the member does not decode to what its header says."""
        return decode_audio(self.data(), self.header)
