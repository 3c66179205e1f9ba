"""Reading feature matrices from Kaldi arks by their ``feats.scp`` rxfilename (``path.ark:offset``).

kaldiio reads the matrices; before it does, :class:`ArkReader` reads the matrix header at the
offset itself (a few bytes), so that what goes wrong is said in words: an offset past the end of
the ark, bytes that are no Kaldi matrix (``feats.scp`` and ark do not belong together), a matrix
that runs past the end of the ark (a truncated copy).  kaldiio alone answers those with a bare
``AssertionError`` or a numpy message.  Only Kaldi binary matrices (``FM``, ``DM``, ``CM``,
``CM2``, ``CM3``), vectors and text matrices are handed to kaldiio: it would also unpickle a
``PKL`` entry, which wdsprep never does.

A system error while reading (``EIO``, permissions) is not a property of one utterance: it is
raised, naming the ark, and stops the job.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from wdsprep.files import naming
from wdsprep.prep.kaldi import ark_offset

# Bytes per value of the Kaldi binary types, for the size of the data after the header.
_PLAIN = {"FM": 4, "DM": 8, "FV": 4, "DV": 8}
_COMPRESSED = ("CM", "CM2", "CM3")
_HEAD = 32  # enough for "\0B", the longest token and either header


class ArkError(ValueError):
    """A matrix that cannot be read; the message names the ark, the byte offset and what to do."""


@dataclass(frozen=True)
class MatrixHeader:
    """What the header of a Kaldi binary matrix says: type, shape and where its bytes end."""

    kind: str
    rows: int
    cols: int | None  # None for a vector
    end: int  # byte offset just past the matrix


def parse_header(head: bytes, offset: int) -> MatrixHeader | str | None:
    """The header of the Kaldi object starting ``head`` (read at ``offset``), a sentence saying why
    it is no feature matrix, or None for a text (ASCII) matrix, which has no header to check."""
    if head.lstrip(b" \t\n")[:1] == b"[":
        return None
    if head[:2] != b"\0B":
        return f"no Kaldi matrix at byte {offset:,} (found {head[:8]!r})"
    kind, sep, rest = head[2:].partition(b" ")
    kind_s = kind.decode("ascii", "replace")
    if not sep or (kind_s not in _PLAIN and kind_s not in _COMPRESSED):
        return f"a Kaldi object of type {kind_s[:8]!r} at byte {offset:,}, not a feature matrix (FM, DM, CM, CM2, CM3)"
    start = offset + 3 + len(kind)  # "\0B", the token and its space
    try:
        if kind_s in _COMPRESSED:
            _, _, rows, cols = struct.unpack("<ffii", rest[:16])
            per_value = {"CM": 1, "CM2": 2, "CM3": 1}[kind_s]
            col_headers = 8 * cols if kind_s == "CM" else 0
            end = start + 16 + col_headers + rows * cols * per_value
        elif kind_s.endswith("M"):
            size1, rows, size2, cols = struct.unpack("<bibi", rest[:10])
            if size1 != 4 or size2 != 4:
                raise struct.error
            end = start + 10 + rows * cols * _PLAIN[kind_s]
        else:
            size1, rows = struct.unpack("<bi", rest[:5])
            if size1 != 4:
                raise struct.error
            cols = None
            end = start + 5 + rows * _PLAIN[kind_s]
    except struct.error:
        return f"a damaged {kind_s} header at byte {offset:,}"
    if rows < 0 or (cols is not None and cols < 0):
        return f"a damaged {kind_s} header at byte {offset:,} ({rows} x {cols})"
    return MatrixHeader(kind_s, rows, cols, end)


class ArkReader:
    """Matrices by rxfilename, with the header checked first; keeps each ark open (arks are read in order)."""

    def __init__(self) -> None:
        self._arks: dict[str, tuple[int, int]] = {}  # path -> (fd, size)
        self._kaldiio_fds: dict = {}  # kaldiio keeps its own file objects here

    def _ark(self, path: str) -> tuple[int, int]:
        got = self._arks.get(path)
        if got is None:
            fd = os.open(path, os.O_RDONLY)
            got = self._arks[path] = (fd, os.fstat(fd).st_size)
        return got

    def header(self, rxfile: str) -> MatrixHeader | None:
        """The checked header of the matrix ``rxfile`` names; None when there is none to check
        (a pipe, a text matrix).  Raises :class:`ArkError` saying what is wrong."""
        where = ark_offset(rxfile)
        if where is None:
            return None
        path, offset = where
        with naming(path):
            fd, size = self._ark(path)
            if offset >= size:
                raise ArkError(f"{path}: byte offset {offset:,} is past the end of the ark ({size:,} bytes): the "
                               f"ark is truncated, or feats.scp points into another ark; copy the ark again or "
                               f"recompute the features")
            head = os.pread(fd, _HEAD, offset)
        parsed = parse_header(head, offset)
        if isinstance(parsed, str):
            raise ArkError(f"{path}: {parsed}: feats.scp and the ark do not belong together (an offset from another "
                           f"ark, or an ark rewritten since); write feats.scp and arks again")
        if parsed is not None and parsed.end > size:
            shape = f"{parsed.rows} x {parsed.cols}" if parsed.cols is not None else f"{parsed.rows}"
            raise ArkError(f"{path}: the {shape} {parsed.kind} matrix at byte {offset:,} ends at byte "
                           f"{parsed.end:,}, past the end of the ark ({size:,} bytes): the ark is truncated; "
                           f"copy it again or recompute the features")
        return parsed

    def load(self, rxfile: str) -> np.ndarray:
        """The matrix ``rxfile`` names, after its header is checked; :class:`ArkError` when it cannot be read."""
        import kaldiio

        self.header(rxfile)
        where = ark_offset(rxfile)
        try:
            with naming(where[0] if where else rxfile):
                return kaldiio.load_mat(rxfile, fd_dict=self._kaldiio_fds)
        except OSError:
            raise
        except Exception as e:  # kaldiio's parsers raise AssertionError, ValueError, RuntimeError, ...
            what = f"{where[0]}: the matrix at byte {where[1]:,}" if where else f"{rxfile!r}"
            why = str(e).strip() or "kaldiio gives no reason"
            raise ArkError(f"{what} cannot be read ({type(e).__name__}: {why}); check that feats.scp and the "
                           f"arks belong together, or recompute the features") from None

    def close(self) -> None:
        for fd, _ in self._arks.values():
            os.close(fd)
        self._arks.clear()
        for f in self._kaldiio_fds.values():
            f.close()
        self._kaldiio_fds.clear()
