"""features="waveform": the loader's padded, augmented waveforms, from which wdsprep.Fbank on the
device gives the loader's own fbank batches; the plan, keys and len as with features="fbank", on
any topology."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from audio_shards import audio_like, demo_waves, feature_shards
from shardsets import train_char_tokenizer

import wdsprep
from wdsprep.device import Fbank
from wdsprep.format.index import read_index

pytestmark = pytest.mark.timeout(300)

SPEED = {"speed": {"factors": [0.9, 1.0, 1.1]}}
# Every waveform part that needs no folder of recordings, drawn per utterance.
MORE = {**SPEED, "clip": {"prob": 0.5}, "lowpass": {"prob": 0.5}, "codec": {"formats": ["mulaw"], "prob": 0.5}}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The demo train set as FLAC shards (and the feature shards they are laid out from), a tokenizer."""
    root = tmp_path_factory.mktemp("waveform")
    feats = feature_shards(root, backend="numpy")
    flac = audio_like(feats, root / "flac")
    return feats, flac, train_char_tokenizer(root, demo_waves()[2] / "text")


def epoch(flac, tok, features: str, augment=None, **kw) -> list:
    loader = wdsprep.make_loader(f"{flac}/*/data-*.tar", str(tok), max_frames=3000, seed=9, augment=augment,
                                 features=features, **kw)
    loader.set_epoch(1)
    batches = list(loader)
    assert len(loader) == len(batches)
    return batches


@pytest.mark.parametrize("augment", [None, SPEED, MORE], ids=["plain", "speed", "speed+clip+lowpass+codec"])
def test_fbank_of_the_waveform_batches_equals_the_loaders_fbank_batches(shards, augment):
    """For every utterance: wdsprep.Fbank (the index's options, float64) of batch.audio equals the
    features="fbank" loader's batch within 1e-3; keys, frame counts and len identical."""
    _, flac, tok = shards
    fb, wv = epoch(flac, tok, "fbank", augment), epoch(flac, tok, "waveform", augment)
    assert len(fb) == len(wv) and len(fb) > 1
    opts = read_index(next(p for p in sorted(flac.iterdir()) if (p / "index.json").exists())).audio
    module = Fbank(num_mel_bins=opts.num_mel_bins, sample_rate=opts.sample_rate)
    seen, worst, prefixes = 0, 0.0, set()
    for a, b in zip(fb, wv):
        assert a.keys == b.keys
        assert torch.equal(a.feat_lens, b.feat_lens) and torch.equal(a.labels, b.labels)
        assert b.audio.dtype == torch.float32 and b.audio_lens.dtype == torch.int64
        assert b.audio.shape == (len(b.keys), int(b.audio_lens.max())) and b.feats.shape[2] == 0
        assert a.audio is None and a.audio_lens is None
        feats, lens = module(b.audio.double(), b.audio_lens)
        assert torch.equal(lens, a.feat_lens)
        for i, n in enumerate(lens.tolist()):
            assert not b.audio[i, int(b.audio_lens[i]):].any()  # zero-padded
            worst = max(worst, float((feats[i, :n] - a.feats[i, :n].double()).abs().max()))
        prefixes.update(k.split("-", 1)[0] for k in b.keys if k.startswith("sp"))
        seen += len(b.keys)
    assert worst < 1e-3, worst
    assert seen == sum(1 for _ in read_index_keys(flac))
    assert (augment is None) == (not prefixes)


def read_index_keys(flac):
    for p in sorted(flac.iterdir()):
        if (p / "index.json").exists():
            yield from read_index(p).keys()


def test_waveform_batches_are_the_same_on_two_ranks_with_workers(shards):
    """(1 rank, 0 workers) and (2 ranks in-process, 2 workers each) deliver the same batches, bit for bit
    (the plan fixed by streams=4, as on any topology)."""
    _, flac, tok = shards
    one = {tuple(b.keys): b for b in epoch(flac, tok, "waveform", MORE, streams=4)}
    two = [b for r in range(2) for b in epoch(flac, tok, "waveform", MORE, rank=r, world_size=2, num_workers=2,
                                                     streams=4)]
    assert sorted(tuple(b.keys) for b in two) == sorted(one)
    for b in two:
        a = one[tuple(b.keys)]
        assert torch.equal(a.audio, b.audio) and torch.equal(a.audio_lens, b.audio_lens)
        assert torch.equal(a.feat_lens, b.feat_lens) and torch.equal(a.labels, b.labels)


def test_waveform_is_refused_for_feature_shards_and_with_specaugment(shards):
    feats, flac, tok = shards
    with pytest.raises(ValueError, match="needs audio shards"):
        wdsprep.make_loader(f"{feats}/*/data-*.tar", str(tok), max_frames=3000, features="waveform")
    with pytest.raises(ValueError, match="SpecAugmentModule"):
        wdsprep.make_loader(f"{flac}/*/data-*.tar", str(tok), max_frames=3000, features="waveform",
                            augment={"specaugment": {}})
    with pytest.raises(ValueError, match="dither 1.0 with features='waveform'"):
        wdsprep.make_loader(f"{flac}/*/data-*.tar", str(tok), max_frames=3000, features="waveform",
                            fbank={"dither": 1.0})
    with pytest.raises(ValueError, match="features must be one of"):
        wdsprep.make_loader(f"{flac}/*/data-*.tar", str(tok), max_frames=3000, features="mfcc")


def test_batch_to_keeps_the_waveform(shards):
    _, flac, tok = shards
    b = epoch(flac, tok, "waveform")[0]
    moved = b.to("cpu")
    assert torch.equal(moved.audio, b.audio) and torch.equal(moved.audio_lens, b.audio_lens)
    assert np.array_equal(moved.feat_lens.numpy(), b.feat_lens.numpy())
