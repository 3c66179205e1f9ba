"""Looking before training, every command reading through ``wdsprep.format``: ``inspect`` (numbers
per group and shard) with ``plot`` (its figures, from plain data), ``verify`` (what the loader
would refuse), ``dryrun`` (the loader without a model) and ``planreport`` (``dry-run --plan``: the
epoch's plan from the index alone, torch-free), ``calibrate`` (the cost of a training step of the
user's model; ``costfit``, its fit, needs no torch) and ``rehearse`` (the epoch's costliest
batches through the model); ``index_remote`` is ``wdsprep index`` on a bucket's folder, in place.
"""
