"""Plans that count label tokens (issue 37): pools ordered by frames and tokens, the label
filters decided with the plan, and the tokens-per-second distribution they are chosen from."""

from __future__ import annotations

from collections import Counter

import kaldiio
import numpy as np
import pytest

import wdsprep.plan.batching as batching
from wdsprep.plan.batching import BatchFit, band_edges, band_order, stable_order
from wdsprep.plan.cost import CostModel
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.source import epoch_source
from wdsprep.plan.stats import BatchTally
from wdsprep.plan.streams import PlanOptions, plan_epoch, token_rates, tokens_per_second

# The cost: an encoder's linear part and self-attention, a transducer's joint t·u, a decoder's u².
TRANSDUCER = CostModel(subsampling=4, per_frame=512, per_frame2=1, per_frame_token=2, per_token2=1)


def labelled(n: int, per_shard: int = 1000, seed: int = 0, rate: float = 0.1):
    """Lognormal frames (median 600) and a text rate that varies per utterance (lognormal tokens
    per frame, sigma 0.5), as shard sizes, frames and tokens."""
    rng = np.random.default_rng(seed)
    frames = np.clip(rng.lognormal(np.log(600), 0.5, n), 50, 3000).astype(np.int32)
    tokens = np.maximum(1, np.round(frames * rng.lognormal(np.log(rate), 0.5, n))).astype(np.int32)
    utts = np.full(n // per_shard, per_shard, np.int64)
    utts[-1] += n - int(utts.sum())
    return utts, frames, tokens


def tally(plan, frames, tokens) -> BatchTally:
    t = BatchTally()
    for s in plan.streams:
        for j in range(s.num_batches):
            rows = s.batch(j)
            t.add(frames[rows], None, tokens[rows])
    return t


@pytest.fixture(scope="module")
def corpus():
    utts, frames, tokens = labelled(30_000)
    by_frames = plan_epoch(utts, frames, PlanOptions(max_frames=20_000), seed=0, epoch=0)
    largest = max(float(TRANSDUCER.batch(len(b), frames[b].max(), tokens[b].max()))
                  for s in by_frames.streams for b in (s.batch(j) for j in range(s.num_batches)))
    return utts, frames, tokens, PlanOptions(cost=TRANSDUCER, max_cost=largest)


def test_pools_ordered_by_frames_and_tokens_pad_labels_less_at_the_same_frames_padding(corpus, monkeypatch):
    utts, frames, tokens, options = corpus
    both = plan_epoch(utts, frames, options, seed=0, epoch=0, tokens=tokens)
    monkeypatch.setattr(batching, "band_order", lambda order, lens, tokens: order)  # pools sorted by frames only
    by_frames = plan_epoch(utts, frames, options, seed=0, epoch=0, tokens=tokens)
    two, one = tally(both, frames, tokens), tally(by_frames, frames, tokens)
    assert two.padding_efficiency >= 0.97
    assert two.label_padding_efficiency >= one.label_padding_efficiency + 0.1
    for plan in (both, by_frames):  # every utterance once, every batch within the budget (or alone)
        rows = np.concatenate([s.rows for s in plan.streams])
        assert sorted(rows.tolist()) == list(range(len(frames)))
        for s in plan.streams:
            for j in range(s.num_batches):
                b = s.batch(j)
                assert len(b) == 1 or TRANSDUCER.batch(len(b), frames[b].max(), tokens[b].max()) <= options.max_cost


def test_a_plan_counting_tokens_is_the_same_on_any_topology_and_resumes_on_another(corpus):
    utts, frames, tokens, options = corpus
    shards = ShardSet([f"s/{i}.tar" for i in range(len(utts))], utts, frames, [""] * len(utts),
                      np.full(len(utts), -1, np.int64), tokens=tokens)

    def batches(source, run, ranks):
        return [tuple(source.rows(b).tolist()) for r in ranks for w in run.windows(r) for b in w.refs]

    one = epoch_source(shards, options, seed=5, world_size=1, num_workers=0)
    every = batches(one, one.run(one.start(1)), [0])
    three = epoch_source(shards, options, seed=5, world_size=3, num_workers=2)
    run = three.run(three.start(1))
    dealt = batches(three, run, range(3))
    left = [tuple(three.rows(b).tolist()) for b in run.discarded()]
    assert sorted(dealt + left) == sorted(every) and len(left) < 3
    assert len({run.steps(r) for r in range(3)}) == 1 and sum(run.steps(r) for r in range(3)) == len(dealt)
    # Stopped after 4 steps on 3 ranks, resumed on 2: the rest of the same epoch, nothing twice.
    done = [b for r in range(3) for b in batches(three, run, [r])[:4]]
    two = epoch_source(shards, options, seed=5, world_size=2, num_workers=1)
    rest = two.run(run.after(0, 4))
    later = batches(two, rest, range(2))
    tail = [tuple(two.rows(b).tolist()) for b in rest.discarded()]
    assert not set(done) & set(later) and sorted(done + later + tail) == sorted(every) and len(tail) < 2


def test_the_cut_of_a_pool_ordered_by_both_equals_cutting_one_sample_at_a_time():
    """Lengths no longer ascend in such a pool: a batch is bounded by its running longest frames and label."""
    utts, frames, tokens = labelled(3000, seed=1)
    lens, toks = frames.astype(np.int64), tokens.astype(np.int64)
    order = band_order(stable_order(lens), lens, toks)
    assert not np.all(np.diff(lens[order]) >= 0)  # not frames-sorted
    for fit in (BatchFit(cost=TRANSDUCER, max_cost=3e7), BatchFit(20_000, 40, TRANSDUCER, 2e7)):
        cuts = fit.cut(lens[order], toks[order])
        want, start = [], 0
        for i in range(1, len(order) + 1):
            rows = order[start:i + 1]
            if i == len(order) or not fit.fits(len(rows), int(lens[rows].max()), int(toks[rows].max())):
                want.append((start, i))
                start = i
        assert cuts == want


def test_bands_are_two_and_a_half_percent_wide_and_alternate_directions():
    edges = band_edges()
    big = edges[edges >= 100]
    assert np.all(np.diff(big) == big[:-1] * 25 // 1000) and {120, 123, 126, 129} <= set(big.tolist())
    lens = np.array([120, 121, 122, 123, 124, 125, 126, 127], np.int64)  # bands [120, 123), [123, 126), [126, 129)
    toks = np.array([5, 1, 9, 7, 2, 8, 3, 4], np.int64)
    order = band_order(stable_order(lens), lens, toks)
    assert lens[order].tolist() == [121, 120, 122, 125, 123, 124, 126, 127]
    assert toks[order].tolist() == [1, 5, 9, 8, 7, 2, 3, 4]  # up, down, up


def test_label_filters_drop_by_reason_and_keep_every_other_utterance_once():
    utts, frames, tokens = labelled(5000, per_shard=500, seed=2)
    tokens[[3, 70]] = 400  # 400 tokens in 1 s: a misaligned segment
    frames[[3, 70]] = 100
    frames[1100], tokens[1100] = 3000, 1500  # 50 tokens a second, but too long a label
    tokens[[9, 2000]] = 0  # empty transcripts
    frames[5] = 20  # too short, and too many tokens per second: counted once, by the first reason
    tokens[5] = 400
    options = PlanOptions(max_frames=20_000, min_frames=30, max_tokens_per_second=100, min_tokens_per_second=0.5,
                          max_label_tokens=1000)
    assert options.needs_tokens and not options.fit.uses_tokens
    plan = plan_epoch(utts, frames, options, seed=0, epoch=0, tokens=tokens)
    rate = tokens_per_second(frames, tokens)
    out = {"too_short": frames < 30}
    out["too_many_tokens_per_second"] = (rate > 100) & ~out["too_short"]
    out["too_few_tokens_per_second"] = rate < 0.5
    out["label_too_long"] = (tokens > 1000) & (rate <= 100)
    assert plan.dropped == {k: int(v.sum()) for k, v in out.items()}
    assert plan.dropped["too_many_tokens_per_second"] == 2 and plan.dropped["label_too_long"] == 1
    kept = np.flatnonzero(~np.any(list(out.values()), axis=0))
    assert sorted(np.concatenate([s.rows for s in plan.streams]).tolist()) == kept.tolist()
    # The same options without frames-only batches, or without their tokens:
    with pytest.raises(ValueError, match="max_tokens_per_second, min_tokens_per_second, max_label_tokens count label"):
        plan_epoch(utts, frames, options, seed=0, epoch=0)
    for bad, match in [({"max_tokens_per_second": -1}, "max_tokens_per_second must be"),
                       ({"min_tokens_per_second": 9, "max_tokens_per_second": 3}, "is above max_tokens_per_second"),
                       ({"max_label_tokens": 0}, "max_label_tokens must be"),
                       ({"max_label_tokens": 2.5}, "max_label_tokens must be")]:
        with pytest.raises(ValueError, match=match):
            PlanOptions(max_frames=100, **bad)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A real Kaldi dir packed into shards: 300 utterances, 294 of 1.5-4 s with a few words each
    and 6 of 1 s whose transcript is 400 characters (a misaligned segment); a char tokenizer."""
    from wdsprep.pack import pack_data
    from wdsprep.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("planted")
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "speech", "data"]
    bad = {f"spk{i % 5}-utt{i:04d}" for i in range(7, 300, 50)}
    with kaldiio.WriteHelper(f"ark,scp:{root}/feats.ark,{root}/feats.scp") as w, \
            open(root / "text", "w", encoding="utf-8") as t:
        for i in range(300):
            uttid = f"spk{i % 5}-utt{i:04d}"
            n = 100 if uttid in bad else int(rng.integers(150, 400))
            w(uttid, rng.standard_normal((n, 4)).astype(np.float32))
            text = ("x" * 400) if uttid in bad else " ".join(rng.choice(words, size=int(rng.integers(1, 6))))
            t.write(f"{uttid} {text}\n")
    pack_data(root / "feats.scp", root / "text", root / "shards", utts_per_shard=40, progress=False)
    train_tokenizer("char", [root / "text"], root / "char.json")
    return f"{root}/shards/data-*.tar", root / "char.json", bad


def test_planted_transcripts_are_dropped_by_tokens_per_second_and_counted(planted):
    from wdsprep.plan.compose import load_shards
    from wdsprep.plan.shardset import row_keys
    from wdsprep.tokenizer import load_tokenizer

    trset, tok, bad = planted
    shards = load_shards(trset, tokenizer=load_tokenizer(tok))
    rates = token_rates(shards.frames, shards.tokens)
    assert rates["max"] >= 400 and rates["p50"] < 20 and rates["utterances"] == 300
    options = PlanOptions(max_frames=3000, max_tokens_per_second=60)
    keys = row_keys(shards)
    for world_size in (1, 3):
        source = epoch_source(shards, options, seed=1, world_size=world_size, num_workers=0)
        run = source.run(source.start(0))
        dropped, got = Counter(), Counter()
        for r in range(world_size):
            for w in run.windows(r):
                dropped.update(w.dropped)
                got.update(keys[i] for b in w.refs for i in source.rows(b).tolist())
        got.update(keys[i] for b in run.discarded() for i in source.rows(b).tolist())
        assert dropped == {"too_many_tokens_per_second": len(bad)}
        assert set(got) == set(keys) - bad and max(got.values()) == 1
        assert len({run.steps(r) for r in range(world_size)}) == 1


def test_pools_that_count_tokens_hold_many_batches_and_streams_a_pool_each(corpus):
    from wdsprep.plan.streams import TOKEN_POOL_BATCHES, layout, typical_batch

    utts, frames, tokens, options = corpus
    by_frames = PlanOptions(max_frames=20_000)
    assert layout(by_frames, utts, frames) == (by_frames.num_streams(len(utts), len(frames)), 4000, 2000)
    batch = typical_batch(options.fit, frames, tokens)
    assert np.mean(options.fit.room(frames, tokens) < batch) == pytest.approx(0.2, abs=0.01)
    streams, pool, stream_utts = layout(options, utts, frames, tokens)
    assert pool == stream_utts == TOKEN_POOL_BATCHES * batch > options.pool_size
    assert streams == len(frames) // pool
    assert layout(PlanOptions(cost=TRANSDUCER, max_cost=options.max_cost, streams=6), utts, frames, tokens)[:2] == \
        (6, pool)
    assert len(plan_epoch(utts, frames, options, seed=0, epoch=0, tokens=tokens).streams) == streams


def test_dry_run_plan_counts_the_batches_subword_sampling_could_still_empty(planted, tmp_path, capsys):
    """The plan decides the CTC rule with each label's best segmentation; a sampled one is longer
    (at most a piece per character, and one more), and the readers' rule may then drop every
    utterance of a batch.  dry-run --plan counts those batches, from the index's transcript
    lengths; without sampling the plan's decision is the readers' and no batch is at risk."""
    import json
    from collections import defaultdict
    from pathlib import Path

    from wdsprep.cli import main
    from wdsprep.tokenizer import train_tokenizer

    trset, _, _ = planted
    root = Path(trset).parent.parent
    words = tmp_path / "words.json"
    train_tokenizer("simple", [root / "text"], words)  # a token a word: labels far shorter than their text
    frames = {k: len(m) for k, m in kaldiio.load_scp(str(root / "feats.scp")).items()}
    chars = dict(line.split(" ", 1) for line in (root / "text").read_text(encoding="utf-8").splitlines())
    dump, stats = tmp_path / "keys.tsv", tmp_path / "plan.json"
    argv = ["dry-run", "--plan", "--trset", trset, "--tokenizer", str(words), "--max-frames", "800",
            "--ctc-subsampling", "16", "--dump-keys", str(dump), "--stats-json", str(stats)]
    assert main([*argv, "--subword-sampling", "0.1"]) == 0
    out = capsys.readouterr().out
    batches = defaultdict(list)
    for line in dump.read_text(encoding="utf-8").splitlines():
        _, step, rank, key = line.split("\t")
        batches[step, rank].append(key)
    expect = sum(all(frames[k] // 16 <= len(chars[k]) + 1 for k in keys) for keys in batches.values())
    report = json.loads(stats.read_text())[0]
    assert report["may_end_empty"] == expect > 0
    assert f"may end empty       {expect} batch(es)" in out
    assert main(argv) == 0
    assert "may end empty" not in capsys.readouterr().out and json.loads(stats.read_text())[0]["may_end_empty"] is None
