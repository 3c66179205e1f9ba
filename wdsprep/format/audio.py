"""Audio members of a shard (16-bit FLAC, WAV or Ogg Opus, 1 to 8 channels): headers read undecoded, and the codecs.

An audio shard stores each utterance's samples instead of its features (``KEY.flac``, ``KEY.wav``
or ``KEY.opus`` beside ``KEY.txt``); the loader computes the features while training.  What the
plan needs of an utterance, its sample count (and so its frame count), comes from the member's
header alone: FLAC's STREAMINFO block, WAV's ``fmt `` and ``data`` chunks, or an Opus stream's
identification header and last granule position, parsed here without a decoder.  A member is
usable when that header parses, says 16-bit samples (Opus: decoded as 16-bit), one to eight
channels, a speech sample rate and at least one sample, and its data is all there (a member whose
header parses but says otherwise is :class:`RefusedAudio`: left out alone, the shard read on);
decoding it (:meth:`FileAudio.pcm`) must then give exactly the samples the header says (per
channel: int16 [n] for one channel, [n, C] for C; the readers downmix by the mean of the channels).

FLAC and WAV are lossless: the features of a stored utterance equal those of the original audio.
Opus is lossy: its members are coded with libopus through PyAV (soundfile's libsndfile fixes its
encoder at a cost three times libopus's own for the same settings) and laid out here, trimmed to
the samples encoded (the last granule position, RFC 7845), so a member decodes to exactly the
samples written; the readers (libsndfile's decoder) check every decoding against the header all the
same, so every sample count the plan uses is exact for every format.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from wdsprep.format import ogg
from wdsprep.format.keys import uttid_for_message
from wdsprep.format.native import untrack
from wdsprep.format.shardfile import ShardError, ShardFile, Source

AUDIO_BITS = 16  # what the writer stores and the readers accept (Opus: what it is decoded to)
# The fbank backends an audio folder's index may name for the loader (wdsprep.prep.fbank implements them).
FBANK_BACKENDS = ("torchaudio", "kaldi-native-fbank", "numpy")
MAX_MEL_BINS = 1024  # mel bins an audio folder's fbank may have (more are no speech feature; 10^6 took 1.9 GiB)
# The sample rates an audio member may have: below 100 Hz a 10 ms frame shift is no sample at all.
MIN_RATE, MAX_RATE = 1000, 768_000
MAX_SAMPLES = 2**31 - 1  # an index counts an utterance's samples in int32
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the rates Opus codes at
OPUS_BITRATE = 32000  # bit/s of speech: ~14 MB per hour of audio
MAX_CHANNELS = 8  # channels an audio member may hold (the readers downmix them by their mean)
OPUS_BITRATES = (6000, 256000)  # what the Opus encoder takes (per channel)
_OPUS_GRANULE_RATE = 48000  # Ogg Opus granule positions count 48 kHz samples at any coded rate (RFC 7845)
_WAVE_PCM, _WAVE_EXTENSIBLE = 1, 0xFFFE
_PCM_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_PCM after its first 2 bytes


@dataclass(frozen=True)
class AudioHeader:
    """What an audio member's header says: its layout (the codec), rate, channels, bits per sample and samples;
    ``data`` is where a WAV's samples start within the member (-1 for formats that need decoding)."""

    layout: str
    sample_rate: int
    channels: int
    bits: int
    samples: int
    data: int = -1


Read = Callable[[int, int], bytes]  # (start, stop) within the member -> its bytes


def audio_header(layout: str, head: bytes, size: int, read: Read | None = None) -> AudioHeader:
    """The header of a ``size``-byte audio member of layout ``layout`` whose first bytes are ``head``
    (``read`` fetches more of it when the header is longer); ValueError saying why the readers
    refuse it (not that format, not 16-bit, over 8 channels, no samples, data cut short)."""
    codec = _codec(layout)

    def more(start: int, stop: int) -> bytes:
        if stop <= len(head):
            return head[start:stop]
        if read is None or stop > size:
            raise ValueError(f"header cut short: needs {stop} bytes, the member has {size}")
        return read(start, stop)

    header = codec.header(more, size)
    if not 1 <= header.channels <= MAX_CHANNELS:
        raise RefusedAudio(f"{header.channels} channels; audio shards hold 1 to {MAX_CHANNELS}")
    if header.bits != AUDIO_BITS:
        raise RefusedAudio(f"{header.bits}-bit samples; audio shards hold {AUDIO_BITS}-bit PCM")
    if not MIN_RATE <= header.sample_rate <= MAX_RATE:
        raise RefusedAudio(f"a sample rate of {header.sample_rate} Hz, which no speech recording has (audio shards "
                           f"hold {MIN_RATE:,} to {MAX_RATE:,} Hz)")
    if header.samples < 1:
        raise RefusedAudio("no samples")
    if header.samples > MAX_SAMPLES:
        raise RefusedAudio(f"{header.samples:,} samples, more than an index counts (at most {MAX_SAMPLES:,})")
    return header


class RefusedAudio(ValueError):
    """A well-formed audio member the readers do not use (not 16-bit, over 8 channels, a rate no speech has, no
    samples, more than an index counts): its sample alone is left out, counted as unreadable, and
    the shard is read on; the members around it were written whole."""


def _flac_header(more: Read, size: int) -> AudioHeader:
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


def _opus_header(more: Read, size: int) -> AudioHeader:
    """An Ogg Opus stream's header: its identification packet and its last page's granule position.

    The decoded length is that granule position less the pre-skip (RFC 7845), in 48 kHz samples,
    divided down to the rate the decoder gives: the lowest Opus rate at or above the input rate the
    stream records, as libsndfile decodes.  The stream's granule positions must start at 0 (as
    libsndfile and opusenc write them); the readers check the decoded count against it either way.
    """
    data = more(0, size)  # a few kB at speech rates: the pages are walked to the last one
    found = ogg.pages(data)
    first, last = found[0], found[-1]
    ident = bytes(data[first.body:first.offset + first.size])
    if not first.flags & ogg.BOS or not ident.startswith(b"OpusHead") or len(ident) < 19:
        raise ValueError("not an Ogg Opus stream (no OpusHead packet on its first page)")
    version, channels = ident[8], ident[9]
    preskip, input_rate = int.from_bytes(ident[10:12], "little"), int.from_bytes(ident[12:16], "little")
    if version >> 4:
        raise ValueError(f"Ogg Opus encapsulation version {version}; the readers know version 0 and 1")
    if len({p.serial for p in found}) != 1:
        raise ValueError("Ogg data holding more than one stream (chained or multiplexed)")
    if not last.flags & ogg.EOS:
        raise ValueError(f"Ogg Opus stream cut short: its last page (byte {last.offset}) does not end the stream")
    if last.granule < preskip:
        raise ValueError(f"Ogg Opus stream whose last granule position {last.granule} is below its pre-skip "
                         f"{preskip}")
    rate = next((r for r in OPUS_RATES if r >= input_rate), OPUS_RATES[-1])
    return AudioHeader("opus", rate, channels, AUDIO_BITS, (last.granule - preskip) // (_OPUS_GRANULE_RATE // rate))


def _shaped(pcm: np.ndarray, channels: int) -> np.ndarray:
    """Interleaved samples as int16 [n] (one channel) or [n, channels]."""
    return pcm if channels == 1 else pcm.reshape(-1, channels)


def _decode_wav(data: bytes | memoryview, header: AudioHeader) -> np.ndarray:
    """Plain PCM: no decoder needed."""
    ch = header.channels
    end = header.data + 2 * header.samples * ch
    if end > len(data):
        raise ValueError(f"WAV data cut short: {header.samples} samples need {end} bytes, {len(data)} present")
    return _shaped(np.frombuffer(data, "<i2", header.samples * ch, header.data).astype(np.int16, copy=False), ch)


def _decode_soundfile(data: bytes | memoryview, header: AudioHeader) -> np.ndarray:
    import soundfile as sf

    what = header.layout.upper() if header.layout != "opus" else "Opus"
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels = f.samplerate, f.channels
            # The raw samples, without soundfile's array handling: ~20% of the decode's time (measured).
            raw = f.buffer_read(dtype="int16")
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError... for damaged data
        raise ValueError(f"{what} data does not decode ({type(e).__name__}: {e})") from None
    pcm = np.frombuffer(raw, np.int16)
    if channels != header.channels or rate != header.sample_rate or len(pcm) != header.samples * channels:
        raise ValueError(f"{what} data decodes to {len(pcm) // max(channels, 1)} samples x {channels} channel(s) at "
                         f"{rate} Hz, its header says {header.samples} x {header.channels} at {header.sample_rate} Hz")
    return _shaped(pcm, channels)


def _encode_soundfile(pcm: np.ndarray, sample_rate: int, codec: Codec, bitrate: int | None) -> bytes:
    """A lossless member through soundfile (libsndfile)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, pcm, sample_rate, format=codec.sf_format, subtype=codec.subtype)
    return buf.getvalue()


# The Opus encoder's settings (libopus through PyAV), what each costs and buys measured in docs/audio.md:
# complexity 10 (every lower one costs feature fidelity at the same bitrate), 40 ms packets (fewer
# packets' overhead: closer features than 20 ms for the same bits), the "audio" application, variable rate.
OPUS_COMPLEXITY, OPUS_FRAME_MS, OPUS_APPLICATION = 10, 40, "audio"
OPUS_ENCODER = f"libopus complexity {OPUS_COMPLEXITY}, {OPUS_FRAME_MS} ms, {OPUS_APPLICATION}"  # in a pack's record
# FFmpeg's layout of 1 to 8 channels, in the order Opus's mapping family 1 (Vorbis order) codes them.
_LAYOUTS = ("mono", "stereo", "3.0", "quad", "5.0", "5.1", "6.1", "7.1")
_OPUS_VENDOR = b"wdsprep"  # the comment packet's vendor string: no comments, no padding


def _encode_opus(pcm: np.ndarray, sample_rate: int, codec: Codec, bitrate: int | None) -> bytes:
    """Ogg Opus: libopus (PyAV's) codes the packets, :func:`wdsprep.format.ogg.mux` lays them out
    with a fixed serial, granule positions from the packet count and the last one trimmed to the
    input's length (RFC 7845), so the member decodes to exactly ``len(pcm)`` samples."""
    av = opus_encoder()
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    layout = av.AudioLayout(_LAYOUTS[channels - 1])
    ctx = av.CodecContext.create("libopus", "w")
    ctx.sample_rate, ctx.layout, ctx.format = sample_rate, layout, "s16"
    ctx.bit_rate = OPUS_BITRATE if bitrate is None else bitrate
    ctx.options = {"compression_level": str(OPUS_COMPLEXITY), "frame_duration": str(OPUS_FRAME_MS),
                   "application": OPUS_APPLICATION, "vbr": "on"}
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm).reshape(1, -1), format="s16", layout=layout)
    frame.sample_rate, frame.pts = sample_rate, 0
    packets = [bytes(p) for p in ctx.encode(frame)] + [bytes(p) for p in ctx.encode(None)]
    head = bytes(ctx.extradata)  # OpusHead: its pre-skip (48 kHz) and channel mapping as libopus set them
    step = _OPUS_GRANULE_RATE * OPUS_FRAME_MS // 1000
    end = int.from_bytes(head[10:12], "little") + len(pcm) * (_OPUS_GRANULE_RATE // sample_rate)
    tags = b"OpusTags" + len(_OPUS_VENDOR).to_bytes(4, "little") + _OPUS_VENDOR + bytes(4)
    return ogg.mux(head, tags, [(p, (i + 1) * step) for i, p in enumerate(packets)], end)


def opus_encoder() -> Any:
    """PyAV (``av``), whose libopus codes Opus members; ImportError saying how to install it."""
    try:
        import av
    except ImportError:
        raise ImportError("Opus members are coded with libopus through PyAV, which is not installed: "
                          "pip install 'wdsprep[opus]' (or pip install av)") from None
    return av


@dataclass(frozen=True)
class Codec:
    """How one audio format is stored and read: its encoder (with soundfile's format and subtype
    where soundfile writes it), the header parser, the decoder, and for a lossy format the rates
    it codes at."""

    sf_format: str
    subtype: str
    header: Callable[[Read, int], AudioHeader]
    decode: Callable[[bytes | memoryview, AudioHeader], np.ndarray]
    encode: Callable[[np.ndarray, int, Codec, int | None], bytes] = _encode_soundfile
    lossless: bool = True
    rates: tuple[int, ...] | None = None  # None: any rate


# format (the member's extension) -> its codec
AUDIO_FORMATS: dict[str, Codec] = {
    "flac": Codec("FLAC", "PCM_16", _flac_header, _decode_soundfile),
    "wav": Codec("WAV", "PCM_16", _wav_header, _decode_wav),
    "opus": Codec("OGG", "OPUS", _opus_header, _decode_soundfile, _encode_opus, lossless=False, rates=OPUS_RATES),
}
LOSSY_FORMATS = tuple(f for f, c in AUDIO_FORMATS.items() if not c.lossless)


def _codec(layout: str) -> Codec:
    try:
        return AUDIO_FORMATS[layout]
    except KeyError:
        raise ValueError(f"unknown audio layout {layout!r}; audio shards hold {', '.join(AUDIO_FORMATS)}") from None


def check_bitrate(bitrate: int) -> int:
    """``bitrate`` if the Opus encoder takes it; else ValueError saying what it takes."""
    low, high = OPUS_BITRATES
    if isinstance(bitrate, bool) or not isinstance(bitrate, int) or not low <= bitrate <= high:
        raise ValueError(f"Opus bitrate {bitrate!r} must be a whole number of bit/s in [{low}, {high}] "
                         f"(e.g. {OPUS_BITRATE} for speech)")
    return bitrate


def encode_audio(pcm: np.ndarray, sample_rate: int, layout: str, *, bitrate: int | None = None) -> tuple[bytes, int]:
    """16-bit samples as the bytes of an audio member of layout ``layout``, and the number of
    samples those bytes decode to (``len(pcm)``: Opus members are trimmed to it), checked against
    the member's header for a lossy format (ValueError when they differ: the readers would refuse
    the member).  ``bitrate``: a lossy format's, in bit/s (Opus: :data:`OPUS_BITRATE` when None)."""
    codec = _codec(layout)
    pcm = np.asarray(pcm)
    if pcm.dtype != np.int16 or not 1 <= pcm.ndim <= 2 or not len(pcm) or pcm.ndim == 2 and not \
            1 <= pcm.shape[1] <= MAX_CHANNELS:
        raise ValueError(f"audio to store must be int16 samples, [n] or [n, channels] (1 to {MAX_CHANNELS}), got "
                         f"{pcm.dtype} {pcm.shape}")
    if codec.rates is not None and sample_rate not in codec.rates:
        raise ValueError(f"{layout} codes audio at {', '.join(map(str, codec.rates))} Hz, not {sample_rate}: resample "
                         f"it to one of them (pack-audio --sample-rate)")
    if codec.lossless and bitrate is not None:
        raise ValueError(f"a bitrate applies to the lossy formats ({', '.join(LOSSY_FORMATS)}), not to {layout}")
    if not codec.lossless:
        check_bitrate(OPUS_BITRATE if bitrate is None else bitrate)
    data = codec.encode(pcm, sample_rate, codec, bitrate)
    if not codec.lossless:
        header = audio_header(layout, data, len(data))
        if header.samples != len(pcm) or header.sample_rate != sample_rate:
            raise ValueError(f"{layout} member of {len(pcm)} samples at {sample_rate} Hz: its header says "
                             f"{header.samples} at {header.sample_rate} Hz")
    return data, len(pcm)


def decode_audio(data: bytes | memoryview, header: AudioHeader) -> np.ndarray:
    """The int16 samples of an audio member's bytes; ValueError when they are not what ``header`` says."""
    return _codec(header.layout).decode(data, header)


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
