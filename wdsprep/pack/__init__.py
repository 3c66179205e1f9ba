"""Utterances to shards: ``pack_data`` (features, CAT's signature) and ``pack_audio`` (audio), from
Kaldi files or, with a :class:`Manifest`, another project's (``sources/``: Lhotse, NeMo, Hugging
Face, WeNet).

Each is a source (``from_feats.py``, ``from_audio.py``, ``sources/``) for the steps every pack takes
(``driver.py``): its options (``options.py``), each utterance's language and fields, from tables
or the source (``fields.py``), the length groups (``groups.py``), the shard plan
(``plan.py``), the shards written in workers (``sink.py``: the local pool's, or an engine's such as
a Dask cluster's) and the output folder's transaction, from the lock to the commit (``output.py``),
or the same transaction over a bucket (``bucket.py``: ``--out s3://BUCKET/PREFIX``).
"""

from wdsprep.pack.from_audio import pack_audio
from wdsprep.pack.from_feats import pack_data
from wdsprep.pack.sources import Manifest

__all__ = ["pack_data", "pack_audio", "Manifest"]
