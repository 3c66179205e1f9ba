"""Shards as CAT writes them, read by wdsprep: both layouts, unencoded dotted ids, no index.json,
through make_loader, verify and inspect, with the C walk and with the Python one.

CAT writes with webdataset's ShardWriter: ``{"__key__": uttid, "npy": feats, "txt": text}``
(``cat``; ``cat/utils/data/prep_wds.py``) or ``{"__key__": uttid, "mat.npy": feats, "label.txt":
text}`` (``cat-v3``; v3's ``egs/wenetspeech/local/prep_wds.py``), the id as it is: a
speed-perturbed ``sp0.9-spk00-utt0003`` goes in with its dot, which webdataset's own reader then
cuts at.  ShardWriter stamps a float mtime, so every member has a pax header.  Folders are
``{lo}_{hi}`` per length group (v3 leaves an open end empty, today's CAT writes ``INF``).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from cat_reference import SentencePieceTokenizer, corpus, tknz

from wdsprep import inspect_shards, make_loader, make_loader_from_hyper, verify_shards
from wdsprep.format import native
from wdsprep.tokenizer import import_cat_tokenizer, load_tokenizer

CAT_EXTS = {"cat": ("npy", "txt"), "cat-v3": ("mat.npy", "label.txt")}
# CAT's folder names for the groups [0, 60), [60, 150), [150, inf)
CAT_FOLDERS = {"cat": ["0_60", "60_150", "150_INF"], "cat-v3": ["_60", "60_150", "150_"]}
BOUNDS = [(0, 60), (60, 150), (150, 1 << 31)]


@pytest.fixture(autouse=True, params=["native", "python"])
def walk(request, monkeypatch):
    """Each test runs with the C walk (when built) and with the Python one it falls back to."""
    if request.param == "python":
        monkeypatch.setattr(native, "lib", None)
    elif native.lib is None:
        pytest.skip("wdsprep._native not built or WDSPREP_PURE_PYTHON set (see test_native.py)")
    return request.param


def cat_utterances(n: int = 60, seed: int = 3) -> dict[str, tuple[np.ndarray, str]]:
    """Speed-perturbed copies with dotted ids (as CAT's sp recipes name them), Mandarin and English text."""
    rng = np.random.default_rng(seed)
    texts = [t.strip() for t in corpus(n, seed=seed)]
    utts = {}
    for i in range(n):
        speed = ("sp0.9-", "sp1.0-", "sp1.1-", "")[i % 4]
        uttid = f"{speed}spk{i % 5:02d}-utt{i:04d}"
        utts[uttid] = (rng.standard_normal((int(rng.integers(10, 300)), 8)).astype(np.float32), texts[i])
    return utts


def write_cat_shards(root: Path, layout: str, utts: dict, per_shard: int = 7) -> Path:
    """Shards written the way CAT writes them (webdataset.ShardWriter, raw ids, one folder per group)."""
    feat_ext, text_ext = CAT_EXTS[layout]
    sinks = []
    for folder in CAT_FOLDERS[layout]:
        (root / folder).mkdir(parents=True, exist_ok=True)
        sinks.append(wds.ShardWriter(str(root / folder / "%05d.tar"), maxcount=per_shard, verbose=0))
    for uttid, (feats, text) in utts.items():
        group = next(k for k, (lo, hi) in enumerate(BOUNDS) if lo <= len(feats) < hi)
        sinks[group].write({"__key__": uttid, feat_ext: feats, text_ext: text})
    for s in sinks:
        s.close()
    assert not list(root.rglob("index.json"))
    return root


@pytest.fixture(scope="module")
def cat_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """CAT's char tokenizer (sentencepiece, add_dummy_prefix=false), its .tknz, and CAT's encoder."""
    d = tmp_path_factory.mktemp("tok")
    (d / "corpus.txt").write_text("\n".join(corpus()), encoding="utf-8")
    SentencePieceTokenizer.train(str(d / "corpus.txt"), str(d / "spm"), 2000, model_type="char",
                                 add_dummy_prefix=False, use_all_vocab=True, hard_vocab_limit=False)
    cat = SentencePieceTokenizer(str(d / "spm.model"))
    return tknz(cat, d / "tokenizer.tknz"), cat


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_loader_reads_cat_shards_whole(tmp_path: Path, layout: str, cat_tokenizer) -> None:
    utts = cat_utterances()
    root = write_cat_shards(tmp_path / "shards", layout, utts)
    src, cat = cat_tokenizer
    tok = import_cat_tokenizer(src, tmp_path / "tokenizer.json")
    pattern = f"{root}/{{{','.join(CAT_FOLDERS[layout])}}}/*.tar"
    loader = make_loader(pattern, tok, max_frames=1500, seed=1)
    loader.set_epoch(0)
    seen = Counter()
    for b in loader:
        for j, key in enumerate(b.keys):
            seen[key] += 1
            feats, text = utts[key]  # the dotted id whole: "sp0.9-spk00-utt0000", not "sp0"
            np.testing.assert_array_equal(b.feats[j, : b.feat_lens[j]].numpy(), feats)
            assert b.labels[j, : b.label_lens[j]].tolist() == cat.encode(text)  # CAT's ids
    assert seen == Counter(utts.keys())
    assert sum("." in k for k in utts) == len(utts) * 3 // 4


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_verify_and_inspect_read_cat_shards(tmp_path: Path, layout: str) -> None:
    utts = cat_utterances()
    root = write_cat_shards(tmp_path / "shards", layout, utts)
    r = verify_shards(f"{root}/*/*.tar")
    assert r.ok, r.format()
    assert r.samples == len(utts)
    # Dotted keys are read whole, and the note says other readers would not.
    assert sorted(n.key for n in r.notes) == sorted(k for k in utts if "." in k)
    result = inspect_shards(f"{root}/*/*.tar", max_frames_list=[2000])
    assert not result.problems, result.problems
    assert result.utts == len(utts)
    assert all(s.source == "tar" and s.layout == layout for s in result.shards)  # no index.json: the tars
    by_folder = {g.folder.rstrip("/").rsplit("/", 1)[-1]: g for g in result.groups}
    for folder, (lo, hi) in zip(CAT_FOLDERS[layout], BOUNDS):
        want = sorted(len(f) for f, _ in utts.values() if lo <= len(f) < hi)
        assert sorted(by_folder[folder].frames.tolist()) == want


def test_cat_experiment_as_it_is(tmp_path: Path, cat_tokenizer) -> None:
    """A CAT experiment dir unchanged (hyphenated keys, the .tknz in tokenizer.file, '|V|'), plus the
    imported tokenizer: the loader reads CAT's shards with CAT's ids and bounded batches."""
    utts = cat_utterances(n=40)
    root = write_cat_shards(tmp_path / "data" / "wds", "cat", utts)
    src, cat = cat_tokenizer
    hyper = {"tokenizer": {"type": "SentencePieceTokenizer", "file": str(src), "|V|": cat.vocab_size},
             "train": {"bin": "cat.ctc.train",
                       "option": {"amp": True, "large-dataset": True, "ld": f"{root}/{{0_60,60_150,150_INF}}/*.tar",
                                  "batching-mode": "bucket", "bucket-size": 1200, "batch_size": 64,
                                  "grad-norm": 5.0, "check-freq": 500}}}
    hp = tmp_path / "hyper-p.json"
    hp.write_text(json.dumps(hyper), encoding="utf-8")
    with pytest.raises(ValueError, match="import-cat"), pytest.warns(UserWarning, match="batch_size"):
        make_loader_from_hyper(hp)  # the pickle is not read behind the user's back
    tok = tmp_path / "tokenizer.json"
    import_cat_tokenizer(src, tok)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader_from_hyper(hp, tokenizer=tok)
    assert any("batch_size=64 is not used" in str(w.message) for w in caught)  # said, not silently dropped
    loader.set_epoch(0)
    batches = list(loader)
    assert Counter(k for b in batches for k in b.keys) == Counter(utts.keys())
    assert all(len(b.keys) * int(b.feat_lens.max()) <= 1200 for b in batches if len(b.keys) > 1)
    assert all(b.labels[j, : b.label_lens[j]].tolist() == cat.encode(utts[k][1])
               for b in batches for j, k in enumerate(b.keys))
    assert load_tokenizer(tok).vocab_size == hyper["tokenizer"]["|V|"]
