"""The loader's parts, composed by ``wdsprep.loader``.

The planning side, pure and torch-free: ``shardset`` (the indexed shards), ``batching`` (the one
rule a batch fits by), ``plan`` (a corpus's epoch plan), ``corpus`` (a corpus planned on its own),
``epochs`` (one corpus dealt to ranks and readers, with ``assign``), ``mix`` (named corpora
mixed), ``source`` (the epoch source, one for one corpus and many), ``state`` (the resume state),
``quality`` (the shuffle report), ``stats`` (typed counts).  The run-time side: ``fetch`` (shards
brought ahead), ``read`` and ``records`` (a shard into columns), ``stages`` (the numpy stages),
``collate`` (a batch into one buffer, the layout defined once), ``transport`` (shared memory and
worker control), ``collectives`` and ``stream`` (one reader's epoch, composed).
"""
