"""Reading a shard into :class:`~wdsprep.loading.records.Records` blocks: the loader's read stage.

A plain local shard takes one C call (the walk, grouped into samples, with the ``.npy`` headers
and transcripts decoded) and no Python step per sample; anything else goes through the format's
Python reader, with the same samples and the same damage handling.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sequence

from wdsprep.format.samples import (
    OnCorrupt,
    check_on_error,
    decode_keys,
    iter_decoded,
    native_samples,
    skip_sample,
)
from wdsprep.format.shardfile import ShardFile
from wdsprep.loading.records import Records


def iter_records(url: str, *, on_error: str = "warn", on_corrupt: OnCorrupt | None = None,
                 block: int = 256, source: ShardFile | None = None, fields: Sequence[str] = ()) -> Iterator[Records]:
    """A shard's samples as :class:`Records` of up to ``block`` rows each: what
    ``iter_decoded(url, lazy=True, float32=False)`` yields (same order, same damage handling), as
    columns.  ``source``: the shard already fetched (a pipe's or URL's copy); ``fields``: the
    fields read with each row (its ``values``)."""
    check_on_error(on_error)
    found = native_samples(url, source, fields)
    if found is not None:
        src, keys, texts, layout, values = found
        uttids, kept, bad = decode_keys(keys)
        for key, e in bad:  # left out alone, as the index scan leaves them out
            skip_sample(url, key, e, on_error)
        if kept is not None:
            texts, layout = [texts[i] for i in kept], layout[kept]
            values = [[v[i] for i in kept] for v in values]
        rows = Records.in_shard(src, uttids, texts, layout, values)
        for start in range(0, len(uttids), block):
            yield rows[start:start + block]
        return
    samples = iter_decoded(url, on_error=on_error, on_corrupt=on_corrupt, float32=False, lazy=True, source=source,
                           fields=list(fields) if fields else None)
    while chunk := list(itertools.islice(samples, block)):
        yield Records.of(chunk)
