"""``wdsprep pack-audio``: the same shards as ``fbank`` then ``pack``, with no ark, its frames planned from the
audio headers."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from shard_readers import iter_tar_samples

from wdsprep import compute_fbank, pack_audio, pack_data, read_index
from wdsprep.format.keys import decode_key

AUDIO = Path(__file__).parent / "data" / "audio"
KNF = "kaldi-native-fbank"
GROUPS = ["0:200", "200:"]


def data_dir(tmp_path: Path) -> tuple[Path, Path, Path]:
    """wav.scp (files, a pipe, a failing pipe), segments and text with English and Mandarin speech."""
    wav = tmp_path / "wav.scp"
    wav.write_text(
        f"long {AUDIO / 'en_zh_16k.flac'}\n"
        f"zh22 {AUDIO / 'zh_22k.wav'}\n"
        f"pipe cat {AUDIO / 'en_16k.wav'} |\n"
        f"st {AUDIO / 'stereo_16k.wav'}\n"
        f"ogg {AUDIO / 'en_8k.ogg'}\n"
        "broken false |\n"
    )
    seg = tmp_path / "segments"
    seg.write_text(
        "long-en long 0.0 2.9\n"
        "long-zh long 2.9 -1\n"
        "long-far long 3.5 5.0\n"
        "zh22-1 zh22 0 -1\n"
        "pipe-1 pipe 0.1 -1\n"
        "st-r st 0 -1 1\n"
        "ogg-1 ogg 0 2.0\n"
        "broken-1 broken 0 1\n"
        "lost-1 lost 0 1\n"
    )
    text = tmp_path / "text"
    text.write_text(
        "long-en the quick brown fox jumps over the lazy dog\n"
        "long-zh 你好 世界\n"
        "long-far too far\n"
        "zh22-1 你好 世界\n"
        "pipe-1 seven shards\n"
        "st-r speech recognition\n"
        "ogg-1 speech recognition needs a lot of data\n"
        "broken-1 never read\n"
        "lost-1 no recording\n"
        "only-text nothing to hear\n"
    )
    return wav, seg, text


def shard_contents(d: Path) -> dict[str, tuple[np.ndarray, str]]:
    out = {}
    for tar in sorted(d.glob("*/*.tar")) + sorted(d.glob("*.tar")):
        for key, members in iter_tar_samples(tar):
            out[decode_key(key)] = (np.load(io.BytesIO(members["npy"]), allow_pickle=False),
                                    members["txt"].decode("utf-8"))
    return out


def dropped(d: Path) -> dict[str, set[str]]:
    rep = json.loads((d / "pack_report.json").read_text())
    return {reason: {x["uttid"] for x in items} for reason, items in rep["not_written"].items()}


def test_pack_audio_equals_fbank_then_pack(tmp_path: Path) -> None:
    wav, seg, text = data_dir(tmp_path)
    compute_fbank(wav, tmp_path / "feats", segments=seg, backend=KNF, progress=False)
    pack_data(tmp_path / "feats" / "feats.scp", [text], tmp_path / "two", filter_group=GROUPS, utts_per_shard=2,
              progress=False, max_lost=1)
    pack_audio(wav, [text], tmp_path / "one", filter_group=GROUPS, segments=seg, backend=KNF, utts_per_shard=2,
               progress=False, max_lost=1)

    one, two = shard_contents(tmp_path / "one"), shard_contents(tmp_path / "two")
    assert sorted(one) == sorted(two) == sorted(["long-en", "long-zh", "zh22-1", "pipe-1", "st-r", "ogg-1"])
    for k in one:
        np.testing.assert_array_equal(one[k][0], two[k][0])
        assert one[k][1] == two[k][1]
    for group in ("0_200", "200_inf"):
        one_index, two_index = read_index(tmp_path / "one" / group), read_index(tmp_path / "two" / group)
        assert one_index.shards == two_index.shards and one_index.sizes.tolist() == two_index.sizes.tolist()
        tars = [sorted((tmp_path / d / group).glob("*.tar")) for d in ("one", "two")]
        for a, b in zip(*tars):
            assert a.read_bytes() == b.read_bytes(), f"{a.name} differs"
    assert not list((tmp_path / "one").rglob("*.ark*")), "the shuffle's temporary ark must be gone"
    assert not (tmp_path / "one" / ".features").exists()

    # every utterance not packed is in the report, with the audio reasons pack alone cannot know
    assert dropped(tmp_path / "one") == {
        "bad_segment": {"long-far"},
        "bad_audio": {"broken-1"},
        "missing_recording": {"lost-1"},
        "missing_audio": {"only-text"},
    }
    rep = json.loads((tmp_path / "one" / "pack_report.json").read_text())
    assert "exit 1" in rep["not_written"]["bad_audio"][0]["why"]  # the failing pipe, reported not fatal


def test_pack_audio_in_parallel_and_from_the_cli(tmp_path: Path) -> None:
    wav, seg, text = data_dir(tmp_path)
    pack_audio(wav, [text], tmp_path / "nj1", segments=seg, backend=KNF, progress=False, max_lost=1)
    cmd = [sys.executable, "-m", "wdsprep", "pack-audio", "--wav-scp", str(wav), "--segments", str(seg),
           "--text", str(text), "--out", str(tmp_path / "nj2"), "--nj", "2", "--backend", KNF, "--strict"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    # --strict: everything is written, then the exit status says utterances were dropped
    assert run.returncode == 1 and "strict" in run.stderr, run.stderr
    assert "bad_audio: 1" in run.stdout
    one, two = shard_contents(tmp_path / "nj1"), shard_contents(tmp_path / "nj2")
    assert list(one) == list(two)
    for k in one:
        np.testing.assert_array_equal(one[k][0], two[k][0])
        assert one[k][1] == two[k][1]
    assert dropped(tmp_path / "nj1") == dropped(tmp_path / "nj2")


def test_pack_audio_shuffled_is_the_same_on_any_nj_and_unshuffled_writes_no_ark(tmp_path: Path, monkeypatch) -> None:
    import wdsprep.pack.sink as sink

    wav, seg, text = data_dir(tmp_path)
    for name, nj in (("nj1", 1), ("nj2", 2)):
        pack_audio(wav, [text], tmp_path / name, filter_group=GROUPS, segments=seg, backend=KNF, utts_per_shard=2,
                   nj=nj, seed=7, progress=False, max_lost=1)
    tars = [sorted((tmp_path / d).rglob("*.tar")) for d in ("nj1", "nj2")]
    assert [p.relative_to(tmp_path / "nj1") for p in tars[0]] == [p.relative_to(tmp_path / "nj2") for p in tars[1]]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*tars))

    arks = []
    real = sink.ShardSink.add

    def watch(self, uttid, feats, text):  # no ark anywhere while the features stream
        arks.extend(tmp_path.joinpath("plain").rglob("*.ark*"))
        real(self, uttid, feats, text)

    monkeypatch.setattr(sink.ShardSink, "add", watch)
    pack_audio(wav, [text], tmp_path / "plain", filter_group=GROUPS, segments=seg, backend=KNF, utts_per_shard=2,
               shuffle=False, progress=False, max_lost=1)
    monkeypatch.undo()
    assert not arks
    compute_fbank(wav, tmp_path / "feats", segments=seg, backend=KNF, progress=False)
    pack_data(tmp_path / "feats" / "feats.scp", [text], tmp_path / "two", filter_group=GROUPS, utts_per_shard=2,
              shuffle=False, progress=False, max_lost=1)
    for group in ("0_200", "200_inf"):
        assert read_index(tmp_path / "plain" / group).shards == read_index(tmp_path / "two" / group).shards


def test_frames_planned_from_audio_headers_are_fbank_frames_frame_for_frame(tmp_path: Path) -> None:
    """pack-audio plans every utterance's frames from its recording's header alone; on real audio
    (FLAC segments, 22 kHz WAV and 8 kHz Ogg resampled, MP3, a pipe, a stereo channel, the bundled
    corpus) they are the frames fbank computes, and what cannot be packed is found the same way.  The
    waveforms it reads in shuffled order (a segment of a FLAC alone, without decoding the recording)
    are those fbank reads in order, sample for sample."""
    import random

    from wdsprep.prep.audio import (
        AudioProblem,
        AudioReadError,
        WaveSource,
        iter_waveforms,
        planned_samples,
        probe_recording,
        read_utterances,
    )
    from wdsprep.prep.fbank import Fbank, FbankOptions, iter_features
    from wdsprep.report import Report
    from wdsprep.units import fbank_frames

    wav, seg, text = data_dir(tmp_path)
    with open(wav, "a") as f:
        f.write(f"mp3 {AUDIO / 'en_16k.mp3'}\n")
    with open(seg, "a") as f:
        f.write("mp3-1 mp3 0.2 1.0\nlong-short long 1.0 1.005\n")
    demo = Path(__file__).resolve().parent.parent / "egs" / "demo"
    dev = tmp_path / "dev.scp"  # the bundled corpus's dev set, paths made absolute
    dev.write_text("".join(f"{u} {demo / p}\n" for u, p in (line.split() for line in
                                                             (demo / "data/dev/wav.scp").read_text().splitlines())))
    utts = read_utterances(wav, seg, Report()) + read_utterances(dev, None, Report())
    opts = FbankOptions(backend=KNF)
    fbank = Fbank(opts)
    heads: dict[str, object] = {}
    for u in utts:
        try:
            heads.setdefault(u.rxfile, probe_recording(u.rxfile))
        except AudioReadError as e:
            heads.setdefault(u.rxfile, e)
    waves = {u.uttid: w for u, w in iter_waveforms(utts, sample_rate=16000, channel=0,
                                                   min_samples=fbank.window_samples)}
    feats = {u.uttid: f for u, f in iter_features(utts, fbank)}
    checked = 0
    for u in utts:
        n = planned_samples(u, heads[u.rxfile], sample_rate=16000, channel=0, min_samples=fbank.window_samples)
        got = feats[u.uttid]
        if isinstance(got, AudioProblem):
            assert isinstance(n, AudioProblem) and n.reason == got.reason, (u.uttid, n, got)
            continue
        assert not isinstance(n, AudioProblem), (u.uttid, n)
        assert n == len(waves[u.uttid]) and fbank_frames(n, opts.sample_rate) == got.shape[0], u.uttid
        checked += 1
    assert checked == len(utts) - 3 >= 40  # long-far (past the end), broken-1 (a failing pipe), long-short
    order = [u for u in utts if not isinstance(heads[u.rxfile], AudioReadError)]
    random.Random(0).shuffle(order)
    source = WaveSource(sample_rate=16000, channel=0, min_samples=fbank.window_samples)
    for u in order:
        got = source.waveform(u, heads[u.rxfile])
        want = waves[u.uttid]
        if isinstance(want, AudioProblem):
            assert isinstance(got, AudioProblem) and got.reason == want.reason
        else:
            np.testing.assert_array_equal(got, want, err_msg=u.uttid)
    # decoded whole: the pipe, the resampled 22 kHz WAV and 8 kHz Ogg, the MP3; the FLAC segments and
    # 16 kHz WAVs are read alone
    assert source.decoded == 4


def test_stereo_gives_the_features_the_loader_gives_its_member_and_the_report_counts_the_inputs(tmp_path: Path,
                                                                                                  capsys) -> None:
    """One channel rule: packed with --store flac the stereo recording keeps both channels, and the
    loader's features of that member (the mean of its channels) are the features a features pack
    stores for it; --channel still picks one.  The report counts the stereo and the resampled inputs."""
    import soundfile as sf

    from wdsprep import make_loader, train_tokenizer

    wav, text = tmp_path / "wav.scp", tmp_path / "text"
    wav.write_text(f"st {AUDIO / 'stereo_16k.wav'}\ne8 {AUDIO / 'en_8k.ogg'}\nm {AUDIO / 'en_16k.wav'}\n")
    text.write_text("st stereo speech\ne8 eight kilohertz\nm mono speech\n")
    tok = tmp_path / "char.json"
    train_tokenizer("char", [text], tok)
    kw = dict(backend=KNF, progress=False)
    report = pack_audio(wav, text, tmp_path / "flac", store="flac", **kw)
    pack_audio(wav, text, tmp_path / "feats", **kw)
    (tmp_path / "st.scp").write_text(f"st {AUDIO / 'stereo_16k.wav'}\n")
    pack_audio(tmp_path / "st.scp", text, tmp_path / "right", channel=1, max_lost=1, **kw)

    def loaded(out: Path) -> dict[str, np.ndarray]:
        loader = make_loader(out, tok, max_frames=5000, train=False)
        return {k: b.feats[i, :int(b.feat_lens[i])].numpy() for b in loader for i, k in enumerate(b.keys)}

    member = {decode_key(k): m["flac"] for tar in (tmp_path / "flac").glob("*.tar") for k, m in iter_tar_samples(tar)}
    assert sf.info(io.BytesIO(member["st"])).channels == 2 and sf.info(io.BytesIO(member["m"])).channels == 1
    from_member, stored = loaded(tmp_path / "flac"), loaded(tmp_path / "feats")
    np.testing.assert_array_equal(from_member["st"], stored["st"])
    assert np.abs(loaded(tmp_path / "right")["st"] - stored["st"]).mean() > 0.1  # channel 1 alone differs
    assert report.inputs == {"recordings": 3, "multichannel": {"2": 1}, "resampled": {"8000": 1}, "sample_rate": 16000,
                             "channels": "every channel kept, the loader takes their mean"}
    out = capsys.readouterr().out
    assert "inputs: 1 of 2 channels (of 3 recordings): every channel kept" in out, out
    assert "inputs: 1 at 8000 Hz (of 3 recordings), resampled to 16000 Hz" in out
    saved = json.loads((tmp_path / "feats" / "pack_report.json").read_text())["inputs"]
    assert saved["channels"] == "features from the mean of the channels" and saved["resampled"] == {"8000": 1}
    # A pack made when channel 0 was the default recorded it: resumed without --channel, it goes on with it.
    pack_audio(tmp_path / "st.scp", text, tmp_path / "old", channel=0, max_lost=1, **kw)
    assert pack_audio(tmp_path / "st.scp", text, tmp_path / "old", resume=True, max_lost=1, **kw).groups
