"""Output others read: wdsprep's shards load with ``datasets.load_dataset("webdataset", ...)`` and with
``webdataset.WebDataset`` (a feature layout and an audio layout), and ``wdsprep export lhotse`` writes
a CutSet manifest ``lhotse.load_manifest`` reads, with the shards' ids, durations, texts and speakers.

A key is the utterance id made safe for webdataset (``decode_key`` gives the id back: the corpus
has ids with dots).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from audio_shards import DEMO, demo_waves
from shardsets import build

from wdsprep import decode_key, pack_audio
from wdsprep.cli import main

AUDIO_UTTS = 40


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Feature shards (random features, dotted ids) and FLAC audio shards of real speech (with utt2spk)."""
    root = tmp_path_factory.mktemp("export")
    feats, utts = build(root, n=60, utts_per_shard=25)
    waves, texts, d = demo_waves()
    ids = list(waves)[:AUDIO_UTTS]
    kaldi = root / "kaldi"
    kaldi.mkdir()
    paths = dict(line.split(" ", 1) for line in (d / "wav.scp").read_text().splitlines())
    (kaldi / "wav.scp").write_text("".join(f"{u} {DEMO / paths[u]}\n" for u in ids))
    (kaldi / "text").write_text("".join(f"{u} {texts[u]}\n" for u in ids), encoding="utf-8")
    (kaldi / "utt2spk").write_text("".join(f"{u} speaker-of-{u[:5]}\n" for u in ids))
    (kaldi / "utt2lang").write_text("".join(f"{u} {u[:2]}\n" for u in ids))  # the corpus's ids start en_ or zh_
    audio = root / "audio"
    pack_audio(kaldi / "wav.scp", kaldi / "text", audio, utt2spk=kaldi / "utt2spk", utt2lang=kaldi / "utt2lang",
               store="flac", utts_per_shard=15, progress=False)
    return {"feats": feats, "utts": utts, "audio": audio, "waves": {u: waves[u] for u in ids},
            "texts": {u: texts[u] for u in ids}}


def tars(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("data-*.tar"))


def test_datasets_load_dataset_reads_feature_shards(shards, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("webdataset", data_files={"train": tars(shards["feats"])}, split="train",
                               cache_dir=str(tmp_path))
    rows = {decode_key(r["__key__"]): r for r in ds}
    assert rows.keys() == shards["utts"].keys()
    for uttid, (feats, text) in shards["utts"].items():
        assert rows[uttid]["txt"] == text and np.array_equal(np.array(rows[uttid]["npy"], np.float32), feats)


def test_datasets_load_dataset_reads_audio_shards(shards, tmp_path):
    """The audio member read as bytes (features given: decoding Audio needs torchcodec) and decoded with soundfile."""
    datasets = pytest.importorskip("datasets")
    # As docs/import.md writes it: every member the shards carry named, the language (KEY.lang) too,
    # whose extension datasets does not decode: bytes.
    features = datasets.Features({"__key__": datasets.Value("string"), "__url__": datasets.Value("string"),
                                  "flac": datasets.Value("binary"), "txt": datasets.Value("string"),
                                  "lang": datasets.Value("binary")})
    ds = datasets.load_dataset("webdataset", data_files={"train": tars(shards["audio"])}, split="train",
                               cache_dir=str(tmp_path), features=features)
    rows = {decode_key(r["__key__"]): r for r in ds}
    assert rows.keys() == shards["waves"].keys()
    for uttid, wave in shards["waves"].items():
        pcm, rate = sf.read(io.BytesIO(rows[uttid]["flac"]), dtype="int16")
        assert rate == 16000 and np.array_equal(pcm, wave) and rows[uttid]["txt"] == shards["texts"][uttid]
        assert rows[uttid]["lang"].decode("utf-8") == uttid[:2]


def test_webdataset_reads_both_layouts(shards):
    import webdataset as wds

    got = {decode_key(s["__key__"]): s for s in wds.WebDataset(tars(shards["feats"]), shardshuffle=False).decode()}
    assert got.keys() == shards["utts"].keys()
    assert all(np.array_equal(got[u]["npy"], f) and got[u]["txt"] == t for u, (f, t) in shards["utts"].items())
    got = {decode_key(s["__key__"]): s for s in wds.WebDataset(tars(shards["audio"]), shardshuffle=False)}
    assert got.keys() == shards["waves"].keys()
    for uttid, wave in shards["waves"].items():
        assert np.array_equal(sf.read(io.BytesIO(got[uttid]["flac"]), dtype="int16")[0], wave)
        assert got[uttid]["txt"].decode("utf-8") == shards["texts"][uttid]


def test_export_lhotse_writes_cuts_lhotse_loads(shards, tmp_path, capsys):
    lhotse = pytest.importorskip("lhotse")
    out = tmp_path / "audio_cuts.jsonl.gz"
    assert main(["export", "lhotse", "--trset", f"{shards['audio']}/data-*.tar", "--out", str(out)]) == 0
    cuts = lhotse.load_manifest(out)
    assert isinstance(cuts, lhotse.CutSet) and {c.id for c in cuts} == shards["waves"].keys()
    for c in cuts:
        (sup,) = c.supervisions
        assert c.duration == len(shards["waves"][c.id]) / 16000  # exact: the audio's samples
        assert sup.text == shards["texts"][c.id] and sup.speaker == f"speaker-of-{c.id[:5]}"  # utt2spk's
        assert sup.language == c.id[:2]  # the index's language column
    assert main(["export", "lhotse", "--trset", f"{shards['audio']}/data-*.tar", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    out = tmp_path / "feature_cuts.jsonl"
    assert main(["export", "lhotse", "--trset", f"{shards['feats']}/data-*.tar", "--out", str(out)]) == 0
    cuts = lhotse.load_manifest(out)
    assert {c.id: (c.duration, c.supervisions[0].text) for c in cuts} == \
        {u: (len(f) / 100, t) for u, (f, t) in shards["utts"].items()}  # frames x 10 ms
    assert {c.supervisions[0].language for c in cuts} == {None}  # packed without languages
    assert cuts.split(2)[0].ids  # Lhotse's tooling works on it
