"""Named corpora mixed in one loader, every loader epoch planned like one corpus's: ``weights`` (how
much of each corpus: weights, a temperature or a schedule), ``portions`` (each corpus's portion of
a loader epoch, cut into the epoch's streams without regard to the topology) and ``epochs`` (the
mixed epochs as one corpus's plan, and their epoch source).
"""
