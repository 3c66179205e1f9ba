"""The ``.npy`` header of a feature member, parsed without pickle, and the accepted dtypes.

One parser for every reader (the loader, ``verify``, ``inspect``, ``index``): headers are parsed
with a regex for what numpy writes and :func:`ast.literal_eval` (literals only) otherwise, and
only little-endian float16/32/64 are accepted, so an object array is refused from its header and
never loaded.
"""

from __future__ import annotations

import ast
import functools
import io
import re

import numpy as np

FEATURE_DTYPES = {"<f4": np.dtype("<f4"), "<f2": np.dtype("<f2"), "<f8": np.dtype("<f8")}
NPY_MAGIC = b"\x93NUMPY"
# The header numpy itself writes; a regex is ~10x faster than literal_eval, which remains the fallback.
_NPY_HEADER_RE = re.compile(
    r"^\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), 'shape': \(((?:\d+, ?)*\d*)\), \}")


@functools.lru_cache(maxsize=4096)  # one header per distinct shape: most repeat within a corpus
def parse_npy_header(text: str) -> tuple[str, bool, tuple[int, ...]]:
    """(descr, fortran order, shape) of an ``.npy`` header dict; ValueError for anything else."""
    m = _NPY_HEADER_RE.match(text)
    if m:
        shape = tuple(int(x) for x in m.group(3).replace(" ", "").split(",") if x)
        return m.group(1), m.group(2) == "True", shape
    try:
        d = ast.literal_eval(text)  # literals only: no code runs
    except (SyntaxError, TypeError, RecursionError, MemoryError) as e:  # a damaged header
        raise ValueError(f"not an npy header ({type(e).__name__}): {text[:80]!r}") from None
    if (not isinstance(d, dict) or not {"descr", "fortran_order", "shape"} <= d.keys()
            or not isinstance(d["descr"], str) or not isinstance(d["shape"], tuple)
            or not all(type(x) is int and x >= 0 for x in d["shape"])):
        raise ValueError(f"not an npy header: {text[:80]!r}")
    return d["descr"], bool(d["fortran_order"]), d["shape"]


def npy_header_end(head: bytes) -> int:
    """Where the data of an ``.npy`` starts, from its first 12 bytes."""
    if head[:6] != NPY_MAGIC:
        raise ValueError("not an .npy file (bad magic)")
    major = head[6] if len(head) > 6 else 0
    if major == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    if major in (2, 3):
        return 12 + int.from_bytes(head[8:12], "little")
    raise ValueError(f"unsupported .npy version {major}")


def npy_layout(head: bytes, size: int) -> tuple[np.dtype, bool, tuple[int, int], int]:
    """(dtype, fortran order, shape, data offset) of an ``.npy`` feature member of ``size`` bytes;
    ``head`` holds its header.  ValueError saying why it is not a feature matrix wdsprep reads."""
    end = npy_header_end(head)
    start = 10 if head[6] == 1 else 12
    descr, fortran, shape = parse_npy_header(head[start:end].decode("latin1"))
    dtype = FEATURE_DTYPES.get(descr)
    if dtype is None and "O" in descr:
        raise ValueError(f"pickled object array (dtype {descr!r}) refused: nothing in a shard is unpickled, "
                         f"and an object array can only be read by unpickling")
    if dtype is None:
        raise ValueError(f"feature dtype {descr!r} refused: only little-endian float16/32/64 are read "
                         f"(object arrays would need unpickling)")
    if len(shape) != 2:
        raise ValueError(f"features must be 2-D (frames x dims), got shape {shape}")
    if not shape[0] or not shape[1]:
        raise ValueError(f"empty feature matrix {shape}")
    need = shape[0] * shape[1] * dtype.itemsize
    if end + need > size:
        raise ValueError(f"npy data truncated: shape {shape} needs {need} bytes, {size - end} present")
    return dtype, fortran, shape, end  # type: ignore[return-value]


def as_features(flat: np.ndarray, shape: tuple[int, int], fortran: bool, float32: bool) -> np.ndarray:
    """The 2-D matrix from its flat data: float64 (and with ``float32`` float16) become float32."""
    arr = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    if flat.dtype.itemsize == 8 or (float32 and flat.dtype.itemsize == 2) or fortran:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


def npy_bytes(feats: np.ndarray) -> bytes:
    """Serialize a feature matrix as ``.npy`` (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(feats), allow_pickle=False)
    return buf.getvalue()
