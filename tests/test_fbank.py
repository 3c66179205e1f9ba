"""``wdsprep fbank``: Kaldi conventions, both backends, wav.scp pipes, segments, bad input, parallel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf

from wdsprep import StrictError, compute_fbank
from wdsprep.prep.audio import load_recording, resample
from wdsprep.prep.fbank import BackendUnavailable, Fbank, FbankOptions, resolve_backend

AUDIO = Path(__file__).parent / "data" / "audio"
KNF = "kaldi-native-fbank"
HAVE_SOX = shutil.which("sox") is not None


def torchaudio_reason() -> str | None:
    try:
        resolve_backend("torchaudio")
    except BackendUnavailable as e:
        return str(e)
    return None


TA_MISSING = torchaudio_reason()
needs_torchaudio = pytest.mark.skipif(
    TA_MISSING is not None, reason=f"torchaudio backend not importable here ({TA_MISSING}); `make install` sets it up"
)


def write_scp(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{k} {v}\n" for k, v in rows), encoding="utf-8")
    return path


def feats_of(d: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in kaldiio.load_scp(str(d / "feats.scp")).items()}


def fbank_of_file(path: Path, backend: str = KNF, channel: int = 0) -> np.ndarray:
    data, rate = load_recording(str(path))
    return Fbank(FbankOptions(backend=backend))(resample(data[:, channel], rate, 16000))


def dropped(report_path: Path) -> dict[str, set[str]]:
    rep = json.loads(report_path.read_text())
    return {reason: {x["uttid"] for x in items} for reason, items in rep["not_written"].items()}


# ---------------------------------------------------------------- backends and Kaldi conventions

@needs_torchaudio
@pytest.mark.parametrize("clip", ["en_16k.wav", "en_zh_16k.flac", "zh_22k.wav", "en_16k.mp3", "stereo_16k.wav"])
def test_backends_agree_on_real_speech(clip: str) -> None:
    ta, knf = fbank_of_file(AUDIO / clip, "torchaudio"), fbank_of_file(AUDIO / clip, KNF)
    assert ta.shape == knf.shape and ta.shape[1] == 80
    assert np.abs(ta - knf).max() <= 0.01


@needs_torchaudio
def test_backends_agree_on_quiet_speech() -> None:
    """Every demo utterance and 16 kHz test clip at -28 dBFS, in 16-bit steps as a quiet recording
    is.  Its lowest mel bins hold down to 1e-12 of a frame's energy, where float32 rounding in the
    FFT moves their log: with torchaudio in float32 too the backends differed by up to 0.020 (the
    worst utterance in 100 by 0.0117); torchaudio in float64 leaves knf's own rounding (docs/fbank.md)."""
    clips = sorted(AUDIO.glob("*16k*")) + sorted((AUDIO.parents[2] / "egs/demo/data/audio").glob("*.flac"))
    assert len(clips) > 200
    ta, knf = Fbank(FbankOptions(backend="torchaudio")), Fbank(FbankOptions(backend=KNF))
    worst = []
    for clip in clips:
        data, rate = load_recording(str(clip))
        x = data[:, 0].astype(np.float64)
        assert rate == 16000
        quiet = np.round(x * 10 ** ((-28 - 20 * np.log10(np.sqrt(np.mean((x / 32768) ** 2)))) / 20)).astype(np.float32)
        a, b = ta(quiet), knf(quiet)
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        worst.append(float(np.abs(a - b).max()))
    assert max(worst) <= 0.015 and np.quantile(worst, 0.99) <= 0.008, sorted(worst)[-5:]


@needs_torchaudio
def test_backends_on_upsampled_8k_audio() -> None:
    # Above the original 4 kHz Nyquist the band is (nearly) empty: its log energies are float32
    # rounding noise of the FFT, where the backends may differ a bit more; speech bands agree.
    ta, knf = fbank_of_file(AUDIO / "en_8k.ogg", "torchaudio"), fbank_of_file(AUDIO / "en_8k.ogg", KNF)
    assert np.abs(ta - knf)[:, :60].max() <= 0.01
    assert np.abs(ta - knf).max() <= 0.05


def test_numpy_backend_agrees_with_kaldi_native_fbank_and_torchaudio() -> None:
    """The numpy backend (every frame at once, float64) on every demo utterance and test clip, loud
    and at -28 dBFS: within kaldi-native-fbank's float32 rounding of it, as torchaudio's float64 is;
    and torchaudio's own float64 to 1e-3 (the same exact computation, each rounded to float32)."""
    clips = sorted(AUDIO.glob("*16k*")) + sorted((AUDIO.parents[2] / "egs/demo/data/audio").glob("*.flac"))
    fast, knf = Fbank(FbankOptions(backend="numpy")), Fbank(FbankOptions(backend=KNF))
    ta = Fbank(FbankOptions(backend="torchaudio")) if TA_MISSING is None else None
    worst, worst_ta = [], []
    for clip in clips:
        data, _ = load_recording(str(clip))
        x = data[:, 0].astype(np.float64)
        quiet = np.round(x * 10 ** ((-28 - 20 * np.log10(np.sqrt(np.mean((x / 32768) ** 2)))) / 20)).astype(np.float32)
        for wave in (data[:, 0], quiet):
            a, b = fast(wave), knf(wave)
            assert a.dtype == np.float32 and a.shape == b.shape
            worst.append(float(np.abs(a - b).max()))
            if ta is not None and len(worst_ta) < 40:  # torchaudio is slow; 20 clips say as much
                worst_ta.append(float(np.abs(a - ta(wave)).max()))
    assert max(worst) <= 0.015 and np.quantile(worst, 0.99) <= 0.008, sorted(worst)[-5:]
    assert not worst_ta or max(worst_ta) <= 1e-3, sorted(worst_ta)[-5:]


def test_numpy_backend_dither_draws_from_the_generator_it_is_given() -> None:
    data, _ = load_recording(str(AUDIO / "en_16k.wav"))
    fb = Fbank(FbankOptions(backend="numpy", dither=1.0))
    a, b = fb(data[:, 0], np.random.default_rng(3)), fb(data[:, 0], np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, fb(data[:, 0], np.random.default_rng(4)))
    assert np.abs(a - Fbank(FbankOptions(backend="numpy"))(data[:, 0])).max() > 0
    with pytest.raises(ValueError, match="needs a generator"):
        fb(data[:, 0])


@pytest.mark.parametrize("backend", [KNF, "numpy", pytest.param("torchaudio", marks=needs_torchaudio)])
def test_frame_count_is_kaldi_snip_edges(backend: str) -> None:
    data, _ = load_recording(str(AUDIO / "en_16k.wav"))
    fb = Fbank(FbankOptions(backend=backend))
    for n in (400, 401, 559, 560, 4000, len(data)):
        assert fb(data[:n, 0]).shape == (1 + (n - 400) // 160, 80)
    assert fb.num_frames(399) == 0


def test_samples_are_scaled_to_int16_range(tmp_path: Path) -> None:
    ints, rate = sf.read(AUDIO / "en_16k.wav", dtype="int16")
    sf.write(tmp_path / "float.wav", ints.astype(np.float32) / 32768, rate, subtype="FLOAT")  # in [-1, 1]
    scp = write_scp(tmp_path / "wav.scp", [("f", str(tmp_path / "float.wav")), ("i", str(AUDIO / "en_16k.wav"))])
    compute_fbank(scp, tmp_path / "out", backend=KNF, progress=False)
    feats = feats_of(tmp_path / "out")
    direct = Fbank(FbankOptions(backend=KNF))(ints.astype(np.float32))  # int16 values, as Kaldi reads them
    np.testing.assert_array_equal(feats["f"], feats["i"])
    np.testing.assert_array_equal(feats["i"], direct)


def test_backend_unavailable_is_clear_and_auto_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchaudio", None)  # makes `import torchaudio...` fail
    monkeypatch.setitem(sys.modules, "torchaudio.compliance", None)
    monkeypatch.setitem(sys.modules, "torchaudio.compliance.kaldi", None)
    with pytest.raises(BackendUnavailable, match="--backend kaldi-native-fbank"):
        resolve_backend("torchaudio")
    assert resolve_backend("auto") == KNF
    with pytest.raises(ValueError, match="unknown fbank backend"):
        resolve_backend("librosa")


def test_import_wdsprep_is_cheap() -> None:
    code = "import sys, wdsprep; print(sorted(m for m in ('torch', 'torchaudio', 'scipy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- wav.scp entries

@pytest.mark.skipif(not HAVE_SOX, reason="sox not installed (apt-get install sox)")
def test_pipes_give_the_same_features_as_the_file(tmp_path: Path) -> None:
    wav = AUDIO / "en_16k.wav"
    scp = write_scp(tmp_path / "wav.scp", [
        ("file", str(wav)),
        ("cat", f"cat {wav} |"),
        ("sox", f"sox {wav} -t wav - |"),
        ("flac", f"sox {AUDIO / 'en_zh_16k.flac'} -t wav - |"),
    ])
    compute_fbank(scp, tmp_path / "out", backend=KNF, progress=False)
    feats = feats_of(tmp_path / "out")
    np.testing.assert_array_equal(feats["cat"], feats["file"])
    np.testing.assert_array_equal(feats["sox"], feats["file"])
    np.testing.assert_array_equal(feats["flac"], fbank_of_file(AUDIO / "en_zh_16k.flac"))


def test_stereo_takes_the_mean_of_its_channels_or_the_one_asked_for(tmp_path: Path) -> None:
    stereo = AUDIO / "stereo_16k.wav"
    scp = write_scp(tmp_path / "wav.scp", [("st", str(stereo))])
    compute_fbank(scp, tmp_path / "mean", backend=KNF, progress=False)
    compute_fbank(scp, tmp_path / "c0", backend=KNF, channel=0, progress=False)
    compute_fbank(scp, tmp_path / "c1", backend=KNF, channel=1, progress=False)
    data, _ = load_recording(str(stereo))  # by default, as the loader's readers: the mean of the channels
    mean = Fbank(FbankOptions(backend=KNF))(data.mean(axis=1, dtype=np.float32))
    np.testing.assert_array_equal(feats_of(tmp_path / "mean")["st"], mean)
    left = fbank_of_file(AUDIO / "en_16k.wav")  # the left channel is this clip
    np.testing.assert_array_equal(feats_of(tmp_path / "c0")["st"], left)
    right = feats_of(tmp_path / "c1")["st"]
    np.testing.assert_array_equal(right, fbank_of_file(stereo, channel=1))
    assert np.abs(right - left).mean() > 1.0  # different speech, not a copy of channel 0
    # a segments line may name the channel (Kaldi's optional 5th field); it wins over --channel
    seg = write_scp(tmp_path / "segments", [("a", "st 0 -1 1"), ("b", "st 0 -1 2")])
    compute_fbank(scp, tmp_path / "s", segments=seg, backend=KNF, progress=False)
    np.testing.assert_array_equal(feats_of(tmp_path / "s")["a"], right)
    assert dropped(tmp_path / "s" / "fbank_report.json") == {"bad_segment": {"b"}}
    # --channel beyond a mono file's channels is reported, not fatal
    mono = write_scp(tmp_path / "mono.scp", [("m", str(AUDIO / "en_16k.wav"))])
    compute_fbank(mono, tmp_path / "m", backend=KNF, channel=1, progress=False)
    assert "1 channel(s)" in json.loads((tmp_path / "m" / "fbank_report.json").read_text())[
        "not_written"]["bad_audio"][0]["why"]


@pytest.mark.skipif(not HAVE_SOX, reason="sox not installed (apt-get install sox)")
def test_22k_file_is_resampled_to_16k(tmp_path: Path) -> None:
    clip = AUDIO / "zh_22k.wav"
    scp = write_scp(tmp_path / "wav.scp", [("ours", str(clip)), ("sox", f"sox -D {clip} -r 16000 -t wav - |")])
    compute_fbank(scp, tmp_path / "out", backend=KNF, progress=False)
    feats = feats_of(tmp_path / "out")
    n16 = int(np.ceil(sf.info(str(clip)).frames * 16000 / 22050))
    assert feats["ours"].shape == (1 + (n16 - 400) // 160, 80)
    # a different resampler (sox's) gives nearly the same features: the rate conversion is right
    assert feats["ours"].shape == feats["sox"].shape
    assert np.abs(feats["ours"] - feats["sox"]).mean() < 0.15


# ---------------------------------------------------------------- segments

def test_segments_follow_kaldi_extract_segments(tmp_path: Path) -> None:
    rec = AUDIO / "en_zh_16k.flac"  # 4.196 s
    data, _ = load_recording(str(rec))
    wave = data[:, 0]
    scp = write_scp(tmp_path / "wav.scp", [("rec", str(rec)), ("en", str(AUDIO / "en_16k.wav"))])
    seg = write_scp(tmp_path / "segments", [
        ("rec-a", "rec 0.0 2.9"),
        ("rec-b", "rec 2.9 -1"),  # to the end
        ("rec-over", "rec 3.0 4.5"),  # 0.3 s past the end: truncated
        ("rec-far", "rec 3.0 5.0"),  # 0.8 s past the end: rejected
        ("rec-past", "rec 4.3 4.6"),  # starts after the end
        ("rec-tiny", "rec 1.0 1.05"),  # under Kaldi's 0.1 s minimum
        ("nope-1", "nope 0 1"),  # recording not in wav.scp
        ("en-1", "en 0.2 1.0"),
    ])
    report = compute_fbank(scp, tmp_path / "out", segments=seg, backend=KNF, progress=False)
    feats = feats_of(tmp_path / "out")
    fb = Fbank(FbankOptions(backend=KNF))
    np.testing.assert_array_equal(feats["rec-a"], fb(wave[:int(2.9 * 16000)]))
    np.testing.assert_array_equal(feats["rec-b"], fb(wave[int(2.9 * 16000):]))
    np.testing.assert_array_equal(feats["rec-over"], fb(wave[3 * 16000:]))
    assert dropped(tmp_path / "out" / "fbank_report.json") == {
        "bad_segment": {"rec-far", "rec-past", "rec-tiny"},
        "missing_recording": {"nope-1"},
    }
    why = {x["uttid"]: x["why"] for x in report.dropped["bad_segment"]}
    assert "segments:4" in why["rec-far"] and "0.5 s tolerance" in why["rec-far"]
    # feats.scp lists utterances grouped by recording, in segments order; utt2num_frames matches
    assert list(feats) == ["rec-a", "rec-b", "rec-over", "en-1"]
    u2nf = dict(line.split() for line in (tmp_path / "out" / "utt2num_frames").read_text().splitlines())
    assert {k: int(v) for k, v in u2nf.items()} == {k: v.shape[0] for k, v in feats.items()}


# ---------------------------------------------------------------- bad input, strict, parallel, CLI

def bad_data_dir(tmp_path: Path) -> Path:
    (tmp_path / "text.wav").write_text("this is not audio\n")
    sf.write(tmp_path / "empty.wav", np.zeros(0, dtype=np.int16), 16000)
    sf.write(tmp_path / "short.wav", np.ones(300, dtype=np.int16), 16000)  # < one 25 ms window
    return write_scp(tmp_path / "wav.scp", [
        ("good", str(AUDIO / "en_16k.wav")),
        ("notaudio", str(tmp_path / "text.wav")),
        ("empty", str(tmp_path / "empty.wav")),
        ("short", str(tmp_path / "short.wav")),
        ("gone", str(tmp_path / "gone.wav")),
        ("failpipe", "sh -c 'echo decoder exploded >&2; exit 3' |"),
        ("good2", str(AUDIO / "en_8k.ogg")),
    ])


def test_bad_input_is_reported_not_fatal(tmp_path: Path) -> None:
    compute_fbank(bad_data_dir(tmp_path), tmp_path / "out", backend=KNF, progress=False)
    assert list(feats_of(tmp_path / "out")) == ["good", "good2"]
    report = json.loads((tmp_path / "out" / "fbank_report.json").read_text())
    why = {x["uttid"]: x["why"] for items in report["not_written"].values() for x in items}
    assert dropped(tmp_path / "out" / "fbank_report.json") == {
        "bad_audio": {"notaudio", "empty", "gone", "failpipe"}, "too_short": {"short"}}
    assert "not readable audio" in why["notaudio"] and "no samples" in why["empty"]
    assert "exit 3" in why["failpipe"] and "decoder exploded" in why["failpipe"]
    assert "no such file" in why["gone"]
    assert report["written"]["utterances"] == 2
    assert not list((tmp_path / "out").glob(".*")), "temporary files left behind"


def test_strict_fails_after_writing_the_report(tmp_path: Path) -> None:
    with pytest.raises(StrictError, match="bad_audio"):
        compute_fbank(bad_data_dir(tmp_path), tmp_path / "out", backend=KNF, strict=True, progress=False)
    assert (tmp_path / "out" / "fbank_report.json").is_file()


def test_nj2_gives_the_same_features_as_nj1(tmp_path: Path) -> None:
    scp = write_scp(tmp_path / "wav.scp", [(p.name, str(p)) for p in sorted(AUDIO.glob("*.*")) if p.suffix != ".sh"])
    backend = resolve_backend("auto")
    compute_fbank(scp, tmp_path / "nj1", backend=backend, nj=1, progress=False)
    compute_fbank(scp, tmp_path / "nj2", backend=backend, nj=2, progress=False)
    one, two = feats_of(tmp_path / "nj1"), feats_of(tmp_path / "nj2")
    assert list(one) == list(two)
    for k in one:
        np.testing.assert_allclose(two[k], one[k], rtol=0, atol=1e-5)  # thread count may reorder sums
    assert sorted(p.name for p in (tmp_path / "nj2").glob("*.ark")) == ["feats.1.ark", "feats.2.ark"]
    # rerunning into the same dir with one worker replaces the output and its now-stale second ark
    compute_fbank(scp, tmp_path / "nj2", backend=backend, nj=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "nj2").glob("*.ark")) == ["feats.1.ark"]
    assert list(feats_of(tmp_path / "nj2")) == list(one)


def test_cli(tmp_path: Path) -> None:
    scp = bad_data_dir(tmp_path)
    cmd = [sys.executable, "-m", "wdsprep", "fbank", "--wav-scp", str(scp), "--backend", KNF,
           "--num-mel-bins", "40"]
    ok = subprocess.run([*cmd, "--out-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "bad_audio: 4" in ok.stdout
    assert feats_of(tmp_path / "out")["good"].shape[1] == 40
    strict = subprocess.run([*cmd, "--out-dir", str(tmp_path / "out2"), "--strict"], capture_output=True, text=True)
    assert strict.returncode == 1 and "strict" in strict.stderr
    missing = subprocess.run([*cmd, "--out-dir", str(tmp_path / "out3"), "--segments", str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_interrupted_job_leaves_no_output_under_final_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scp = write_scp(tmp_path / "wav.scp", [("a", str(AUDIO / "en_16k.wav")), ("b", str(AUDIO / "en_8k.ogg"))])
    calls = []

    def fail_on_second(self: Fbank, wave: np.ndarray) -> np.ndarray:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return self._fn(wave)

    monkeypatch.setattr(Fbank, "__call__", fail_on_second)
    with pytest.raises(KeyboardInterrupt):
        compute_fbank(scp, tmp_path / "out", backend=KNF, progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_rerun_stopped_after_the_arks_leaves_no_feats_scp_pointing_into_them(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run renames its arks over the first run's; stopped before its feats.scp is written,
    the first feats.scp must not remain, its offsets pointing into the new arks (other utterances)."""
    from wdsprep.prep import fbank

    out = tmp_path / "out"
    first = write_scp(tmp_path / "wav1.scp", [("a", str(AUDIO / "en_16k.wav")), ("b", str(AUDIO / "zh_22k.wav"))])
    compute_fbank(first, out, backend=KNF, progress=False)
    assert set(feats_of(out)) == {"a", "b"}
    second = write_scp(tmp_path / "wav2.scp", [("b", str(AUDIO / "zh_22k.wav")), ("a", str(AUDIO / "en_16k.wav"))])

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fbank, "write_text", stop)
    with pytest.raises(KeyboardInterrupt):
        compute_fbank(second, out, backend=KNF, progress=False)
    assert not (out / "feats.scp").exists() and not (out / "utt2num_frames").exists()
    monkeypatch.undo()
    compute_fbank(second, out, backend=KNF, progress=False)
    got = feats_of(out)
    np.testing.assert_allclose(got["a"], fbank_of_file(AUDIO / "en_16k.wav"), atol=1e-4)
