"""Ogg pages (RFC 3533), the container of an audio shard's Opus members: read, and made reproducible.

A member is a sequence of pages; each starts with ``OggS``, its header says its flags (2: first
page of the stream, 4: last), its granule position (for Opus: the 48 kHz sample count decoded by
the end of the page, RFC 7845), the stream's serial number, the page's sequence number and CRC,
and its segment table the lengths of the packet pieces in its body.

libsndfile gives each stream a random serial number and pads its comment packet with ~700 bytes;
:func:`normalize` replaces the serial with a fixed one, cuts the comment packet to its vendor
string (no comments, no padding) and renumbers and re-checksums the pages, so the same samples
always make the same bytes, as every other member of a shard does.
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


def packets(data: bytes | memoryview, page_list: list[Page]) -> list[bytes]:
    """The complete packets of consecutive pages (a packet continues across pages while its last
    lacing value is 255)."""
    out, part = [], bytearray()
    for p in page_list:
        pos = p.body
        for lace in p.lacing:
            part += data[pos:pos + lace]
            pos += lace
            if lace < 255:
                out.append(bytes(part))
                part = bytearray()
    return out


def _page(flags: int, granule: int, sequence: int, lacing: bytes, body: bytes | memoryview) -> bytes:
    head = _HEADER.pack(MAGIC, 0, flags, granule, SERIAL, sequence, 0, len(lacing))
    page = bytearray(head + lacing + body)
    struct.pack_into("<I", page, 22, crc(bytes(page)))
    return bytes(page)


def _lacing(size: int) -> bytes:
    """The segment table of one packet of ``size`` bytes alone on a page."""
    return b"\xff" * (size // 255) + bytes([size % 255])


def normalize(data: bytes, comment_magic: bytes) -> bytes:
    """An Ogg stream of one codec (identification packet on its first page, comment packet starting
    with ``comment_magic`` next) with serial :data:`SERIAL`, the comment packet cut to its vendor
    string on one page, and the pages renumbered and re-checksummed; the audio pages' bodies and
    granule positions are kept byte for byte."""
    found = pages(data)
    serials = {p.serial for p in found}
    if len(serials) != 1:
        raise ValueError(f"Ogg data with {len(serials)} streams; one expected")
    # The comment packet starts on page 1 and ends on the first page whose last lacing value is < 255.
    last = next((i for i in range(1, len(found)) if found[i].lacing and found[i].lacing[-1] < 255), None)
    if last is None:
        raise ValueError("Ogg data without a complete comment packet")
    comment = packets(data, found[1:last + 1])
    if len(comment) != 1 or not comment[0].startswith(comment_magic):
        raise ValueError(f"Ogg data whose second packet is not a {comment_magic!r} packet alone on its pages")
    at = len(comment_magic)
    (vendor_len,) = struct.unpack_from("<I", comment[0], at)
    tags = comment[0][:at + 4 + vendor_len] + struct.pack("<I", 0)
    head = found[0]
    out = [_page(head.flags, head.granule, 0, head.lacing, data[head.body:head.offset + head.size]),
           _page(0, 0, 1, _lacing(len(tags)), tags)]
    for seq, p in enumerate(found[last + 1:], start=2):
        out.append(_page(p.flags, p.granule, seq, p.lacing, data[p.body:p.offset + p.size]))
    return b"".join(out)
