"""Hostile testing, round 5 (issue 46): manifests from elsewhere are untrusted input.

Each test builds a manifest in a project's real format around a few of the demo corpus's real
recordings, plants what a stranger's manifest may hold, and checks that the pack leaves exactly
that out, counted by reason and named by file and line, that nothing but the audio's samples and
the transcripts reach the shards, and that no input ends in an "unexpected" error or a hang.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
import soundfile as sf
from shard_readers import iter_tar_samples

from wdsprep import Manifest, pack_audio
from wdsprep.cli import main
from wdsprep.format.keys import decode_key

AUDIO = Path(__file__).resolve().parents[1] / "egs" / "demo" / "data" / "audio"
RECORDINGS = ["en_f1_r1.10_p70-0001", "en_m1_r1.05_p50-0002", "zh_f1_r1.10_p65-0003"]
PACK = dict(store="flac", utts_per_shard=40, progress=False, max_lost=1)
TIMEOUT = 120


def _audio(rec: str) -> str:
    return str(AUDIO / f"{rec}.flac")


def _duration(rec: str) -> float:
    return sf.info(_audio(rec)).duration


def _packed(out: Path) -> dict[str, str]:
    """{uttid: transcript} of every shard of a pack, read from the tars themselves."""
    return {decode_key(k): m["txt"].decode("utf-8") for tar in sorted(out.rglob("data-*.tar"))
            for k, m in iter_tar_samples(tar)}


def _everything_in(out: Path) -> bytes:
    """Every byte the pack wrote (shards, index, report): where a leaked secret would be."""
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


def _report(out: Path) -> dict:
    return json.loads((out / "pack_report.json").read_text(encoding="utf-8"))


def _nemo(folder: Path, entries: list[dict], name: str = "manifest.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def _entry(rec: str, **extra) -> dict:
    return {"audio_filepath": _audio(rec), "duration": _duration(rec), **extra}


def _cli_error(capsys, *argv: str, status: int = 1) -> str:
    """The one line a CLI run that fails prints (exit status 1 for bad data, 2 for an argument of the
    wrong kind; never the catch-all)."""
    assert main(list(argv)) == status
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unexpected" not in err and ".tmp-" not in err, err
    return err


# -- item 1: a manifest cannot make a pack copy a file that is not audio into a shard ---------------------


@pytest.mark.timeout(TIMEOUT)
def test_r5_item1_text_filepath_is_read_only_under_the_manifest_folder_or_the_text_root(tmp_path):
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("THE SECRET TOKEN 7f3a")
    ds = tmp_path / "ds"
    (ds / "texts").mkdir(parents=True)
    (ds / "texts" / "a.txt").write_text("HELLO\nWORLD")
    (ds / "texts" / "link.txt").symlink_to(secret)  # inside by name, outside by where it leads
    (ds / "texts" / "zero.txt").symlink_to("/dev/zero")
    os.mkfifo(ds / "texts" / "fifo.txt")
    (ds / "texts" / "big.txt").write_bytes(b"A" * (2 << 20))
    (ds / "texts" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    roots = tmp_path / "texts_elsewhere"
    roots.mkdir()
    (roots / "b.txt").write_text("FROM THE ROOT")
    r0, r1, r2 = RECORDINGS
    planted = {"../outside/secret.txt": "bad_text", str(secret): "bad_text", "../../../../../../etc/hostname":
               "bad_text", "/dev/zero": "bad_text", "texts/link.txt": "bad_text", "texts/zero.txt": "bad_text",
               "texts/fifo.txt": "bad_text", "texts/big.txt": "bad_text", "texts/latin1.txt": "bad_text",
               "texts/none.txt": "missing_file", str(roots / "b.txt"): "bad_text"}
    entries = [_entry(r0, id="good", text_filepath="texts/a.txt")]
    entries += [_entry(r1, id=f"bad{k}", text_filepath=p) for k, p in enumerate(planted)]
    manifest = _nemo(ds, entries)
    out = tmp_path / "out"
    pack_audio(Manifest("nemo", manifest), None, out, **PACK)
    assert _packed(out) == {"good": "HELLOWORLD"}
    assert b"7f3a" not in _everything_in(out) and b"SECRET" not in _everything_in(out)
    report = _report(out)
    assert report["counts"] == {"bad_text": 10, "missing_file": 1}, report["not_written"]
    why = {d["uttid"]: d["why"] for ds_ in report["not_written"].values() for d in ds_}
    assert f"{manifest}:2: text_filepath '../outside/secret.txt' is outside the manifest's folder" in why["bad0"]
    assert "is a FIFO" in why["bad6"] and "is outside" in why["bad5"] and "more than" in why["bad7"]
    assert "not UTF-8" in why["bad8"]
    # The user names another folder the manifest's text files may be in: there, they are read.
    again = _nemo(ds, [_entry(r2, id="rooted", text_filepath=str(roots / "b.txt"))], "m2.json")
    out2 = tmp_path / "out2"
    pack_audio(Manifest("nemo", again, text_root=str(roots)), None, out2, **PACK)
    assert _packed(out2) == {"rooted": "FROM THE ROOT"}


@pytest.mark.timeout(TIMEOUT)
def test_r5_item1_audio_paths_are_read_as_audio_only_never_run_nor_copied(tmp_path, monkeypatch):
    """A NeMo manifest names audio anywhere; what is not audio is a counted bad_audio, and a path that
    a wav.scp would run (a real file named ``x |``) is never run."""
    monkeypatch.chdir(tmp_path)  # where the trap's command would leave its file
    ds = tmp_path / "ds"
    ds.mkdir()
    trap = ds / "x; touch ran |"  # a wav.scp value ending in "|" runs in a shell: its second command here
    trap.write_bytes(Path(_audio(RECORDINGS[0])).read_bytes())  # a real FLAC under a command's name
    notes = ds / "notes.flac"
    notes.write_text("THE SECRET TOKEN 7f3a " * 100)
    os.mkfifo(ds / "fifo.flac")
    r0 = RECORDINGS[0]
    manifest = _nemo(ds, [_entry(r0, id="good", text="A"), _entry(r0, id="run", text="B", audio_filepath=trap.name),
                          _entry(r0, id="notes", text="C", audio_filepath="notes.flac"),
                          _entry(r0, id="fifo", text="D", audio_filepath="fifo.flac"),
                          _entry(r0, id="zero", text="E", audio_filepath="/dev/zero")])
    out = tmp_path / "out"
    pack_audio(Manifest("nemo", manifest), None, out, **PACK)
    assert _packed(out) == {"good": "A"} and not (tmp_path / "ran").exists()
    assert b"7f3a" not in _everything_in(out)
    counts = _report(out)["counts"]
    assert counts == {"bad_audio": 2, "missing_file": 2}, _report(out)["not_written"]


# -- item 4: what is read whole is bounded ---------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT)
def test_r5_item4_a_gzip_bomb_manifest_ends_in_one_line_naming_the_file_and_line(tmp_path, capsys):
    # A cut that packs, then one flat line (a string, not nesting): only the bound on a line's
    # length can stop it at line 2.
    first = gzip.decompress(_lhotse_cuts(tmp_path / "one.jsonl.gz", {}).read_bytes()).split(b"\n")[0]
    bomb = tmp_path / "cuts.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        f.write(first + b"\n" + b'"' + b"a" * (17 << 20) + b'"\n')
    assert bomb.stat().st_size < 200_000
    err = _cli_error(capsys, "pack-audio", "--from", "lhotse", str(bomb), "--out", str(tmp_path / "o"))
    assert f"{bomb}:2: a line longer than 16,777,216 bytes" in err


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("kind", ["nemo", "wenet"])
def test_r5_item4_a_manifest_that_is_a_device_or_fifo_is_refused_unread(tmp_path, capsys, kind):
    os.mkfifo(tmp_path / "fifo.json")
    for path in ("/dev/zero", str(tmp_path / "fifo.json")):
        err = _cli_error(capsys, "pack-audio", "--from", kind, path, "--out", str(tmp_path / "o"), status=2)
        assert path in err and "not a regular file" in err


@pytest.mark.timeout(TIMEOUT)
def test_r5_item4_a_field_table_that_is_dev_zero_is_one_line(tmp_path, capsys):
    # With --from, --field NAME=KEY names a key of the manifest's lines; a table is a Kaldi pack's.
    (tmp_path / "wav.scp").write_text(f"u1 {_audio(RECORDINGS[0])}\n")
    (tmp_path / "text").write_text("u1 A\n")
    err = _cli_error(capsys, "pack-audio", "--wav-scp", str(tmp_path / "wav.scp"), "--text", str(tmp_path / "text"),
                     "--out", str(tmp_path / "o"), "--field", "topic=/dev/zero")
    assert "/dev/zero:1: a line longer than" in err


# -- items 5, 8, 9, 14: values typed and finite, ids and speakers held to the index's rules ------------


BAD_NEMO = [  # (entry fields, the reason it is counted under)
    ({"duration": float("nan"), "offset": 0.0}, "bad_segment"),
    ({"duration": 1e308, "offset": 0.0}, "bad_segment"),
    ({"duration": float("inf")}, "bad_segment"),
    ({"offset": float("-inf"), "duration": 0.5}, "bad_segment"),
    ({"offset": "0.5", "duration": 0.5}, "bad_segment"),
    ({"id": "has\nnewline"}, "bad_id"),
    ({"id": "has\x00nul"}, "bad_id"),
    ({"id": "two words"}, "bad_id"),
    ({"id": float("nan")}, "bad_id"),
    ({"id": ["x"]}, "bad_id"),
    ({"speaker": "spk\nsecond"}, "bad_speaker"),
    ({"speaker": {"a": 1}}, "bad_speaker"),
    ({"lang": 7}, "bad_language"),
    ({"text": {"a": [1, 2]}}, "bad_text"),
    ({"text": ["x", "y"]}, "bad_text"),
    ({"text": 3.5}, "bad_text"),
]


@pytest.mark.timeout(TIMEOUT)
def test_r5_items5_8_9_14_bad_nemo_values_are_counted_by_reason_naming_the_line(tmp_path):
    ds = tmp_path / "ds"
    r0, r1 = RECORDINGS[:2]
    good = [_entry(r0, id="good", text="GOOD", speaker=12, lang="en")]
    entries = [{**_entry(r1, id=f"u{k}", text="T"), **fields} for k, (fields, _) in enumerate(BAD_NEMO)]
    manifest = _nemo(ds, good + entries)
    with open(manifest, "ab") as f:  # lines no JSON parser takes whole
        f.write(b"[" * 100_000 + b"\n")  # RecursionError
        f.write(b'{"audio_filepath": "x.flac", "text": "caf\xe9"}\n')  # not UTF-8
        f.write(b"not json at all\n" b"[1, 2]\n")
    out = tmp_path / "out"
    pack_audio(Manifest("nemo", manifest), None, out, **PACK)
    assert _packed(out) == {"good": "GOOD"}
    report = _report(out)
    expected: dict[str, int] = {"bad_line": 4}
    for _, reason in BAD_NEMO:
        expected[reason] = expected.get(reason, 0) + 1
    assert report["counts"] == expected, report["not_written"]
    named = [d["why"] for d in report["not_written"]["bad_line"]]
    n = len(good) + len(entries)
    assert sorted(w.split(": ")[0] for w in named) == [f"{manifest}:{n + k}" for k in range(1, 5)]
    assert any("nested deeper" in w for w in named) and any("not UTF-8" in w for w in named)
    nan = next(d for d in report["not_written"]["bad_segment"] if "nan" in d["why"])
    assert nan["why"].startswith(f"{manifest}:2: duration nan")
    spk = report["not_written"]["bad_speaker"][0]
    assert spk["uttid"] == "u10" and spk["why"].startswith(f"{manifest}:12: the speaker 'spk\\nsecond'")


@pytest.mark.timeout(TIMEOUT)
def test_r5_items5_8_14_bad_wenet_values_are_counted_and_the_pack_verifies(tmp_path):
    from wdsprep import verify_shards

    r0, r1 = RECORDINGS[:2]
    lines = [{"key": "good", "wav": _audio(r0), "txt": "GOOD", "spk": "s1"},
             {"key": "nan", "wav": _audio(r1), "txt": "X", "start": 0.0, "end": float("nan")},
             {"key": "huge", "wav": _audio(r1), "txt": "X", "start": 0.0, "end": 1e308},
             {"key": "inf", "wav": _audio(r1), "txt": "X", "start": float("inf"), "end": 1.0},
             {"key": "a\nb", "wav": _audio(r1), "txt": "X"},
             {"key": "spk", "wav": _audio(r1), "txt": "X", "spk": "a b"},
             {"key": "txt", "wav": _audio(r1), "txt": ["x", "y"]},
             {"key": 5, "wav": _audio(r1), "txt": "X"}]
    data_list = tmp_path / "data.list"
    data_list.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    pack_audio(Manifest("wenet", data_list), None, out, **PACK)
    assert _packed(out) == {"good": "GOOD", "5": "X"}
    assert _report(out)["counts"] == {"bad_segment": 3, "bad_id": 1, "bad_speaker": 1, "bad_text": 1,
                                      "no_speaker": 1}  # "5" has none, "good" has one: flagged, packed
    assert verify_shards(f"{out}/data-*.tar").ok


def _lhotse_cuts(path: Path, mutate: dict[str, dict]) -> Path:
    """A CutSet manifest of the recordings (one cut each, by lhotse), with fields of some cuts'
    JSON replaced as ``mutate`` says ({cut id: {key: value}}; ``sup.KEY`` a supervision's)."""
    from lhotse import CutSet, Recording, SupervisionSegment

    cuts = []
    for k, rec in enumerate(RECORDINGS * 4):
        r = Recording.from_file(_audio(rec), recording_id=f"r{k}")
        cut = r.to_cut().with_id(f"c{k}")
        cut.supervisions = [SupervisionSegment(f"s{k}", r.id, 0, r.duration, text=f"T{k}", speaker="spk")]
        cuts.append(cut)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for d in CutSet.from_cuts(cuts).to_dicts():
            for key, value in mutate.get(d["id"], {}).items():
                if key.startswith("sup."):
                    d["supervisions"][0][key[4:]] = value
                elif key.startswith("rec."):
                    d["recording"][key[4:]] = value
                else:
                    d[key] = value
            f.write(json.dumps(d) + "\n")
    return path


@pytest.mark.timeout(TIMEOUT)
def test_r5_items5_8_12_14_bad_lhotse_cuts_are_counted_and_commands_are_not_run(tmp_path):
    ran = tmp_path / "ran"
    command = {"type": "command", "channels": [0], "source": f"touch {ran}; cat {_audio(RECORDINGS[0])}"}
    cuts = _lhotse_cuts(tmp_path / "cuts.jsonl.gz", {
        "c1": {"duration": float("nan")}, "c2": {"duration": 1e308}, "c3": {"start": float("inf")},
        "c4": {"id": "c\n4"}, "c5": {"sup.speaker": "a\nb"}, "c6": {"sup.text": {"a": [1, 2]}},
        "c7": {"rec.sources": [command]}, "c8": {"rec.sampling_rate": 0}, "c9": {"start": None},
        "c10": {"id": 10}, "c11": {"supervisions": "x"}})
    out = tmp_path / "out"
    pack_audio(Manifest("lhotse", cuts), None, out, **PACK)
    assert _packed(out) == {"c0": "T0", "10": "T10"} and not ran.exists()
    report = _report(out)
    assert report["counts"] == {"bad_segment": 4, "bad_id": 1, "bad_speaker": 1, "bad_text": 1,
                                "unsupported_cut": 1, "bad_audio": 1, "bad_line": 1}, report["not_written"]
    command_why = report["not_written"]["unsupported_cut"][0]["why"]
    assert command_why.startswith(f"{cuts}:8: recording 'r7' is made by a command; wdsprep runs no command")


# -- item 7: Hugging Face metadata that lies, or is no JSON ------------------------------------------------


def _parquet(path: Path, metadata: bytes) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    audio = pa.array([{"bytes": Path(_audio(r)).read_bytes(), "path": f"{r}.flac"} for r in RECORDINGS])
    table = pa.table({"audio": audio, "text": ["A", "B", "C"], "id": ["x0", "x1", "x2"]})
    pq.write_table(table.replace_schema_metadata({b"huggingface": metadata}), path)
    return path


@pytest.mark.timeout(TIMEOUT)
def test_r5_item7_hf_metadata_naming_a_dropped_column_is_read_by_the_columns_there(tmp_path):
    features = {"audio": {"_type": "Audio"}, "text": {"_type": "Value"}, "id": {"_type": "Value"},
                "language": {"_type": "Value"}}  # "language" was dropped from the table, not from the metadata
    path = _parquet(tmp_path / "train.parquet", json.dumps({"info": {"features": features}}).encode())
    out = tmp_path / "out"
    pack_audio(Manifest("hf", path), None, out, **PACK)
    assert _packed(out) == {"x0": "A", "x1": "B", "x2": "C"}


@pytest.mark.timeout(TIMEOUT)
def test_r5_item7_hf_metadata_that_is_not_json_is_one_line_naming_the_file(tmp_path, capsys):
    path = _parquet(tmp_path / "train.parquet", b"{not json")
    err = _cli_error(capsys, "pack-audio", "--from", "hf", str(path), "--out", str(tmp_path / "o"))
    assert f"{path}: its huggingface metadata is not what datasets writes" in err


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("column,values,reason", [("text", [["x", "y"], ["z"], []], "bad_text"),
                                                  ("id", [1.5, float("nan"), 3.0], "bad_id")])
def test_r5_item14_hf_values_that_are_not_strings_are_counted_not_packed_as_their_repr(tmp_path, column, values,
                                                                                        reason):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wdsprep.errors import LostError

    audio = pa.array([{"bytes": Path(_audio(r)).read_bytes(), "path": f"{r}.flac"} for r in RECORDINGS])
    columns = {"audio": audio, "text": ["A", "B", "C"], "id": ["x0", "x1", "x2"], column: values}
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    out = tmp_path / "out"
    with pytest.raises(LostError, match="wrote none of its"):
        pack_audio(Manifest("hf", tmp_path / "t.parquet", audio_column="audio"), None, out, **PACK)
    report = _report(out)
    assert report["counts"] == {reason: 3} and not _packed(out), report["not_written"]
    assert f"{tmp_path / 't.parquet'}:2: " in report["not_written"][reason][1]["why"]
