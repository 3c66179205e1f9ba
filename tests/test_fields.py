"""Samples that carry a language and fields: packed into the shards, indexed, and delivered in batches,
each utterance tokenized by its language's tokenizer (and its corpus's), mixed by language."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from shardsets import build, build_multilingual, make_multilingual_dir, train_char_tokenizer

import wdsprep
from wdsprep import load_tokenizer, make_loader, pack_data
from wdsprep.format import native
from wdsprep.format.index import read_index
from wdsprep.plan.state import StateError
from wdsprep.tokenizer import AggregateTokenizer, train_tokenizer


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    """English, Mandarin and Russian (60/30/10% of the hours) packed with --utt2lang and --field prev_text."""
    root = tmp_path_factory.mktemp("fields")
    out, utts, toks = build_multilingual(root)
    return root, out, utts, toks


def expected_ids(toks: dict[str, Path], lang: str, text: str) -> list[int]:
    """``text`` in its language's own tokenizer, its ids moved to the language's range: the
    aggregate layout, worked out here from each tokenizer's own encode and vocab size."""
    offset = 2
    for name, path in toks.items():
        tok = load_tokenizer(path)
        if name == lang:
            return [i if i < 2 else i - 2 + offset for i in tok.encode(text)]
        offset += tok.vocab_size - 2
    raise KeyError(lang)


def test_webdataset_returns_the_language_and_fields_of_every_sample(multilingual):
    import webdataset as wds

    _, out, utts, _ = multilingual
    seen = {}
    for s in wds.WebDataset(sorted(str(p) for p in out.glob("data-*.tar")), shardshuffle=False).decode():
        uttid = wdsprep.decode_key(s["__key__"])
        seen[uttid] = (s["lang"].decode(), s["txt"], s["prev_text"].decode())
        assert s["npy"].ndim == 2
    assert seen == utts


def test_every_utterance_gets_its_languages_ids_language_and_fields(multilingual):
    """One tokenizer per language: every utterance's labels and previous-text tokens are its
    language's tokenizer's own encode, in that language's range; batch.lang and batch.fields hold
    its own values, with workers and without, the C reader and the Python one."""
    _, out, utts, toks = multilingual
    cached: dict[tuple[str, str], list[int]] = {}

    def ids(lang, text):
        if (lang, text) not in cached:
            cached[lang, text] = expected_ids(toks, lang, text)
        return cached[lang, text]

    for workers, pure in ((0, False), (2, False), (0, True)):
        lib = native.lib
        native.lib = None if pure else lib
        try:
            loader = make_loader(f"{out}/data-*.tar", toks, max_frames=1500, num_workers=workers, seed=3,
                                 fields=["prev_text"], text_fields=["prev_text"], streams=2)
            batches = list(loader)
        finally:
            native.lib = lib
        assert isinstance(loader.tokenizer, AggregateTokenizer) and loader.tokenizer.languages == ("en", "zh", "ru")
        got = []
        for b in batches:
            assert len(b.lang) == len(b.keys) == len(b.fields["prev_text"]) == b.field_tokens["prev_text"].shape[0]
            for i, uttid in enumerate(b.keys):
                lang, text, prev = utts[uttid]
                assert b.lang[i] == lang and b.fields["prev_text"][i] == prev
                assert b.labels[i, :b.label_lens[i]].tolist() == ids(lang, text)
                n = int(b.field_lens["prev_text"][i])
                assert b.field_tokens["prev_text"][i, :n].tolist() == ids(lang, prev)
                assert not b.field_tokens["prev_text"][i, n:].any()  # padded with 0
                got.append(uttid)
        assert sorted(got) == sorted(utts)  # every utterance once


def test_the_index_has_a_language_column_that_index_verify_and_inspect_know(multilingual, tmp_path):
    import shutil

    _, out, utts, _ = multilingual
    index = read_index(out)
    assert index.fields == ("lang", "prev_text") and list(index.columns) == ["lang"]
    keys = [wdsprep.decode_key(k) for k in index.keys()]
    assert index.columns["lang"].values() == [utts[k][0] for k in keys]
    doc = json.loads((out / "index.json").read_text())
    # An optional object of version 2: a reader without fields reads the rest as ever.
    assert doc["version"] == 2 and doc["fields"] == {"lang": {"values": 3}, "prev_text": {}}
    assert wdsprep.verify_shards(f"{out}/data-*.tar").ok
    # Re-indexed from the shards alone: the same column, and prev_text too when asked.
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for p in copy.glob("index*"):
        p.unlink()
    wdsprep.index_shards(f"{copy}/data-*.tar", index_fields=["prev_text"])
    again = read_index(copy)
    assert again.columns["lang"].values() == index.columns["lang"].values()
    assert again.columns["prev_text"].values() == [utts[k][2] for k in keys]
    result = wdsprep.inspect_shards(f"{out}/data-*.tar", max_frames_list=[])
    langs = result.languages()
    assert list(langs) == ["en", "zh", "ru"] and [n for n, _ in langs.values()] == [360, 180, 60]
    frames = np.asarray(index.frames)
    assert [round(h, 6) for _, h in langs.values()] == [
        round(float(frames[[utts[k][0] == lang for k in keys]].sum()) / 360_000, 6) for lang in ("en", "zh", "ru")]
    text = result.format()
    assert "language" in text and "ru" in text


def test_verify_finds_a_field_that_differs_from_the_index(multilingual, tmp_path):
    import os
    import shutil

    from shard_helpers import rewrite_tar, tar_members

    _, out, _, _ = multilingual
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shard = sorted(copy.glob("data-*.tar"))[0]
    st = shard.stat()
    first = next(n for n, _ in tar_members(shard) if n.endswith(".lang"))
    rewrite_tar(shard, lambda ms: [(n, b"xx" if n == first else d) for n, d in ms])  # same size: en, zh, ru
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    problems = [str(p) for p in wdsprep.verify_shards(f"{copy}/data-*.tar").problems]
    assert any("field lang is 'xx'" in p for p in problems), problems


def test_a_missing_language_or_field_is_reported_by_name_never_packed_empty(tmp_path):
    kd = tmp_path / "k"
    utts = make_multilingual_dir(kd, {"en": 12, "ru": 6})
    lines = (kd / "utt2lang").read_text().splitlines()
    no_lang = lines[3].split()[0]
    (kd / "utt2lang").write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    prev = (kd / "text.prev").read_text().splitlines()
    no_prev = prev[7].split()[0]
    (kd / "text.prev").write_text("\n".join(prev[:7] + prev[8:]) + "\n")
    report = pack_data(kd / "feats.scp", kd / "text", tmp_path / "out", utt2lang=kd / "utt2lang",
                       fields={"prev_text": kd / "text.prev"}, progress=False, max_lost=1)
    doc = json.loads((tmp_path / "out" / "pack_report.json").read_text())["not_written"]
    assert [d["uttid"] for d in doc["missing_lang"]] == [no_lang] and "utt2lang" in doc["missing_lang"][0]["why"]
    assert [d["uttid"] for d in doc["missing_field"]] == [no_prev]
    assert "field prev_text" in doc["missing_field"][0]["why"] and "text.prev" in doc["missing_field"][0]["why"]
    assert report.counts() == {"missing_lang": 1, "missing_field": 1}
    index = read_index(tmp_path / "out")
    assert index.num_utts == len(utts) - 2


def test_a_resume_with_other_fields_is_refused_and_older_records_have_none(tmp_path):
    from wdsprep.errors import DataError
    from wdsprep.pack.options import PackOptions

    assert "fields" not in PackOptions().record() and "index_fields" not in PackOptions().record()
    kd = tmp_path / "k"
    make_multilingual_dir(kd, {"en": 10})
    pack_data(kd / "feats.scp", kd / "text", tmp_path / "out", utt2lang=kd / "utt2lang", progress=False)
    with pytest.raises(DataError, match=r"field prev_text is .*not given|fields=\['lang', 'prev_text'\]"):
        pack_data(kd / "feats.scp", kd / "text", tmp_path / "out", utt2lang=kd / "utt2lang",
                  fields={"prev_text": kd / "text.prev"}, resume=True, progress=False)
    # The same inputs resume (a complete pack is only reported).
    pack_data(kd / "feats.scp", kd / "text", tmp_path / "out", utt2lang=kd / "utt2lang", resume=True, progress=False)


@pytest.mark.parametrize("name,why", [("txt", "taken"), ("json", "taken"), ("pyd", "taken"), ("Lang", "lowercase"),
                                      ("prev.text", "lowercase"), ("mat", "taken")])
def test_field_names_that_would_clash_are_refused(tmp_path, name, why):
    kd = tmp_path / "k"
    make_multilingual_dir(kd, {"en": 3})
    with pytest.raises(ValueError, match=why):
        pack_data(kd / "feats.scp", kd / "text", tmp_path / "out", fields={name: kd / "text.prev"}, progress=False)
    assert not (tmp_path / "out").exists()


def test_the_cli_packs_fields_and_an_aggregate_tokenizer(tmp_path, multilingual):
    from wdsprep.cli import main

    _, _, _, toks = multilingual
    kd = tmp_path / "k"
    make_multilingual_dir(kd, {"en": 6, "zh": 4})
    assert main(["pack", "--scp", str(kd / "feats.scp"), "--text", str(kd / "text"), "--out", str(tmp_path / "o"),
                 "--utt2lang", str(kd / "utt2lang"), "--field", f"prev_text={kd / 'text.prev'}",
                 "--index-field", "prev_text", "--no-progress"]) == 0
    assert list(read_index(tmp_path / "o").columns) == ["lang", "prev_text"]
    assert main(["tokenizer", "aggregate", f"en={toks['en']}", f"zh={toks['zh']}", "--out",
                 str(tmp_path / "agg.json")]) == 0
    agg = load_tokenizer(tmp_path / "agg.json")
    en, zh = load_tokenizer(toks["en"]), load_tokenizer(toks["zh"])
    assert agg.vocab_size == en.vocab_size + zh.vocab_size - 2 and agg.offsets == {"en": 2, "zh": en.vocab_size}


def test_an_aggregate_tokenizer_lays_ids_out_and_reads_back(multilingual, tmp_path):
    _, _, _, toks = multilingual
    subs = {lang: load_tokenizer(p) for lang, p in toks.items()}
    agg = AggregateTokenizer(subs)
    ranges = []
    for lang, tok in subs.items():
        ranges.append(set(range(agg.offsets[lang], agg.offsets[lang] + tok.vocab_size - 2)))
        assert agg.id_to_piece(agg.offsets[lang]) == tok.id_to_piece(2)
    assert all(not (a & b) for i, a in enumerate(ranges) for b in ranges[i + 1:])  # disjoint ranges
    assert set().union(*ranges) == set(range(2, agg.vocab_size))
    text = {"en": "the cat sat", "zh": "你好世界", "ru": "кот сидел"}
    for lang, t in text.items():
        ids = agg.encode(t, lang)
        assert ids == [i if i < 2 else i - 2 + agg.offsets[lang] for i in subs[lang].encode(t)]
        assert agg.decode(ids) == subs[lang].decode(subs[lang].encode(t))
    agg.save(tmp_path / "agg.json")
    again = load_tokenizer(tmp_path / "agg.json")
    want = [agg.encode(t, lang) for lang, t in text.items()]
    assert again.encode_batch(list(text.values()), langs=list(text)) == want
    doc = json.loads((tmp_path / "agg.json").read_text())
    doc["languages"][1]["offset"] += 1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(wdsprep.tokenizer.TokenizerFileError, match="offsets"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="by its language"):
        agg.encode("x")


def test_normalization_is_one_treatment_for_training_and_loading_and_a_resume_keeps_it(tmp_path):
    from wdsprep.tokenizer import parse_normalize

    n = parse_normalize(["nfkc", "lower", "strip_punct", "collapse_spaces"])
    assert n("  Ｈｅｌｌｏ,   WORLD!  你好。") == "hello world 你好"
    assert parse_normalize(["remove_spaces"])("你 好 世 界") == "你好世界"
    (tmp_path / "mine.py").write_text("def clean(t):\n    return t.replace('cat', 'dog')\n")
    assert parse_normalize([f"{tmp_path / 'mine.py'}:clean", "upper"])("a cat") == "A DOG"
    with pytest.raises(ValueError, match="nope"):
        parse_normalize(["nope"])
    out, utts = build(tmp_path, n=60, utts_per_shard=20, seed=4)
    text = tmp_path / "kaldi-cat-4" / "text"
    trained = train_tokenizer("char", [text], tmp_path / "upper.json", normalize=["upper"])
    pieces = [trained.id_to_piece(i) for i in range(3, trained.vocab_size)]  # after <s>, <unk>, <space>
    assert pieces and all(p == p.upper() for p in pieces) and any(p != p.lower() for p in pieces)
    loader = make_loader(f"{out}/data-*.tar", tmp_path / "upper.json", max_frames=2000, normalize=["upper"])
    for b in loader:
        for i, k in enumerate(b.keys):
            assert b.labels[i, :b.label_lens[i]].tolist() == trained.encode(utts[k][1].upper())
            assert 1 not in b.labels[i, :b.label_lens[i]].tolist()  # no <unk>: treated as in training
    state = loader.state_dict()
    other = make_loader(f"{out}/data-*.tar", tmp_path / "upper.json", max_frames=2000, normalize=["upper", "strip"])
    with pytest.raises(StateError, match=r"normalize=\[upper\] \(this loader: \[upper, strip\]\)"):
        other.load_state_dict(state)
    plain = make_loader(f"{out}/data-*.tar", tmp_path / "upper.json", max_frames=2000)
    with pytest.raises(StateError, match="normalize"):
        plain.load_state_dict(state)
    plain.load_state_dict(make_loader(f"{out}/data-*.tar", tmp_path / "upper.json", max_frames=2000).state_dict())


def test_each_corpus_tokenizes_and_augments_by_its_own_transforms(multilingual, tmp_path):
    """Two corpora mixed, each with its own tokenizer and augmentation; a third inherits the
    loader's: every utterance's labels are its corpus's tokenizer's, SpecAugment masks only the
    corpus that asks for it, and hyper-p.json's ld object gives the same loader."""
    _, out, utts, toks = multilingual
    fe, fe_utts = build(tmp_path, n=80, utts_per_shard=20, seed=6, prefix="x-")
    char = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-6" / "text")
    mask = {"specaugment": {"freq_masks": 2, "freq_width": 4, "time_masks": 0, "fill": "zero"}}
    corpora = {"ml": {"shards": f"{out}/data-*.tar", "tokenizer": {k: str(v) for k, v in toks.items()},
                      "augment": mask},
               "x": {"shards": f"{fe}/data-*.tar", "normalize": ["upper"]}}
    loader = make_loader(corpora, char, max_frames=1500, weights={"ml": 1, "x": 1}, seed=5)
    upper = load_tokenizer(char)
    masked = plain = 0
    batches = list(loader)
    for b in batches:
        for i, k in enumerate(b.keys):
            got = b.labels[i, :b.label_lens[i]].tolist()
            if loader.corpora[int(b.corpus[i])] == "ml":
                assert got == expected_ids(toks, utts[k][0], utts[k][1])
                row = b.feats[i, :int(b.feat_lens[i])].numpy()
                masked += int((row == 0).all(axis=0).any())
            else:
                assert got == upper.encode(fe_utts[k][1].upper())
                row = b.feats[i, :int(b.feat_lens[i])].numpy()
                assert np.array_equal(row, fe_utts[k][0])  # not augmented: the shard's features
                plain += 1
    assert masked > 0 and plain > 0
    hyper = tmp_path / "hyper-p.json"
    hyper.write_text(json.dumps({"train": {"option": {"ld": {"corpora": corpora, "weights": {"ml": 1, "x": 1},
                                                             "max_frames": 1500, "seed": 5},
                                                      "tokenizer": str(char)}}}))
    from wdsprep.hyper import make_loader_from_hyper

    again = make_loader_from_hyper(hyper)
    assert [b.keys for b in again] == [b.keys for b in batches]
    assert again.dataset.fingerprint() == loader.dataset.fingerprint()


def test_mixing_by_language_gives_the_temperatures_shares(multilingual):
    """Languages of 60/30/10% of the hours, temperature 2: each language's share of the utterances
    over an epoch is within 5 points of hours^(1/2), as named corpora's are."""
    _, out, utts, toks = multilingual
    loader = make_loader(f"{out}/data-*.tar", toks, max_frames=600, mix_by="lang", temperature=2,
                         steps_per_epoch=1500, seed=1)
    assert loader.corpora == ("en", "zh", "ru") and loader.source.kind == "mixture"
    index = read_index(out)
    lang = index.columns["lang"].values()
    hours = {x: float(np.asarray(index.frames)[[y == x for y in lang]].sum()) for x in loader.corpora}
    assert abs(hours["en"] / sum(hours.values()) - 0.6) < 0.03 and abs(hours["ru"] / sum(hours.values()) - 0.1) < 0.02
    want = {x: h ** 0.5 for x, h in hours.items()}
    drawn = dict.fromkeys(loader.corpora, 0)
    for b in loader:
        assert len(set(b.lang)) <= 1 and b.lang == [loader.corpora[c] for c in b.corpus.tolist()]
        for k, x in zip(b.keys, b.lang):
            assert utts[k][0] == x
            drawn[x] += 1
    total = sum(drawn.values())
    for x in loader.corpora:
        assert abs(drawn[x] / total - want[x] / sum(want.values())) < 0.05, (drawn, want)


def test_a_temperature_per_level_and_weights_that_name_the_parts(multilingual, tmp_path):
    _, out, utts, toks = multilingual
    other, _ = build(tmp_path, n=60, utts_per_shard=20, seed=8, prefix="o-")
    kd = tmp_path / "kaldi-cat-8"
    (kd / "utt2lang").write_text("".join(f"{line.split()[0]} en\n" for line in (kd / "text").read_text().splitlines()))
    pack_data(kd / "feats.scp", kd / "text", tmp_path / "o2", utt2lang=kd / "utt2lang", utts_per_shard=20,
              progress=False)
    trset = {"ml": f"{out}/data-*.tar", "o": f"{tmp_path / 'o2'}/data-*.tar"}
    loader = make_loader(trset, toks, max_frames=1500, mix_by="lang", temperature=[1, 4])
    assert loader.corpora == ("ml/en", "ml/zh", "ml/ru", "o/en")
    shares = dict(zip(loader.corpora, loader.source.mixture.points[0]))
    index, hours = read_index(out), {}
    for x in ("en", "zh", "ru"):
        hours[x] = float(np.asarray(index.frames)[[y == x for y in index.columns["lang"].values()]].sum())
    o_hours = float(np.asarray(read_index(tmp_path / "o2").frames).sum())
    ml = sum(hours.values())
    inner = {x: h ** 0.25 for x, h in hours.items()}
    assert shares["o/en"] == pytest.approx(o_hours / (o_hours + ml))
    for x in hours:
        assert shares[f"ml/{x}"] == pytest.approx(ml / (o_hours + ml) * inner[x] / sum(inner.values()))
    weighted = make_loader(trset, toks, max_frames=1500, mix_by="lang",
                           weights={"ml/en": 0, "ml/zh": 1, "ml/ru": 1, "o/en": 0})
    assert {lang for b in weighted for lang in b.lang} == {"zh", "ru"}
    with pytest.raises(ValueError, match="no corpus named"):
        make_loader(trset, toks, max_frames=1500, mix_by="lang", weights={"en": 1})
    with pytest.raises(ValueError, match="mix_by 'task'.*no task column"):
        make_loader(trset, toks, max_frames=1500, mix_by="task")


def refs_of(loader, at, rank):
    """The planned batches ``rank`` yields in the run from position ``at``."""
    run = loader.source.run(at)
    return [ref for window in run.windows(rank) for ref in window.refs]


def test_mixing_by_language_resumes_on_another_world_size(multilingual):
    """Two ranks stop at step 4; three resume: every resumed batch is the plan's for the saved
    position on three ranks, and no planned batch of any language's part is yielded twice."""
    from wdsprep.format.records import iter_records

    _, out, _, toks = multilingual
    kw = {"max_frames": 1500, "mix_by": "lang", "temperature": 3, "seed": 2}
    two = [make_loader(f"{out}/data-*.tar", toks, rank=r, world_size=2, **kw) for r in range(2)]
    its = [iter(x) for x in two]
    seen = [[next(it).keys for _ in range(4)] for it in its]
    state = two[0].state_dict()
    assert state == two[1].state_dict() and state["step"] == 4
    before = [ref for r in range(2) for ref in refs_of(two[r], two[r].source.start(0), r)[:4]]
    keys = np.array([k for url in two[0].source.shards.urls for b in iter_records(url) for k in b.uttids.tolist()],
                    object)
    three = [make_loader(f"{out}/data-*.tar", toks, rank=r, world_size=3, **kw) for r in range(3)]
    for x in three:
        x.load_state_dict(state)
    left = len(three[0]) - three[0].position().step  # len counts from the epoch's start
    rest = [[sorted(b.keys) for b in x] for x in three]
    assert len({len(r) for r in rest}) == 1 and len(rest[0]) == left > 0
    after = []
    for r, x in enumerate(three):
        refs = refs_of(x, x.source.start(0), r)
        assert [sorted(keys[x.source.rows(ref)].tolist()) for ref in refs] == rest[r]
        after += refs
    assert not set(before) & set(after) and len(set(after)) == len(after)
    assert [sorted(keys[two[r].source.rows(ref)].tolist()) for r in range(2)
            for ref in refs_of(two[r], two[r].source.start(0), r)[:4]] == [sorted(k) for r in seen for k in r]


def test_label_tokens_are_counted_per_language_for_cost_sized_batches(multilingual):
    from wdsprep.format.index import tokens_name
    from wdsprep.plan.tokens import LabelTokens

    _, out, utts, toks = multilingual
    loader = make_loader(f"{out}/data-*.tar", toks, max_frames=None, cost={"per_frame": 1.0, "per_frame_token": 0.01},
                         max_cost=4000, seed=1)
    shards = loader.source.shards
    index = read_index(out)
    keys = [wdsprep.decode_key(k) for k in index.keys()]
    want = [len(expected_ids(toks, utts[k][0], utts[k][1])) for k in keys]
    assert np.asarray(shards.tokens).tolist() == want
    name = tokens_name(index, LabelTokens(loader.tokenizer).digest)
    assert (out / name).is_file()
    assert sum(len(b.keys) for b in loader) == len(utts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        upper = make_loader(f"{out}/data-*.tar", toks, max_frames=None, max_cost=4000, normalize=["upper"],
                            cost={"per_frame": 1.0, "per_frame_token": 0.01})
    assert tokens_name(index, LabelTokens(upper.dataset.transforms[0]).digest) != name  # another column
