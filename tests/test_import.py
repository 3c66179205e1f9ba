"""``pack-audio --from KIND PATH`` and ``pack --from lhotse``: the demo corpus's real speech, given in each
project's format by that project's own tooling where it installs (Lhotse's CutSet, Shar export and
features; ``datasets``' Audio column and ``save_to_disk``) and by the documented format where not
(NeMo manifests and tarred datasets, WeNet lists and shards), packs with one call.  The shards hold
the source's keys and texts, the samples of the same audio packed from a Kaldi ``wav.scp`` +
``segments`` (whole files and three segments), and the loader computes the same features from
them; speakers go into the index and languages into the report; the items planted broken in each
source are counted by reason.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from audio_shards import DEMO, demo_waves
from shard_readers import iter_tar_samples

import wdsprep
from wdsprep import Manifest, make_loader, pack_audio, read_index
from wdsprep.cli import main
from wdsprep.format.keys import decode_key

SEGMENTS = ["en_f2_r1.00_p60-0004", "en_f4_r1.40_p55-0005", "zh_f2_r1.00_p60-0004"]  # recordings over 1.3 s
START, END = 0.25, 1.0  # exact in samples at 16 kHz: every project cuts them alike
PACK = dict(store="flac", utts_per_shard=40, progress=False, max_lost=1)  # each test plants bad items


def seg_id(rec: str) -> str:
    return f"{rec}-{round(START * 100):07d}-{round(END * 100):07d}"  # NeMo's and Kaldi's segment naming


def language(uttid: str) -> str:
    return uttid[:2]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo train set as Kaldi files (absolute paths), packed from its wav.scp + segments: the
    reference every import is held against; a tokenizer; a corrupt audio file."""
    root = tmp_path_factory.mktemp("import")
    waves, texts, d = demo_waves()
    audio = {u: str(DEMO / p) for u, p in (line.split(" ", 1) for line in (d / "wav.scp").read_text().splitlines())}
    speakers = dict(line.split() for line in (d / "utt2spk").read_text().splitlines())
    kaldi = root / "kaldi"
    kaldi.mkdir()
    (kaldi / "wav.scp").write_text("".join(f"{u} {p}\n" for u, p in audio.items()))
    segments = {u: (u, 0.0, -1.0) for u in audio} | {seg_id(r): (r, START, END) for r in SEGMENTS}
    (kaldi / "segments").write_text("".join(f"{s} {r} {a} {b}\n" for s, (r, a, b) in segments.items()))
    texts = texts | {seg_id(r): f"PART OF {texts[r]}" for r in SEGMENTS}
    speakers = speakers | {seg_id(r): speakers[r] for r in SEGMENTS}
    (kaldi / "text").write_text("".join(f"{u} {t}\n" for u, t in texts.items()), encoding="utf-8")
    (kaldi / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in speakers.items()))
    ref = root / "ref"
    pack_audio(kaldi / "wav.scp", kaldi / "text", ref, segments=kaldi / "segments", utt2spk=kaldi / "utt2spk", **PACK)
    tok = root / "char.json"
    wdsprep.train_tokenizer("char", [kaldi / "text"], tok)
    bad = root / "bad.flac"
    bad.write_bytes(b"not audio at all" * 64)
    return {"root": root, "audio": audio, "texts": texts, "speakers": speakers, "ref": contents(ref),
            "ref_features": features(ref, tok), "tok": tok, "bad": str(bad), "waves": waves}


def contents(out: Path) -> dict[str, tuple[str, np.ndarray]]:
    """{uttid: (text, int16 samples)} of every shard of a pack."""
    got = {}
    for tar in sorted(out.rglob("data-*.tar")):
        for key, members in iter_tar_samples(tar):
            pcm, _ = sf.read(io.BytesIO(members["flac"]), dtype="int16")
            got[decode_key(key)] = (members["txt"].decode("utf-8"), pcm)
    return got


def features(out: Path, tok: Path) -> dict[str, np.ndarray]:
    """{uttid: features} as the loader computes them from the pack's audio (dev mode: each once)."""
    loader = make_loader(f"{out}/data-*.tar", tok, max_frames=4000, train=False)
    return {k: b.feats[i, :int(b.feat_lens[i])].numpy().copy() for b in loader for i, k in enumerate(b.keys)}


def check(demo: dict, out: Path, ids: dict[str, str], planted: dict[str, int], *, speakers: bool = True,
          languages: bool = True) -> None:
    """The pack ``out`` holds the utterances ``ids`` ({its id: the reference's}) with the reference's
    texts, samples and features, the speakers and languages, and the report counts ``planted``."""
    got = contents(out)
    assert set(got) == set(ids)
    for uttid, ref_id in ids.items():
        text, pcm = got[uttid]
        ref_text, ref_pcm = demo["ref"][ref_id]
        assert text == ref_text and np.array_equal(pcm, ref_pcm), uttid
    feats = features(out, demo["tok"])
    assert all(np.array_equal(feats[u], demo["ref_features"][r]) for u, r in ids.items())
    report = json.loads((out / "pack_report.json").read_text(encoding="utf-8"))
    assert report["counts"] == planted, report["not_written"]
    if languages:
        assert report["written"]["languages"] == dict(Counter(language(r) for r in ids.values()))
    if speakers:
        index = read_index(out)
        spk = index.speakers()
        named = {decode_key(k): spk.names[i] for k, i in zip(index.keys(), spk.ids.tolist())}
        assert named == {u: demo["speakers"][r] for u, r in ids.items()}


def same_ids(demo: dict) -> dict[str, str]:
    return {u: u for u in demo["ref"]}


# -- NeMo -----------------------------------------------------------------------------------------------


def nemo_entry(demo: dict, uttid: str, audio: str, **extra) -> dict:
    return {"audio_filepath": audio, "duration": sf.info(demo["audio"][uttid]).duration,
            "text": demo["texts"][uttid], "lang": language(uttid), "speaker": demo["speakers"][uttid], **extra}


def test_a_nemo_manifest_packs_with_paths_resolved_as_nemo_resolves_them(demo, tmp_path):
    d = tmp_path / "nemo"
    d.mkdir()
    (d / "wavs").symlink_to(DEMO / "data" / "audio")  # "wavs/x.flac": relative to the manifest's folder
    shutil.copy(demo["bad"], d / "bad.flac")
    entries = [nemo_entry(demo, u, f"wavs/{Path(p).name}") for u, p in demo["audio"].items()]
    entries[0]["audio_filepath"] = demo["audio"][entries[0]["audio_filepath"][5:-5]]  # an absolute path
    entries += [{**nemo_entry(demo, r, f"wavs/{r}.flac"), "offset": START, "duration": END - START,
                 "text": demo["texts"][seg_id(r)]} for r in SEGMENTS]
    r = SEGMENTS[0]
    entries += [{**nemo_entry(demo, r, f"wavs/{r}.flac"), "offset": 99.0, "duration": 1.0},  # past the end
                {**nemo_entry(demo, r, "wavs/gone.flac")},
                {**nemo_entry(demo, r, "bad.flac")},
                {**nemo_entry(demo, r, f"wavs/{r}.flac"), "id": "silent", "text": ""}]
    (d / "train.json").write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    out = tmp_path / "out"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # "wavs/..." exists only beside the manifest
    try:
        pack_audio(Manifest("nemo", d / "train.json"), None, out, **PACK)
    finally:
        os.chdir(cwd)
    check(demo, out, same_ids(demo), {"bad_segment": 1, "missing_file": 1, "bad_audio": 1, "empty_text": 1})


def test_a_nemo_tarred_dataset_packs_from_its_tars(demo, tmp_path):
    """As convert_to_tarred_audio_dataset.py writes one: audio_N.tar with each file once under its
    squashed name, a repeated file's entry named -subN with its offset, shard_id in each entry."""
    d = tmp_path / "tarred"
    d.mkdir()
    recs = list(demo["audio"])
    entries = []
    for shard, part in enumerate([recs[::2], recs[1::2]]):
        with tarfile.open(d / f"audio_{shard}.tar", "w") as tar:
            for u in part:
                tar.add(demo["audio"][u], arcname=f"{u}.flac")
                entries.append({**nemo_entry(demo, u, f"{u}.flac"), "shard_id": shard})
            if shard == 0:
                tar.add(demo["bad"], arcname="bad.flac")
    entries.append({**nemo_entry(demo, recs[0], "bad.flac"), "shard_id": 0})
    entries.append({**nemo_entry(demo, recs[0], "gone.flac"), "shard_id": 1})
    entries.append({**nemo_entry(demo, recs[2], f"{recs[2]}-sub1.flac"), "shard_id": 0, "text": " "})
    for r in SEGMENTS:
        shard = recs.index(r) % 2
        entries.append({**nemo_entry(demo, r, f"{r}-sub1.flac"), "shard_id": shard, "offset": START,
                        "duration": END - START, "text": demo["texts"][seg_id(r)]})
    (d / "tarred_audio_manifest.json").write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    out = tmp_path / "out"
    pack_audio(Manifest("nemo-tarred", d), None, out, **PACK)
    ids = {u: u for u in recs} | {f"{r}-sub1-{seg_id(r)[len(r) + 1:]}": seg_id(r) for r in SEGMENTS}
    check(demo, out, ids, {"bad_audio": 1, "missing_file": 1, "empty_text": 1})


def _samples(out: Path) -> dict[str, dict[str, str]]:
    """{uttid: {member extension: text}} of a pack's text members (audio left out)."""
    return {decode_key(k): {e: v.decode("utf-8") for e, v in m.items() if e != "flac"}
            for tar in sorted(out.rglob("data-*.tar")) for k, m in iter_tar_samples(tar)}


def canary_entries(demo: dict, recs: list[str]) -> list[dict]:
    """Canary's manifest lines (answer, source_lang, target_lang, pnc, taskname); the 2nd and 4th
    without source_lang, the 5th without target_lang."""
    entries = []
    for k, u in enumerate(recs):
        e = {"audio_filepath": demo["audio"][u], "duration": sf.info(demo["audio"][u]).duration,
             "answer": demo["texts"][u], "source_lang": language(u), "target_lang": language(u), "pnc": "yes",
             "taskname": "asr"}
        if k in (1, 3):
            del e["source_lang"]
        if k == 4:
            del e["target_lang"]
        entries.append(e)
    return entries


def test_a_canary_manifest_packs_with_one_command(demo, tmp_path, capsys):
    """Canary's keys known as NeMo's Canary configs read them (text: answer; language: target_lang,
    optional per line as NeMo's lang is), the others carried as fields where a line has them; a
    line's every problem reported with it; keys named by the user, a key no line has refused."""
    recs = [u for u in demo["audio"] if u.startswith("en")][:3] + [u for u in demo["audio"] if u.startswith("zh")][:3]
    entries = canary_entries(demo, recs)
    entries.append({"audio_filepath": str(tmp_path / "gone.flac"), "duration": 1.0, "answer": "X",
                    "speaker": "two words", "target_lang": "en"})  # a bad speaker, and no audio either
    manifest = tmp_path / "canary.json"
    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    out = tmp_path / "out"
    base = ["pack-audio", "--from", "nemo", str(manifest), "--store", "flac", "--no-progress", "--max-lost", "0.2"]
    assert main([*base, "--out", str(out)]) == 0, capsys.readouterr().err
    got = _samples(out)
    assert set(got) == set(recs)
    for k, u in enumerate(recs):
        e = entries[k]
        assert got[u]["txt"] == demo["texts"][u] and got[u]["pnc"] == "yes" and got[u]["taskname"] == "asr"
        assert got[u].get("lang") == e.get("target_lang") and got[u].get("target_lang") == e.get("target_lang")
        assert got[u].get("source_lang") == e.get("source_lang")
    index = read_index(out)
    langs = dict(zip(map(decode_key, index.keys()), index.columns["lang"].values()))
    assert langs == {u: e.get("target_lang") for u, e in zip(recs, entries)}  # None: packed without one
    assert wdsprep.verify_shards(str(out)).ok
    again = tmp_path / "again"
    shutil.copytree(out, again)
    wdsprep.index_shards(str(again), force=True)  # an index made from the shards knows the line without one too
    index = read_index(again)
    assert dict(zip(map(decode_key, index.keys()), index.columns["lang"].values())) == langs
    assert set(index.fields) == {"lang", "pnc", "source_lang", "target_lang", "taskname"}
    loader = make_loader(out, demo["tok"], max_frames=1000, train=False, fields=["pnc"])
    rows = {k: (lang, pnc) for b in loader for k, lang, pnc in zip(b.keys, b.lang, b.fields["pnc"])}
    assert rows == {u: (e.get("target_lang"), "yes") for u, e in zip(recs, entries)}
    wdsprep.aggregate_tokenizers({"en": demo["tok"], "zh": demo["tok"]}, tmp_path / "agg.json")
    with pytest.raises(ValueError, match="some of the shards' utterances have none"):  # NeMo's aggregate refuses too
        make_loader(out, tmp_path / "agg.json", max_frames=1000)
    report = json.loads((out / "pack_report.json").read_text(encoding="utf-8"))
    assert report["counts"] == {"bad_speaker": 1}
    (dropped,) = report["not_written"]["bad_speaker"]
    assert dropped["also"] == ["missing_file"] and "gone.flac" in dropped["why"] and "two words" in dropped["why"]
    # Keys named: the language of source_lang (absent on two lines), a key carried as a field of another name
    named = tmp_path / "named"
    assert main([*base, "--out", str(named), "--text-column", "answer", "--lang-column", "source_lang",
                 "--field", "task=taskname"]) == 0
    got = _samples(named)
    assert all(got[u].get("lang") == e.get("source_lang") and got[u]["task"] == "asr" for u, e in zip(recs, entries))
    assert main([*base, "--out", str(tmp_path / "typo"), "--lang-column", "sourcelang"]) == 2
    err = capsys.readouterr().err
    assert "--lang-column sourcelang: no line of" in err and "has the key 'sourcelang'" in err and "answer" in err


def test_nemo_buckets_and_sharded_manifests_pack_in_one_command(demo, tmp_path):
    """What convert_to_tarred_audio_dataset.py writes with --buckets_num 2 (bucket1/, bucket2/, each
    tars with tarred_audio_manifest.json and sharded_manifests/manifest_N.json), and a folder with
    its sharded manifests only: one command each, every utterance once."""
    recs = list(demo["audio"])[:8]
    d = tmp_path / "tarred"
    for b, part in enumerate([recs[:4], recs[4:]], 1):
        bucket = d / f"bucket{b}"
        (bucket / "sharded_manifests").mkdir(parents=True)
        whole = []
        for shard, names in enumerate([part[:2], part[2:]]):
            lines = [{**nemo_entry(demo, u, f"{u}.flac"), "shard_id": shard} for u in names]
            with tarfile.open(bucket / f"audio_{shard}.tar", "w") as tar:
                for u in names:
                    tar.add(demo["audio"][u], arcname=f"{u}.flac")
            (bucket / "sharded_manifests" / f"manifest_{shard}.json").write_text(
                "".join(json.dumps(e) + "\n" for e in lines), encoding="utf-8")
            whole += lines
        (bucket / "tarred_audio_manifest.json").write_text("".join(json.dumps(e) + "\n" for e in whole),
                                                           encoding="utf-8")
    pack_audio(Manifest("nemo-tarred", d), None, tmp_path / "buckets", **PACK)
    tars = sorted((tmp_path / "buckets").rglob("data-*.tar"))
    keys = [decode_key(k) for tar in tars for k, _ in iter_tar_samples(tar)]
    assert Counter(keys) == Counter(recs)
    (d / "bucket2" / "tarred_audio_manifest.json").unlink()
    pack_audio(Manifest("nemo-tarred", d / "bucket2"), None, tmp_path / "sharded", **PACK)
    assert set(_samples(tmp_path / "sharded")) == set(recs[4:])
    report = json.loads((tmp_path / "buckets" / "pack_report.json").read_text(encoding="utf-8"))
    assert report["counts"] == {} and report["written"]["utterances"] == len(recs)


# -- WeNet ----------------------------------------------------------------------------------------------


def test_a_wenet_data_list_packs(demo, tmp_path):
    lines = [{"key": u, "wav": p, "txt": demo["texts"][u]} for u, p in demo["audio"].items()]
    lines += [{"key": seg_id(r), "wav": demo["audio"][r], "start": START, "end": END, "txt": demo["texts"][seg_id(r)]}
              for r in SEGMENTS]
    lines += [{"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "x"},
              {"key": "bad", "wav": demo["bad"], "txt": "x"},
              {"key": "silent", "wav": demo["audio"][SEGMENTS[0]], "txt": ""}]
    (tmp_path / "data.list").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                                        encoding="utf-8")
    out = tmp_path / "out"
    pack_audio(Manifest("wenet", tmp_path / "data.list"), None, out, **PACK)
    check(demo, out, same_ids(demo), {"missing_file": 1, "bad_audio": 1, "empty_text": 1}, speakers=False,
          languages=False)


def test_a_wenet_data_list_with_other_keys_packs_them_where_named(demo, tmp_path):
    recs = list(demo["audio"])[:4]
    lines = [{"utt": u, "path": demo["audio"][u], "sentence": demo["texts"][u], "language": language(u),
              "emotion": "neutral" if k % 2 else None} for k, u in enumerate(recs)]
    (tmp_path / "data.list").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    keys = dict(id_column="utt", audio_column="path", text_column="sentence", lang_column="language")
    out = tmp_path / "out"
    pack_audio(Manifest("wenet", tmp_path / "data.list", **keys, fields={"emotion": "emotion"}), None, out, **PACK)
    got = _samples(out)
    assert got == {u: {"txt": demo["texts"][u], "lang": language(u), **({"emotion": "neutral"} if k % 2 else {})}
                   for k, u in enumerate(recs)}
    with pytest.raises(ValueError, match="--duration-column is for --from nemo or nemo-tarred or hf, not --from wenet"):
        Manifest("wenet", tmp_path / "data.list", duration_column="d")


def test_wenet_shards_pack(demo, tmp_path):
    """Tars of KEY.txt + KEY.flac as tools/make_shard_list.py writes them (.wav there), listed one per line."""
    recs = list(demo["audio"])
    shards = []
    for k, part in enumerate([recs[:90], recs[90:]]):
        path = tmp_path / f"shards_{k:09d}.tar"
        with tarfile.open(path, "w") as tar:
            for u in part:
                _add(tar, f"{u}.txt", demo["texts"][u].encode("utf-8"))
                tar.add(demo["audio"][u], arcname=f"{u}.flac")
            if k == 1:
                _add(tar, "bad.txt", b"x")
                tar.add(demo["bad"], arcname="bad.flac")
                _add(tar, "lost.txt", b"no audio beside it")
                tar.add(demo["audio"][recs[0]], arcname="untold.flac")  # no transcript
        shards.append(str(path))
    (tmp_path / "shards.list").write_text("".join(s + "\n" for s in shards))
    out = tmp_path / "out"
    pack_audio(Manifest("wenet", tmp_path / "shards.list"), None, out, **PACK)
    check(demo, out, {u: u for u in recs}, {"bad_audio": 1, "missing_file": 1, "empty_text": 1}, speakers=False,
          languages=False)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# -- Hugging Face ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dataset(demo, tmp_path_factory):
    """A datasets.Dataset with an Audio column (Common Voice's column names), saved to disk and as parquet."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf")
    recs = list(demo["audio"])
    rows = {"id": recs + ["bad", "silent"],
            "audio": [{"path": demo["audio"][u], "bytes": None} for u in [*recs, recs[0], recs[0]]],
            "sentence": [demo["texts"][u] for u in recs] + ["x", ""],
            "locale": [language(u) for u in recs] + ["en", "en"],
            "client_id": [demo["speakers"][u] for u in recs] + ["s", "s"]}
    rows["audio"][-2] = {"path": None, "bytes": b"garbage" * 100}
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())
    ds.save_to_disk(root / "saved", max_shard_size="2MB")  # several Arrow files
    (root / "parquet").mkdir()
    ds.to_parquet(root / "parquet" / "train-00000-of-00001.parquet", batch_size=50)
    return root


@pytest.mark.parametrize("layout", ["saved", "parquet"])
def test_a_hugging_face_dataset_packs_from_its_audio_bytes(demo, hf_dataset, tmp_path, layout):
    out = tmp_path / "out"
    pack_audio(Manifest("hf", hf_dataset / layout), None, out, **PACK)
    check(demo, out, {u: u for u in demo["audio"]}, {"bad_audio": 1, "empty_text": 1})


def test_hugging_face_columns_are_named_and_held_against_a_resume(demo, hf_dataset, tmp_path, capsys):
    out = tmp_path / "out"
    cmd = ["pack-audio", "--from", "hf", str(hf_dataset / "saved"), "--out", str(out), "--text-column", "sentence",
           "--store", "flac", "--no-progress", "--max-lost", "1"]
    assert main([*cmd, "--speaker-column", "id"]) == 0
    spk = read_index(out).speakers()
    assert set(spk.names) == {decode_key(k) for k in read_index(out).keys()}  # each its own speaker: the id column
    assert main([*cmd, "--speaker-column", "id", "--resume"]) == 0 and "is complete" in capsys.readouterr().out
    assert main([*cmd, "--resume"]) == 1  # the columns are part of what the pack was made from
    assert "speaker_column='client_id' (the pack started with 'id')" in capsys.readouterr().err


def test_a_dataset_object_packs_as_its_saved_form_and_one_without_files_is_refused(demo, hf_dataset, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_from_disk(str(hf_dataset / "saved"))
    pack_audio(Manifest("hf", hf_dataset / "saved", speaker_column="client_id"), None, tmp_path / "saved", **PACK)
    pack_audio(Manifest("hf", ds, speaker_column="client_id"), None, tmp_path / "object", **PACK)
    assert _tree(tmp_path / "object") == _tree(tmp_path / "saved")
    small = datasets.Dataset.from_dict({"audio": [demo["audio"][next(iter(demo["audio"]))]], "text": ["x"]})
    refused = {"held in memory only": small, "sliced": ds.select([0, 1]), "indices mapping": ds.shuffle(seed=0),
               "give one split, e.g. Manifest('hf', dataset['train'])": datasets.DatasetDict({"train": ds})}
    for words, obj in refused.items():
        with pytest.raises(TypeError, match=r"save_to_disk|one split") as e:
            Manifest("hf", obj)
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TypeError, match="no path of a --from nemo manifest; give the path of its manifest"):
        Manifest("nemo", ds)
    # a column carried as a field, as a manifest's key is
    pack_audio(Manifest("hf", hf_dataset / "parquet", fields={"who": "client_id"}), None, tmp_path / "who", **PACK)
    got = _samples(tmp_path / "who")
    assert got and all(got[u]["who"] == demo["speakers"][u] for u in got)


def _tree(out: Path) -> dict[str, bytes]:
    """The bytes of a pack's shards and indexes, index.json without when each shard was written (its
    report and plan name where the lines came from)."""
    tree = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name not in ("pack_report.json", "pack_plan.json"):
            data = p.read_bytes()
            if p.name == "index.json":
                doc = json.loads(data)
                for shard in doc["shards"]:
                    del shard["mtime_ns"]
                data = json.dumps(doc).encode()
            tree[str(p.relative_to(out))] = data
    return tree


# -- Lhotse ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lhotse_cuts(demo, tmp_path_factory):
    """Recordings and supervisions made by lhotse from the demo files, a CutSet of one cut per
    supervision (trim_to_supervisions), planted cuts lhotse can describe but not pack."""
    lhotse = pytest.importorskip("lhotse")
    from lhotse import AudioSource, CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    root = tmp_path_factory.mktemp("lhotse")
    recs = [Recording.from_file(p, recording_id=u) for u, p in demo["audio"].items()]
    recs.append(Recording("gone", [AudioSource("file", [0], str(root / "gone.flac"))], 16000, 16000, 1.0))
    recs.append(Recording("bad", [AudioSource("file", [0], demo["bad"])], 16000, 16000, 1.0))

    def sup(i: str, rec: str, start: float, duration: float, text: str | None = None) -> SupervisionSegment:
        return SupervisionSegment(i, rec, start, duration, text=demo["texts"][i] if text is None else text,
                                  speaker=demo["speakers"].get(i, "x"), language=language(i))

    sups = [sup(r.id, r.id, 0, r.duration) for r in recs[:-2]]
    sups += [sup(seg_id(r), r, START, END - START) for r in SEGMENTS]
    sups += [sup(r, r, 0, 1.0, "x") for r in ("gone", "bad")]
    recordings, supervisions = RecordingSet.from_recordings(recs), SupervisionSet.from_segments(sups)
    cuts = CutSet.from_manifests(recordings, supervisions).trim_to_supervisions(keep_overlapping=False).to_eager()
    silent = without_text(cuts[SEGMENTS[1]])
    fast = cuts[SEGMENTS[2]].perturb_speed(1.1)  # lhotse would resample it while loading
    planted = CutSet.from_cuts([*cuts, silent, fast])
    planted.to_file(root / "cuts.jsonl.gz")
    recordings.to_file(root / "demo_recordings_train.jsonl.gz")
    supervisions.to_file(root / "demo_supervisions_train.jsonl.gz")
    return root, cuts, lhotse


def without_text(cut):
    """A copy of a cut, named "silent", whose supervisions have no text."""
    from lhotse.utils import fastcopy

    return fastcopy(cut, id="silent", supervisions=[fastcopy(s, text="") for s in cut.supervisions])


def test_a_lhotse_cutset_packs(demo, lhotse_cuts, tmp_path):
    root, _, _ = lhotse_cuts
    out = tmp_path / "out"
    pack_audio(Manifest("lhotse", root / "cuts.jsonl.gz"), None, out, **PACK)
    check(demo, out, same_ids(demo), {"missing_file": 1, "bad_audio": 1, "empty_text": 1, "unsupported_cut": 1})


def test_a_cutset_object_packs_as_its_saved_form(demo, lhotse_cuts, tmp_path):
    root, _, lhotse = lhotse_cuts
    cuts = lhotse.load_manifest(root / "cuts.jsonl.gz")
    pack_audio(Manifest("lhotse", root / "cuts.jsonl.gz"), None, tmp_path / "saved", **PACK)
    pack_audio(Manifest("lhotse", cuts), None, tmp_path / "object", **PACK)
    assert _tree(tmp_path / "object") == _tree(tmp_path / "saved")
    report = json.loads((tmp_path / "object" / "pack_report.json").read_text(encoding="utf-8"))
    assert report["counts"] == {"missing_file": 1, "bad_audio": 1, "empty_text": 1, "unsupported_cut": 1}
    with pytest.raises(TypeError, match=r"save it \(cuts.to_file\('cuts.jsonl.gz'\)\)"):
        Manifest("lhotse", list(cuts))


def test_lhotse_recordings_and_supervisions_pack_without_cuts(demo, lhotse_cuts, tmp_path):
    root, _, _ = lhotse_cuts
    out = tmp_path / "out"
    pack_audio(Manifest("lhotse", root / "demo_recordings_train.jsonl.gz"), None, out, **PACK)
    check(demo, out, same_ids(demo), {"missing_file": 1, "bad_audio": 1})


def test_a_lhotse_shar_directory_packs(demo, lhotse_cuts, tmp_path):
    """lhotse's own Shar export (FLAC per cut); one member's bytes damaged after, one cut without text."""
    _, cuts, _ = lhotse_cuts
    shar = tmp_path / "shar"
    shar.mkdir()
    good = cuts.filter(lambda c: c.id not in ("gone", "bad"))
    silent = without_text(good[SEGMENTS[1]])
    type(cuts).from_cuts([*good, silent]).to_shar(shar, fields={"recording": "flac"}, shard_size=100)
    tar = shar / "recording.000001.tar"
    with tarfile.open(tar) as t:
        victim = next(m for m in t.getmembers() if m.name.endswith(".flac"))
    with open(tar, "r+b") as f:  # the member's bytes, no longer a FLAC stream
        f.seek(victim.offset_data)
        f.write(bytes(victim.size))
    out = tmp_path / "out"
    pack_audio(Manifest("lhotse-shar", shar), None, out, **PACK)
    damaged = victim.name.rsplit(".", 1)[0]
    check(demo, out, {u: u for u in demo["ref"] if u != damaged}, {"bad_audio": 1, "empty_text": 1})


def test_lhotse_features_pack_as_lhotse_loads_them(demo, lhotse_cuts, tmp_path):
    """pack --from lhotse: cuts whose fbank lhotse computed and stored (lilcom, as icefall stores them)."""
    _, cuts, lhotse = lhotse_cuts
    from lhotse import Fbank, LilcomChunkyWriter

    some = cuts.filter(lambda c: c.id not in ("gone", "bad")).subset(first=30)
    with_feats = some.compute_and_store_features(Fbank(), tmp_path / "feats", storage_type=LilcomChunkyWriter)
    bare = some[0].with_id("bare")  # no features
    from lhotse.utils import fastcopy

    moved = fastcopy(with_feats[1], id="moved",
                     features=fastcopy(with_feats[1].features, storage_path=str(tmp_path / "elsewhere.lca")))
    manifest = tmp_path / "cuts_fbank.jsonl.gz"
    type(cuts).from_cuts([*with_feats, bare, moved]).to_file(manifest)
    out = tmp_path / "out"
    code = main(["pack", "--from", "lhotse", str(manifest), "--out", str(out), "--utts-per-shard", "8",
                 "--no-progress", "--max-lost", "1"])
    assert code == 0
    packed = {decode_key(k): (np.load(io.BytesIO(m["npy"])), m["txt"].decode("utf-8"))
              for tar in sorted(out.glob("data-*.tar")) for k, m in iter_tar_samples(tar)}
    assert set(packed) == {c.id for c in with_feats}
    for c in with_feats:
        feats, text = packed[c.id]
        assert np.array_equal(feats, c.load_features()) and text == demo["texts"][c.id]
    report = json.loads((out / "pack_report.json").read_text())
    assert report["counts"] == {"no_features": 1, "missing_file": 1}
    assert report["written"]["languages"] == dict(Counter(language(c.id) for c in with_feats))


def test_without_its_extra_a_kind_says_which_to_install(demo, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lhotse", None)  # as if not installed
    code = main(["pack-audio", "--from", "lhotse", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pip install 'wdsprep[lhotse]'" in err, err
