"""The bundled demo corpus (egs/demo/data) is a valid Kaldi data dir, and the tool that makes it
works and is deterministic. The committed-corpus tests need no espeak-ng; the tool tests are
skipped without espeak-ng and sox."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "egs" / "demo"          # wav.scp paths are relative to this
DATA = RECIPE / "data"
TOOL = REPO / "tools" / "make_demo_corpus.py"
PARTS = ("train", "dev")
MAX_BYTES = 3_000_000

HANZI = re.compile(r"^[\u4e00-\u9fff]+$")
ENGLISH = re.compile(r"^[A-Z]+( [A-Z]+)*$")

have_tools = shutil.which("espeak-ng") is not None and shutil.which("sox") is not None
needs_tools = pytest.mark.skipif(not have_tools, reason="needs espeak-ng and sox on PATH")


def read_table(path: Path) -> list[tuple[str, str]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        key, _, rest = line.partition(" ")
        assert key and rest and rest == rest.strip(), f"{path}:{n}: malformed line {line!r}"
        rows.append((key, rest))
    return rows


def c_sorted(keys: list[str]) -> bool:
    b = [k.encode("utf-8") for k in keys]   # LC_ALL=C order is byte order
    return b == sorted(b)


def check_data_dir(data: Path, recipe: Path) -> dict:
    """Assert the Kaldi invariants of data/{train,dev}; return per-utterance facts."""
    facts = {}
    for part in PARTS:
        d = data / part
        tables = {name: read_table(d / name) for name in
                  ("wav.scp", "text", "utt2spk", "utt2dur")}
        for name, rows in tables.items():
            keys = [k for k, _ in rows]
            assert c_sorted(keys), f"{d / name} is not sorted in LC_ALL=C order"
            assert len(set(keys)) == len(keys), f"{d / name} has duplicate keys"
        ids = [k for k, _ in tables["wav.scp"]]
        for name in ("text", "utt2spk", "utt2dur"):
            assert [k for k, _ in tables[name]] == ids, f"{d / name} and wav.scp list different utts"
        utt2spk = dict(tables["utt2spk"])
        for utt, spk in utt2spk.items():
            assert " " not in spk and utt.startswith(spk + "-"), f"{utt} not prefixed by {spk}"
        spk2utt = {spk: utts.split() for spk, utts in read_table(d / "spk2utt")}
        assert c_sorted(list(spk2utt)), f"{d / 'spk2utt'} is not sorted"
        assert sorted(u for us in spk2utt.values() for u in us) == sorted(ids)
        for spk, utts in spk2utt.items():
            assert c_sorted(utts) and all(utt2spk[u] == spk for u in utts)
        text, utt2dur = dict(tables["text"]), dict(tables["utt2dur"])
        for utt, rel in tables["wav.scp"]:
            assert not Path(rel).is_absolute(), f"{utt}: wav.scp path {rel} is absolute"
            path = recipe / rel
            assert path.is_file(), f"{utt}: {path} missing"
            info = sf.info(str(path))
            assert (info.samplerate, info.channels) == (16000, 1), f"{path}: {info}"
            assert info.format == "FLAC" and info.subtype == "PCM_16", f"{path}: {info}"
            dur = info.frames / info.samplerate
            assert 0.45 <= dur <= 8.5, f"{path}: implausible duration {dur:.2f} s"
            assert abs(dur - float(utt2dur[utt])) < 2e-3, f"{utt}: utt2dur disagrees with audio"
            t = text[utt]
            lang = "zh" if HANZI.match(t) else "en" if ENGLISH.match(t) else None
            assert lang, f"{utt}: transcript {t!r} is neither UPPER CASE English nor bare hanzi"
            assert utt.startswith(lang + "_"), f"{utt}: speaker language disagrees with text"
            facts[utt] = dict(part=part, lang=lang, dur=dur, path=path, text=t,
                              bytes=path.stat().st_size)
    train_spk = {u.split("-")[0] for u, f in facts.items() if f["part"] == "train"}
    dev_spk = {u.split("-")[0] for u, f in facts.items() if f["part"] == "dev"}
    assert not train_spk & dev_spk, "train and dev share speakers"
    return facts


def frame_groups(facts: dict) -> dict[str, int]:
    frames = [int(f["dur"] * 100) for f in facts.values()]
    return {":200": sum(n < 200 for n in frames),
            "200:400": sum(200 <= n < 400 for n in frames),
            "400:": sum(n >= 400 for n in frames)}


# ------------------------------------------------------------------ the committed corpus


@pytest.fixture(scope="module")
def committed():
    return check_data_dir(DATA, RECIPE)


def test_committed_corpus_is_a_valid_kaldi_data_dir(committed):
    assert len(committed) >= 200


def test_committed_corpus_has_both_languages_in_both_parts(committed):
    for part in PARTS:
        langs = {f["lang"] for f in committed.values() if f["part"] == part}
        assert langs == {"en", "zh"}, f"{part}: languages {langs}"


def test_committed_corpus_fits_the_size_budget():
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, f"egs/demo/data is {total} bytes, budget {MAX_BYTES}"


def test_committed_corpus_has_no_stray_audio(committed):
    on_disk = {p.resolve() for p in (DATA / "audio").glob("*.flac")}
    assert on_disk == {f["path"].resolve() for f in committed.values()}


def test_committed_corpus_lengths_spread_over_frame_groups(committed):
    groups = frame_groups(committed)
    assert groups[":200"] >= 100 and groups["200:400"] >= 10 and groups["400:"] >= 5, groups
    durs = sorted(f["dur"] for f in committed.values())
    assert durs[0] < 0.7 and durs[-1] > 5.0, (durs[0], durs[-1])


def test_committed_corpus_has_dotted_ids_and_decodes(committed):
    # Every id carries a dot (the rate in the speaker id): downstream keys must cope.
    assert all("." in u for u in committed)
    f = next(iter(committed.values()))
    x, sr = sf.read(str(f["path"]), dtype="float32")
    assert x.ndim == 1 and 0 < np.abs(x).max() <= 1.0


# ------------------------------------------------------------------ the tool (needs espeak-ng)


def run_tool(out: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(TOOL), "--out", str(out), *args], check=True,
                   capture_output=True, timeout=240)


@needs_tools
def test_tool_end_to_end(tmp_path):
    run_tool(tmp_path / "data", "--num-utts", "8", "--seed", "3", "--mix", "1,1,1")
    facts = check_data_dir(tmp_path / "data", tmp_path)
    assert len(facts) == 8
    for part in PARTS:
        assert {f["lang"] for f in facts.values() if f["part"] == part} == {"en", "zh"}
    groups = frame_groups(facts)
    assert all(n > 0 for n in groups.values()), groups


@needs_tools
def test_tool_same_seed_same_corpus(tmp_path):
    a, b, c = tmp_path / "a" / "data", tmp_path / "b" / "data", tmp_path / "c" / "data"
    run_tool(a, "--num-utts", "6", "--seed", "7")
    run_tool(b, "--num-utts", "6", "--seed", "7", "--jobs", "1")
    run_tool(c, "--num-utts", "6", "--seed", "8")
    for part in PARTS:
        for name in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur"):
            assert (a / part / name).read_bytes() == (b / part / name).read_bytes(), name
    for fa in sorted((a / "audio").glob("*.flac")):
        xa, _ = sf.read(str(fa), dtype="int16")
        xb, _ = sf.read(str(b / "audio" / fa.name), dtype="int16")
        assert np.array_equal(xa, xb), fa.name
    texts = [(d / p / "text").read_bytes() for d in (a, c) for p in PARTS]
    assert texts[:2] != texts[2:], "a different seed should give different sentences"
