"""The shard format: the only code that knows the bytes on disk.

``keys`` (sample keys and the member-name rule), ``npy`` (feature headers), ``audio`` (audio
members: headers and codecs) with ``ogg`` (the pages of Opus members), ``tar`` (the walk),
``shardfile`` (positional reads, row reads, readahead), ``samples`` (members grouped and decoded,
damage reported), ``records`` (a shard's rows as columnar blocks, what the loader's stages move),
``index`` (the per-folder index: read, checked, written), ``reindex`` (the index written from the
shards' headers, ``wdsprep index``; above the reader), ``writer`` (one shard), ``shardlist``
(patterns to shard lists), ``commit`` (whether a pack's folder is complete or growing).  The C part
(``_native``) sits behind ``native``.
"""
