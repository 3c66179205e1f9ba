"""Audio shards of the bundled real-speech corpus, and feature shards laid out alike.

``wdsprep fbank`` + ``pack`` make the feature shards; the audio shards are written through the
format's writer (``write_audio_shard``, what ``pack-audio --store`` calls) with the same folders,
shard names and utterance order, so a loader plans the same batches over both.  Shared by the
audio tests and by ``ddp_worker.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import soundfile as sf

DEMO = Path(__file__).resolve().parents[1] / "egs" / "demo"
GROUPS = ["0:120", "120:"]


def demo_waves(part: str = "train") -> tuple[dict[str, np.ndarray], dict[str, str], Path]:
    """{uttid: int16 samples}, {uttid: transcript} of a part of the demo corpus, and its data dir."""
    d = DEMO / "data" / part
    texts = dict(line.rstrip("\n").split(" ", 1) for line in (d / "text").read_text(encoding="utf-8").splitlines())
    waves = {}
    for line in (d / "wav.scp").read_text().splitlines():
        uttid, path = line.split(" ", 1)
        pcm, rate = sf.read(DEMO / path, dtype="int16")
        assert rate == 16000 and pcm.ndim == 1
        waves[uttid] = pcm
    return waves, texts, d


def feature_shards(root: Path, *, backend: str = "kaldi-native-fbank", utts_per_shard: int = 20) -> Path:
    """Offline ``wdsprep fbank`` (``backend``) + ``pack`` of the demo train set, two length groups."""
    from wdsprep import compute_fbank, pack_data

    _, _, d = demo_waves()
    fb = root / f"fbank-{backend}"
    cwd = os.getcwd()
    os.chdir(DEMO)  # wav.scp paths are relative to the recipe
    try:
        compute_fbank(d / "wav.scp", fb, backend=backend, progress=False)
    finally:
        os.chdir(cwd)
    out = root / f"feats-{backend}"
    pack_data(fb / "feats.scp", d / "text", out, filter_group=GROUPS, utts_per_shard=utts_per_shard, progress=False,
              utt2spk=d / "utt2spk")
    return out


def audio_like(features: Path, out: Path, *, fmt: str = "flac", num_mel_bins: int = 80,
               backend: str = "numpy") -> Path:
    """Audio shards of the utterances of ``features`` (a packed folder tree), folder for folder, shard
    for shard, in the same order, with their indexes (speakers carried over)."""
    from wdsprep.format.index import AudioIndex, FolderIndex, read_index, write_index
    from wdsprep.format.keys import decode_key
    from wdsprep.format.writer import write_audio_shard

    waves, texts, _ = demo_waves()
    for folder in sorted(p for p in features.iterdir() if (p / "index.json").exists()):
        index = read_index(folder)
        (out / folder.name).mkdir(parents=True, exist_ok=True)
        infos, sizes, mtimes = [], [], []
        for i, name in enumerate(index.names):
            a, b = int(index.starts[i]), int(index.starts[i + 1])
            ids = [decode_key(k) for k in index.keys()[a:b]]
            path = out / folder.name / name
            infos.append(write_audio_shard(path, [(u, waves[u], texts[u]) for u in ids], layout=fmt, sample_rate=16000,
                                           mtime=0))
            st = os.stat(path)
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns)
        audio = AudioIndex(fmt, 16000, num_mel_bins=num_mel_bins, backend=backend)
        write_index(out / folder.name, FolderIndex.from_shards(fmt, num_mel_bins, "float32", infos, sizes=sizes,
                                                                mtimes=mtimes, speakers=index.speakers(), audio=audio))
    return out
