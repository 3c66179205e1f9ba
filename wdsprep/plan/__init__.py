"""The epoch plan: every batch of every epoch, decided from the index before the epoch starts.

Given the shards' index (every shard's utterances, every utterance's frames, label lengths,
speakers and fields), the options and a seed, the plan says which utterances make which batch,
which rank and reader yields each, in what order, and where an epoch stands after any step, so a
resume on another topology yields exactly what is left.  It is a pure function of those values:
it does no I/O beyond reading the index (and fetching a remote folder's index files), and it
never imports torch.  The readers (``wdsprep/loading/``) read what it planned.

Entry points: :func:`~wdsprep.plan.compose.build_source` (options and trset to the epoch source),
:class:`~wdsprep.plan.source.EpochSource` (what every source answers), and
:class:`~wdsprep.plan.options.LoaderOptions` (every loader option, in its group).
"""

from __future__ import annotations

from wdsprep.lazy import lazy_exports

# Imported when first asked for: a reader of one module (device/ reads the augmentation's draws)
# does not load the whole plan.
_LAZY = {"build_source": "compose", "LoaderOptions": "options", "EpochSource": "source"}

__all__ = sorted(_LAZY)


__getattr__ = lazy_exports(__name__, _LAZY)
