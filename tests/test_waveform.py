"""features="waveform": the loader's padded, augmented waveforms, from which wdsprep.Fbank on the
device gives the loader's own fbank batches; the plan, keys and len as with features="fbank", on
any topology."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from audio_shards import audio_like, demo_waves, feature_shards
from shardsets import train_char_tokenizer

import wdsprep
from wdsprep.device import Fbank
from wdsprep.format.index import read_index
from wdsprep.format.keys import decode_key

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


# ---------------------------------------------------------------- any sample rate


def stored_pcm(wave: np.ndarray, rate: int, stereo: bool = False) -> np.ndarray:
    """A 16 kHz demo waveform as stored at ``rate`` (int16, FLAC is lossless); ``stereo``: [n, 2],
    the second channel the first reversed in time and halved (so a downmix is not either)."""
    from wdsprep.prep.audio import resample

    pcm = np.round(resample(wave.astype(np.float32), 16000, rate)).clip(-32768, 32767).astype(np.int16)
    return np.stack([pcm, pcm[::-1] // 2], axis=1) if stereo else pcm


def rate_folder(out: Path, utts: list[str], rate: int, stereo: bool = False) -> Path:
    """A folder of one FLAC shard of the demo utterances ``utts`` stored at ``rate`` Hz (resampled as
    pack-audio does), with its index."""
    from wdsprep.format.index import AudioIndex, FolderIndex, write_index
    from wdsprep.format.writer import write_audio_shard

    waves, texts, _ = demo_waves()
    out.mkdir(parents=True)
    path = out / "data-00000.tar"
    rows = [(u, stored_pcm(waves[u], rate, stereo), texts[u]) for u in utts]
    info = write_audio_shard(path, rows, layout="flac", sample_rate=rate, mtime=0)
    st = path.stat()
    write_index(out, FolderIndex.from_shards("flac", 80, "float32", [info], sizes=[st.st_size],
                                             mtimes=[st.st_mtime_ns], audio=AudioIndex("flac", rate)))
    return out


@pytest.fixture(scope="module")
def rates(tmp_path_factory, shards):
    """An 8 kHz folder and a 16 kHz stereo folder of the demo utterances (every other one each)."""
    root = tmp_path_factory.mktemp("rates")
    ids = sorted(demo_waves()[0])
    return root, rate_folder(root / "r8k", ids[::2], 8000), rate_folder(root / "r16k", ids[1::2], 16000, stereo=True)


@pytest.mark.parametrize("augment", [None, SPEED], ids=["plain", "speed"])
def test_folders_at_8_and_16_khz_stereo_load_together_at_16_khz(rates, shards, augment):
    """The readers resample the 8 kHz rows to 16 kHz and downmix the stereo ones (mean of channels);
    the plan's frames are computed exactly from the stored sample counts and rates and equal every
    utterance's delivered feat_lens; len equals the batches delivered; an 8 kHz utterance's features
    are the numpy fbank of its resampled audio, a stereo one's that of its channels' mean."""
    from wdsprep.plan.augment import Speed, perturbed_samples
    from wdsprep.prep.audio import resample, resampled_length
    from wdsprep.prep.fbank import Fbank as NumpyFbank
    from wdsprep.prep.fbank import FbankOptions
    from wdsprep.units import fbank_frames

    root, r8, r16 = rates
    tok = shards[2]
    stored = {}
    for folder, rate in ((r8, 8000), (r16, 16000)):
        index = read_index(folder)
        for k, n in zip(index.keys(), index.samples):
            stored[decode_key(k)] = (int(n), rate)
    pattern = f"{root}/r*/data-*.tar"
    with pytest.raises(ValueError, match="8000, 16000 Hz: give the rate"):
        wdsprep.make_loader(pattern, str(tok), max_frames=3000)
    loader = wdsprep.make_loader(pattern, str(tok), max_frames=3000, seed=3, fbank={"sample_rate": 16000},
                                 augment=augment)
    loader.set_epoch(0)
    batches = list(loader)
    assert len(batches) == len(loader)
    speed = Speed((0.9, 1.0, 1.1))
    waves = demo_waves()[0]
    seen, checked, rows8, stereo = 0, False, 0, False
    for b in batches:
        assert b.feats.shape[2] == 80
        for i, key in enumerate(b.keys):
            prefix, _, uttid = key.partition("-") if key.startswith("sp") else ("sp1.0", "", key)
            n, rate = stored[uttid]
            factor = float(prefix[2:])
            at16 = perturbed_samples(np.array([resampled_length(n, rate, 16000)]),
                                     np.array([speed.factors.index(factor)]), speed)[0]
            assert int(b.feat_lens[i]) == fbank_frames(int(at16), 16000), key
            rows8 += rate == 8000
            if rate == 8000 and factor == 1.0 and not checked:
                pcm = stored_pcm(waves[uttid], 8000)
                ref = NumpyFbank(FbankOptions(backend="numpy"))(resample(pcm.astype(np.float32), 8000, 16000))
                got = b.feats[i, :int(b.feat_lens[i])].numpy()
                assert ref.shape == got.shape and np.abs(ref - got).max() < 1e-4
                checked = True
            if rate == 16000 and factor == 1.0 and not stereo:
                pcm = stored_pcm(waves[uttid], 16000, stereo=True)
                ref = NumpyFbank(FbankOptions(backend="numpy"))(pcm.astype(np.float32).mean(axis=1, dtype=np.float32))
                got = b.feats[i, :int(b.feat_lens[i])].numpy()
                assert ref.shape == got.shape and np.abs(ref - got).max() < 1e-4
                stereo = True
        seen += len(b.keys)
    assert seen == len(stored) and checked and stereo and rows8 == len(read_index(r8).samples)


def test_mixed_rates_and_stereo_as_waveforms_and_verified(rates, shards):
    """features="waveform" over the 8 kHz and 16 kHz stereo folders: 16 kHz mono waveforms of exactly
    the resampled lengths, feat_lens their frames; verify finds nothing wrong with stereo members or
    with folders of two rates."""
    from wdsprep.check.verify import verify_shards
    from wdsprep.prep.audio import resampled_length
    from wdsprep.units import fbank_frames

    root, r8, r16 = rates
    stored = {decode_key(k): (int(n), rate) for folder, rate in ((r8, 8000), (r16, 16000))
              for k, n in zip(read_index(folder).keys(), read_index(folder).samples)}
    loader = wdsprep.make_loader(f"{root}/r*/data-*.tar", str(shards[2]), max_frames=3000, seed=3,
                                 fbank={"sample_rate": 16000}, features="waveform")
    batches = list(loader)
    assert len(batches) == len(loader) and sum(len(b.keys) for b in batches) == len(stored)
    for b in batches:
        assert b.audio.ndim == 2
        for i, key in enumerate(b.keys):
            n, rate = stored[key]
            assert int(b.audio_lens[i]) == resampled_length(n, rate, 16000)
            assert int(b.feat_lens[i]) == fbank_frames(int(b.audio_lens[i]), 16000)
    # Both folders at once: each is of one rate, as the loader above needs (it resamples between them).
    result = verify_shards(f"{root}/r*/data-*.tar")
    assert not result.problems and result.samples == len(stored), result.format()


def test_pinned_waveform_batches_pin_the_audio_too(shards, monkeypatch):
    """pin_memory=True (CUDA faked): batch.audio is pinned beside the batch's buffer, its values kept."""
    import wdsprep.loader as loader_mod

    _, flac, tok = shards
    plain = {tuple(b.keys): b for b in epoch(flac, tok, "waveform", SPEED, streams=2)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pinned = []
    monkeypatch.setattr(loader_mod, "_pin", lambda t: pinned.append(t.dtype) or t.clone())
    batches = epoch(flac, tok, "waveform", SPEED, streams=2, num_workers=2, pin_memory=True)
    assert pinned.count(torch.float32) == len(batches) and pinned.count(torch.uint8) == len(batches)
    for b in batches:
        assert torch.equal(b.audio, plain[tuple(b.keys)].audio)
        assert not b.audio.untyped_storage().is_shared()
