"""The tar walk: a shard's members from its 512-byte headers, in C or in Python, and the tar's end.

``scan_ustar`` reads one header at a time together with the first :data:`PEEK` bytes of its
member (enough for an ``.npy`` header and most transcripts), one ``pread`` per member, in C when
it was built.  ustar, pax extended headers and GNU long names are handled; anything more unusual
(sparse files, pax records beyond path/size...) falls back to Python's ``tarfile``
(:func:`scan_tarfile`), so the fast path never has to be complete.
"""

from __future__ import annotations

import io
import re
import tarfile

import numpy as np

from wdsprep.format import native
from wdsprep.format.shardfile import ShardFile, Source

BLOCK = 512
# Member bytes read together with each header: a .npy header (128 bytes as numpy writes it) and
# transcripts up to this size come with the header's pread instead of needing their own.
PEEK = 512
_ZERO_BLOCK = bytes(BLOCK)
# Type flags of members that carry data ('0', and '\0' from pre-POSIX writers) or nothing to read.
_REGULAR = (b"0", b"\0", b"7")
_SKIP = (b"5", b"1", b"2", b"3", b"4", b"6")  # directories, links, devices, fifos
_PAX_KNOWN = frozenset({"path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname"})
_MTIME_ONLY = re.compile(rb"\A\d+ mtime=[0-9.]+\n\Z")


# One regular file in a tar: (name, offset of its data, size, its first PEEK bytes).  A plain
# tuple, not a NamedTuple or dataclass: a shard's members stay alive while it is read, and the
# GC stops tracking exact tuples of plain values only.  Tracked objects that live long (members,
# samples waiting in the buffers) are what drives CPython's full collections, which cost the
# loader ~15% of its time before.
Member = tuple[str, int, int, bytes]


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        return int.from_bytes(field[1:], "big")
    field = field.rstrip(b" \0")
    return int(field, 8) if field else 0


class _Exotic(Exception):
    """A header the fast path does not handle; use tarfile."""


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header (``"%d %s=%s\\n"`` each)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8")] = value.decode("utf-8")
        pos += length
    return out


def _first_bad_checksum(headers: list[bytes]) -> int | None:
    """Index of the first header whose checksum is wrong, or None.

    Vectorized over all headers at once: a Python ``sum`` per header cost more than the rest of
    the scan.  The checksum is the byte sum of the header with its checksum field read as spaces.
    """
    if not headers:
        return None
    blocks = np.frombuffer(b"".join(headers), np.uint8).reshape(-1, BLOCK)
    actual = blocks[:, :148].sum(1, dtype=np.int64) + blocks[:, 156:].sum(1, dtype=np.int64) + 8 * 32
    stored = np.full(len(headers), -1, np.int64)
    for i, h in enumerate(headers):
        field = h[148:156].rstrip(b" \0")
        try:
            stored[i] = int(field, 8)
        except ValueError:
            pass
    bad = np.flatnonzero(stored != actual)
    return int(bad[0]) if len(bad) else None


def scan_ustar(src: Source) -> tuple[list[Member], str | None]:
    """Walk the 512-byte headers of a tar (a :class:`ShardFile` or bytes in memory).

    Handles ustar, pax extended headers (``x``: path/size overrides; Python's tarfile writes one
    per member when mtime is a float, as webdataset's TarWriter does) and GNU long names (``L``).
    Returns the members found and, when the tar is corrupt or truncated, a description of the
    problem (the members before it are good).  Raises ``_Exotic`` for headers left to tarfile.
    """
    if native.lib is not None:
        found = native.lib.walk(src.fileno() if isinstance(src, ShardFile) else src, PEEK, len(src))
        if found is not None:  # a plain tar, all checksums right; else the walk below says what is wrong
            return found, None
    headers: list[bytes] = []  # every header walked, checksummed together at the end
    positions: list[int] = []
    owners: list[int] = []  # number of members complete before each header
    members: list[Member] = []
    problem: str | None = None
    exotic: bytes | None = None
    try:
        problem = _walk(src, headers, positions, owners, members)
    except _Exotic as e:
        exotic = e.args[0]
    bad = _first_bad_checksum(headers)
    if bad is not None:
        # The walk trusted that header's size field, so nothing from it on can be trusted.
        return members[:owners[bad]], f"header checksum mismatch at byte {positions[bad]}"
    if exotic is not None:
        raise _Exotic(exotic)
    return members, problem


def _walk(src: Source, headers: list[bytes], positions: list[int], owners: list[int],
          members: list[Member]) -> str | None:
    n = len(src)
    pos = 0
    pending: dict[str, str] = {}  # overrides from a pax/GNU header for the next member
    while True:
        if pos + BLOCK > n:
            # A tar ends with zero blocks; running out of bytes before them means truncation,
            # even at a member boundary (the cut may have split a sample's members).
            return f"truncated at byte {pos} (file has {n} bytes)"
        chunk = bytes(src[pos:pos + BLOCK + PEEK])  # one read: the header and the start of its member
        header = chunk[:BLOCK]
        if header[0] == 0 and header == _ZERO_BLOCK:
            return None
        headers.append(header)
        positions.append(pos)
        owners.append(len(members))
        typeflag = header[156:157]
        try:
            size = _octal(header[124:136])
        except ValueError:
            return f"bad size field at byte {pos}"
        if typeflag in _REGULAR and "size" in pending:
            size = int(pending["size"])
        data = pos + BLOCK
        if data + size > n:
            return f"member at byte {pos} needs {size} bytes, only {n - data} left (truncated)"
        if typeflag == b"x":
            record = chunk[BLOCK:BLOCK + size] if size <= PEEK else bytes(src[data:data + size])
            # tarfile writes an mtime-only record per member for a float mtime (webdataset's
            # TarWriter does): nothing the reader needs, and skipping its parse halves the scan.
            if not _MTIME_ONLY.match(record):
                try:
                    pending.update(_pax_records(record))
                except (ValueError, UnicodeDecodeError):
                    return f"bad pax header at byte {pos}"
                if pending.keys() - _PAX_KNOWN:
                    raise _Exotic(b"x")  # e.g. sparse-file or charset records: tarfile knows them
        elif typeflag == b"L":
            raw = chunk[BLOCK:BLOCK + size] if size <= PEEK else bytes(src[data:data + size])
            pending["path"] = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif typeflag in _REGULAR:
            if "path" in pending:
                name = pending["path"]
            else:
                raw = header[:100].split(b"\0", 1)[0]
                if header[257:262] == b"ustar":
                    prefix = header[345:500].split(b"\0", 1)[0]
                    if prefix:
                        raw = prefix + b"/" + raw
                try:
                    name = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _Exotic(b"name") from None
            members.append((name, data, size, chunk[BLOCK:BLOCK + size]))
            pending = {}
        elif typeflag in _SKIP:
            pending = {}
        else:
            raise _Exotic(typeflag)
        pos = data + (size + BLOCK - 1) // BLOCK * BLOCK


def scan_tarfile(src: Source) -> tuple[list[Member], str | None]:
    """The fallback: tarfile finds the members (pax, GNU long names...), we still slice the bytes."""
    members: list[Member] = []
    if isinstance(src, ShardFile) and src.copy is None:
        fileobj: io.IOBase = open(src.url, "rb")
    else:  # bytes, or a fetched copy (its url names no file here): exactly its bytes
        fileobj = io.BytesIO(src[0:len(src)] if isinstance(src, ShardFile) else src)
    try:
        with fileobj, tarfile.open(fileobj=fileobj, mode="r:") as tf:
            for m in tf:
                if m.isfile():
                    if m.offset_data + m.size > len(src):
                        return members, f"member {m.name!r} truncated"
                    head = bytes(src[m.offset_data:m.offset_data + min(m.size, PEEK)])
                    members.append((m.name, m.offset_data, m.size, head))
    except tarfile.TarError as e:
        return members, f"{type(e).__name__}: {e}"
    return members, None


def member_bytes(src: Source, m: Member) -> bytes:
    """All bytes of a member (no read when the walk already has them)."""
    _, offset, size, head = m
    return head if size <= PEEK else bytes(src[offset:offset + size])
