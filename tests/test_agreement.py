"""verify, inspect and the loader read a shard through one format module: they refuse the same samples."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from shard_helpers import cat_members, npy, write_tar

from wdsprep import inspect_shards, make_loader, train_tokenizer, verify_shards
from wdsprep.format.samples import iter_decoded
from wdsprep.format.shardfile import ShardError

UTTS = [f"u{i}" for i in range(4)]


def shard_with(tmp_path, bad_member: bytes):
    """A cat-layout shard of four samples whose third features member is ``bad_member``."""
    feats = {u: np.full((10 + i, 3), i, np.float32) for i, u in enumerate(UTTS)}
    texts = {u: f"text {u}" for u in UTTS}
    members = cat_members(feats, texts, "cat")
    members[4] = ("u2.npy", bad_member)
    path = tmp_path / "g" / "data-00000.tar"
    write_tar(path, members)
    (tmp_path / "text").write_text("".join(f"{u} {t}\n" for u, t in texts.items()))
    return path


GARBAGE_HEADER = b"\x93NUMPY\x01\x00\x3c\x00{'descr': <f4', 'fortran_order': False, 'shape': (12, 3), }    \n"
BIG_ENDIAN = npy(np.ones((12, 3), ">f4"))


@pytest.mark.parametrize("bad, why", [(GARBAGE_HEADER + bytes(144), "not an npy header"),
                                      (BIG_ENDIAN, "'>f4' refused")], ids=["garbage header", "big-endian"])
def test_every_reader_refuses_the_same_sample_for_the_same_reason(tmp_path, bad, why):
    path = shard_with(tmp_path, bad)

    v = verify_shards(str(path))
    assert not v.ok
    member = [p for p in v.problems if p.member == "u2.npy"]
    assert len(member) == 1 and why in member[0].what and "leaves this sample out" in member[0].what
    assert len(v.problems) == 1, v.format()

    i = inspect_shards(str(path), max_frames_list=())
    assert i.shards[0].utts == 3  # what the loader reads: all but the refused sample, which is named
    assert any("'u2.npy'" in p and why in p and "leaves this sample out" in p for p in i.problems)

    with pytest.raises(ShardError, match=f"utterance 'u2'.*{why}"):
        list(iter_decoded(str(path), on_error="raise"))

    tok = tmp_path / "char.json"
    train_tokenizer("char", [tmp_path / "text"], tok)
    loader = make_loader(str(path), tok, max_frames=1000, shuffle_buffer=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [k for b in loader for k in b.keys]
    assert sorted(keys) == ["u0", "u1", "u3"]  # the loader leaves out the sample verify named, alone
    # Planned from its headers (no index), the shard's refused sample is known lost; the tar is whole.
    assert loader.stats.corrupt_shards == 0 and loader.stats.dropped == {"unreadable": 1}
    assert any(why in str(w.message) and "u2" in str(w.message) for w in caught)
