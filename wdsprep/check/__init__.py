"""Looking before training: ``inspect`` (numbers and plots), ``verify`` (what the loader would
refuse), ``dryrun`` (the loader without a model)."""
