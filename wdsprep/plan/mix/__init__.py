"""Named corpora mixed in one loader: ``weights`` (how much of each corpus at every step: weights,
temperature or a schedule), ``deal`` (which corpus each rank's step draws, and which planned batch
of it each reader yields) and ``epochs`` (the epoch source over the corpora's own plans).
"""
