"""Looking before training: ``inspect`` (numbers and plots), ``verify`` (what the loader would
refuse), ``dryrun`` (the loader without a model), ``calibrate`` (the cost of a training step of
the user's model; ``costfit``, its fit, needs no torch)."""
