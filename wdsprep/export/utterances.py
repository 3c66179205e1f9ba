"""A shard set's utterances as manifests describe them: id, duration, transcript, speaker, language.

The transcripts are read from the shards (each sample's transcript member; the features or audio
stay unread), the speakers from each folder's index (by the key rule without one).  A duration is
the audio's (samples / rate) for audio shards, and frames x 10 ms for feature shards, as Lhotse
counts a cut's feature frames.  Each utterance's language comes from its folder's index (its
``lang`` column: ``pack --utt2lang``, a manifest's languages), None where it has none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from wdsprep.format.audio import FileAudio
from wdsprep.format.index import FolderIndex, read_index
from wdsprep.format.keys import LANG, encode_key, speaker_of
from wdsprep.format.samples import iter_decoded
from wdsprep.format.shardlist import expand_shards, index_place, is_url, refuse_commands
from wdsprep.units import FRAMES_PER_SECOND


@dataclass(frozen=True)
class Utterance:
    uttid: str
    duration: float  # seconds
    text: str
    speaker: str
    language: str | None = None


def utterances(trset: str | os.PathLike | Sequence[str | os.PathLike]) -> Iterator[Utterance]:
    """Every utterance of the local shards ``trset`` names, shard after shard."""
    paths = expand_shards(trset)
    refuse_commands(paths, "export")
    remote = [p for p in paths if is_url(p)]
    if remote:
        raise ValueError(f"export reads local shards; {remote[0]} is not one (download the shards first)")
    described: dict[str, dict[str, tuple[str, str | None]]] = {}
    for path in paths:
        folder = index_place(path)[0]
        if folder not in described:
            described[folder] = _described(read_index(folder))
        named = described[folder]
        for uttid, data, text in iter_decoded(path, on_error="raise", lazy=True):
            if isinstance(data, FileAudio):
                duration = data.header.samples / data.header.sample_rate
            else:
                duration = data.shape[0] / FRAMES_PER_SECOND
            speaker, language = named.get(encode_key(uttid), (None, None))
            yield Utterance(uttid, duration, text, speaker or speaker_of(uttid), language)


def _described(index: FolderIndex | None) -> dict[str, tuple[str, str | None]]:
    """{key: (speaker, language)} of a folder's index (empty without one: the key rule then, and no
    language); a language None where the index has no language column or no value for the row."""
    if index is None:
        return {}
    spk = index.speakers()
    column = index.columns.get(LANG)
    langs = [None] * len(spk.ids) if column is None else column.values()
    return {k: (spk.names[i], lang) for k, i, lang in zip(index.keys(), spk.ids.tolist(), langs)}
