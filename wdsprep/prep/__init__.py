"""Kaldi data dirs to features: tables (``kaldi``), feature arks (``ark``), audio and segments
(``audio``), ``fbank`` (the features, every backend) with its options and the other Kaldi-input
options in ``options`` (torch-free), and ``parallel`` (chunks of work over worker processes).
"""
