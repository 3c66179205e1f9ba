"""Audio shards on the bundled real-speech corpus: the format, features computed in the readers,
and augmentation the plan knows (speed, noise, reverberation, SpecAugment)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from audio_shards import audio_like, demo_waves, feature_shards
from scipy.signal import resample_poly
from shardsets import train_char_tokenizer

from wdsprep import inspect_shards, make_loader, verify_shards
from wdsprep.format.audio import FileAudio
from wdsprep.format.index import AudioIndex, DamagedIndexError, FolderIndex, read_index, write_index
from wdsprep.format.keys import decode_key
from wdsprep.format.reindex import index_shards
from wdsprep.format.samples import iter_decoded
from wdsprep.format.writer import ShardWriter, write_audio_shard
from wdsprep.plan import augment as augment_module
from wdsprep.plan.augment import Draw, Draws, Effect, Noise, SpecAugment, add_noise, parse_augment, spec_augment
from wdsprep.plan.state import StateError
from wdsprep.prep.fbank import Fbank, FbankOptions
from wdsprep.units import fbank_frames

MAX_FRAMES = 3000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Offline kaldi-native-fbank + pack of the demo train set, and FLAC and WAV shards laid out alike."""
    root = tmp_path_factory.mktemp("audio")
    feats = feature_shards(root)
    flac = audio_like(feats, root / "flac")
    wav = audio_like(feats, root / "wav", fmt="wav")
    tok = train_char_tokenizer(root, Path(demo_waves()[2]) / "text")
    return root, feats, flac, wav, tok


def pattern(d: Path) -> str:
    return f"{d}/*/data-*.tar"


def epoch(loader, e: int = 0) -> list:
    loader.set_epoch(e)
    return list(loader)


# ---------------------------------------------------------------- the format


def test_audio_shards_are_plain_tars_that_tarfile_and_webdataset_read(corpus):
    """KEY.flac + KEY.txt members; the audio decodes with plain soundfile to the corpus's samples;
    webdataset groups the samples by key; the index holds rate, fbank options and sample counts."""
    import webdataset as wds

    root, feats, flac, wav, tok = corpus
    waves, texts, _ = demo_waves()
    shard = sorted(flac.glob("*/data-*.tar"))[0]
    with tarfile.open(shard) as tf:
        names = tf.getnames()
        assert names[0].endswith(".flac") and names[1].endswith(".txt") and len(names) % 2 == 0
        key = names[0][:-len(".flac")]
        pcm, rate = sf.read(io.BytesIO(tf.extractfile(names[0]).read()), dtype="int16")
    assert rate == 16000 and np.array_equal(pcm, waves[decode_key(key)])
    samples = list(wds.WebDataset(str(shard), shardshuffle=False))
    assert [s["__key__"] for s in samples] == [n[:-len(".flac")] for n in names[::2]]
    assert samples[0]["txt"].decode() == texts[decode_key(key)]
    for d, fmt in ((flac, "flac"), (wav, "wav")):
        index = read_index(shard.parent if d is flac else sorted(d.glob("*/"))[0])
        assert index.layout == fmt and index.dims == 80 and index.audio == AudioIndex(fmt, 16000)
        ids = [decode_key(k) for k in index.keys()]
        assert index.samples.tolist() == [len(waves[u]) for u in ids]
        assert index.frames.tolist() == [fbank_frames(len(waves[u]), 16000) for u in ids]
        assert json.loads((index.folder / "index.json").read_text())["audio"] == {
            "format": fmt, "sample_rate": 16000, "bits": 16,
            "fbank": {"num_mel_bins": 80, "dither": 0.0, "backend": "numpy"}}


def test_inspect_verify_and_index_treat_audio_shards_as_feature_shards(corpus, tmp_path):
    root, feats, flac, wav, tok = corpus
    for d in (flac, wav):
        assert verify_shards(pattern(d)).ok
    a, f = inspect_shards(pattern(flac), max_frames_list=[]), inspect_shards(pattern(feats), max_frames_list=[])
    assert [(g.name, g.utts, g.frames.sum()) for g in a.groups] == [(g.name, g.utts, g.frames.sum()) for g in f.groups]
    assert {g.layout for g in a.groups} == {"flac"}
    # wdsprep index rebuilds an audio folder's index from the shards alone (headers, no decoding) ...
    copy = shutil.copytree(flac, tmp_path / "copy")
    before = read_index(copy / "0_120")
    for p in (copy / "0_120").glob("index.*"):
        p.unlink()
    result = index_shards(pattern(copy))
    again = read_index(copy / "0_120")
    assert result.ok and "default options" in result.folders[str(copy / "0_120")]
    assert again.frames.tolist() == before.frames.tolist() and again.samples.tolist() == before.samples.tolist()
    assert again.audio == AudioIndex("flac", 16000)
    # ... and a forced rebuild keeps the fbank options the index had
    idx = read_index(copy / "120_inf")
    write_index(copy / "120_inf", FolderIndex.from_shards("flac", 40, "float32", idx.shards, sizes=idx.sizes,
                                                         mtimes=idx.mtimes, audio=AudioIndex("flac", 16000, 40)))
    index_shards(pattern(copy), force=True)
    assert read_index(copy / "120_inf").audio.num_mel_bins == 40


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]


def _rewrite(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _pcm24(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, 16000, format="FLAC", subtype="PCM_24")
    return buf.getvalue()


@pytest.mark.parametrize("damage,why", [
    (lambda data, pcm: data[:len(data) // 2], "does not decode"),  # cut after the header
    (lambda data, pcm: b"RIFF" + data[4:], "not a FLAC stream"),
    (lambda data, pcm: _pcm24(pcm), "24-bit samples"),  # (stereo is read and downmixed: test_waveform)
])
def test_damaged_audio_members_are_named_by_verify_and_skipped_by_the_loader(corpus, tmp_path, damage, why):
    """A FLAC member whose data is cut short, one that is no FLAC, one of 24-bit samples: verify names
    the member; the loader warns naming shard and utterance, counts it, and the step stays."""
    root, feats, flac, wav, tok = corpus
    d = shutil.copytree(flac / "120_inf", tmp_path / "g" / "120_inf")
    shard = sorted(d.glob("data-*.tar"))[0]
    members = _members(shard)
    name, data = members[2]
    pcm, _ = sf.read(io.BytesIO(data), dtype="int16")
    members[2] = (name, damage(data, pcm))
    _rewrite(shard, members)
    index_shards(str(shard), refresh=True)
    result = verify_shards(str(shard))
    assert any(why in p.what and p.member == name for p in result.problems), result.format()
    good = [decode_key(n[:-5]) for n, _ in members[::2] if n != name]
    with pytest.warns(RuntimeWarning, match="shard .*data-.*tar"):
        batches = epoch(make_loader(str(shard), tok, max_frames=MAX_FRAMES))
    got = [k for b in batches for k in b.keys]
    assert set(got) <= set(good) and decode_key(name[:-5]) not in got


def test_a_damaged_audio_index_is_refused_naming_file_and_field(corpus, tmp_path):
    root, feats, flac, wav, tok = corpus
    d = shutil.copytree(flac / "120_inf", tmp_path / "120_inf")
    doc = json.loads((d / "index.json").read_text())
    cases = [
        ({**doc, "audio": {**doc["audio"], "fbank": {**doc["audio"]["fbank"], "backend": "librosa"}}},
         "field 'audio.fbank.backend'"),
        ({k: v for k, v in doc.items() if k != "audio"}, "field 'audio' is missing"),
        ({**doc, "audio": {**doc["audio"], "sample_rate": 8000}}, "index.frames.npy: row 0"),
        ({**doc, "layout": "cat"}, "field 'audio' is there, but layout 'cat'"),
        ({**doc, "dims": 40}, "field 'dims' is 40"),
    ]
    for bad, why in cases:
        (d / "index.json").write_text(json.dumps(bad))
        with pytest.raises(DamagedIndexError, match=why):
            read_index(d)
    (d / "index.json").write_text(json.dumps(doc))
    np.save(d / "index.samples.npy", np.ones(len(read_index(d).frames), np.int32))
    with pytest.raises(DamagedIndexError, match="index.frames.npy: row 0 says"):
        read_index(d)
    (d / "index.samples.npy").unlink()
    with pytest.raises(DamagedIndexError, match="index.samples.npy: is missing"):
        read_index(d)


def test_the_writer_refuses_what_the_loader_could_not_use(tmp_path):
    with pytest.raises(ValueError, match="give the sample rate"):
        ShardWriter(tmp_path / "a.tar", "flac")
    with pytest.raises(ValueError, match="fewer than one frame"):
        write_audio_shard(tmp_path / "b.tar", [("u1", np.zeros(399, np.int16), "x")], layout="flac", sample_rate=16000)
    with pytest.raises(ValueError, match="must be int16 samples"):
        write_audio_shard(tmp_path / "c.tar", [("u1", np.zeros(1600, np.float32), "x")], layout="flac",
                          sample_rate=16000)
    with pytest.raises(ValueError, match=r"\[n, channels\] \(1 to 8\)"):
        write_audio_shard(tmp_path / "c.tar", [("u1", np.zeros((1600, 9), np.int16), "x")], layout="flac",
                          sample_rate=16000)
    assert not list(tmp_path.iterdir())  # nothing left behind
    w = ShardWriter(tmp_path / "d.tar", "flac", sample_rate=16000)
    with pytest.raises(ValueError, match="stores audio, not features"):
        w.write("u1", np.zeros((3, 2), np.float32), "x")
    w.abort()


# ---------------------------------------------------------------- features computed while training


def test_flac_features_equal_offline_fbank_shards_batch_for_batch(corpus):
    """The same plan over feature shards (offline wdsprep fbank + pack, kaldi-native-fbank) and over
    FLAC and WAV shards of the same utterances: the same batches, and features equal to float
    rounding with the same backend, within the backends' agreement with the default one."""
    root, feats, flac, wav, tok = corpus
    want = epoch(make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=3))
    for d, fbank, tol in ((flac, {"backend": "kaldi-native-fbank"}, 1e-5), (wav, {"backend": "kaldi-native-fbank"},
                                                                              1e-5), (flac, None, 0.02)):
        got = epoch(make_loader(pattern(d), tok, max_frames=MAX_FRAMES, seed=3, fbank=fbank))
        assert len(got) == len(want) > 3
        for a, b in zip(want, got):
            assert a.keys == b.keys and a.feat_lens.tolist() == b.feat_lens.tolist()
            assert a.labels.tolist() == b.labels.tolist()
            assert float((a.feats - b.feats).abs().max()) <= tol


def test_fbank_options_for_audio_shards_are_the_indexs_or_the_loaders(corpus):
    root, feats, flac, wav, tok = corpus
    (b,) = epoch(make_loader(str(sorted(flac.glob("120_inf/*.tar"))[0]), tok, max_frames=10**6,
                             fbank={"num_mel_bins": 40}))
    assert b.feats.shape[2] == 40
    with pytest.raises(ValueError, match="fbank has \\['frame_shift'\\]"):  # sample_rate resamples (test_waveform)
        make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, fbank={"frame_shift": 5})
    with pytest.raises(ValueError, match="cannot be seeded"):
        make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, fbank={"dither": 1.0, "backend": "kaldi-native-fbank"})
    with pytest.raises(ValueError, match="fbank options apply to audio shards"):
        make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, fbank={"num_mel_bins": 40})
    # dither with the numpy backend: seeded per utterance, so two loaders agree and differ from dither 0
    runs = [epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=3, fbank=f))[0]
            for f in ({"dither": 1.0}, {"dither": 1.0}, None)]
    assert runs[0].feats.equal(runs[1].feats) and not runs[0].feats.equal(runs[2].feats)


@pytest.mark.timeout(120)
def test_audio_shards_on_a_web_server_give_the_local_batches(corpus):
    """Audio shards served over HTTP (their index files, the sample counts too, beside them): the
    plan and the augmented features are those of the local shards, bit for bit."""
    from remote_servers import http_server

    root, feats, flac, wav, tok = corpus
    names = {g.name: sorted(p.name for p in g.glob("data-*.tar")) for g in sorted(flac.glob("*_*"))}
    aug = {**SPEED, "specaugment": {}}
    want = epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=6, augment=aug))
    with http_server(flac) as srv:
        parts = [f"{g}/data-{{00000..{len(n) - 1:05d}}}.tar" for g, n in names.items()]
        got = epoch(make_loader(f"http://127.0.0.1:{srv.server_port}/{{{','.join(parts)}}}", tok,
                                max_frames=MAX_FRAMES, seed=6, augment=aug))
        assert srv.gets["/0_120/index.samples.npy"] == 1
    assert [b.keys for b in got] == [b.keys for b in want]
    assert all(a.feats.equal(b.feats) for a, b in zip(got, want))


def test_a_loader_reads_one_kind_of_features(corpus):
    root, feats, flac, wav, tok = corpus
    with pytest.raises(ValueError, match="holds features, folder .* flac audio|holds flac audio.* features"):
        make_loader([pattern(feats), pattern(flac)], tok, max_frames=MAX_FRAMES)
    with pytest.raises(ValueError, match="corpus .* holds"):
        make_loader({"a": pattern(feats), "b": pattern(flac)}, tok, max_frames=MAX_FRAMES)


# ---------------------------------------------------------------- speed perturbation


SPEED = {"speed": {"factors": [0.9, 1.0, 1.1]}}


def test_speed_perturbed_batches_have_the_planned_lengths_and_resampled_audio(corpus):
    """Each utterance's factor is drawn by the plan; its batch is cut with the perturbed length
    (B x longest <= max_frames holds for what is delivered), its key says the factor (Kaldi's
    sp0.9-), and its features are those of the audio resampled by exactly that factor."""
    root, feats, flac, wav, tok = corpus
    waves, _, _ = demo_waves()
    loader = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment=SPEED)
    batches = epoch(loader)
    assert len(batches) == len(loader)
    keys = [k for b in batches for k in b.keys]
    plain = [k.split("-", 1)[1] if k.startswith("sp") else k for k in keys]
    assert Counter(plain) == Counter(list(waves))  # every utterance once
    factors = Counter(k.split("-", 1)[0] if k.startswith("sp") else "1.0" for k in keys)
    assert set(factors) == {"sp0.9", "1.0", "sp1.1"} and min(factors.values()) > 30
    fb = Fbank(FbankOptions(backend="numpy"))
    for b in batches:
        lens = b.feat_lens.tolist()
        assert len(b.keys) * max(lens) <= MAX_FRAMES or len(b.keys) == 1
        for i, k in enumerate(b.keys):
            factor, uttid = (float(k[2:].split("-", 1)[0]), k.split("-", 1)[1]) if k.startswith("sp") else (1.0, k)
            pcm = waves[uttid]
            up, down = {0.9: (10, 9), 1.0: (1, 1), 1.1: (10, 11)}[factor]
            assert lens[i] == fbank_frames(-(-len(pcm) * up // down), 16000)
            if i == 0:  # the audio really was resampled: features of scipy's resampling, computed here
                wave = resample_poly(pcm.astype(np.float32), up, down) if up != down else pcm.astype(np.float32)
                np.testing.assert_allclose(b.feats[i, :lens[i]].numpy(), fb(wave.astype(np.float32)), atol=1e-4)
    # the plan counted the perturbed lengths: dry-run's padded frames are the delivered ones
    planned = [loader.source.planned_frames(bid) for bid in loader.source.run(loader.source.start(0)).windows(0)
               .__next__().refs]
    assert sorted(int(f.sum()) for f in planned) == sorted(int(b.feat_lens.sum()) for b in batches)
    # a new epoch draws again; the same seed draws the same
    again = epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment=SPEED))
    assert [b.keys for b in again] == [b.keys for b in batches]
    assert Counter(k for b in epoch(loader, 1) for k in b.keys) != Counter(keys)


def test_the_ctc_rule_is_planned_with_the_perturbed_lengths_so_no_batch_comes_empty(corpus):
    """Issue 35: speed perturbation shortens utterances and the CTC rule then drops some; applied by
    the readers alone it emptied a planned batch, and egs/audio's trainer deadlocked under DDP on
    it.  The plan decides the rule with the perturbed frames and the counted labels: the utterances
    it drops are counted, no batch of any rank comes empty, len is what each rank yields, and the
    readers' own check (the safety net) finds nothing left to drop."""
    root, feats, flac, wav, tok = corpus
    kw = dict(max_frames=500, augment=SPEED, world_size=2, seed=0)  # egs/audio: 1,000 frames over 2 ranks
    loaders = [make_loader(pattern(flac), tok, ctc_subsampling=4, rank=r, **kw) for r in (0, 1)]
    tokens = loaders[0].source.shards.tokens
    # What the readers alone would have done: batches of the plan without the rule whose every
    # utterance fails it.  The first epoch that has one (planning alone, nothing read).
    bare = make_loader(pattern(flac), tok, rank=0, **kw).source.corpus

    def emptied(e: int) -> list[np.ndarray]:
        frames = bare.frames(e)
        return [rows for s in bare.plan(e).streams for rows in (s.batch(j) for j in range(s.num_batches))
                if (frames[rows] // 4 <= tokens[rows]).all()]

    e = next(e for e in range(20) if emptied(e))
    planned = loaders[0].source.corpus.plan(e).dropped["ctc_too_short"]
    assert planned >= sum(len(rows) for rows in emptied(e))
    delivered = []
    for loader in loaders:
        batches = epoch(loader, e)
        assert len(batches) == len(loader) == loader.stats.planned_steps
        assert all(len(b.keys) for b in batches), "a planned batch came empty"
        for b in batches:
            assert (b.feat_lens // 4 > b.label_lens).all()
        delivered += [k for b in batches for k in b.keys]
    assert sum(loader.stats.dropped.get("ctc_too_short", 0) for loader in loaders) == planned  # none by the readers
    assert not {f"sp{f:g}-" for f in (0.9, 1.1)}.isdisjoint(k[:6] for k in delivered)


def test_a_rehearsal_reads_the_augmented_batches_training_gets_and_moves_no_draw(corpus):
    """Loader.rehearse on audio shards with speed perturbation and SpecAugment: the batches it runs
    are the epoch's own, bit for bit (features made and masked as in training), and the epoch
    afterwards is that of a loader that never rehearsed."""
    root, feats, flac, wav, tok = corpus
    kw = dict(max_frames=MAX_FRAMES, seed=5, augment={**SPEED, "specaugment": {"time_masks": 2, "freq_masks": 2}})
    rehearsed, plain = make_loader(pattern(flac), tok, **kw), make_loader(pattern(flac), tok, **kw)
    rehearsed.set_epoch(2)
    seen = []
    rehearsed.rehearse(lambda b: seen.append((list(b.keys), b.feats.clone())), k=3)
    got, want = epoch(rehearsed, 2), epoch(plain, 2)
    assert [b.keys for b in got] == [b.keys for b in want]
    assert all(torch.equal(a.feats, b.feats) and torch.equal(a.labels, b.labels) for a, b in zip(got, want))
    by_keys = {tuple(b.keys): b.feats for b in want}
    assert len(seen) == 3 and all(torch.equal(f, by_keys[tuple(k)]) for k, f in seen)
    assert any(key.startswith("sp") for keys, _ in seen for key in keys)


def test_speed_perturbation_changes_the_plan_and_resume_knows_it(corpus):
    root, feats, flac, wav, tok = corpus
    plain = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5)
    fast = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment={"speed": {"factors": [1.1]}})
    assert sum(b.feat_lens.sum() for b in epoch(fast)) < 0.95 * sum(b.feat_lens.sum() for b in epoch(plain))
    state = json.loads(json.dumps(fast.state_dict()))  # through JSON: the factors come back as lists
    again = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment={"speed": {"factors": [1.1]}})
    again.load_state_dict(state)
    with pytest.raises(StateError, match="speed="):
        plain.load_state_dict(state)
    spec = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment={"specaugment": {}})
    with pytest.raises(StateError, match="fingerprint"):
        spec.load_state_dict(plain.state_dict())


def test_augment_errors_are_one_line_and_say_what_to_do(corpus, tmp_path):
    root, feats, flac, wav, tok = corpus
    cases = [
        (dict(trset=pattern(feats), augment=SPEED), "resamples audio: these shards hold features"),
        (dict(trset=pattern(feats), augment={"noise": {"dir": str(root)}}), "act on audio: these shards hold features"),
        (dict(trset=pattern(flac), augment=SPEED, train=False), "augment is for training"),
        (dict(trset=pattern(flac), augment={"sped": {}}), "augment has \\['sped'\\]"),
        (dict(trset=pattern(flac), augment={"speed": {"factors": [0.93333]}}), "at most two decimals"),
        (dict(trset=pattern(flac), augment={"noise": {"dir": str(tmp_path)}}), "holds no audio file"),
        (dict(trset=pattern(flac), augment={"noise": {"snr": [5, 10]}}), "augment noise: .*dir"),
        (dict(trset=pattern(flac), augment="{not json"), "not valid JSON"),
    ]
    for kw, why in cases:
        with pytest.raises(ValueError, match=why):
            make_loader(kw.pop("trset"), tok, max_frames=MAX_FRAMES, **kw)
    spec = tmp_path / "augment.json"
    spec.write_text(json.dumps(SPEED))
    assert parse_augment(str(spec)) == parse_augment(SPEED) == parse_augment(json.dumps(SPEED))


# ---------------------------------------------------------------- noise, reverberation, SpecAugment


def _noise_dir(d: Path) -> Path:
    """Three noise recordings: white noise, a real recording at 22.05 kHz (resampled when loaded),
    and a 0.3 s tone (shorter than every utterance: looped)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sf.write(d / "white.wav", (rng.standard_normal(48000) * 3000).astype(np.int16), 16000)
    shutil.copy(Path(__file__).parent / "data" / "audio" / "zh_22k.wav", d / "babble.wav")
    t = np.arange(4800) / 16000
    sf.write(d / "tone.flac", (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16), 16000)
    return d


def _rows(loader) -> dict[str, tuple[int, FileAudio]]:
    """Each utterance's row in the loader's shard set and its audio member."""
    shards = loader.dataset.shards
    out = {}
    for s, url in enumerate(shards.urls):
        for j, (uttid, audio, _) in enumerate(iter_decoded(url, lazy=True)):
            out[uttid] = (int(shards.starts[s]) + j, audio)
    return out


def test_noise_is_added_at_the_drawn_snr(corpus, tmp_path):
    """SNR drawn from [5, 15] dB per utterance: what the reader adds to each utterance, measured
    against the clean audio, is at the drawn SNR within 0.5 dB; the batch's features are those of
    that waveform; and the draws spread over the range."""
    root, feats, flac, wav, tok = corpus
    noise = {"dir": str(_noise_dir(tmp_path / "noise")), "snr": [5, 15]}
    loader = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=9, augment={"noise": noise})
    batches = epoch(loader)
    maker, unit = loader.dataset.features, loader.source.corpus_of(0)
    draws = maker.draws(unit.seed, 0)
    part = parse_augment({"noise": noise}).get(Noise)
    bank = maker._bank(part)
    assert len(bank) == 3
    fb = Fbank(FbankOptions(backend="numpy"))
    snrs = []
    rows = _rows(loader)
    for b in batches[:4]:
        for i, k in enumerate(b.keys):
            row, audio = rows[k]
            u = draws.read(row, maker.layout)
            noisy, _ = maker.waveform(audio, row, u, None)
            clean = audio.pcm().astype(np.float64)
            added = noisy.astype(np.float64) - clean
            measured = 10 * np.log10(np.mean(clean ** 2) / np.mean(added ** 2))
            _, drawn = add_noise(clean.astype(np.float32), bank, part, u["noise"])
            assert 5 <= drawn <= 15 and abs(measured - drawn) < 0.5
            snrs.append(drawn)
            n = int(b.feat_lens[i])
            np.testing.assert_allclose(b.feats[i, :n].numpy(), fb(noisy), atol=1e-4)
    assert max(snrs) - min(snrs) > 5
    clean = epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=9))
    assert clean[0].keys == batches[0].keys and not clean[0].feats.equal(batches[0].feats)


def test_a_noise_folder_that_cannot_be_used_is_refused_naming_the_file(corpus, tmp_path):
    root, feats, flac, wav, tok = corpus
    d = tmp_path / "n"
    d.mkdir()
    sf.write(d / "silence.wav", np.zeros(16000, np.int16), 16000)
    with pytest.raises(ValueError, match="silence.wav is silent"):
        make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, augment={"noise": {"dir": str(d)}})
    (d / "silence.wav").write_bytes(b"RIFF not really")
    with pytest.raises(ValueError, match="silence.wav.* is not readable audio"):
        make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, augment={"reverb": {"dir": str(d)}})


def _rir_dir(d: Path) -> Path:
    """Two impulse responses: a direct path after 5 ms and an exponentially decaying tail."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for i, t60 in enumerate((0.2, 0.5)):
        n = int(16000 * t60)
        rir = rng.standard_normal(n) * np.exp(-6.9 * np.arange(n) / n) * 0.1
        rir = np.concatenate([np.zeros(80), [1.0], rir])
        sf.write(d / f"rir{i}.wav", (rir / np.abs(rir).max() * 30000).astype(np.int16), 16000)
    return d


def test_reverb_keeps_the_utterance_in_place_and_at_its_power(corpus, tmp_path):
    root, feats, flac, wav, tok = corpus
    loader = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=2,
                         augment={"reverb": {"dir": str(_rir_dir(tmp_path / "rir"))}})
    batches = epoch(loader)
    maker, rows = loader.dataset.features, _rows(loader)
    draws = maker.draws(loader.source.corpus_of(0).seed, 0)
    k = batches[0].keys[0]
    row, audio = rows[k]
    wet, _ = maker.waveform(audio, row, draws.read(row, maker.layout), None)
    dry = audio.pcm().astype(np.float64)
    assert len(wet) == len(dry)
    assert abs(np.mean(wet.astype(np.float64) ** 2) / np.mean(dry ** 2) - 1) < 1e-3
    lag = np.argmax(np.correlate(wet[:4000], dry[:4000], "full")) - 3999
    assert lag == 0  # aligned at the direct path: labels stay where they were
    assert np.corrcoef(wet, dry)[0, 1] < 0.99  # but it is reverberant


def test_specaugment_masks_feature_shards_as_drawn(corpus):
    """On offline feature shards: each utterance gets its bands and stretches set to its mean, the
    rest untouched; the same seed masks alike, another epoch otherwise."""
    root, feats, flac, wav, tok = corpus
    spec = {"specaugment": {"freq_masks": 2, "freq_width": 10, "time_masks": 2, "time_width": 20}}
    plain = epoch(make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=4))
    masked = epoch(make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=4, augment=spec))
    again = epoch(make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=4, augment=spec))
    assert all(a.feats.equal(b.feats) for a, b in zip(masked, again))
    bands = []
    for a, b in zip(plain, masked):
        assert a.keys == b.keys
        for i in range(len(a.keys)):
            n = int(a.feat_lens[i])
            x, y = a.feats[i, :n].numpy(), b.feats[i, :n].numpy()
            changed = x != y
            fill = np.float32(x.mean())
            assert np.all(y[changed] == fill)  # masked cells hold the utterance's mean
            cols = np.flatnonzero((y == fill).all(axis=0))
            rows_ = np.flatnonzero((y == fill).all(axis=1))
            assert len(cols) <= 2 * 10 and len(rows_) <= 2 * min(20, int(0.2 * n))  # two masks each
            bands.append(len(cols))
            assert (b.feats[i, n:] == 0).all()  # padding stays padding
    assert max(bands) > 0 and min(bands) < max(bands)
    loader = make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=4, augment=spec)
    assert not all(a.feats.equal(b.feats) for a, b in zip(masked, epoch(loader, 1)) if a.keys == b.keys) or \
        [b.keys for b in masked] != [b.keys for b in epoch(loader, 1)]


def test_time_warp_keeps_the_length_and_moves_frames(corpus):
    root, feats, flac, wav, tok = corpus
    spec = {"specaugment": {"freq_masks": 0, "time_masks": 0, "time_warp": 5}}
    plain = epoch(make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=4))
    warped = epoch(make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, seed=4, augment=spec))
    moved = 0
    for a, b in zip(plain, warped):
        assert a.feat_lens.tolist() == b.feat_lens.tolist()
        for i in range(len(a.keys)):
            n = int(a.feat_lens[i])
            x, y = a.feats[i, :n].numpy(), b.feats[i, :n].numpy()
            np.testing.assert_allclose(y[[0, n - 1]], x[[0, n - 1]], atol=1e-4)  # the ends stay
            moved += not np.allclose(x, y, atol=1e-4)
    assert moved > 100


# ---------------------------------------------------------------- the effects' draws


def _philox(seed: int, epoch: int, row: int, n: int, purpose: int = 0) -> np.ndarray:
    """An utterance's uniforms computed here, from numpy alone: the Philox generator keyed by
    (seed, epoch, 12) at counter (0, row, purpose, 0)."""
    key = np.random.SeedSequence([seed, epoch, 12]).generate_state(2, np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=[0, row, purpose, 0])).random(n)


NOISE, REVERB = {"dir": "n"}, {"dir": "r"}


def test_todays_effects_read_fixed_slots_whatever_else_is_on():
    """The draws of speed, noise, reverb and SpecAugment are pinned: noise reads uniforms 0-3 of
    the utterance's stream, reverb 4-5, SpecAugment 6 on (two per mask and two for the warp), each
    whether or not the others are on.  An effect placed before SpecAugment would fail here."""
    assert [k.name for k in augment_module.EFFECTS[:4]] == ["speed", "noise", "reverb", "specaugment"]
    assert len({k.name for k in augment_module.EFFECTS}) == len({k.order for k in augment_module.EFFECTS}) == \
        len(augment_module.EFFECTS)
    spec = {"freq_masks": 3, "time_masks": 1, "time_warp": 4}
    raw = _philox(7, 2, 41, 6 + 2 * (3 + 1 + 1))
    for on in ({"noise": NOISE}, {"reverb": REVERB}, {"specaugment": spec}, {"noise": NOISE, "specaugment": spec},
               {**SPEED, "noise": NOISE, "reverb": REVERB, "specaugment": spec}):
        aug = parse_augment(on)
        u = Draws(7, 2).read(41, aug.layout())
        assert set(u) == set(on)
        want = {"speed": raw[:0], "noise": raw[0:4], "reverb": raw[4:6], "specaugment": raw[6:]}
        for name in on:
            np.testing.assert_array_equal(u[name], want[name])
    # the transforms read their own uniforms: SpecAugment's masks are those its slice says
    feats = np.random.default_rng(0).standard_normal((300, 40)).astype(np.float32)
    part = parse_augment({"specaugment": spec}).get(SpecAugment)
    direct = spec_augment(feats, part, raw[6:])
    np.testing.assert_array_equal(part.apply(feats, Draw(raw[6:])), direct)
    assert (direct != feats).any()


@dataclass(frozen=True)
class PeakClip(Effect):
    """A part as a coming issue would add one: clips the waveform at ``level`` of its peak, with
    probability ``prob`` (its two uniforms: whether, and a level jitter)."""

    name = "peak"
    on_audio = True
    order = 90
    uniforms = 2

    level: float = 0.5
    prob: float = 1.0

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        if draw.u[0] >= self.prob:
            return x
        top = float(np.abs(x).max()) * self.level * (0.9 + 0.2 * draw.u[1])
        return np.clip(x, -top, top).astype(np.float32)


@pytest.fixture
def with_clip(monkeypatch):
    monkeypatch.setattr(augment_module, "EFFECTS", (*augment_module.EFFECTS, PeakClip))


def test_an_effect_appended_moves_no_draw_and_needs_nothing_else(corpus, with_clip):
    """An effect appended to EFFECTS (here a test's own clipping) leaves every draw of today's effects where
    it was, reads a stream of its own (the same uniforms whatever SpecAugment's options), and the
    loader applies it, checks it and fingerprints it with no other change."""
    root, feats, flac, wav, tok = corpus
    spec = {"freq_masks": 3, "time_masks": 1, "time_warp": 4}
    today = {**SPEED, "noise": NOISE, "reverb": REVERB, "specaugment": spec}
    before = parse_augment(today).layout()
    for other in ({"freq_masks": 1}, {"time_masks": 5}):
        after = parse_augment({**today, "specaugment": other, "peak": {}}).layout()
        fixed = ("speed", "noise", "reverb")
        assert {k: after[k] for k in fixed} == {k: before[k] for k in fixed}
        assert after["specaugment"].start == before["specaugment"].start
        u = Draws(7, 2).read(41, after)
        # after the effects of stream 1 (lowpass 0-1, clip 2-3, codec 4-6), whether they are on or not
        np.testing.assert_array_equal(u["peak"], _philox(7, 2, 41, 9, 101)[7:])
    assert parse_augment({"peak": {}}).layout()["peak"] == parse_augment(today | {"peak": {}}).layout()["peak"]
    # the loader: same plan (speed's draws), the clipped audio's features, refused on feature shards
    plain = epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment=SPEED))
    clipped = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment={**SPEED, "peak": {"level": 0.1}})
    got = epoch(clipped)
    assert [b.keys for b in got] == [b.keys for b in plain]
    assert all(not a.feats.equal(b.feats) for a, b in zip(plain, got))
    loose = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment={**SPEED, "peak": {"level": 2.0}})
    assert all(a.feats.equal(b.feats) for a, b in zip(plain, epoch(loose)))  # above the peak: nothing clipped
    assert loose.dataset.fingerprint() != clipped.dataset.fingerprint()  # a resume knows its options
    with pytest.raises(ValueError, match="augment peak act on audio"):
        make_loader(pattern(feats), tok, max_frames=MAX_FRAMES, augment={"peak": {}})


def test_named_corpora_augment_from_their_own_draws(corpus):
    """Mixed corpora: each utterance's augmentation is its corpus's (seed, corpus epoch, row), so
    adding a corpus to the mixture leaves another's augmented features as they were, and workers
    make the same."""
    root, feats, flac, wav, tok = corpus
    aug = {**SPEED, "specaugment": {"time_warp": 2}}
    a, b = f"{flac}/0_120/data-*.tar", f"{flac}/120_inf/data-*.tar"

    def run(trset, weights, workers=0):
        return [(k, bt.feats[i, :int(bt.feat_lens[i])].clone()) for bt in epoch(
            make_loader(trset, tok, max_frames=MAX_FRAMES, seed=2, augment=aug, weights=weights, num_workers=workers))
                for i, k in enumerate(bt.keys)]

    def first(trset, weights):
        seen = {}
        for k, f in run(trset, weights):
            seen.setdefault(k, f)
        return seen

    alone, mixed = first({"a": a}, {"a": 1}), first({"a": a, "b": b}, {"a": 1, "b": 1})

    def bare(k: str) -> str:
        return k.split("-", 1)[1] if k.startswith("sp") else k

    by_id = {bare(k): k for k in alone}
    from_a = [k for k in mixed if bare(k) in by_id]  # the mixed epoch holds about half of corpus a's epoch
    assert len(from_a) > 30 and all(by_id[bare(k)] == k for k in from_a)  # the same speed factor each
    assert any(k.startswith("sp") for k in from_a) and all(alone[k].equal(mixed[k]) for k in from_a)
    # With workers the batches come in another order (a small corpus loops through its epochs, so
    # an utterance recurs, augmented anew): the same utterances with the same features all the same.
    def digests(rows):
        return Counter((k, hash(f.numpy().tobytes())) for k, f in rows)

    assert digests(run({"a": a, "b": b}, {"a": 1, "b": 1}, 2)) == digests(run({"a": a, "b": b}, {"a": 1, "b": 1}))


def test_hyper_ld_augment_and_dry_run_plan(corpus, tmp_path, capsys):
    """hyper-p.json's ld.augment reaches the loader; dry-run --plan plans with the perturbed lengths."""
    from wdsprep.cli import main
    from wdsprep.hyper import make_loader_from_hyper

    root, feats, flac, wav, tok = corpus
    hyper = tmp_path / "hyper-p.json"
    hyper.write_text(json.dumps({"train": {"option": {"ld": {"shards": pattern(flac), "augment": SPEED},
                                                      "tokenizer": str(tok), "bucket_size": MAX_FRAMES,
                                                      "seed": 5}}}))
    loader = make_loader_from_hyper(hyper, world_size=1)
    want = make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=5, augment=SPEED)
    assert [b.keys for b in epoch(loader)] == [b.keys for b in epoch(want)]
    assert main(["dry-run", "--plan", "--trset", pattern(flac), "--max-frames", str(MAX_FRAMES), "--seed", "5",
                 "--augment", json.dumps(SPEED)]) in (0, None)
    out = capsys.readouterr().out
    hours = sum(int(b.feat_lens.sum()) for b in epoch(want)) / 360000
    assert f"{hours:.3f}" in out or f"{hours:.2f}" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train": {"option": {"ld": {"shards": pattern(flac), "augment": {"speed": 1}},
                                                    "tokenizer": str(tok), "bucket_size": MAX_FRAMES}}}))
    with pytest.raises(ValueError, match="bad.json: ld augment speed must be an object"):
        make_loader_from_hyper(bad, world_size=1)


def test_workers_make_the_same_augmented_batches(corpus, tmp_path):
    """Features and every augmentation draw are made in the DataLoader workers, identically."""
    root, feats, flac, wav, tok = corpus
    aug = {**SPEED, "noise": {"dir": str(_noise_dir(tmp_path / "n")), "snr": [10, 20]}, "specaugment": {}}
    runs = [epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=8, augment=aug, num_workers=w,
                              streams=4)) for w in (0, 2)]
    by_key = [{tuple(b.keys): (b.feats.clone(), b.feat_lens.clone()) for b in r} for r in runs]
    assert by_key[0].keys() == by_key[1].keys()
    for k, (f, n) in by_key[0].items():
        assert f.equal(by_key[1][k][0]) and n.equal(by_key[1][k][1])


# ---------------------------------------------------------------- band limit, clipping, codecs

CHANNEL = {"lowpass": {"cutoff": [2500, 3500], "prob": 0.7}, "clip": {"gain": [6, 20], "prob": 0.5},
           "codec": {"formats": ["mulaw", "opus", "mp3"], "prob": 0.8, "bitrate": [8000, 16000]}}


def test_channel_parts_take_stream_one_after_todays_parts_and_move_none_of_their_draws():
    """lowpass, clip and codec are appended: they read uniforms 0-1, 2-3 and 4-6 of stream 1, on or
    off, whatever SpecAugment's options; the effects before keep their slots."""
    assert [k.name for k in augment_module.EFFECTS] == ["speed", "noise", "reverb", "specaugment", "lowpass", "clip",
                                                      "codec"]
    today = {**SPEED, "noise": NOISE, "reverb": REVERB, "specaugment": {"freq_masks": 3}}
    raw = _philox(7, 2, 41, 7, 101)
    for on in (CHANNEL, {"codec": CHANNEL["codec"]}, {**today, "clip": {}}, {**today, **CHANNEL}):
        aug = parse_augment(on)
        u = Draws(7, 2).read(41, aug.layout())
        want = {"lowpass": raw[0:2], "clip": raw[2:4], "codec": raw[4:7]}
        for name in set(on) & set(want):
            np.testing.assert_array_equal(u[name], want[name])
        before = parse_augment(today).layout()
        assert all(slots == before[k] for k, slots in aug.layout().items() if k in today)


def _speechlike(n: int = 16000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    tones = sum(np.sin(2 * np.pi * f * t) * a for f, a in ((220, 6000), (1200, 2000), (5000, 1500)))
    return (tones + rng.standard_normal(n) * 300).astype(np.float32)


def test_channel_transforms_do_what_they_say_and_are_functions_of_their_uniforms():
    from wdsprep.plan.augment import Clip, Codec, Lowpass, clip, codec, lowpass, mulaw

    x = _speechlike()
    spectrum = lambda w: np.abs(np.fft.rfft(w.astype(np.float64)))  # noqa: E731 -- 1 Hz bins
    # lowpass at a drawn cutoff in [2500, 3500]: 5 kHz is gone, 220 Hz stays, nothing moves in time
    part = Lowpass(cutoff=(2500, 3500))
    y = lowpass(x, 16000, part, np.array([0.5, 0.0]))
    assert len(y) == len(x) and y.dtype == np.float32
    assert spectrum(y)[5000] < 1e-3 * spectrum(x)[5000] and abs(spectrum(y)[220] / spectrum(x)[220] - 1) < 0.01
    assert np.array_equal(lowpass(x, 16000, part, np.array([0.5, 0.99])), y)  # prob 1 > 0.99: filtered ...
    assert lowpass(x, 16000, Lowpass(prob=0.5), np.array([0.5, 0.7])) is x  # ... 0.7 >= prob 0.5: not
    assert lowpass(x, 8000, Lowpass(cutoff=(5000, 6000)), np.array([0.0, 0.0])) is x  # above Nyquist
    # clip: gain then full scale
    y = clip(x, Clip(gain=(20, 20)), np.array([0.3, 0.0]))
    assert np.abs(y).max() == 32767 and np.allclose(y[np.abs(y) < 32767], 10 * x[np.abs(y) < 32767], rtol=1e-5)
    # mu-law: 8 bits (at most 256 values), about 38 dB SNR on speech-like audio
    y = mulaw(x)
    err = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean((y - x).astype(np.float64) ** 2))
    assert len(np.unique(y)) <= 256 and 30 < err < 45
    for fmt in ("opus", "mp3"):
        y = codec(x, 16000, Codec(formats=(fmt,)), np.array([0.0, 0.0, 0.5]))
        assert len(y) == len(x) and np.corrcoef(x, y)[0, 1] > 0.9 and not np.array_equal(np.rint(x), y)
    # Each is a function of its input and uniforms: the same draws give the same bits, others others.
    u = np.random.default_rng(3).random(3)
    for fmt in CODECS_ALL:
        part = Codec(formats=(fmt,))
        a, b = codec(x, 16000, part, u), codec(x.copy(), 16000, part, u.copy())
        assert np.array_equal(a, b), fmt
    assert not np.array_equal(codec(x, 16000, Codec(formats=("opus",)), np.array([0.0, 0.0, 0.0])),
                              codec(x, 16000, Codec(formats=("opus",)), np.array([0.0, 0.0, 1.0])))
    with pytest.raises(ValueError, match="opus codes audio at"):
        codec(x, 22050, Codec(formats=("opus",)), np.zeros(3))
    with pytest.raises(ValueError, match="codec formats must be some of"):
        parse_augment({"codec": {"formats": ["gsm"]}})
    with pytest.raises(ValueError, match="lowpass cutoff"):
        parse_augment({"lowpass": {"cutoff": [4000, 3000]}})


CODECS_ALL = ("mulaw", "opus", "mp3")


def test_channel_augmentation_is_the_same_on_any_topology_and_for_the_same_seed(corpus):
    """lowpass + clip + codec (mu-law, Opus, MP3) with speed: (1 rank, 0 workers) and (2 ranks, 2
    workers each) make bit-identical batches, as does a second run with the same seed; another seed
    other features, and the batches are those of speed alone (the channel keeps every length)."""
    root, feats, flac, wav, tok = corpus
    aug = {**SPEED, **CHANNEL}

    def batches(seed: int, world_size: int = 1, workers: int = 0) -> dict[tuple, torch.Tensor]:
        out = {}
        for r in range(world_size):
            for b in epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=seed, augment=aug, streams=4,
                                       rank=r, world_size=world_size, num_workers=workers)):
                out[tuple(b.keys)] = b.feats.clone()
        return out

    one = batches(4)
    two = batches(4, world_size=2, workers=2)
    assert set(two) <= set(one) and len(two) >= len(one) - 2
    assert all(two[k].equal(one[k]) for k in two)
    again = batches(4)
    assert again.keys() == one.keys() and all(again[k].equal(one[k]) for k in one)
    plain = {tuple(b.keys): b.feats for b in epoch(make_loader(pattern(flac), tok, max_frames=MAX_FRAMES, seed=4,
                                                               augment=SPEED, streams=4))}
    assert plain.keys() == one.keys() and sum(not plain[k].equal(one[k]) for k in one) >= len(one) - 1


def test_pack_audio_stores_the_audio_the_loader_makes_the_features_of(corpus, tmp_path, monkeypatch):
    """pack-audio --store flac: the same plan as pack-audio's feature shards (the same utterances
    in the same shards), 16-bit FLAC members, an index recording the fbank options; the loader's
    features from them equal the feature shards' (kaldi-native-fbank on both sides)."""
    from audio_shards import DEMO, GROUPS

    from wdsprep.cli import main

    root, feats, flac, wav, tok = corpus
    _, _, d = demo_waves()
    monkeypatch.chdir(DEMO)  # wav.scp paths are relative to the recipe
    common = ["pack-audio", "--wav-scp", str(d / "wav.scp"), "--text", str(d / "text"), "--filter-group", *GROUPS,
              "--utts-per-shard", "20", "--backend", "kaldi-native-fbank", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "f")]) == 0
    assert main([*common, "--out", str(tmp_path / "a"), "--store", "flac"]) == 0
    for group in ("0_120", "120_inf"):
        fi, ai = read_index(tmp_path / "f" / group), read_index(tmp_path / "a" / group)
        assert ai.names == fi.names and ai.keys() == fi.keys() and ai.frames.tolist() == fi.frames.tolist()
        assert ai.layout == "flac" and ai.audio == AudioIndex("flac", 16000, 80, 0.0, "kaldi-native-fbank")
        with tarfile.open(tmp_path / "a" / group / ai.names[0]) as tf:
            assert tf.getnames()[0].endswith(".flac") and tf.getnames()[1].endswith(".txt")
    want = epoch(make_loader(pattern(tmp_path / "f"), tok, max_frames=MAX_FRAMES, seed=3))
    got = epoch(make_loader(pattern(tmp_path / "a"), tok, max_frames=MAX_FRAMES, seed=3))
    assert len(got) == len(want) > 3
    for a, b in zip(want, got):
        assert a.keys == b.keys and a.feat_lens.tolist() == b.feat_lens.tolist()
        assert float((a.feats - b.feats).abs().max()) <= 1e-5
