"""The epoch plan: every batch of every epoch, decided from the index before the epoch starts.

Given the shards' index (every shard's utterances, every utterance's frames, label lengths,
speakers and fields), the options and a seed, the plan says which utterances make which batch,
which rank and reader yields each, in what order, and where an epoch stands after any step, so a
resume on another topology yields exactly what is left.  It is a pure function of those values:
it does no I/O beyond reading the index (and fetching a remote folder's index files), and it
never imports torch.  The readers (``wdsprep/loading/``) read what it planned.

In the order the plan is made: ``options`` (every loader option, in its group) and ``compose``
(options to the epoch source: the one path the loader and ``dry-run --plan`` take); what the plan
is made from: ``shardset`` (the indexed shard set), ``tokens`` (label lengths in tokens, counted
once per tokenizer), ``transforms`` (each corpus's tokenizer, text treatment and augmentation),
``augment`` (the augmentation's effects and their draws); the batch rule: ``batching`` (what fits a
batch) and ``cost`` (what a training step costs); one corpus: ``streams`` (an epoch laid out in
canonical streams), ``corpus`` (a corpus planned on its own), ``assign`` (streams dealt to ranks and
readers) and ``epochs`` (one corpus's epochs); many: ``mix`` (corpora mixed); ``source`` (the
epoch source over either), ``growing`` and ``follow`` (folders a pack is still writing, and the
source over them); and what it reports: ``state`` (the resume state, checked), ``quality`` (the
shuffle report), ``stats`` (the typed counts).

Entry points: :func:`~wdsprep.plan.compose.build_source`, :class:`~wdsprep.plan.source.EpochSource`
and :class:`~wdsprep.plan.options.LoaderOptions`.
"""

from __future__ import annotations

from wdsprep.lazy import lazy_exports

# Imported when first asked for: a reader of one module (device/ reads the augmentation's draws)
# does not load the whole plan.
_LAZY = {"build_source": "compose", "LoaderOptions": "options", "EpochSource": "source"}

__all__ = sorted(_LAZY)


__getattr__ = lazy_exports(__name__, _LAZY)
