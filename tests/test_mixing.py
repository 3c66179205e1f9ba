"""Named corpora in one loader: mixed by weight or schedule on real packed shards, resumed anywhere."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.check.planreport import plan_report
from wdsprep.format.records import iter_records
from wdsprep.loader import make_loader
from wdsprep.units import FRAMES_PER_HOUR


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A larger English-like corpus and a small one with other ids, packed as users pack them."""
    root = tmp_path_factory.mktemp("mixing")
    en, en_utts = build(root, n=240, utts_per_shard=20, seed=0, prefix="en-")
    zh, zh_utts = build(root, n=60, utts_per_shard=15, seed=1, prefix="zh-", layout="cat-v3")
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return {"en": f"{en}/data-*.tar", "zh": f"{zh}/data-*.tar"}, {**en_utts, **zh_utts}, tok


def corpus_of(key: str) -> str:
    return key.split("-", 1)[0]


def epoch_batches(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def planned_keys(loader, rank_refs):
    """The utterance ids the mixed plan puts in each of these batches (read from the shards, not
    from the loader): what the loader must yield."""
    source = loader.source
    keys = np.array([k for url in source.shards.urls for r in iter_records(url) for k in r.uttids.tolist()], object)
    return [sorted(keys[source.rows(ref)].tolist()) for ref in rank_refs]


def planned_refs(loader, epoch, rank):
    """The batches the mixed plan gives ``rank`` in ``epoch``, from where the loader starts it."""
    run = loader.source.run(loader.source.start(epoch))
    return [ref for window in run.windows(rank) for ref in window.refs]


def test_batches_say_which_corpus_each_utterance_came_from(corpora):
    trset, utts, tok = corpora
    loader = make_loader(trset, tok, max_frames=1500, weights={"en": 1, "zh": 1})
    assert loader.source.kind == "mixture" and loader.corpora == ("en", "zh")
    batches = epoch_batches(loader, 0)
    assert len(batches) == len(loader) == loader.stats.steps == loader.stats.planned_steps
    per = Counter()
    frames = Counter()
    for b in batches:
        feats, feat_lens, labels, label_lens, keys = b  # still five fields
        assert [loader.corpora[c] for c in b.corpus.tolist()] == [corpus_of(k) for k in keys]
        for i, k in enumerate(keys):
            np.testing.assert_array_equal(feats[i, :int(feat_lens[i])].numpy(), utts[k][0])
            per[corpus_of(k)] += 1
            frames[corpus_of(k)] += int(feat_lens[i])
    st = loader.stats
    assert {n: c.utterances for n, c in st.corpora.items()} == per
    hours = {n: f / FRAMES_PER_HOUR for n, f in frames.items()}
    assert {n: c.hours for n, c in st.corpora.items()} == pytest.approx(hours)
    # Equal weights: zh (60 utterances against 240) loops through its own epochs several times.
    assert st.corpora["zh"].epochs > 1.5 and st.corpora["en"].epochs < 1
    assert st.utterances == st.assigned == sum(per.values()) and st.num_dropped == 0


def test_the_share_of_utterances_follows_the_schedule_epoch_by_epoch(corpora):
    """Four loader epochs of 150 steps: each takes the schedule's mean share over its steps, within
    the rounding of a batch's utterances (the corpora's own batches are mixed, mix_unit='batch')."""
    trset, _, tok = corpora
    schedule = [(0, {"en": 9, "zh": 1}), (400, {"en": 1, "zh": 1})]
    loader = make_loader(trset, tok, max_frames=700, schedule=schedule, steps_per_epoch=150)
    shares = []
    for epoch in range(4):
        corpus = np.concatenate([b.corpus.numpy() for b in epoch_batches(loader, epoch)])
        scheduled = loader.source.mixture.at(150 * epoch + np.arange(150)).mean(axis=0)[1]
        shares.append((corpus == 1).mean())
        assert abs(shares[-1] - scheduled) <= 0.05, (epoch, shares[-1], scheduled)
    assert shares[0] < 0.2 and 0.4 < shares[-1] < 0.6


def test_same_seed_same_batches(corpora):
    trset, _, tok = corpora
    runs = [[b.keys for b in epoch_batches(make_loader(trset, tok, max_frames=1500, seed=s), 1)] for s in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_workers_yield_exactly_the_plan(corpora):
    trset, _, tok = corpora
    loader = make_loader(trset, tok, max_frames=1500, num_workers=2, temperature=2.0)
    for epoch in (0, 1):
        batches = epoch_batches(loader, epoch)
        refs = planned_refs(loader, epoch, 0)
        assert [sorted(b.keys) for b in batches] == planned_keys(loader, refs)


def ranks(trset, tok, world, **kw):
    return [make_loader(trset, tok, max_frames=1500, rank=r, world_size=world, **kw) for r in range(world)]


def test_resumed_mid_schedule_on_another_world_size_it_continues_the_plan(corpora):
    """Two ranks stop at step 9 of epoch 1; three resume.  Every resumed batch is the one the plan
    gives for the saved position on three ranks; the schedule's clock goes on; within a corpus
    epoch no utterance comes twice."""
    trset, _, tok = corpora
    schedule = [(0, {"en": 9, "zh": 1}), (120, {"en": 1, "zh": 1})]
    two = ranks(trset, tok, 2, schedule=schedule)
    seen = []
    for loader in two:
        epoch_batches(loader, 0)
        loader.set_epoch(1)
        it = iter(loader)
        seen += [next(it) for _ in range(9)]
    state = two[0].state_dict()
    assert state == two[1].state_dict()  # every rank is at the same place: rank 0's serves
    json.dumps(state)  # a checkpoint holds it as it is
    assert state["step"] == 9 and state["global_step"] == len(planned_refs(two[0], 0, 0)) + 9
    three = ranks(trset, tok, 3, schedule=schedule)
    for loader in three:
        loader.load_state_dict(state)
        left = loader.source.run(loader.source.start(1)).steps(0)
        assert len(loader) == state["step"] + left and left == (sum(two[0].source.planner.counts(1)) - 18) // 3
    for r, loader in enumerate(three):
        batches = epoch_batches(loader, 1)
        refs = planned_refs(loader, 1, r)
        assert [sorted(b.keys) for b in batches] == planned_keys(loader, refs)
    end = three[0].state_dict()
    assert end["global_step"] == state["global_step"] + len(batches) and end["complete"]


def test_resumed_on_the_same_world_size_it_goes_on_as_if_never_stopped(corpora):
    trset, _, tok = corpora
    whole = [[b.keys for b in epoch_batches(loader, 0)] for loader in ranks(trset, tok, 2, num_workers=2)]
    first = ranks(trset, tok, 2, num_workers=2)
    head = []
    for loader in first:
        loader.set_epoch(0)
        it = iter(loader)
        head.append([next(it).keys for _ in range(7)])
    state = first[0].state_dict()
    for r, loader in enumerate(ranks(trset, tok, 2, num_workers=2)):
        loader.load_state_dict(state)
        assert head[r] + [b.keys for b in epoch_batches(loader, 0)] == whole[r]


def test_changed_weights_at_resume_say_what_changed_and_apply_from_the_next_epoch(corpora):
    """The saved epoch keeps the shares it was planned with (so its batches are the ones planned);
    the new mixture plans the epochs after it."""
    trset, _, tok = corpora
    loader = make_loader(trset, tok, max_frames=1500, weights={"en": 1, "zh": 1})
    loader.set_epoch(0)
    it = iter(loader)
    head = [next(it).keys for _ in range(5)]
    state = loader.state_dict()
    whole = make_loader(trset, tok, max_frames=1500, weights={"en": 1, "zh": 1})
    changed = make_loader(trset, tok, max_frames=1500, weights={"en": 1, "zh": 0})
    with pytest.warns(UserWarning, match=r"mixture differs.*en 0\.5, zh 0\.5 \(weights\) -> en 1, zh 0 \(weights\)"
                                         r".*from the next epoch on"):
        changed.load_state_dict(state)
    assert head + [b.keys for b in epoch_batches(changed, 0)] == [b.keys for b in epoch_batches(whole, 0)]
    assert all(set(b.corpus.tolist()) == {0} for b in epoch_batches(changed, 1))


def test_a_dev_loader_reads_every_corpus_once(corpora):
    trset, utts, tok = corpora
    loader = make_loader(trset, tok, max_frames=1500, train=False)
    assert loader.source.kind == "corpus" and loader.corpora == ("en", "zh")
    batches = epoch_batches(loader, 0)
    keys = [k for b in batches for k in b.keys]
    assert Counter(keys) == Counter(utts.keys())
    assert all([loader.corpora[c] for c in b.corpus.tolist()] == [corpus_of(k) for k in b.keys] for b in batches)
    assert {n: c.utterances for n, c in loader.stats.corpora.items()} == {"en": 240, "zh": 60}
    with pytest.raises(ValueError, match="dev loader.*once"):
        make_loader(trset, tok, max_frames=1500, train=False, weights={"en": 1, "zh": 1})


def test_mistakes_are_refused_saying_what_to_do(corpora, tmp_path):
    trset, _, tok = corpora
    with pytest.raises(ValueError, match=r"no weight for \['zh'\]"):
        make_loader(trset, tok, max_frames=1500, weights={"en": 1})
    with pytest.raises(ValueError, match="only named corpora are mixed.*name: pattern"):
        make_loader(trset["en"], tok, max_frames=1500, weights={"en": 1})
    with pytest.raises(ValueError, match="is in corpus 'en' and in corpus 'again'"):
        make_loader({**trset, "again": trset["en"]}, tok, max_frames=1500)
    plain = make_loader(trset["en"], tok, max_frames=1500)
    with pytest.raises(ValueError, match="saved by a mixed loader"):
        plain.load_state_dict(make_loader(trset, tok, max_frames=1500).state_dict())


def test_hyper_ld_object_names_the_corpora_and_the_mixture(corpora, tmp_path):
    from wdsprep.hyper import make_loader_from_hyper

    trset, _, tok = corpora
    hyper = tmp_path / "hyper-p.json"
    ld = {"corpora": trset, "schedule": [[0, {"en": 3, "zh": 1}], [50, {"en": 1, "zh": 1}]], "steps-per-epoch": 40}
    hyper.write_text(json.dumps({"train": {"option": {"ld": ld, "bucket_size": 3000, "tokenizer": str(tok)}}}))
    loader = make_loader_from_hyper(hyper, world_size=2, rank=1)
    assert loader.source.kind == "mixture" and len(loader) == 40
    assert loader.source.mixture.describe() == "en 0.75@0 -> 0.5@50, zh 0.25@0 -> 0.5@50 (schedule)"
    hyper.write_text(json.dumps({"train": {"option": {"ld": {"corpora": trset, "mix": 1}, "bucket_size": 3000,
                                                      "tokenizer": str(tok)}}}))
    with pytest.raises(ValueError, match=r"ld has \['mix'\]"):
        make_loader_from_hyper(hyper, world_size=1)


def test_dry_run_shows_the_planned_mixture(corpora, tmp_path):
    trset, _, tok = corpora
    corpus_args = [a for name, p in trset.items() for a in ("--corpus", f"{name}={p}")]
    plan = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--plan", *corpus_args, "--max-frames", "1500",
                           "--schedule", "0:en=9,zh=1", "100:en=1,zh=1", "--world-size", "2",
                           "--plot", str(tmp_path / "planned.png")], capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert (tmp_path / "planned.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "en 0.9@0 -> 0.5@100, zh 0.1@0 -> 0.5@100 (schedule)" in plan.stdout
    assert "share of utterances per step range, scheduled -> planned (share of hours)" in plan.stdout
    rows = re.findall(r"^ +(\d+)-(\d+) +([01]\.\d{3})->([01]\.\d{3}) \([01]\.\d{3}\)", plan.stdout, re.M)
    assert len(rows) == 8 and rows[0][0] == "0" and float(rows[0][2]) > 0.85  # en's share, scheduled
    real = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", *corpus_args, "--tokenizer", str(tok),
                           "--max-frames", "1500", "--weights", "en=1", "zh=1", "--epochs", "2",
                           "--plot", str(tmp_path / "mix.png")], capture_output=True, text=True, timeout=120)
    assert real.returncode == 0, real.stderr
    assert (tmp_path / "mix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"mixture plot: {tmp_path}" in real.stdout
    line = next(x for x in real.stdout.splitlines() if "per corpus" in x)
    assert "en: " in line and "zh: " in line and "epochs" in line


def test_what_the_plan_leaves_out_is_counted_once_per_corpus_epoch(corpora):
    """Only zh is drawn: each of its epochs leaves out its short utterances once, whichever of the
    two ranks reads the streams; a corpus epoch begun counts what its begun streams left out."""
    trset, utts, tok = corpora
    short = sum(1 for k, (f, _) in utts.items() if corpus_of(k) == "zh" and len(f) < 60)
    assert short
    loaders = ranks(trset, tok, 2, min_frames=60, weights={"en": 0, "zh": 1}, steps_per_epoch=20)
    dropped = Counter()
    for loader in loaders:
        epoch_batches(loader, 0)
        dropped += Counter(loader.stats.dropped)
    epochs = loaders[0].stats.corpora["zh"].epochs
    assert loaders[0].stats.corpora["en"].utterances == 0 and epochs > 2
    assert math.floor(epochs) * short <= dropped["too_short"] <= math.ceil(epochs) * short


def test_each_corpus_has_a_shuffle_report_of_its_own_batches_and_speakers(tmp_path):
    """Two corpora packed with utt2spk (7 speakers each): the loader's and the dry-run's per-corpus
    report count what the yielded batches hold."""
    from shardsets import make_kaldi_dir

    from wdsprep.check.planreport import plan_report
    from wdsprep.pack import pack_data
    from wdsprep.tokenizer import train_tokenizer

    trset, speaker = {}, {}
    for name, n, seed in (("en", 140, 0), ("zh", 70, 1)):
        kd = tmp_path / f"kaldi-{name}"
        utts = make_kaldi_dir(kd, n, seed=seed, prefix=f"{name}-")
        speaker.update({u: re.sub(r"-utt\d+$", "", u).replace("sp1.1-", "") for u in utts})
        (kd / "utt2spk").write_text("".join(f"{u} {speaker[u]}\n" for u in utts))
        pack_data(kd / "feats.scp", kd / "text", tmp_path / name, utts_per_shard=20, utt2spk=kd / "utt2spk",
                  progress=False)
        trset[name] = f"{tmp_path / name}/data-*.tar"
    tok = tmp_path / "char.json"
    train_tokenizer("char", [tmp_path / "kaldi-en" / "text", tmp_path / "kaldi-zh" / "text"], tok)

    loader = make_loader(trset, tok, max_frames=1500, weights={"en": 1, "zh": 1})
    batches = epoch_batches(loader, 0)
    for c, name in enumerate(loader.corpora):
        seq = [{speaker[k] for k in b[4]} for b in batches if int(b.corpus[0]) == c]
        report = loader.stats.corpora[name].shuffle
        assert report["batches"] == len(seq) > 5
        assert report["speakers"] == 7 and report["speaker_source"] == "utt2spk"
        assert report["speakers_per_batch"] == pytest.approx(np.mean([len(s) for s in seq]))
        hits = sum(len(a & b) for a, b in zip(seq, seq[1:]))  # a speaker of a batch in the corpus's next batch
        assert report["recurrence"]["1"] == pytest.approx(hits / sum(len(a) for a in seq[:-1]))
        assert 1 < report["speakers_per_batch_random"] < 7 and report["speakers_ratio"] > 0.5

    out = io.StringIO()
    planned = plan_report(trset, max_frames=1500, weights={"en": 1, "zh": 1}, out=out)[0]["shuffle"]
    for name in loader.corpora:  # the plan's report for one rank is the loader's, read from nothing but the index
        assert planned[name]["speakers_per_batch"] == pytest.approx(
            loader.stats.corpora[name].shuffle["speakers_per_batch"])
        assert f"shuffle of {name} (steps: the batches holding it, its utterances in each)" in out.getvalue()

    # With the speaker cap the dry-run plans as the loader does: one utterance per speaker per batch.
    capped = plan_report(trset, max_frames=1500, weights={"en": 1, "zh": 1}, max_utts_per_speaker=1,
                         out=io.StringIO())[0]["shuffle"]
    for name in loader.corpora:
        sums = capped[name]["sums"]
        assert sums["distinct"] == sums["utterances"] > sums["batches"]


def test_a_long_epoch_is_planned_in_bounded_time_and_memory_and_a_longer_one_refused(corpora, tmp_path):
    """A mixed epoch is planned whole before it starts (the same batches on any topology): 10**5
    steps of these small corpora (hundreds of their own epochs each) within a 3 GB address space;
    10**9 (the hostile round's: memory exhausted) is refused, saying why."""
    trset, _, tok = corpora
    code = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from wdsprep.loader import make_loader
loader = make_loader({trset!r}, {str(tok)!r}, max_frames=700, weights={{"en": 1, "zh": 1}}, steps_per_epoch=10**5)
it = iter(loader)
got = [next(it) for _ in range(5)]
print(len(loader), len(got))
try:
    make_loader({trset!r}, {str(tok)!r}, max_frames=700, steps_per_epoch=10**9)
except ValueError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    first, refused = r.stdout.splitlines()[:2]
    assert first == "100000 5"
    assert refused.startswith("steps_per_epoch must be in [1, 1,000,000], got 1,000,000,000")


def test_a_mixture_of_utterances_holds_several_corpora_in_a_batch_each_with_its_own_tokenizer(tmp_path):
    """English and Mandarin as named corpora, each with its own tokenizer, mixed utterance by
    utterance: most batches hold both; batch.corpus names each utterance's corpus and its labels
    are its own corpus's tokenizer's; the same batches with workers; shares at the weights."""
    from shardsets import make_multilingual_dir

    from wdsprep import load_tokenizer, pack_data
    from wdsprep.tokenizer import train_tokenizer

    trset, utts, toks = {}, {}, {}
    for lang, n in (("en", 160), ("zh", 120)):
        kd = tmp_path / f"kaldi-{lang}"
        utts.update(make_multilingual_dir(kd, {lang: n}, seed=len(lang) + n))
        pack_data(kd / "feats.scp", kd / "text", tmp_path / lang, utts_per_shard=40, progress=False)
        toks[lang] = train_tokenizer("char", [kd / "text"], tmp_path / f"{lang}.json", keep_spaces=lang == "en")
        trset[lang] = {"shards": f"{tmp_path / lang}/data-*.tar", "tokenizer": str(tmp_path / f"{lang}.json")}
    kw = dict(max_frames=2500, weights={"en": 1, "zh": 1}, mix_unit="utterance", seed=4)
    loader = make_loader(trset, tmp_path / "en.json", **kw)
    batches = epoch_batches(loader, 0)
    corpora = [[loader.corpora[c] for c in b.corpus.tolist()] for b in batches]
    assert np.mean([len(set(c)) == 2 for c in corpora]) >= 0.5
    flat = [c for cs in corpora for c in cs]
    assert abs(flat.count("zh") / len(flat) - 0.5) <= 0.02
    own = {lang: load_tokenizer(tmp_path / f"{lang}.json") for lang in toks}  # as the loader reads them
    for b, cs in zip(batches, corpora):
        for i, (key, c) in enumerate(zip(b.keys, cs)):
            assert utts[key][0] == c
            assert b.labels[i, :int(b.label_lens[i])].tolist() == own[c].encode(utts[key][1])
    workers = make_loader(trset, tmp_path / "en.json", num_workers=2, **kw)
    assert [b.keys for b in epoch_batches(workers, 0)] == [b.keys for b in batches]
    out = io.StringIO()
    report = plan_report(trset, tmp_path / "en.json", out=out, **kw)[0]
    share = np.mean([len(set(c)) == 2 for c in corpora])
    assert report["mix_unit"] == "utterance" and report["mixed_batches"] == pytest.approx(share, abs=1e-4)
    assert f"mixed by utterance: {share:.1%} of the batches hold several corpora" in out.getvalue()
