"""A shard set's utterances as manifests describe them: id, duration, transcript, speaker, language.

The transcripts are read from the shards (each sample's transcript member; the features or audio
stay unread), the speakers from each folder's index (by the key rule without one).  A duration is
the audio's (samples / rate) for audio shards, and frames x 10 ms for feature shards, as Lhotse
counts a cut's feature frames.  Each utterance's language comes from the index once it has a
language column (issue 38); until then it is None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from wdsprep.format.audio import FileAudio
from wdsprep.format.index import FolderIndex, read_index
from wdsprep.format.keys import encode_key, speaker_of
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
    speakers: dict[str, dict[str, str]] = {}
    for path in paths:
        folder = index_place(path)[0]
        if folder not in speakers:
            speakers[folder] = _speakers(read_index(folder))
        named = speakers[folder]
        for uttid, data, text in iter_decoded(path, on_error="raise", lazy=True):
            if isinstance(data, FileAudio):
                duration = data.header.samples / data.header.sample_rate
            else:
                duration = data.shape[0] / FRAMES_PER_SECOND
            yield Utterance(uttid, duration, text, named.get(encode_key(uttid)) or speaker_of(uttid))


def _speakers(index: FolderIndex | None) -> dict[str, str]:
    """{key: speaker} of a folder's index (empty without one: the key rule then)."""
    if index is None:
        return {}
    spk = index.speakers()
    return {k: spk.names[i] for k, i in zip(index.keys(), spk.ids.tolist())}
