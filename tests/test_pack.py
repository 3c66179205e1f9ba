"""``pack``: Kaldi arks written by kaldiio -> shards, read back with plain tarfile + numpy."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.parse import unquote

import kaldiio
import numpy as np
import pytest

from wdsprep import StrictError, pack_data
from wdsprep.format.index import read_index
from wdsprep.format.keys import decode_key, encode_key
from wdsprep.prep.kaldi import KaldiDataError

# Ids a real Kaldi data dir has, plus the awkward ones keys must survive.
IDS = [f"spk{i % 4}-utt{i:03d}" for i in range(40)] + [
    "sp1.1-spk1-utt3", "sp0.9-spk2-utt7", "a.b.c", "100%-sure", "dir/like", "中文-utt1",
]


def write_ark(path: Path, feats: dict[str, np.ndarray], compress: bool = False) -> Path:
    """An ark + scp written by kaldiio; returns the scp."""
    scp = path.with_suffix(".scp")
    kaldiio.save_ark(str(path), feats, scp=str(scp), compression_method=2 if compress else None)
    return scp


def write_text(path: Path, texts: dict[str, str]) -> Path:
    path.write_text("".join(f"{k} {v}\n" for k, v in texts.items()), encoding="utf-8")
    return path


def read_shard(path: Path) -> dict[str, dict[str, bytes]]:
    """key -> {ext: bytes}, with nothing but the standard library."""
    out: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            key, _, ext = m.name.partition(".")
            out.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return out


def load_npy(b: bytes) -> np.ndarray:
    return np.load(io.BytesIO(b), allow_pickle=False)


@pytest.fixture
def corpus(tmp_path):
    """Two uncompressed + one compressed ark, two text files in other orders."""
    rng = np.random.default_rng(0)
    feats = {u: rng.standard_normal((int(rng.integers(3, 400)), 13)).astype(np.float32) for u in IDS}
    texts = {u: f"transcript of {u}  with  inner spaces" for u in IDS}
    ids = list(feats)
    scps = [
        write_ark(tmp_path / "a.ark", {u: feats[u] for u in ids[:20]}),
        write_ark(tmp_path / "b.ark", {u: feats[u] for u in ids[20:35]}),
        write_ark(tmp_path / "c.ark", {u: feats[u] for u in ids[35:]}, compress=True),
    ]
    # The compressed ark holds what kaldiio decompresses, so compare against that.
    feats.update(kaldiio.load_scp(str(scps[2])))
    rev = ids[::-1]
    txts = [write_text(tmp_path / "t1", {u: texts[u] for u in rev[:25]}),
            write_text(tmp_path / "t2", {u: texts[u] for u in rev[25:]})]
    return tmp_path, scps, txts, feats, texts


def all_samples(out: Path) -> dict[str, tuple[str, dict[str, bytes]]]:
    """uttid -> (folder, members) over every shard under out; fails on a duplicate."""
    found: dict[str, tuple[str, dict[str, bytes]]] = {}
    for shard in sorted(out.rglob("*.tar")):
        for key, members in read_shard(shard).items():
            uttid = unquote(key)
            assert uttid not in found, f"{uttid} in two shards"
            found[uttid] = (shard.parent.name, members)
    return found


def test_every_utterance_packed_in_its_group_and_readable_without_wdsprep(corpus):
    tmp, scps, txts, feats, texts = corpus
    out = tmp / "out"
    report = pack_data(scps, txts[::-1], out, filter_group=["10:100", "100:250", "250:"], utts_per_shard=7)

    found = all_samples(out)
    lost = {d["uttid"] for d in report.dropped["outside_groups"]}
    assert lost == {u for u, f in feats.items() if f.shape[0] < 10}
    assert set(found) | lost == set(IDS) and not set(found) & lost
    for uttid, (folder, members) in found.items():
        n = feats[uttid].shape[0]
        expected = "10_100" if n < 100 else "100_250" if n < 250 else "250_inf"
        assert folder == expected
        assert set(members) == {"npy", "txt"}
        np.testing.assert_array_equal(load_npy(members["npy"]), feats[uttid])
        assert members["txt"].decode("utf-8") == texts[uttid]
    for shard in out.rglob("*.tar"):
        assert len(read_shard(shard)) <= 7
    report_json = json.loads((out / "pack_report.json").read_text())
    assert report_json["written"]["utterances"] == len(found)
    assert {d["uttid"] for d in report_json["not_written"]["outside_groups"]} == lost


def test_index_matches_the_tars(corpus):
    tmp, scps, txts, feats, texts = corpus
    out = tmp / "out"
    pack_data(scps, txts, out, filter_group=[":100", "100:"], utts_per_shard=5)
    for folder in ("0_100", "100_inf"):
        index = read_index(out / folder)
        assert index.layout == "cat" and index.dims == 13
        assert [s.name for s in index.shards] == sorted(p.name for p in (out / folder).glob("*.tar"))
        for info in index.shards:
            members = read_shard(out / folder / info.name)
            assert info.keys == list(members)
            assert info.frames == [feats[decode_key(k)].shape[0] for k in info.keys]
            assert info.text_lens == [len(texts[decode_key(k)]) for k in info.keys]
            assert info.num_frames == sum(info.frames)


def test_keys_round_trip_and_never_collide():
    for uttid in IDS + ["x%2E", "x.", "x%", "a_b", "a-b", "ü"]:
        key = encode_key(uttid)
        assert unquote(key) == uttid
        assert "." not in key and "/" not in key
    assert encode_key("x.") != encode_key("x%2E")
    assert len({encode_key(u) for u in IDS}) == len(IDS)


def test_cat_v3_layout_and_no_groups(corpus):
    tmp, scps, txts, feats, texts = corpus
    out = tmp / "out"
    pack_data(scps, txts, out, layout="cat-v3")
    shards = list(out.glob("*.tar"))
    assert shards and not [p for p in out.iterdir() if p.is_dir()]
    found = all_samples(out)
    assert set(found) == set(IDS)
    members = found["sp1.1-spk1-utt3"][1]
    assert set(members) == {"mat.npy", "label.txt"}
    np.testing.assert_array_equal(load_npy(members["mat.npy"]), feats["sp1.1-spk1-utt3"])


def test_float16_halves_bytes(corpus):
    tmp, scps, txts, feats, texts = corpus
    pack_data(scps, txts, tmp / "f32")
    with pytest.warns(UserWarning, match="CAT's own reader"):
        pack_data(scps, txts, tmp / "f16", dtype="float16")
    f16 = all_samples(tmp / "f16")
    x = load_npy(f16["spk1-utt001"][1]["npy"])
    assert x.dtype == np.float16
    np.testing.assert_allclose(x.astype(np.float32), feats["spk1-utt001"], atol=4e-3)
    size = lambda d: sum(p.stat().st_size for p in d.glob("*.tar"))  # noqa: E731
    assert size(tmp / "f16") < 0.6 * size(tmp / "f32")
    assert read_index(tmp / "f16").dtype == "float16"


def test_two_jobs_pack_the_same_utterances_as_one(corpus):
    tmp, scps, txts, feats, texts = corpus
    pack_data(scps, txts, tmp / "nj1", filter_group=[":200", "200:"], utts_per_shard=6, progress=False)
    pack_data(scps, txts, tmp / "nj2", filter_group=[":200", "200:"], utts_per_shard=6, nj=2, progress=False)
    one, two = all_samples(tmp / "nj1"), all_samples(tmp / "nj2")
    assert set(one) == set(two) == set(IDS)
    for u in IDS:
        assert one[u][0] == two[u][0]
        assert one[u][1] == two[u][1]
    assert not list((tmp / "nj2").rglob(".w*")), "hidden worker shards left behind"


def test_missing_labels_features_and_empty_text_are_reported(corpus):
    tmp, scps, txts, feats, texts = corpus
    text = write_text(tmp / "partial", {**{u: texts[u] for u in IDS[5:]}, "ghost-utt": "no features", IDS[6]: ""})
    out = tmp / "out"
    report = pack_data(scps, [text], out, max_lost=1)
    got = json.loads((out / "pack_report.json").read_text())
    assert {d["uttid"] for d in got["not_written"]["missing_label"]} == set(IDS[:5])
    assert [d["uttid"] for d in got["not_written"]["missing_features"]] == ["ghost-utt"]
    assert got["flagged"]["empty_text"] == [IDS[6]]
    assert read_shard_text(out, IDS[6]) == ""
    assert report.num_dropped == 6


def read_shard_text(out: Path, uttid: str) -> str:
    return all_samples(out)[uttid][1]["txt"].decode()


def test_bad_features_are_reported_not_packed(tmp_path):
    good = np.ones((20, 4), np.float32)
    nan = good.copy()
    nan[3, 1] = np.nan
    scp = write_ark(tmp_path / "a.ark",
                    {"good": good, "nan": nan, "vector": np.ones(5, np.float32), "inf": good * np.inf})
    # An entry pointing past the end of the ark: what a truncated copy looks like.
    with open(scp, "a") as f:
        f.write(f"cut {tmp_path / 'a.ark'}:999999\n")
    text = write_text(tmp_path / "text", {u: "x" for u in ["good", "nan", "vector", "inf", "cut"]})
    report = pack_data([scp], [text], tmp_path / "out", max_lost=1)
    bad = {d["uttid"]: d["why"] for d in report.dropped["bad_features"]}
    assert set(bad) == {"nan", "vector", "inf", "cut"}
    assert "2-D" in bad["vector"] and "NaN" in bad["nan"]
    assert f"{tmp_path / 'a.ark'}: byte offset 999,999 is past the end of the ark" in bad["cut"]
    assert set(all_samples(tmp_path / "out")) == {"good"}


def test_features_that_change_after_the_headers_pass_are_reported_not_packed(corpus, monkeypatch, tmp_path):
    """An ark rewritten between the headers pass and the writing of a shard: a matrix whose frames or
    dims are no longer what its header gave is dropped as bad_features, naming the ark; the rest of
    its shard is packed."""
    from wdsprep.prep.ark import ArkReader

    tmp, scps, txts, feats, texts = corpus
    real, calls = ArkReader.load, []

    def load(self, rxfile):  # the headers pass reads headers alone; this is the writing
        m = real(self, rxfile)
        calls.append(rxfile)
        return {1: m[:-1], 2: m[:, :-1]}.get(len(calls), m)

    monkeypatch.setattr(ArkReader, "load", load)
    report = pack_data(scps, txts, tmp_path / "out", shuffle=False, utts_per_shard=100, progress=False, max_lost=1)
    bad = report.dropped["bad_features"]
    assert [d["uttid"] for d in bad] == IDS[:2]  # the first two read (input order)
    assert f"{len(feats[IDS[0]]) - 1} frames, {len(feats[IDS[0]])} when the pack measured it: {calls[0]} " \
           f"changed during the pack" in bad[0]["why"]
    assert f"12 feature dims, 13 when the pack measured it: {calls[1]} changed" in bad[1]["why"]
    assert set(all_samples(tmp_path / "out")) == set(IDS[2:])


def test_the_resume_record_is_the_plan_files_options(corpus):
    """``PackOptions.record()`` is what pack_plan.json keeps as ``options``: the keys and order a plan
    written by an earlier pack holds (a stopped pack resumes only if they match), the groups in
    one spelling, and pack-audio's fbank options flat after its own, with the backend resolved."""
    from wdsprep.pack.options import AudioOptions, PackOptions
    from wdsprep.prep.options import FbankOptions

    tmp, scps, txts, feats, texts = corpus
    options = PackOptions(filter_group=["150:", ":150"], utts_per_shard=20, seed=3)
    assert list(options.record()) == ["fmt", "filter_group", "utts_per_shard", "layout", "dtype", "dims", "shuffle",
                                      "seed"]
    assert options.record()["filter_group"] == ["0:150", "150:"]
    pack_data(scps, txts, tmp / "out", filter_group=["150:", ":150"], utts_per_shard=20, seed=3, progress=False)
    assert json.loads((tmp / "out" / "pack_plan.json").read_text())["options"] == options.record()
    audio = PackOptions(layout="flac", audio=AudioOptions(FbankOptions(backend="numpy", dither=0.5), "flac"))
    assert audio.record() == {"fmt": "data-%05d.tar", "filter_group": None, "utts_per_shard": 2000, "layout": "flac",
                              "dtype": "float32", "shuffle": True, "seed": 0, "num_mel_bins": 80, "sample_rate": 16000,
                              "dither": 0.5, "backend": "numpy", "store": "flac"}  # channel: none picked


def test_strict_fails_after_writing_the_report(corpus):
    tmp, scps, txts, feats, texts = corpus
    with pytest.raises(StrictError, match="outside_groups"):
        pack_data(scps, txts, tmp / "out", filter_group=["50:"], strict=True)
    assert (tmp / "out" / "pack_report.json").is_file()


@pytest.mark.parametrize("case", ["dup_scp", "dup_text", "bad_line", "not_utf8", "no_ark"])
def test_bad_input_names_file_and_line(tmp_path, case):
    scp = write_ark(tmp_path / "a.ark", {"u1": np.ones((5, 2), np.float32), "u2": np.ones((6, 2), np.float32)})
    text = write_text(tmp_path / "text", {"u1": "a", "u2": "b"})
    scps, texts = [scp], [text]
    if case == "dup_scp":
        scps = [scp, write_ark(tmp_path / "b.ark", {"u2": np.ones((3, 2), np.float32)})]
        where = f"{tmp_path / 'b.scp'}:1"
    elif case == "dup_text":
        texts = [text, write_text(tmp_path / "text2", {"x": "y", "u1": "again"})]
        where = f"{tmp_path / 'text2'}:2"
    elif case == "bad_line":
        scp.write_text(scp.read_text() + "u3\n")
        where = f"{scp}:3"
    elif case == "not_utf8":
        text.write_bytes(text.read_bytes() + "u3 中文\n".encode("gbk"))
        where = f"{text}:3"
    else:
        scp.write_text(scp.read_text() + "u3 /no/such.ark:15\n")
        where = f"{scp}:3"
    with pytest.raises(KaldiDataError) as e:
        pack_data(scps, texts, tmp_path / "out")
    assert where in str(e.value)


def test_refuses_non_empty_output_unless_overwrite(corpus):
    tmp, scps, txts, feats, texts = corpus
    out = tmp / "out"
    pack_data(scps, txts, out, filter_group=[":100", "100:"])
    with pytest.raises(FileExistsError, match="overwrite"):
        pack_data(scps, txts, out)
    (out / "notes.md").write_text("mine")
    pack_data(scps, txts, out, filter_group=[":250", "250:"], overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["0_250", "250_inf", "notes.md", "pack_plan.json",
                                                     "pack_report.json"]


def test_interrupted_pack_keeps_only_published_shards_and_resume_finishes_it(corpus, monkeypatch, tmp_path):
    """Ctrl-C half-way: no partial file stays, every shard under a final name is a published one
    (listed by an entry), and --resume gives the bytes an uninterrupted pack gives."""
    from wdsprep.format.index import read_index
    from wdsprep.pack import sink as writer

    tmp, scps, txts, feats, texts = corpus
    calls = {"n": 0}
    real_add = writer.ShardSink.add

    def add_then_die(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        real_add(self, *args, **kwargs)

    monkeypatch.setattr(writer.ShardSink, "add", add_then_die)
    out = tmp / "out"
    kw = dict(filter_group=[":200", "200:"], utts_per_shard=4)
    with pytest.raises(KeyboardInterrupt):
        pack_data(scps, txts, out, **kw)
    monkeypatch.undo()
    assert not [p for p in out.rglob("*") if p.name.startswith((".w", "..w")) or p.name.endswith(".tmp")]
    published = {p.name for d in out.iterdir() if d.is_dir() for p in d.glob("data-*.tar")}
    listed = {n for d in out.iterdir() if d.is_dir() for n in read_index(d).names}
    assert published == listed and 0 < len(listed) < 12
    pack_data(scps, txts, out, **kw, resume=True)
    whole = tmp_path / "whole"
    pack_data(scps, txts, whole, **kw)
    digest = lambda d: {str(p.relative_to(d)): p.read_bytes() for p in d.glob("*/data-*.tar")}  # noqa: E731
    assert digest(out) == digest(whole)


def test_groups_must_not_overlap(corpus):
    tmp, scps, txts, feats, texts = corpus
    with pytest.raises(ValueError, match="overlap"):
        pack_data(scps, txts, tmp / "out", filter_group=["10:100", "50:200"])
    with pytest.raises(ValueError, match="LO:HI"):
        pack_data(scps, txts, tmp / "out", filter_group=["10-100"])


def test_groups_in_seconds_are_the_groups_of_their_frames(corpus):
    """``:1s 1s:2.005s 2.005s:`` packs what ``:100 100:201 201:`` packs (an edge that is no whole
    frame rounds up: an utterance of 200 frames, 2.00 s, is shorter than 2.005 s), and records it so."""
    tmp, scps, txts, feats, texts = corpus
    pack_data(scps, txts, tmp / "seconds", filter_group=[":1s", "1s:2.005s", "2.005s:"], progress=False)
    pack_data(scps, txts, tmp / "frames", filter_group=[":100", "100:201", "201:"], progress=False)
    assert all_samples(tmp / "seconds") == all_samples(tmp / "frames")
    assert sorted(p.name for p in (tmp / "seconds").iterdir() if p.is_dir()) == ["0_100", "100_201", "201_inf"]
    plans = [json.loads((tmp / d / "pack_plan.json").read_text())["options"] for d in ("seconds", "frames")]
    assert plans[0] == plans[1]
    with pytest.raises(ValueError, match="in frames or in seconds"):
        pack_data(scps, txts, tmp / "bad", filter_group=[":-1s"])


def test_cli_mirrors_the_api(corpus):
    tmp, scps, txts, feats, texts = corpus
    out = tmp / "out"
    cmd = [sys.executable, "-m", "wdsprep", "pack", "--scp", *map(str, scps), "--text", *map(str, txts),
           "--out", str(out), "--filter-group", ":100", "100:", "--utts-per-shard", "9", "--nj", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "0_100" in r.stdout and "100_inf" in r.stdout
    assert set(all_samples(out)) == set(IDS)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "not empty" in again.stderr
    strict = subprocess.run(cmd[:-4] + ["--filter-group", "100:", "--overwrite", "--strict"],
                            capture_output=True, text=True, timeout=120)
    assert strict.returncode == 1 and "outside_groups" in strict.stderr


def test_webdataset_reads_the_shards(corpus):
    """The shards are plain webdataset shards: its own reader sees every sample with our keys."""
    import webdataset as wds

    tmp, scps, txts, feats, texts = corpus
    pack_data(scps, txts, tmp / "out", utts_per_shard=20)
    urls = sorted(str(p) for p in (tmp / "out").glob("*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=False).decode()  # webdataset's default npy decoder
    got = {decode_key(s["__key__"]): (s["npy"], s["txt"]) for s in ds}
    assert set(got) == set(IDS)
    np.testing.assert_array_equal(got["sp1.1-spk1-utt3"][0], feats["sp1.1-spk1-utt3"])
    assert got["a.b.c"][1] == texts["a.b.c"]


def test_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    """Notepad and some exporters start UTF-8 files with a BOM; Kaldi tables must not see it in the first id."""
    feats = {"u1": np.ones((5, 2), np.float32), "u2": np.ones((6, 2), np.float32)}
    scp = write_ark(tmp_path / "a.ark", feats)
    scp.write_bytes(b"\xef\xbb\xbf" + scp.read_bytes())
    text = write_text(tmp_path / "text", {"u1": "a", "u2": "b"})
    text.write_bytes(b"\xef\xbb\xbf" + text.read_bytes())
    report = pack_data([scp], [text], tmp_path / "out")
    assert report.num_dropped == 0, report.to_json()["not_written"]
    assert set(all_samples(tmp_path / "out")) == {"u1", "u2"}


def ark_with_entries(tmp_path: Path, n: int = 6, dims: int = 5) -> tuple[Path, Path, list[tuple[str, int]]]:
    """An ark of n matrices written by kaldiio, its scp and text; returns (scp, text, [(uttid, offset)])."""
    rng = np.random.default_rng(1)
    feats = {f"u{i}": rng.standard_normal((30 + i, dims)).astype(np.float32) for i in range(n)}
    scp = write_ark(tmp_path / "a.ark", feats)
    entries = [(line.split()[0], int(line.rsplit(":", 1)[1])) for line in scp.read_text().splitlines()]
    return scp, write_text(tmp_path / "text", {u: "x" for u in feats}), entries


def test_truncated_ark_is_reported_with_ark_offset_and_utterance(tmp_path):
    scp, text, entries = ark_with_entries(tmp_path)
    ark = tmp_path / "a.ark"
    cut = entries[3][1] + 40  # inside the 4th matrix's data
    ark.write_bytes(ark.read_bytes()[:cut])
    report = pack_data([scp], [text], tmp_path / "out", max_lost=1)
    bad = {d["uttid"]: d["why"] for d in report.dropped["bad_features"]}
    assert set(bad) == {"u3", "u4", "u5"}
    assert bad["u3"].startswith(f"{ark}: the 33 x 5 FM matrix at byte {entries[3][1]:,} ends at byte")
    assert f"past the end of the ark ({cut:,} bytes): the ark is truncated" in bad["u3"]
    assert f"byte offset {entries[4][1]:,} is past the end of the ark" in bad["u4"]
    assert "AssertionError" not in json.dumps(report.to_json())
    assert set(all_samples(tmp_path / "out")) == {"u0", "u1", "u2"}


def test_offsets_that_do_not_fit_the_ark_are_named(tmp_path):
    import pickle

    scp, text, entries = ark_with_entries(tmp_path)
    ark = tmp_path / "a.ark"
    # A pickled entry kaldiio would unpickle (it runs code): wdsprep must refuse it unread.
    boom = tmp_path / "boom"
    evil = b"PKL" + pickle.dumps(Path.touch.__get__(boom))  # noqa: S301 - the test writes it, never loads it
    with open(ark, "ab") as f:
        evil_at = f.tell()
        f.write(evil)
    lines = scp.read_text().splitlines()
    lines[1] = f"u1 {ark}:{entries[1][1] + 7}"  # off by a few bytes: inside the header
    lines[2] = f"u2 {ark}:{evil_at}"
    scp.write_text("\n".join(lines) + "\n")
    report = pack_data([scp], [text], tmp_path / "out", max_lost=1)
    bad = {d["uttid"]: d["why"] for d in report.dropped["bad_features"]}
    assert set(bad) == {"u1", "u2"}
    assert f"{ark}: no Kaldi matrix at byte {entries[1][1] + 7:,}" in bad["u1"]
    assert "feats.scp and the ark do not belong together" in bad["u1"]
    assert f"no Kaldi matrix at byte {evil_at:,} (found b'PKL" in bad["u2"]
    assert not boom.exists()


@pytest.fixture
def mixed_dims(tmp_path):
    """One 40-dim utterance first, then 80-dim ones: the case where the first utterance decided before."""
    rng = np.random.default_rng(2)
    feats = {"a-first": rng.standard_normal((20, 40)).astype(np.float32)}
    feats.update({f"b-{i:02d}": rng.standard_normal((20 + i, 80)).astype(np.float32) for i in range(9)})
    scp = write_ark(tmp_path / "a.ark", feats)
    return tmp_path, scp, write_text(tmp_path / "text", {u: "x" for u in feats}), feats


@pytest.mark.parametrize("nj", [1, 2])
def test_mixed_dims_fail_by_default_naming_each_dimension(mixed_dims, nj):
    tmp, scp, text, feats = mixed_dims
    out = tmp / f"out{nj}"
    with pytest.raises(ValueError) as e:
        pack_data([scp], [text], out, nj=nj, progress=False)
    msg = str(e.value)
    assert "80 dims in 9 utterance(s), the first b-00" in msg
    assert "40 dims in 1 utterance(s), the first a-first" in msg
    assert "--dims 80" in msg
    assert [p for p in out.rglob("*")] == [], "a failed pack leaves nothing"


@pytest.mark.parametrize("nj", [1, 2])
def test_dims_keeps_one_dimension_and_reports_the_others(mixed_dims, nj):
    tmp, scp, text, feats = mixed_dims
    out = tmp / f"out{nj}"
    report = pack_data([scp], [text], out, dims=80, nj=nj, progress=False, max_lost=1)
    assert set(all_samples(out)) == {u for u, f in feats.items() if f.shape[1] == 80}
    got = json.loads((out / "pack_report.json").read_text())
    assert got["not_written"]["other_dims"] == [{"uttid": "a-first", "why": "40 feature dims; only 80-dim "
                                                                             "features are packed (dims)"}]
    assert got["counts"] == {"other_dims": 1} and report.num_dropped == 1
    assert read_index(out).dims == 80


def test_mixed_dims_on_the_command_line(mixed_dims):
    tmp, scp, text, feats = mixed_dims
    cmd = [sys.executable, "-m", "wdsprep", "pack", "--scp", str(scp), "--text", str(text), "--out", str(tmp / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "different dimensions" in r.stderr and "--dims 80" in r.stderr
    r = subprocess.run(cmd + ["--dims", "80", "--strict"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "other_dims" in r.stderr
    assert len(all_samples(tmp / "o")) == 9


def test_float16_says_only_wdsprep_converts(corpus):
    """CAT's reader (webdataset .decode()) hands float16 arrays on as they are: pack says so."""
    import webdataset as wds

    tmp, scps, txts, feats, texts = corpus
    for layout in ("cat", "cat-v3"):
        cmd = [sys.executable, "-m", "wdsprep", "pack", "--scp", *map(str, scps), "--text", *map(str, txts),
               "--out", str(tmp / layout), "--dtype", "float16", "--layout", layout]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"wdsprep pack: warning: {layout} layout with float16 features" in r.stderr
        assert "UserWarning" not in r.stderr  # a line for the user, not Python's warning format
    ds = wds.WebDataset(sorted(str(p) for p in (tmp / "cat").glob("*.tar")), shardshuffle=False).decode()
    assert {s["npy"].dtype for s in ds} == {np.dtype(np.float16)}  # what CAT's model would get
    with pytest.warns(UserWarning, match="float16 features") as warned:
        pack_data(scps, txts, tmp / "api", dtype="float16", progress=False)
    assert warned[0].filename == __file__  # the line that called pack_data
    with pytest.raises(ValueError, match="dtype 'bfloat16'"):
        pack_data(scps, txts, tmp / "x", dtype="bfloat16")
    assert not (tmp / "x").exists()  # refused before anything was written
