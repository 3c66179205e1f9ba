"""Test data for inspect/verify (and cold files for the readahead tests).

Kaldi arks packed by ``pack_data``, and CAT-style tars made with plain ``tarfile``.
"""

from __future__ import annotations

import errno
import io
import subprocess
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import kaldiio
import numpy as np
import pytest
from pagecache import evict, resident_fraction

from wdsprep import pack_data
from wdsprep.format.keys import LAYOUTS, encode_key

GROUPS = ["0:60", "60:150", "150:"]
DIMS = 4


def kaldi_data(tmp: Path, n: int = 30, seed: int = 0) -> tuple[Path, Path, dict[str, np.ndarray], dict[str, str]]:
    """feats.scp (+ ark written by kaldiio) and text for ``n`` utterances of 10..299 frames."""
    rng = np.random.default_rng(seed)
    feats, texts = {}, {}
    for i in range(n):
        # Speed-perturbed style ids (with a '.') and non-ASCII transcripts, as in real recipes.
        uttid = f"sp1.1-spk{i % 3}-utt{i:03d}" if i % 4 == 0 else f"spk{i % 3}-utt{i:03d}"
        feats[uttid] = rng.standard_normal((int(rng.integers(10, 300)), DIMS)).astype(np.float32)
        texts[uttid] = "你好 world " * int(rng.integers(1, 4)) + str(i)
    tmp.mkdir(parents=True, exist_ok=True)
    scp, text = tmp / "feats.scp", tmp / "text"
    kaldiio.save_ark(str(tmp / "feats.ark"), feats, scp=str(scp))
    text.write_text("".join(f"{u} {t}\n" for u, t in texts.items()), encoding="utf-8")
    # Expected numbers come from the arks as kaldiio reads them back, not from the arrays we wrote.
    return scp, text, dict(kaldiio.load_scp(str(scp))), texts


def packed(tmp: Path, layout: str = "cat") -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    """Shards written by ``pack_data`` in three length groups, 4 utterances per shard."""
    scp, text, feats, texts = kaldi_data(tmp / "kaldi")
    d = tmp / "shards"
    pack_data(scp, text, d, filter_group=GROUPS, utts_per_shard=4, layout=layout, progress=False)
    return d, feats, texts


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """A plain POSIX tar with the given (name, data) members, as CAT's webdataset writer produces."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def npy(a: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def cat_members(feats: dict[str, np.ndarray], texts: dict[str, str], layout: str) -> list[tuple[str, bytes]]:
    feat_ext, text_ext = LAYOUTS[layout]
    out = []
    for uttid, m in feats.items():
        key = encode_key(uttid)
        out += [(f"{key}.{feat_ext}", npy(m)), (f"{key}.{text_ext}", texts[uttid].encode("utf-8"))]
    return out


def tar_members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]


def rewrite_tar(path: Path, edit: Callable[[list[tuple[str, bytes]]], list[tuple[str, bytes]]]) -> None:
    """Rewrite a shard with its members changed by ``edit`` (to plant one specific fault)."""
    write_tar(path, edit(tar_members(path)))


def cold_file(path, nbytes=3 * (1 << 20) + 1000):
    """A file of ``nbytes`` dropped from the page cache; skips where the cache cannot be dropped (tmpfs)."""
    path.write_bytes(np.random.default_rng(0).bytes(nbytes))
    for _ in range(10):  # pages still under writeback are not dropped: evict again once they are clean
        evict([path])
        left = resident_fraction([path])
        if left is None or left == 0:
            break
        time.sleep(0.05)
    if left is None or left > 0:
        pytest.skip("the page cache cannot be dropped or inspected on this file system")
    return path


def wait_for(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


@contextmanager
def small_fs(path: Path, size: str):
    """A real file system of ``size`` (a tmpfs) mounted at ``path``, for disk-full tests; skips where
    mounting is not permitted (not root, or no CAP_SYS_ADMIN in the container)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode(errors='replace').strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(fs: Path) -> Path:
    """Fill a file system to the last byte (so the next write fails with ENOSPC); returns the filler."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 65536):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        try:
            while f.write(b"\0"):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler
