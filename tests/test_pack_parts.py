"""A pack spread over machines: ``--plan-only``, then ``--part I/N`` in separate processes (any
order, at once, one killed and run again), then ``--resume`` commits, to the bytes one run gives."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf

from wdsprep.pack.output import STAGED_DIR, lock_folder

IDS = [f"spk{i % 4}-utt{i:03d}" for i in range(46)]
GROUPS = ["--filter-group", ":200", "200:", "--utts-per-shard", "4"]  # 5 + 7 shards

KILL = "os.kill(os.getpid(), signal.SIGKILL)"  # no cleanup runs


def on_call(method: str, n: int, action: str = KILL) -> str:
    """Code run first in a process: ``ShardSink.METHOD`` does ``action`` on its ``n``-th call."""
    return f"""
import os, signal, sys
from wdsprep.pack import sink
real, calls = sink.ShardSink.{method}, [0]
def {method}(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == {n}:
        {action}
    real(self, *args, **kwargs)
sink.ShardSink.{method} = {method}
"""


# The CLI with its argv, after ``on_call``'s patch.
CLI = """
from wdsprep.cli import main
sys.exit(main(sys.argv[1:]))
"""
# A part killed while it writes its second shard, its first one staged (and published, where it
# came next).
KILLED = on_call("add", 6) + CLI


@pytest.fixture
def corpus(tmp_path):
    """An ark of 46 utterances and their transcripts (with one of no utterance: a drop to report)."""
    rng = np.random.default_rng(0)
    feats = {u: rng.standard_normal((int(rng.integers(3, 400)), 13)).astype(np.float32) for u in IDS}
    scp = tmp_path / "feats.scp"
    kaldiio.save_ark(str(tmp_path / "a.ark"), feats, scp=str(scp))
    text = tmp_path / "text"
    text.write_text("".join(f"{u} words of {u}\n" for u in [*IDS, "spk9-gone"]), encoding="utf-8")
    return ["pack", "--scp", str(scp), "--text", str(text), *GROUPS, "--max-lost", "0.05"]


def wdsprep(args: list[str], *, script: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "wdsprep", *args] if script is None else [sys.executable, "-c", script, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def digests(d: Path) -> dict[str, str]:
    """sha256 of every file under ``d``; of each index.json without the shards' mtimes (when each
    shard was written: the one thing two runs of the same pack differ in, documented as such)."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "index.json":
                doc = json.loads(data)
                for s in doc["shards"]:
                    assert isinstance(s.pop("mtime_ns"), int)
                data = json.dumps(doc).encode()
            out[str(p.relative_to(d))] = hashlib.sha256(data).hexdigest()
    return out


def test_parts_in_reverse_one_killed_and_resumed_give_the_bytes_of_one_run(corpus, tmp_path):
    whole, spread = tmp_path / "whole", tmp_path / "spread"
    wdsprep([*corpus, "--out", str(whole)])
    out = ["--out", str(spread)]
    wdsprep([*corpus, *out, "--plan-only"])
    assert sorted(p.name for p in spread.iterdir()) == ["PACK_INCOMPLETE", "pack_plan.json"]
    wdsprep([*corpus, *out, "--part", "2/3"])
    killed = wdsprep([*corpus, *out, "--part", "1/3"], script=KILLED, check=False)
    assert killed.returncode == -9
    # Part 1's first shard (planned shard 1, of 0_200) is staged; its second was being written.
    assert (spread / "0_200" / STAGED_DIR / "00000001.json").is_file()
    assert list(spread.glob("*/.w*")) or list(spread.glob("*/..w*"))
    again = wdsprep([*corpus, *out, "--part", "1/3", "--resume"])
    assert "part 1/3 wrote 3 of its 4 shards" in again.stdout
    assert not list(spread.glob("*/.w*")) and not list(spread.glob("*/..w*"))
    wdsprep([*corpus, *out, "--part", "0/3"])
    # Every part published what came next in plan order: all but nothing is left staged unpublished.
    assert (spread / "PACK_INCOMPLETE").exists()
    committed = wdsprep([*corpus, *out, "--resume"])
    assert "not written by a part" not in committed.stdout
    assert not (spread / "PACK_INCOMPLETE").exists()
    got, want = digests(spread), digests(whole)
    assert len(want) == 26 and got == want
    report = json.loads((spread / "pack_report.json").read_text())
    assert report["counts"] == {"missing_features": 1} and report["written"]["utterances"] == 46
    # A part run after the commit has nothing to do.
    assert "nothing to do" in wdsprep([*corpus, *out, "--part", "0/3"]).stdout


def test_parts_at_once_and_a_part_never_run_are_committed_to_the_same_bytes(corpus, tmp_path):
    """Three parts run at the same time on one folder (a shared lock, one publisher at a time);
    another pack run, where part 1 of 3 never ran, is finished by the committing run itself."""
    whole, spread, short = tmp_path / "whole", tmp_path / "spread", tmp_path / "short"
    wdsprep([*corpus, "--out", str(whole)])
    wdsprep([*corpus, "--out", str(spread), "--plan-only"])
    parts = [subprocess.Popen([sys.executable, "-m", "wdsprep", *corpus, "--out", str(spread), "--part", f"{i}/3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    for p in parts:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    wdsprep([*corpus, "--out", str(spread), "--resume"])
    assert digests(spread) == digests(whole)

    wdsprep([*corpus, "--out", str(short), "--plan-only"])
    for i in (2, 0):
        wdsprep([*corpus, "--out", str(short), "--part", f"{i}/3"])
    committed = wdsprep([*corpus, "--out", str(short), "--resume"])
    # Counted against the plan's 12 shards, not against those the parts left unpublished.
    assert "4 of the 12 planned shards were not written by a part" in committed.stdout, committed.stdout
    assert digests(short) == digests(whole)


def test_a_part_that_fails_keeps_what_it_staged_and_removes_only_its_half_written_shard(corpus, tmp_path):
    spread = tmp_path / "spread"
    out = [*corpus, "--out", str(spread)]
    wdsprep([*out, "--plan-only"])
    failing = on_call("add", 6, "raise OSError(28, 'No space left on device')") + CLI
    failed = wdsprep([*out, "--part", "1/3"], script=failing, check=False)
    assert failed.returncode == 1 and "part 1/3 stopped" in failed.stderr and "--part 1/3" in failed.stderr
    assert (spread / "0_200" / STAGED_DIR / "00000001.json").is_file() and (spread / "PACK_INCOMPLETE").exists()
    assert not list(spread.glob("*/.w*")) and not list(spread.glob("*/..w*"))
    assert "wrote 3 of its 4 shards" in wdsprep([*out, "--part", "1/3"]).stdout


def test_parts_share_the_folder_lock_and_a_whole_run_is_refused_meanwhile(tmp_path):
    a, b = lock_folder(tmp_path, shared=True), lock_folder(tmp_path, shared=True)
    try:
        with pytest.raises(FileExistsError, match="another pack is writing there"):
            lock_folder(tmp_path)
    finally:
        import os

        os.close(a)
        os.close(b)


def test_a_part_needs_the_plan_and_a_part_number_in_range(corpus, tmp_path):
    out = ["--out", str(tmp_path / "spread")]
    done = wdsprep([*corpus, *out, "--part", "0/2"], check=False)
    assert done.returncode == 2 and "--plan-only" in done.stderr
    done = wdsprep([*corpus, *out, "--part", "2/2"], check=False)
    assert done.returncode == 2 and "0 <= I < N" in done.stderr
    done = wdsprep([*corpus, *out, "--part", "0/2", "--plan-only"], check=False)
    assert done.returncode == 2 and "give one" in done.stderr


def test_pack_audio_in_parts_gives_the_bytes_of_one_run(tmp_path):
    """Audio shards (Opus, the store whose lengths come from decoding; FLAC's path is the same), two
    parts in reverse, an unreadable file among the inputs."""
    store = ["opus", "--bitrate", "16k"]
    rng = np.random.default_rng(1)
    wav, text = tmp_path / "wav.scp", tmp_path / "text"
    lines, texts = [], []
    for i in range(20):
        path = tmp_path / f"r{i:02d}.wav"
        sf.write(path, (rng.standard_normal(int(rng.integers(1600, 12000))) * 3000).astype(np.int16), 16000)
        lines.append(f"r{i:02d} {path}")
        texts.append(f"r{i:02d} say {i}")
    lines.append(f"r99 {tmp_path / 'missing.wav'}")
    texts.append("r99 lost")
    wav.write_text("\n".join(lines) + "\n")
    text.write_text("\n".join(texts) + "\n")
    cmd = ["pack-audio", "--wav-scp", str(wav), "--text", str(text), "--store", *store, "--filter-group", ":40", "40:",
           "--utts-per-shard", "3", "--max-lost", "0.05"]
    whole, spread = tmp_path / "whole", tmp_path / "spread"
    wdsprep([*cmd, "--out", str(whole)])
    wdsprep([*cmd, "--out", str(spread), "--plan-only"])
    for i in (1, 0):
        wdsprep([*cmd, "--out", str(spread), "--part", f"{i}/2"])
    wdsprep([*cmd, "--out", str(spread), "--resume"])
    got, want = digests(spread), digests(whole)
    assert got == want and sum(n.endswith(".tar") for n in want) >= 6
    assert json.loads((spread / "pack_report.json").read_text())["counts"]
    # Each utterance's decoded length, as the index records it.
    from wdsprep.format.index import read_index
    from wdsprep.format.samples import iter_decoded

    for folder in (p for p in spread.iterdir() if p.is_dir()):
        index = read_index(folder)
        assert index.audio.layout == "opus"
        for k, name in enumerate(index.names):
            decoded = [len(a.pcm()) for _, a, _ in iter_decoded(str(folder / name), lazy=True)]
            assert decoded == index.shard(k).samples
