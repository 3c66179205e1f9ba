"""Kaldi data dirs to features: tables (``kaldi``), audio and segments (``audio``), fbank, parallel jobs."""
