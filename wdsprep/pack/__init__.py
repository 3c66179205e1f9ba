"""Features to shards: length groups, the grouped sink, ``pack_data`` (CAT's signature) and ``pack_audio``."""

from wdsprep.pack.from_audio import pack_audio
from wdsprep.pack.from_feats import pack_data

__all__ = ["pack_data", "pack_audio"]
