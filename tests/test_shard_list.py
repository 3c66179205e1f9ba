"""Shard patterns name regular files only: a directory or a FIFO that a glob matches is a named error
at loader start, in verify and in inspect, and nothing blocks on it (opening a FIFO for reading
waits for a writer that never comes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from shard_helpers import packed
from shardsets import train_char_tokenizer

from wdsprep import inspect_shards, verify_shards
from wdsprep.format.shardfile import ShardError, ShardFile


@pytest.fixture(params=["directory", "FIFO"])
def intruder(request, tmp_path):
    """A good pack with a directory or a FIFO named like a shard in one of its folders."""
    d, feats, texts = packed(tmp_path)
    path = d / "60_150" / "data-00009.tar"
    if request.param == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi" / "text")
    return d, path, request.param, tok


@pytest.mark.timeout(60)
def test_loader_refuses_it_at_start(intruder):
    from wdsprep.loader import make_loader

    d, path, kind, tok = intruder
    for pattern in (f"{d}/*/data-*.tar", str(path)):  # by glob, and named outright
        with pytest.raises(ValueError) as e:
            make_loader(pattern, tok, max_frames=1000)
        assert f"{path!s}" in str(e.value) and f"a {kind}" in str(e.value) and "regular files" in str(e.value)


@pytest.mark.timeout(60)
def test_verify_and_inspect_refuse_it(intruder):
    d, path, kind, _ = intruder
    pattern = f"{d}/*/data-*.tar"
    for check in (verify_shards, inspect_shards):
        with pytest.raises(ValueError, match=f"matches '{path}', a {kind}"):
            check(pattern)
    for command in ("verify", "inspect"):
        r = subprocess.run([sys.executable, "-m", "wdsprep", command, pattern], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"{path}', a {kind}: only regular files" in r.stderr


@pytest.mark.timeout(30)
def test_the_reader_never_blocks_on_a_fifo(tmp_path):
    """Below the shard list too: a FIFO handed to the shard reader (e.g. one that appeared after the list
    was made) is refused without waiting for a writer."""
    fifo = tmp_path / "data-00000.tar"
    os.mkfifo(fifo)
    with pytest.raises(ShardError, match="not a regular file \\(a FIFO\\)"):
        ShardFile(str(fifo))
