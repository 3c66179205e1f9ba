"""Ogg pages (RFC 3533), the container of an audio shard's Opus members: read, and made reproducible.

A member is a sequence of pages; each starts with ``OggS``, its header says its flags (2: first
page of the stream, 4: last), its granule position (for Opus: the 48 kHz sample count decoded by
the end of the page, RFC 7845), the stream's serial number, the page's sequence number and CRC,
and its segment table the lengths of the packet pieces in its body.

:func:`mux` lays a codec's packets out as one stream with a fixed serial number and a comment
packet that is its vendor string alone, so the same packets always make the same bytes, as every
other member of a shard does.  (libsndfile, whose Opus members older packs hold, draws a random serial
and pads its comment packet with ~700 bytes: :func:`normalize` makes its output reproducible.)
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = b"OggS"
BOS, EOS = 2, 4  # header flags: first and last page of a logical stream
SERIAL = 0x77647370  # b"wdsp": the serial number of every stream normalize() writes
_HEADER = struct.Struct("<4sBBqIII B")  # magic, version, flags, granule, serial, sequence, CRC, segments
# The Ogg CRC is CRC-32 with polynomial 0x04C11DB7 not bit-reflected, initial value and final xor 0.
# zlib's is the bit-reflected one with both 0xFFFFFFFF: on bit-reversed bytes, undone and reversed,
# it is the Ogg one, in C (a Python loop would cost ~1 ms per kB).
_REVERSED = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


@dataclass(frozen=True)
class Page:
    """One page: where it is in the member, its header fields, and its packets' pieces (``lacing``)."""

    offset: int
    size: int  # header, segment table and body
    flags: int
    granule: int
    serial: int
    sequence: int
    lacing: bytes

    @property
    def body(self) -> int:
        """Where the page's body starts within the member."""
        return self.offset + _HEADER.size + len(self.lacing)


def crc(page: bytes) -> int:
    """The Ogg checksum of a page whose CRC field holds zeros."""
    raw = zlib.crc32(page.translate(_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{raw:032b}"[::-1], 2)


def pages(data: bytes | memoryview) -> list[Page]:
    """The pages of an Ogg stream that fill ``data`` exactly; ValueError naming the byte where one is
    damaged or cut short (the CRCs are left to the decoder, which skips a page that fails it)."""
    out: list[Page] = []
    pos, n = 0, len(data)
    while pos < n:
        if pos + _HEADER.size > n:
            raise ValueError(f"Ogg page at byte {pos} cut short: {n - pos} bytes, a header needs {_HEADER.size}")
        magic, version, flags, granule, serial, sequence, _, segments = _HEADER.unpack_from(data, pos)
        if magic != MAGIC or version != 0:
            raise ValueError(f"no Ogg page at byte {pos} (bad magic or version)")
        lacing = bytes(data[pos + _HEADER.size:pos + _HEADER.size + segments])
        size = _HEADER.size + segments + sum(lacing)
        if len(lacing) < segments or pos + size > n:
            raise ValueError(f"Ogg page at byte {pos} cut short: needs {size} bytes, {n - pos} present")
        out.append(Page(pos, size, flags, granule, serial, sequence, lacing))
        pos += size
    if not out:
        raise ValueError("empty Ogg stream")
    return out


def _page(flags: int, granule: int, sequence: int, lacing: bytes, body: bytes | memoryview) -> bytes:
    head = _HEADER.pack(MAGIC, 0, flags, granule, SERIAL, sequence, 0, len(lacing))
    page = bytearray(head + lacing + body)
    struct.pack_into("<I", page, 22, crc(bytes(page)))
    return bytes(page)


def _lacing(size: int) -> bytes:
    """The segment table of one packet of ``size`` bytes alone on a page."""
    return b"\xff" * (size // 255) + bytes([size % 255])


# Audio per page: as libsndfile's 1,000 ms (a reader holds a page at a time; fewer pages, fewer headers).
PAGE_GRANULES = 48000


def mux(head: bytes, tags: bytes, packets: list[tuple[bytes, int]], end: int) -> bytes:
    """One Ogg stream of a codec whose granule positions count 48 kHz samples (Opus): the
    identification packet ``head`` alone on the first page, the comment packet ``tags`` alone on
    the second, then the audio ``packets`` ``(bytes, granule at its end)`` on pages of up to
    :data:`PAGE_GRANULES` each; the last page's granule position is ``end`` (RFC 7845's end
    trimming: what the stream decodes to, less its pre-skip), and it ends the stream."""
    out = [_page(BOS, 0, 0, _lacing(len(head)), head), _page(0, 0, 1, _lacing(len(tags)), tags)]
    seq, lacing, body, start = 2, bytearray(), bytearray(), None
    for i, (packet, granule) in enumerate(packets):
        last = i == len(packets) - 1
        lacing += _lacing(len(packet))
        body += packet
        start = granule if start is None else start
        if last or len(lacing) > 200 or granule - start >= PAGE_GRANULES:
            out.append(_page(EOS if last else 0, end if last else granule, seq, bytes(lacing), body))
            seq, lacing, body, start = seq + 1, bytearray(), bytearray(), None
    return b"".join(out)
