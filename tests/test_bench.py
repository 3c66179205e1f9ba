"""Smoke test of the benchmark on a tiny corpus: every row is there and the numbers are sane.

Nothing here asserts on speed (shared CI machines are noisy); only on completeness and plausibility.
"""

from __future__ import annotations

import argparse
import math

import bench
import pytest


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[bench.Results, str]:
    work = tmp_path_factory.mktemp("bench")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    argv = ["--work", str(work / "corpus"), "--utts", "200", "--utts-per-shard", "40", "--repeat", "1",
            "--vocab-size", "60", "--max-frames", "6000", "--nj", "1", "--skip-demo",
            "--plot", str(work / "b.png"),
            "--markdown", str(work / "b.md")]
    args = p.parse_args(argv)
    res = bench.run_bench(args, "bench " + " ".join(argv), log=lambda s: None)
    bench.plot(res, work / "b.png")
    assert (work / "b.png").stat().st_size > 10_000
    return res, bench.to_markdown(res)


def test_every_row_is_in_the_table(result: tuple[bench.Results, str]) -> None:
    res, md = result
    for name in ["raw read, shards", "raw read, float16 shards", "webdataset .decode()",
                 "kaldiio load_scp, random", "kaldiio random + loader's tokenize/bucket/collate",
                 "wdsprep loader, nw=0", "wdsprep loader, nw=2",
                 "wdsprep loader, nw=0, float16 shards"]:
        assert f"| {name} |" in md, name
    for name in ["CAT stream (no sort)", "WeNet sort window", "wdsprep bucket_batches"]:
        assert f"| {name}" in md
    assert md.count("| N") == 1 and "| 4N" in md
    for nw in (0, 2):  # every ratio target is reported for each worker count
        for ref in ("webdataset default decode (warm)", "kaldiio load_scp random (cold)", "raw read of the shard"):
            assert f"| loader nw={nw} ÷ {ref}" in md, (nw, ref)
    assert "float16 storage" in md
    assert md.startswith("```sh\nbench --work")


def test_numbers_are_sane(result: tuple[bench.Results, str]) -> None:
    res, _ = result
    for c in res.contenders:
        assert c.utts == 200, c.key
        assert c.utts_per_s is not None and c.utts_per_s > 0 and math.isfinite(c.utts_per_s), c.key
        assert c.mb_per_s is not None and c.mb_per_s > 0
        assert len(c.seconds) == 1
    assert res.f16 and res.f16[0].utts == 200
    for f in res.f16:
        assert 0.45 < f.bytes16 / f.bytes32 < 0.6
        assert 0 < f.max_abs_err < 0.05 and f.max_rel_err < 1e-3  # float16 has an 11-bit significand


def test_padding_rows(result: tuple[bench.Results, str]) -> None:
    res, _ = result
    assert [p.name for p in res.padding] == [bench.BATCHERS[0], *bench.BATCHERS[1:] * 2]
    for p in res.padding:
        assert p.efficiency is not None and 0 < p.efficiency <= 1, p
        assert p.displacement is not None and p.displacement >= 0
    stream = res.padding[0]
    assert stream.displacement == 0  # the streaming batcher keeps the order it is given
    # Sorted pools of 4000 fill batches that the unsorted stream leaves a quarter padding in.
    assert max(p.efficiency for p in res.padding) > stream.efficiency + 0.05


def test_rss_rows(result: tuple[bench.Results, str]) -> None:
    res, _ = result
    n, n4 = res.rss
    assert n.utts == 200 and n4.utts == 800
    assert 0 < n.base_mb <= n.peak_mb and 0 < n4.peak_mb


def test_padding_stats_on_known_batches() -> None:
    import numpy as np

    lens = np.array([10, 10, 5, 5])
    eff, disp, means, nb = bench._padding_stats([[0, 1], [2, 3]], lens)
    assert (eff, disp, means, nb) == (1.0, 0.0, [10.0, 5.0], 2)
    eff, disp, _means, _ = bench._padding_stats([[0, 2], [1, 3]], lens)
    assert eff == 30 / 40 and disp == 0.5  # positions 0,2,1,3 vs 0,1,2,3


def test_plan_benchmark_reports_every_figure(tmp_path) -> None:
    """tools/bench/bench_plan.py at a small scale: the plan, the indexed build and the tail are measured."""
    import json

    import bench_plan

    out = tmp_path / "plan.json"
    assert bench_plan.main(["--utts", "200000", "--index-utts", "20000", "--work", str(tmp_path / "w"),
                            "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["plan"]["utterances"] == 200_000 and r["plan"]["batches"] > 0 and r["plan"]["peak_mb"] > 0
    assert r["index"]["shard_set"]["utterances"] == 20_000 and r["index"]["make_loader"]["len"] > 0
    assert r["index"]["files_bytes"]["index.json"] < 1e6  # per-shard totals only; the columns are apart
    assert len(r["tail"]) == 6 and all(t["discarded_batches"] < t["world_size"] for t in r["tail"])


def test_longrun_reads_memory_by_kind_and_tells_a_leak_from_a_band(capsys) -> None:
    """tools/bench/bench_longrun.py: this process's memory splits into private and shared; the table's
    high-water growth stays near 0 for a process that moves within a band and shows one that leaks."""
    import bench_longrun

    m = bench_longrun.memory_mb()
    assert m["private"] > 0 and m["shared"] >= 0 and m["private"] + m["shared"] <= m["rss"] + 1

    def rows(private: list[float]) -> list[list[dict[str, float]]]:
        return [[{"rss": p + 10, "private": p, "shared": 10.0}] for p in private]

    bench_longrun.report(rows([195.0, 201.0, 196.0, 201.0] * 5), 20)  # a band: ends high, starts low
    bench_longrun.report(rows([200.0 + 2 * k for k in range(20)]), 20)  # a leak: 2 MB an epoch
    band, leak = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| main")]
    assert band.split(" | ")[2:5] == ["+3.08%", "201.0 / 201.0", "+0.00%"], band
    assert leak.split(" | ")[2:5] == ["+19.00%", "208.0 / 238.0", "+14.42%"], leak


@pytest.mark.parametrize("lhotse", ["as installed", "hidden"])
def test_audio_bench_reports_every_row(tmp_path, monkeypatch, lhotse):
    """tools/bench/bench_audio.py on 40 s of the demo speech: storage per hour for FLAC, WAV and
    float32/float16 fbank; throughput rows with and without augmentation; Lhotse's rows measured
    when it is installed and saying "skipped" when it is not (it is no dependency of wdsprep)."""
    import sys

    import bench_audio

    if lhotse == "hidden":
        monkeypatch.setitem(sys.modules, "lhotse", None)  # import lhotse fails
    text = bench_audio.main(["--hours", "0.012", "--repeat", "1", "--per-shard", "4", "--work", str(tmp_path),
                             "--quiet"])
    for row in ("FLAC shards (16-bit)", "WAV shards (16-bit)", "float32 fbank shards", "float16 fbank shards",
                "wdsprep, FLAC shards, fbank on the fly", "wdsprep, FLAC shards + speed 0.9/1.0/1.1 + SpecAugment",
                "wdsprep, WAV shards", "wdsprep, float32 features shards", "Lhotse, FLAC files",
                "Lhotse + PerturbSpeed"):
        assert f"| {row}" in text, row
    storage = text.split("| storage")[1].split("\n\n")[0].splitlines()[2:]
    sizes = {line.split("|")[1].strip(): float(line.split("|")[3]) for line in storage}
    assert sizes["float16 fbank shards"] < 0.6 and 0.2 < sizes["FLAC shards (16-bit)"] < 0.8
    try:
        import lhotse as installed  # noqa: F401
    except ImportError:
        installed = None
    skipped = text.count("skipped: lhotse is not installed")
    assert skipped == (2 if lhotse == "hidden" or installed is None else 0)
    assert ("x |" in text.split("Lhotse, FLAC files")[0]) == (skipped == 0)  # a ratio against Lhotse when measured
