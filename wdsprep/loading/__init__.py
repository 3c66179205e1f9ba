"""The loader's parts, composed by ``wdsprep.loader``.

``records`` (utterances as columns), ``read`` (a shard into records), ``stages`` (the numpy
stages), ``batching`` (length buckets), ``collate`` (a batch into one buffer, the layout defined
once), ``transport`` (shared memory and worker control), ``assign`` (who reads which shard),
``collectives``, ``stats`` (typed counts) and ``stream`` (one worker's epoch, composed).
"""
