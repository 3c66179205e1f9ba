"""From the loader's options to its epoch source: the one composition the loader and ``dry-run --plan`` call.

    trset + LoaderOptions
      -> the corpora: their shard patterns, and what each does to its data (``transforms.py``:
         its tokenizer, text treatment and augmentation, the loader's unless it gives its own)
      -> the shard set: each folder's index (remote ones fetched with the retries), every label's
         length in tokens when the plan counts them (each corpus's by its own tokenizer), folders
         a pack is still writing as far as a view of them says they were published
      -> audio shards: the dims of the fbank the readers compute
      -> the epoch source: one corpus, or named corpora mixed (``source.epoch_source``)
      -> with ``growing``: a source that plans each epoch over the shards published when it is set
         (``follow.GrowingSource``), once the first epoch's shards are there

So ``dry-run --plan`` prints the loader's plan by construction.  Torch-free: only indexes are read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from wdsprep.errors import user_level
from wdsprep.format.shardlist import expand_shards
from wdsprep.plan.follow import GrowingSource, Ranks
from wdsprep.plan.growing import View, published_shards, wait_for
from wdsprep.plan.options import LoaderOptions
from wdsprep.plan.shardset import ShardSet, indexed_shards, shard_set, union
from wdsprep.plan.source import EpochSource, Trset, epoch_source
from wdsprep.plan.streams import TYPICAL_SAMPLE, PlanOptions
from wdsprep.plan.tokens import LabelTokens
from wdsprep.plan.transforms import Transforms, corpus_transforms, split_trset
from wdsprep.remote.fetch import RetryPolicy
from wdsprep.remote.listing import lister
from wdsprep.tokenizer import Tokenizer


@dataclass(frozen=True)
class Corpora:
    """A trset taken apart: the shard patterns alone (one, or ``{name: patterns}``), and each
    corpus's transforms (None where no tokenizer was given: a plan that counts no tokens)."""

    trset: Trset
    transforms: tuple[Transforms, ...] | None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(n) for n in self.trset) if isinstance(self.trset, Mapping) else ("",)


def corpora_of(trset: Trset | Corpora, options: LoaderOptions, tokenizer: Tokenizer | None) -> Corpora:
    """``trset``'s shard patterns and each corpus's transforms: its own where it gives them (a named
    corpus's object), the loader's (``tokenizer``, ``normalize``, ``augment``) otherwise."""
    if isinstance(trset, Corpora):
        return trset
    patterns, own = split_trset(trset)
    names = tuple(str(n) for n in patterns) if isinstance(patterns, Mapping) else ("",)
    if not options.plan.train and any("augment" in o and o["augment"] for o in own.values()):
        raise ValueError("augment is for training: a dev loader (train=False) reads the data as it is")
    if tokenizer is None and not (own and all("tokenizer" in own.get(n, {}) for n in names)):
        return Corpora(patterns, None)  # no tokenizer for every corpus: a plan that counts no tokens
    default = Transforms(tokenizer, options.read.normalize, options.read.augment)  # type: ignore[arg-type]
    return Corpora(patterns, corpus_transforms(names, own, default))


def load_shards(trset: Trset, *, policy: RetryPolicy | None = None, derive_speakers: bool = False,
                tokenizer: Tokenizer | Transforms | Sequence[Transforms] | None = None, view: View | None = None,
                view_wait: float = 0.0) -> ShardSet:
    """The shard set of ``trset``: a pattern or list of them, or named corpora ``{name: pattern(s)}``;
    with ``tokenizer`` (one for all corpora, or each corpus's transforms), every label's length in
    its tokens comes with it (``plan/tokens.py``).  ``view``: folders a pack is still writing
    are followed, as far as the view says they were published (``plan/growing.py``;
    ``view_wait``: seconds to wait to see them, for a view taken by another rank); without it
    such a folder is refused."""
    names = [str(n) for n in trset] if isinstance(trset, Mapping) else [""]
    each = list(tokenizer) if isinstance(tokenizer, Sequence) else [tokenizer] * len(names)
    counters = [None if t is None else LabelTokens(t, policy=policy) for t in each]

    def one(patterns: Any, tokens: LabelTokens | None) -> ShardSet:
        kw = {"policy": policy, "derive_speakers": derive_speakers, "tokens": tokens}
        if view is None:
            return indexed_shards(patterns, **kw)
        listed = expand_shards(patterns, growing=True, list_glob=lister(policy or RetryPolicy()))
        urls, indexes = published_shards(listed, view, wait=view_wait)
        return shard_set(urls, indexes=indexes, **kw)

    if isinstance(trset, Mapping):
        return union({str(name): one(patterns, counters[c]) for c, (name, patterns) in enumerate(trset.items())})
    return one(trset, counters[0])


def corpus_plans(plan: PlanOptions, transforms: Sequence[Transforms] | None) -> tuple[PlanOptions, ...] | None:
    """Each corpus's plan options where their augmentation differs (the speed the plan draws); None
    when every corpus plans with the loader's."""
    speeds = [None if t.augment is None else t.augment.speed for t in transforms or ()]
    if all(s == plan.speed for s in speeds):
        return None
    return tuple(replace(plan, speed=s) for s in speeds)


def build_source(trset: Trset | Corpora, options: LoaderOptions, *, tokenizer: Tokenizer | None = None,
                 ranks: Ranks = Ranks(), derive_speakers: bool = False, count_tokens: bool = False) -> EpochSource:
    """The epoch source of ``trset`` under ``options`` (see the module's docstring).

    ``tokenizer`` counts the labels' tokens, where the plan needs them or ``count_tokens`` asks for
    them (a cost model that only judges the plan); ValueError without it.  ``ranks``: how a growing
    source shares rank 0's view of the folders.  ``derive_speakers``: the speakers of shards whose
    index records none are derived from their keys (the shuffle report's; the plan derives them
    anyway where ``max_utts_per_speaker`` needs them).
    """
    plan = options.plan
    corpora = corpora_of(trset, options, tokenizer)
    if (plan.needs_tokens or count_tokens) and corpora.transforms is None:
        raise ValueError("the plan counts label tokens (a cost model that counts them, a label filter or the CTC "
                         "rule): give the tokenizer (--tokenizer) to count them")
    counted = corpora.transforms if plan.needs_tokens or count_tokens else None
    policy = options.fetch.policy()
    derive = derive_speakers or plan.max_utts_per_speaker is not None
    plans = corpus_plans(plan, corpora.transforms)

    def load(view: View | None, wait: float = 0.0) -> ShardSet:
        return load_shards(corpora.trset, policy=policy, derive_speakers=derive, tokenizer=counted, view=view,
                           view_wait=wait)

    def planned(shards: ShardSet) -> EpochSource:
        return epoch_source(shards, plan, seed=options.seed, world_size=options.world_size,
                            num_workers=options.workers.num_workers, named=isinstance(corpora.trset, Mapping),
                            mix=options.mix, plans=plans)

    def build(view: View | None, wait: float = 0.0) -> EpochSource:
        shards = load(view, wait)
        rates = shards.mixed_rates
        if rates and "sample_rate" not in (options.read.fbank or {}):
            raise ValueError(f"the audio folders are at {', '.join(map(str, rates))} Hz: give the rate to compute "
                             f"fbank at, fbank={{'sample_rate': {max(rates)}}} (--fbank); the readers resample to it")
        fbank = options.read.fbank_for(shards.audio)
        if fbank is not None:  # the plan's frames at the rate the readers deliver (resampled from each row's)
            shards = replace(shards.at_rate(fbank.sample_rate), dims=fbank.num_mel_bins)
        source = planned(shards)  # what batches hold
        for name, aug in zip(corpora.names, [t.augment for t in corpora.transforms or ()] or [options.read.augment]):
            if aug is not None:
                try:
                    aug.check_shards(audio=shards.audio is not None)
                except ValueError as e:
                    raise ValueError(f"corpus {name!r}: {e}" if name else str(e)) from None
        return source

    if not options.grow.growing:
        source = build(None)
        _say_budget(plan, source, options.rank)
        return source
    grow = options.grow
    # The first epoch waits for a batch per rank (planned without counting label tokens: a cost
    # model's tokens change how many batches there are by little, and cost a read).
    view = wait_for(corpora.trset, load, min_shards=grow.min_shards, min_hours=grow.min_hours,
                    timeout=grow.wait_timeout, check=planned if not plan.needs_tokens else None)
    view = View.from_json(ranks.share(view.to_json(), "make_loader, sharing rank 0's view of the growing shards"))
    source = GrowingSource(corpora.trset, build, view, ranks)
    _say_budget(plan, source, options.rank)
    return source


# Rows budget_problems looks at per numpy step: its temporaries stay a few MB at any corpus size
# (whole-corpus int64 and float64 copies cost 1.4 GB at 36 M utterances).
_BUDGET_CHUNK = 1 << 20


def budget_problems(plan: PlanOptions, shards: ShardSet, streams: int) -> list[str]:
    """What a user would want to hear about the batch budget before the epoch: utterances that
    exceed it alone (each a batch of its own, over the budget), and a budget so large that a whole
    stream is one batch (a max_cost in another unit than the cost model's, say).  The corpus is
    looked at a chunk at a time, and its 95th percentiles taken from rows at an even stride
    (:data:`~wdsprep.plan.streams.TYPICAL_SAMPLE`), so its memory does not grow with the corpus."""
    fit, out = plan.fit, []
    kept = over = 0
    worst = 1.0
    n = len(shards.frames)
    for a in range(0, n, _BUDGET_CHUNK):
        frames, tokens = _budget_rows(plan, shards, slice(a, a + _BUDGET_CHUNK))
        kept += len(frames)
        if not len(frames):
            continue
        if fit.max_frames is not None:
            over_frames = frames > fit.max_frames
            over += int(over_frames.sum())
            worst = max(worst, int(frames.max()) / fit.max_frames)
        else:
            over_frames = np.zeros(len(frames), bool)
        if fit.cost is not None and fit.max_cost is not None:
            each = fit.cost.per_utterance(frames, tokens)
            over += int(((each > fit.max_cost) & ~over_frames).sum())
            worst = max(worst, float(each.max()) / fit.max_cost)
    if not kept:
        return out
    if over:
        bound = " and ".join(f"{name}={value:g}" for name, value in (("max_frames", fit.max_frames),
                                                                        ("max_cost", fit.max_cost)) if value)
        out.append(f"{over:,} of {kept:,} utterances ({over / kept:.1%}) exceed {bound} alone: each is a batch of "
                   f"its own, up to {worst:.2f}x the budget (raise it, or drop them with max_utt_frames)")
    frames, tokens = _budget_rows(plan, shards, slice(None, None, max(1, n // TYPICAL_SAMPLE)))
    per_stream = kept / max(1, streams)
    typical = int(fit.room(int(np.quantile(frames, 0.95)), int(np.quantile(tokens, 0.95)))) if len(frames) else 0
    if per_stream > 1 and typical >= per_stream:
        out.append(f"the batch budget fits {typical:,} utterances of the corpus's 95th-percentile length in one "
                   f"batch, more than a stream holds ({per_stream:,.0f}): every stream is a single batch. Is max_cost "
                   f"in the cost model's unit (wdsprep calibrate prints one), or max_frames per rank?")
    return out


def _budget_rows(plan: PlanOptions, shards: ShardSet, rows: slice) -> tuple[np.ndarray, np.ndarray]:
    """(frames, label tokens; 0 where not counted) of ``rows`` that the length filters keep, as int64."""
    frames = np.asarray(shards.frames[rows], np.int64)
    tokens = np.asarray(shards.tokens[rows], np.int64) if shards.tokens is not None else np.zeros_like(frames)
    keep = np.ones(len(frames), bool)
    if plan.min_frames is not None:
        keep &= frames >= plan.min_frames
    if plan.max_utt_frames is not None:
        keep &= frames <= plan.max_utt_frames
    return (frames, tokens) if keep.all() else (frames[keep], tokens[keep])


def _say_budget(plan: PlanOptions, source: EpochSource, rank: int) -> None:
    """Say :func:`budget_problems`, once for all ranks (the plan is theirs alike), at the user's line."""
    if rank != 0:
        return
    for problem in budget_problems(plan, source.shards, source.num_streams):
        warnings.warn(problem, UserWarning, stacklevel=user_level())
