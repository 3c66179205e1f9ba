"""A pack's shards written by an existing engine's workers: a real Dask cluster on 127.0.0.1 (``--dask``),
one of its workers killed in mid-shard, gives the bytes of a local pack (``--nj 2``)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import soundfile as sf
from test_pack_parts import digests, on_call

pytest.importorskip("distributed")

# Run in one Dask worker: it kills itself (SIGKILL: nothing runs after) while writing its third
# utterance, in mid-shard; its nanny starts a fresh one and the scheduler runs the task again.
KILL_ON_THIRD = on_call("add_audio", 3)


@pytest.fixture
def audio_corpus(tmp_path):
    rng = np.random.default_rng(3)
    lines, texts = [], []
    for i in range(24):
        path = tmp_path / f"r{i:02d}.wav"
        sf.write(path, (rng.standard_normal(int(rng.integers(1600, 9000))) * 3000).astype(np.int16), 16000)
        lines.append(f"r{i:02d} {path}")
        texts.append(f"r{i:02d} say {i}")
    texts.append("r99 no audio")  # a drop both packs report
    (tmp_path / "wav.scp").write_text("\n".join(lines) + "\n")
    (tmp_path / "text").write_text("\n".join(texts) + "\n")
    return ["pack-audio", "--wav-scp", str(tmp_path / "wav.scp"), "--text", str(tmp_path / "text"), "--store", "flac",
            "--filter-group", ":40", "40:", "--utts-per-shard", "3", "--max-lost", "0.1"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.timeout(150)
def test_a_dask_cluster_with_a_worker_killed_in_mid_shard_packs_the_bytes_of_a_local_pack(audio_corpus, tmp_path):
    from distributed import Client, LocalCluster

    local, on_dask = tmp_path / "local", tmp_path / "dask"
    run([*audio_corpus, "--out", str(local), "--nj", "2"])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      worker_dashboard_address=None, silence_logs=50) as cluster, Client(cluster) as client:
        victim = sorted(client.scheduler_info()["workers"])[0]
        client.run(exec, KILL_ON_THIRD, {}, workers=[victim])
        run([*audio_corpus, "--out", str(on_dask), "--dask", cluster.scheduler_address])
        assert victim not in client.scheduler_info()["workers"]  # it died; its nanny started another
    got, want = digests(on_dask), digests(local)
    assert got == want and sum(n.endswith(".tar") for n in want) >= 8
    report, expected = (json.loads((d / "pack_report.json").read_text()) for d in (on_dask, local))
    assert report["written"] == expected["written"] and report["counts"] == expected["counts"] == {"missing_audio": 1}


def test_any_executor_writes_the_bytes_of_the_local_pool(audio_corpus, tmp_path):
    """pack_audio(executor=...): a process pool given as an engine, each shard one task."""
    import wdsprep

    kw = dict(store="flac", filter_group=[":40", "40:"], utts_per_shard=3, max_lost=0.1, progress=False)
    wav, text = audio_corpus[2], audio_corpus[4]
    wdsprep.pack_audio(wav, text, tmp_path / "pool", nj=2, **kw)
    with ProcessPoolExecutor(2) as pool:
        report = wdsprep.pack_audio(wav, text, tmp_path / "engine", executor=pool, **kw)
    assert digests(tmp_path / "engine") == digests(tmp_path / "pool") and report.counts() == {"missing_audio": 1}
    with pytest.raises(ValueError, match="give one"):
        wdsprep.pack_audio(wav, text, tmp_path / "both", executor=pool, dask="tcp://127.0.0.1:1", **kw)
