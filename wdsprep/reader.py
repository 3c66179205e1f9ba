"""Fast shard reading: a whole tar in memory, ustar headers parsed here, ``.npy`` decoded by hand.

Python's ``tarfile`` plus ``np.load`` (webdataset's default path) spends ~10x longer than reading
the same bytes.  Shards are tens to a few hundred MB, so reading one into memory at once is cheap;
members are then sliced out as memoryviews (no copy) and features come out of ``np.frombuffer``.

Anything unusual about a tar (pax or GNU long-name headers, sparse files...) falls back to
``tarfile`` over the same in-memory bytes, so the fast path never has to be complete.

Nothing is ever unpickled: ``.npy`` headers are parsed with :func:`ast.literal_eval` (literals
only) and only little-endian float dtypes are accepted.
"""

from __future__ import annotations

import ast
import io
import mmap
import os
import re
import subprocess
import tarfile
import warnings
from typing import Callable, Iterator, NamedTuple

import numpy as np

from .shardlist import is_url
from .shards import LAYOUTS, decode_key, split_name

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
# Map every page up front: one call instead of a fault per 64 KiB when the decoder walks the shard.
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# Type flags of members that carry data ('0', and '\0' from pre-POSIX writers) or nothing to read.
_REGULAR = (b"0", b"\0", b"7")
_SKIP = (b"5", b"1", b"2", b"3", b"4", b"6")  # directories, links, devices, fifos
# dtypes a feature matrix may have on disk; everything else (object, big-endian, ints) is refused.
_NPY_DTYPES = {"<f4": np.dtype("<f4"), "<f2": np.dtype("<f2"), "<f8": np.dtype("<f8")}
_NPY_MAGIC = b"\x93NUMPY"
_PAX_KNOWN = frozenset({"path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname"})
_MTIME_ONLY = re.compile(rb"\A\d+ mtime=[0-9.]+\n\Z")
# The header numpy itself writes; a regex is ~10x faster than literal_eval, which remains the fallback.
_NPY_HEADER_RE = re.compile(
    r"^\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), 'shape': \(((?:\d+, ?)*\d*)\), \}")


class ShardError(ValueError):
    """A shard (or one of its samples) cannot be read; the message names the shard and key."""


class Member(NamedTuple):
    """One regular file in a tar: its name and where its bytes are.

    A tuple, not a dataclass: a shard has thousands of members alive until it is done, and
    CPython's GC stops tracking tuples of plain values (dataclass instances made the loader
    spend ~20% of its time in full collections).
    """

    name: str
    offset: int
    size: int


def read_shard_bytes(url: str) -> bytes | bytearray:
    """The whole shard: a local file read at once, or a ``pipe:CMD``'s stdout, or a URL via webdataset."""
    if url.startswith("pipe:"):
        cmd = url[len("pipe:"):]
        proc = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-500:]
            raise ShardError(f"{url}: command exited with status {proc.returncode}: {err}")
        return proc.stdout
    if is_url(url):
        from webdataset.gopen import gopen  # only remote URLs need webdataset's openers

        with gopen(url, "rb") as f:
            return f.read()
    with open(url, "rb") as f:
        # One read() of the whole file: faster than readinto a zeroed bytearray.  Arrays sliced
        # from these bytes are read-only, which is fine: the collate copies them into the batch.
        return f.read()


def map_shard(url: str) -> bytes | mmap.mmap:
    """A local shard mapped read-only (a pipe or URL is read into memory instead).

    ``read()`` copies the file out of the page cache into freshly allocated memory, and the
    first touch of every fresh page is a page fault: that copy was most of the reader's time.
    The mapping shares the page cache; decoded arrays are views on it and the collate makes
    the one copy.  Nothing closes the map explicitly: it is unmapped when the last array
    viewing it is gone (so samples in the shuffle buffer keep only their own shard mapped).
    """
    if url.startswith("pipe:") or is_url(url):
        return read_shard_bytes(url)
    with open(url, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""  # mmap refuses empty files; the scan reports the missing end blocks
        m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ)
    return m


def prefetch_shard(url: str) -> None:
    """Ask the kernel to start reading a local shard into the page cache (no-op when cached or remote).

    Called for the next shard while the current one is decoded, so a cold read overlaps the work.
    """
    if url.startswith("pipe:") or is_url(url) or not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(url, os.O_RDONLY)
    except OSError:
        return  # reported when the shard itself is read
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


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


def _first_bad_checksum(buf: bytes | bytearray | memoryview, positions: list[int]) -> int | None:
    """Index (into ``positions``) of the first header whose checksum is wrong, or None.

    Vectorized over all headers at once: a Python ``sum`` per header cost more than the rest of
    the scan.  The checksum is the byte sum of the header with its checksum field read as spaces.
    """
    if not positions:
        return None
    blocks = np.frombuffer(buf, np.uint8, count=len(buf) // BLOCK * BLOCK).reshape(-1, BLOCK)
    headers = blocks[np.asarray(positions) // BLOCK]
    actual = headers[:, :148].sum(1, dtype=np.int64) + headers[:, 156:].sum(1, dtype=np.int64) + 8 * 32
    stored = np.full(len(positions), -1, np.int64)
    for i, pos in enumerate(positions):
        field = bytes(buf[pos + 148:pos + 156]).rstrip(b" \0")
        try:
            stored[i] = int(field, 8)
        except ValueError:
            pass
    bad = np.flatnonzero(stored != actual)
    return int(bad[0]) if len(bad) else None


def scan_ustar(buf: bytes | bytearray | memoryview) -> tuple[list[Member], str | None]:
    """Walk the 512-byte headers of a tar held in memory.

    Handles ustar, pax extended headers (``x``: path/size overrides; Python's tarfile writes one
    per member when mtime is a float, as webdataset's TarWriter does) and GNU long names (``L``).
    Returns the members found and, when the tar is corrupt or truncated, a description of the
    problem (the members before it are good).  Raises ``_Exotic`` for headers left to tarfile.
    """
    positions: list[int] = []  # every header walked, checksummed together at the end
    owners: list[int] = []  # number of members complete before each header
    members: list[Member] = []
    problem: str | None = None
    exotic: bytes | None = None
    try:
        problem = _walk(buf, positions, owners, members)
    except _Exotic as e:
        exotic = e.args[0]
    bad = _first_bad_checksum(buf, positions)
    if bad is not None:
        # The walk trusted that header's size field, so nothing from it on can be trusted.
        return members[:owners[bad]], f"header checksum mismatch at byte {positions[bad]}"
    if exotic is not None:
        raise _Exotic(exotic)
    return members, problem


def _walk(buf: bytes | bytearray | memoryview, positions: list[int], owners: list[int],
          members: list[Member]) -> str | None:
    view = memoryview(buf)
    n = len(view)
    pos = 0
    pending: dict[str, str] = {}  # overrides from a pax/GNU header for the next member
    while True:
        if pos + BLOCK > n:
            # A tar ends with zero blocks; running out of bytes before them means truncation,
            # even at a member boundary (the cut may have split a sample's members).
            return f"truncated at byte {pos} (file has {n} bytes)"
        header = bytes(view[pos:pos + BLOCK])
        if header[0] == 0 and header == _ZERO_BLOCK:
            return None
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
            record = bytes(view[data:data + size])
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
            pending["path"] = bytes(view[data:data + size]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
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
            members.append(Member(name, data, size))
            pending = {}
        elif typeflag in _SKIP:
            pending = {}
        else:
            raise _Exotic(typeflag)
        pos = data + (size + BLOCK - 1) // BLOCK * BLOCK


def scan_tarfile(buf: bytes | bytearray | memoryview) -> tuple[list[Member], str | None]:
    """The fallback: tarfile finds the members (pax, GNU long names...), we still slice the bytes."""
    members: list[Member] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(buf), mode="r:") as tf:
            for m in tf:
                if m.isfile():
                    if m.offset_data + m.size > len(buf):
                        return members, f"member {m.name!r} truncated"
                    members.append(Member(m.name, m.offset_data, m.size))
    except tarfile.TarError as e:
        return members, f"{type(e).__name__}: {e}"
    return members, None


def iter_shard_samples(
    url: str,
    *,
    on_error: str = "warn",
    on_corrupt: Callable[[str, str | None, str], None] | None = None,
    use_mmap: bool = True,
) -> Iterator[tuple[str, dict[str, memoryview]]]:
    """(key, {extension: bytes}) for every sample of a shard, members sliced from one map or read.

    ``use_mmap=False`` reads local files with one ``read()`` instead of mapping them (same result).

    A corrupt or truncated shard yields its complete samples before the damage, then (with
    ``on_error="warn"``) warns naming the shard and the first key not read and stops; with
    ``on_error="raise"`` it raises :class:`ShardError`.  ``on_corrupt(url, key, why)`` is called
    either way so the caller can count it.
    """
    if on_error not in ("warn", "raise"):
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
    try:
        buf = map_shard(url) if use_mmap else read_shard_bytes(url)
    except (OSError, ValueError, ShardError) as e:
        members, problem, buf = [], f"cannot read: {e}", b""
    else:
        try:
            members, problem = scan_ustar(buf)
        except _Exotic:
            members, problem = scan_tarfile(buf)
    view = memoryview(buf)
    del buf  # the views keep the map alive exactly as long as a sample needs it

    # Group consecutive members by key, one sample at a time (a list of all groups would keep
    # thousands of dicts alive for the GC to walk).  When the tar is damaged the last group may
    # be missing members (e.g. the .npy arrived but not the .txt), so it is reported, not yielded.
    key: str | None = None
    group: dict[str, memoryview] = {}
    count = 0
    for m in members:
        k, ext = split_name(m.name)
        if k != key:
            if key is not None:
                count += 1
                yield key, group
            key, group = k, {}
        group[ext] = view[m.offset:m.offset + m.size]
    del view, members
    bad_key: str | None = None
    if key is not None:
        if problem is None:
            count += 1
            yield key, group
        else:
            bad_key = key
    group = {}
    if problem is not None:
        if on_corrupt is not None:
            on_corrupt(url, bad_key, problem)
        where = f" (at or after utterance {_uttid(bad_key)!r})" if bad_key else ""
        msg = (f"shard {url}: {problem}{where}; {count} samples read, the rest of the shard skipped. "
               f"Re-create the shard (wdsprep pack) or remove it from the shard list")
        if on_error == "raise":
            raise ShardError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)


def _uttid(key: str) -> str:
    """The utterance id for messages; the raw key when it does not decode."""
    try:
        return decode_key(key)
    except UnicodeDecodeError:
        return key


def _parse_npy_header(text: str) -> tuple[str, bool, tuple[int, ...]]:
    m = _NPY_HEADER_RE.match(text)
    if m:
        shape = tuple(int(x) for x in m.group(3).replace(" ", "").split(",") if x)
        return m.group(1), m.group(2) == "True", shape
    d = ast.literal_eval(text)  # literals only: no code runs
    if not isinstance(d, dict) or not {"descr", "fortran_order", "shape"} <= d.keys():
        raise ValueError(f"not an npy header: {text[:80]!r}")
    return d["descr"], bool(d["fortran_order"]), tuple(int(x) for x in d["shape"])


def decode_npy(buf: bytes | bytearray | memoryview, *, float32: bool = True) -> np.ndarray:
    """A 2-D feature matrix from ``.npy`` bytes, without pickle and without copying float32 data.

    Only little-endian float16/32/64 are accepted (object arrays could only be read by unpickling).
    With ``float32=False`` float16 stays float16 (the collate converts while padding, one copy
    fewer); float64 is always converted.  The result may be a read-only view of ``buf``.
    """
    view = memoryview(buf)
    if bytes(view[:6]) != _NPY_MAGIC:
        raise ValueError("not an .npy file (bad magic)")
    major = view[6]
    if major == 1:
        hlen, start = int.from_bytes(view[8:10], "little"), 10
    elif major in (2, 3):
        hlen, start = int.from_bytes(view[8:12], "little"), 12
    else:
        raise ValueError(f"unsupported .npy version {major}")
    descr, fortran, shape = _parse_npy_header(bytes(view[start:start + hlen]).decode("latin1"))
    dtype = _NPY_DTYPES.get(descr)
    if dtype is None:
        raise ValueError(f"feature dtype {descr!r} refused: only little-endian float16/32/64 are read "
                         f"(object arrays would need unpickling)")
    if len(shape) != 2:
        raise ValueError(f"features must be 2-D (frames x dims), got shape {shape}")
    count = shape[0] * shape[1]
    offset = start + hlen
    if offset + count * dtype.itemsize > len(view):
        raise ValueError(f"npy data truncated: shape {shape} needs {count * dtype.itemsize} bytes, "
                         f"{len(view) - offset} present")
    arr = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    if dtype.itemsize == 8 or (float32 and dtype.itemsize == 2) or fortran:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


def split_sample(members: dict[str, memoryview]) -> tuple[memoryview, memoryview]:
    """(feature bytes, transcript bytes) of a sample in either layout, or KeyError naming what is there."""
    for feat_ext, text_ext in LAYOUTS.values():
        if feat_ext in members and text_ext in members:
            return members[feat_ext], members[text_ext]
    raise KeyError(f"no features + transcript pair among members {sorted(members)}; "
                   f"expected one of {sorted(LAYOUTS.values())}")


def iter_decoded(
    url: str,
    *,
    on_error: str = "warn",
    on_corrupt: Callable[[str, str | None, str], None] | None = None,
    float32: bool = True,
    use_mmap: bool = True,
) -> Iterator[tuple[str, np.ndarray, str]]:
    """(utterance id, features, transcript) for every sample of a shard, either layout.

    float32 features of a local shard are read-only views on its memory map (see :func:`map_shard`).

    A sample that cannot be decoded counts as corruption of the shard (same warning/raise path),
    because a shard that holds one bad sample was most likely damaged in writing or copying.
    """
    samples = iter_shard_samples(url, on_error=on_error, on_corrupt=on_corrupt, use_mmap=use_mmap)
    for key, members in samples:
        try:
            feat_bytes, text_bytes = split_sample(members)
            feats = decode_npy(feat_bytes, float32=float32)
            text = str(text_bytes, "utf-8")
            uttid = decode_key(key) if "%" in key else key  # unquote costs more than the npy decode
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            samples.close()
            problem = f"sample cannot be decoded ({e})"
            if on_corrupt is not None:
                on_corrupt(url, key, problem)
            msg = (f"shard {url}: utterance {_uttid(key)!r}: {problem}; the rest of the shard skipped. "
                   f"Re-create the shard (wdsprep pack) or remove it from the shard list")
            if on_error == "raise":
                raise ShardError(msg) from e
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            return
        yield uttid, feats, text
