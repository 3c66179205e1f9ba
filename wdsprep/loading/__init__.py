"""The readers: what reads the planned batches (``wdsprep/plan/``) from the shards, for the trainer.

``stream`` composes one reader's epoch (``ReaderStream.stages``) from the ``stages`` (read each
shard once, tokenize, filter) and ``features`` (audio to fbank, the augmentation's signal
processing); ``readahead`` fetches each reader's shards ahead, in its order; ``collate`` lays a
batch out in one buffer (in a C thread); ``transport`` moves it out of a DataLoader worker through
shared memory; ``collectives`` are the loader's few checks between ranks; ``rehearsal`` runs the
epoch's costliest batches through the trainer's step before it trains.
"""
