"""``export lhotse``: a shard set as a Lhotse ``CutSet`` manifest, written with lhotse.

One ``MonoCut`` per utterance, id as in the shards, ``start`` 0 and its duration, with one
supervision holding its transcript, speaker and language; no recording (the audio stays in the
shards): what Lhotse's tooling needs for statistics and splits (``cuts.describe()``,
``cuts.split(...)``, ``cuts.subset(...)``).
"""

from __future__ import annotations

from typing import Iterable

from wdsprep.export.utterances import Utterance


def write_cuts(utts: Iterable[Utterance], out: str) -> int:
    """Write the cuts of ``utts`` to ``out`` (``.jsonl.gz``, ``.jsonl`` or ``.json``); returns how many."""
    from lhotse import CutSet, MonoCut, SupervisionSegment

    cuts = [MonoCut(id=u.uttid, start=0.0, duration=u.duration, channel=0,
                    supervisions=[SupervisionSegment(id=u.uttid, recording_id=u.uttid, start=0.0, duration=u.duration,
                                                     text=u.text, speaker=u.speaker, language=u.language)])
            for u in utts]
    CutSet.from_cuts(cuts).to_file(out)
    return len(cuts)
