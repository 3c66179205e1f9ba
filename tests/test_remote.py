"""Shards on S3 and web servers: real servers on 127.0.0.1 (moto, http.server), planted faults.

Every remote loader here is held against the same loader over the local files: the same batches,
bit for bit, whatever the server did (a retry never changes, repeats or loses a batch).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from relay import relay
from remote_servers import BUCKET, http_server, s3_server, upload, use_endpoint
from shardsets import build, train_char_tokenizer

import wdsprep
from wdsprep.errors import DataError
from wdsprep.format.shardfile import ShardError
from wdsprep.loading.readahead import ShardFetcher
from wdsprep.plan.options import FetchOptions
from wdsprep.plan.shardset import StaleIndexError
from wdsprep.remote import FetchError, RetryPolicy, fetch_shard, stores
from wdsprep.remote.cache import ShardCache
from wdsprep.remote.clients import Final, Stream
from wdsprep.remote.stores import Store, first_glob_index
from wdsprep.remote.urls import has_folder, is_glob, is_url

pytestmark = pytest.mark.timeout(120)
GROUPS = ("0_150", "150_inf")
FAST = {"retry_backoff": 0.01}  # retries in milliseconds, not seconds


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    out, utts = build(root, n=150, utts_per_shard=15, groups=["0:150", "150:"])
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    names = {g: sorted(p.name for p in (out / g).glob("data-*.tar")) for g in GROUPS}
    return out, utts, tok, names


@pytest.fixture(scope="module")
def web(corpus):
    with http_server(corpus[0]) as srv:
        yield srv


@pytest.fixture
def http(web):
    web.reset()
    yield web
    web.reset()


@pytest.fixture(scope="module")
def s3_endpoint(corpus):
    with s3_server() as endpoint:
        upload(endpoint, corpus[0], "corpus")
        yield endpoint


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    use_endpoint(monkeypatch, s3_endpoint)
    return s3_endpoint


def brace_pattern(base: str, names: dict[str, list[str]]) -> str:
    """Every shard as brace ranges (a web server cannot list)."""
    parts = [f"{g}/data-{{00000..{len(n) - 1:05d}}}.tar" for g, n in names.items()]
    return f"{base}/{{{','.join(parts)}}}"


def epoch(trset, tok, *, epoch: int = 0, **kw):
    """[(keys, feats)] of one epoch and the loader's stats."""
    kw = {"max_frames": 2500, "seed": 5, "shuffle_buffer": 40, **kw}
    loader = wdsprep.make_loader(trset, tok, **kw)
    loader.set_epoch(epoch)
    got = [(tuple(b.keys), b.feats.numpy().copy()) for b in loader]
    return got, loader.stats


def same(a, b) -> bool:
    return [k for k, _ in a] == [k for k, _ in b] and all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))


@pytest.fixture(scope="module")
def local(corpus):
    out, _, tok, _ = corpus
    return {e: epoch(f"{out}/*/data-*.tar", tok, epoch=e)[0] for e in (0, 1)}


def shard_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.glob("*/data-*.tar"))


@pytest.mark.parametrize("workers", [0, 2])
def test_http_shards_give_the_local_batches(corpus, local, http, workers):
    out, _, tok, names = corpus
    got, st = epoch(brace_pattern(http.url, names), tok, num_workers=workers)
    assert same(got, local[0])
    assert st.retries == 0 and st.fetched_bytes == shard_bytes(out)
    assert all(n == 1 for p, n in http.gets.items() if p.endswith(".tar")), "a shard fetched twice"
    assert not any(p.endswith("index.keys.txt") for p in http.gets), "planning needs no keys"


@pytest.mark.parametrize("workers", [0, 2])
def test_s3_glob_shards_give_the_local_batches(corpus, local, s3, workers):
    out, _, tok, _ = corpus
    for e in (0, 1):
        got, st = epoch(f"s3://{BUCKET}/corpus/{{0_150,150_inf}}/data-*.tar", tok, epoch=e, num_workers=workers)
        assert same(got, local[e])
        assert st.retries == 0 and st.fetched_bytes == shard_bytes(out)


def test_s3_brace_urls_and_a_profile_in_the_aws_config_file(corpus, local, s3, tmp_path, monkeypatch):
    """The endpoint and keys as ~/.aws/config gives them (MinIO/Ceph users' way), no AWS variables."""
    out, _, tok, names = corpus
    cfg = tmp_path / "config"
    cfg.write_text(f"[profile minio]\nregion = us-east-1\nendpoint_url = {s3}\naws_access_key_id = testing\n"
                   f"aws_secret_access_key = testing\n")
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_PROFILE", "minio")
    got, _ = epoch(brace_pattern(f"s3://{BUCKET}/corpus", names), tok)
    assert same(got, local[0])


@pytest.mark.parametrize("ranges", [True, False], ids=["resumed", "restarted"])
def test_http_faults_are_retried_counted_and_change_no_batch(corpus, local, tmp_path, ranges):
    """503 twice, a body cut short and a connection reset mid-body: every batch as without them,
    each utterance once, and every retry counted."""
    out, utts, tok, names = corpus
    with http_server(out, ranges=ranges) as srv:
        srv.faults["/0_150/data-00000.tar"] = ["503", "503"]
        srv.faults["/150_inf/data-00001.tar"] = ["truncate"]
        srv.faults["/150_inf/data-00003.tar"] = ["reset"]
        got, st = epoch(brace_pattern(srv.url, names), tok, **FAST)
    assert same(got, local[0])
    assert st.retries == 4
    assert st.fetched_bytes == shard_bytes(out)  # resumed or restarted, the shard counts once
    assert Counter(k for keys, _ in got for k in keys).most_common(1)[0][1] == 1
    assert srv.gets["/0_150/data-00000.tar"] == 3 and srv.gets["/150_inf/data-00001.tar"] == 2


def test_s3_faults_are_retried_counted_and_change_no_batch(corpus, local, s3, monkeypatch):
    """The same faults in S3 responses (a relay in front of moto): a truncated S3 stream is not read as
    the end of the shard."""
    out, _, tok, _ = corpus
    with http_server(upstream=s3) as relay:
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
        key = f"/{BUCKET}/corpus"
        relay.faults[f"{key}/0_150/data-00001.tar"] = ["truncate", "503"]
        relay.faults[f"{key}/150_inf/data-00000.tar"] = ["reset"]
        relay.faults[f"{key}/150_inf/data-00002.tar"] = ["503", "503"]
        got, st = epoch(f"s3://{BUCKET}/corpus/*/data-*.tar", tok, num_workers=2, **FAST)
    assert same(got, local[0])
    assert st.retries == 5


def test_dev_mode_every_utterance_once_through_faults(corpus, http):
    out, utts, tok, names = corpus
    http.faults["/150_inf/data-00000.tar"] = ["truncate", "reset"]
    got, st = epoch(brace_pattern(http.url, names), tok, train=False, num_workers=2, **FAST)
    seen = Counter(k for keys, _ in got for k in keys)
    assert set(seen) == set(utts) and max(seen.values()) == 1
    assert st.retries == 2


def test_a_shard_that_stays_unreachable_is_named_or_skipped_and_counted(corpus, http):
    out, utts, tok, names = corpus
    bad = "/150_inf/data-00002.tar"
    http.faults[bad] = ["503"] * 10
    with pytest.raises(FetchError, match=rf"{http.url}{bad}: HTTP 503; gave up after 3 attempt\(s\)"):
        epoch(brace_pattern(http.url, names), tok, retries=2, on_error="raise", **FAST)
    http.faults[bad] = ["503"] * 10
    with pytest.warns(RuntimeWarning, match=f"{bad}.*unreachable_shard"):
        got, st = epoch(brace_pattern(http.url, names), tok, retries=2, train=False, **FAST)
    in_shard = json.loads((out / "150_inf" / "index.json").read_text())["shards"][2]["utts"]
    seen = Counter(k for keys, _ in got for k in keys)
    assert len(seen) == len(utts) - in_shard and max(seen.values()) == 1
    assert st.unreachable_shards == 1 and st.dropped == {"unreachable_shard": in_shard}
    assert st.retries == 2


def test_a_missing_shard_is_not_retried(corpus, tmp_path):
    out, _, tok, names = corpus
    names = {g: list(n) for g, n in names.items()}
    names["150_inf"].append("data-99999.tar")  # beyond what the server has: not in the index either
    with http_server(out) as srv:
        with pytest.raises(DataError, match=r"150_inf/data-\d+.tar is not in .*150_inf/index.json"):
            epoch(brace_pattern(srv.url, names), tok)
        with pytest.raises(FetchError, match=r"HTTP 404 \(no such file"):
            fetch_shard(f"{srv.url}/150_inf/data-99999.tar", policy=RetryPolicy(retries=3, backoff=5))
        assert srv.gets["/150_inf/data-99999.tar"] == 1


def test_globs_and_missing_indexes_are_clear_errors(corpus, http, s3, tmp_path):
    out, _, tok, _ = corpus
    with pytest.raises(ValueError, match="a web server cannot list files.*brace range"):
        wdsprep.make_loader(f"{http.url}/0_150/data-*.tar", tok, max_frames=2000)
    with pytest.raises(FileNotFoundError, match="matches no object"):
        wdsprep.make_loader(f"s3://{BUCKET}/corpus/*/nothing-*.tar", tok, max_frames=2000)
    with http_server(tmp_path) as bare:  # shards without their index files
        (tmp_path / "g").mkdir()
        (tmp_path / "g" / "data-00000.tar").write_bytes((out / "0_150" / "data-00000.tar").read_bytes())
        with pytest.raises(DataError, match=r"/g/index.json: the shards there have no index.*wdsprep index.*upload"):
            wdsprep.make_loader(f"{bare.url}/g/data-00000.tar", tok, max_frames=2000)


def test_a_shard_changed_since_indexed_is_caught_by_size(corpus, s3, tmp_path):
    """S3 glob: by the listing, before the epoch; brace URLs: when it is downloaded."""
    out, utts, tok, names = corpus
    from remote_servers import client

    c = client(s3)
    changed = (out / "0_150" / "data-00001.tar").read_bytes() + b"\0" * 1024
    c.put_object(Bucket=BUCKET, Key="changed/0_150/data-00001.tar", Body=changed)
    for p in sorted((out / "0_150").iterdir()):
        if p.name != "data-00001.tar" and p.is_file():
            c.upload_file(str(p), BUCKET, f"changed/0_150/{p.name}")
    with pytest.raises(StaleIndexError, match=r"data-00001.tar changed since it was indexed \(the store lists"):
        wdsprep.make_loader(f"s3://{BUCKET}/changed/0_150/data-*.tar", tok, max_frames=2000)
    brace = f"s3://{BUCKET}/changed/0_150/data-{{00000..{len(names['0_150']) - 1:05d}}}.tar"
    with pytest.raises(ShardError, match=r"data-00001.tar has [\d,]+ bytes on the server, its index says"):
        epoch(brace, tok, on_error="raise")
    with pytest.warns(RuntimeWarning, match="its utterances are skipped"):
        got, st = epoch(brace, tok, train=False)
    assert st.stale_shards == 1 and st.dropped == {"stale_shard": 15}


def test_the_cache_serves_later_epochs_and_mirrors_the_urls(corpus, local, http, tmp_path):
    out, _, tok, names = corpus
    cache = tmp_path / "cache"
    for e in (0, 1):
        got, st = epoch(brace_pattern(http.url, names), tok, epoch=e, cache_dir=cache)
        assert same(got, local[e])
        assert st.fetched_bytes == (shard_bytes(out) if e == 0 else 0)
    assert all(n == 1 for p, n in http.gets.items() if p.endswith(".tar"))
    port = http.url.rsplit(":", 1)[1]
    cached = sorted(p.relative_to(cache / "http" / f"127.0.0.1_{port}").as_posix()
                    for p in cache.rglob("*.tar"))
    assert cached == sorted(f"{g}/{n}" for g, ns in names.items() for n in ns)
    assert not [p for p in cache.rglob(".*.tmp")]


def test_the_cache_is_bounded_least_recently_used_first(corpus, local, http, tmp_path):
    out, _, tok, names = corpus
    sizes = sorted(p.stat().st_size for p in out.glob("*/data-*.tar"))
    bound = sum(sizes[-3:])
    cache = tmp_path / "cache"
    got, _ = epoch(brace_pattern(http.url, names), tok, cache_dir=cache, cache_bytes=bound, read_ahead=1)
    assert same(got, local[0])
    files = list(cache.rglob("*.tar"))
    assert 0 < sum(p.stat().st_size for p in files) <= bound and len(files) < len(sizes)
    # The survivors are the most recently used: a fresh cache's eviction keeps the newest mtimes.
    c = ShardCache(cache, bound)
    os.utime(files[0], (1, 1))  # made the oldest: the next eviction takes it first
    c.max_bytes = sum(p.stat().st_size for p in files) - 1
    c.evict()
    assert not files[0].exists() and all(p.exists() for p in files[1:])


def test_a_cache_of_no_bytes_spools_each_shard_and_keeps_nothing(corpus, local, http, tmp_path):
    """cache_bytes=0: every shard written to disk, read from its open descriptor while evictions by
    the other fetch threads unlink it at once."""
    out, _, tok, names = corpus
    cache = tmp_path / "cache"
    got, st = epoch(brace_pattern(http.url, names), tok, cache_dir=cache, cache_bytes=0, read_ahead=4)
    assert same(got, local[0]) and st.fetched_bytes == shard_bytes(out)
    assert not list(cache.rglob("*.tar"))


def test_a_shard_evicted_the_moment_it_is_renamed_is_still_read(corpus, http, tmp_path, monkeypatch):
    """The worst moment for another process's eviction: right after the rename, before any open."""
    import wdsprep.files

    out = corpus[0]
    real = os.replace

    def replace_then_evict(src, dst):
        real(src, dst)
        os.unlink(dst)

    monkeypatch.setattr(wdsprep.files.os, "replace", replace_then_evict)
    copy, _, hit = ShardCache(tmp_path / "cache", 0).fetch(f"{http.url}/0_150/data-00000.tar")
    assert not hit and not Path(copy.path).exists()
    assert os.pread(copy.fd, copy.size + 1, 0) == (out / "0_150" / "data-00000.tar").read_bytes()


def test_an_interrupted_download_leaves_no_file_under_its_final_name(corpus, http, tmp_path):
    out, _, tok, names = corpus
    cache = ShardCache(tmp_path / "cache", 10 << 20)
    url = f"{http.url}/0_150/data-00000.tar"
    http.faults["/0_150/data-00000.tar"] = ["truncate"]
    with pytest.raises(FetchError, match="gave up after 1 attempt"):
        cache.fetch(url, policy=RetryPolicy(retries=0))
    final = cache.path_for(url)
    assert not final.exists() and not list(final.parent.glob(".*"))
    copy, retries, hit = cache.fetch(url, policy=RetryPolicy(retries=0))
    assert (retries, hit) == (0, False) and final.read_bytes() == (out / "0_150" / "data-00000.tar").read_bytes()
    # A temporary file a killed process left behind is cleared by the next eviction.
    orphan = final.with_name(".data-00009.tar.tmp")
    orphan.write_bytes(b"partial")
    cache.evict()
    assert not orphan.exists() and final.exists()


def test_processes_sharing_a_cache_download_a_shard_once(corpus, http, tmp_path):
    out, _, tok, _ = corpus
    http.faults["/0_150/data-00001.tar"] = ["slow"]  # the first download takes a while: the others wait
    code = ("import sys; from wdsprep.remote.cache import ShardCache; "
            "c, r, hit = ShardCache(sys.argv[1], 1 << 30).fetch(sys.argv[2]); "
            "print(hit, open(c.path, 'rb').read() == open(sys.argv[3], 'rb').read())")
    args = [str(tmp_path / "cache"), f"{http.url}/0_150/data-00001.tar", str(out / "0_150" / "data-00001.tar")]
    procs = [subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = sorted(p.communicate(timeout=60)[0].split() for p in procs)
    assert outs == [["False", "True"], ["True", "True"], ["True", "True"]]
    assert http.gets["/0_150/data-00001.tar"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("store", ["http", "s3"])
def test_through_a_slow_store_the_reader_keeps_many_requests_in_flight(corpus, local, http, s3_endpoint, monkeypatch,
                                                                        store):
    """Through the latency relay (0.2 s before each response's first byte, 1 MB/s a connection), a
    reader sized to the store has many downloads in flight at once, where read_ahead=2 had at most 3,
    and the epoch is the local one; the timeout bounds a reader that would fetch one shard at a time."""
    out, _, tok, names = corpus
    with relay(http.url if store == "http" else s3_endpoint, latency=0.2, rate=1e6) as slow:
        if store == "http":
            trset = brace_pattern(slow.url, names)
        else:
            use_endpoint(monkeypatch, slow.url)
            trset = f"s3://{BUCKET}/corpus/*/data-*.tar"
        loader = wdsprep.make_loader(trset, tok, max_frames=2500, seed=5, shuffle_buffer=40)
        loader.set_epoch(0)
        slow.reset()  # the shards' requests alone, not the index files'
        got = [(tuple(b.keys), b.feats.numpy().copy()) for b in loader]
        assert same(got, local[0])
        assert slow.requests == sum(len(n) for n in names.values())
        assert slow.peak_in_flight >= 6, slow.peak_in_flight


def test_read_ahead_is_bounded_in_shards_and_bytes(corpus, http):
    """A reader never has more than read_ahead shards fetched ahead (or read_ahead_bytes of them)."""
    out, _, _, names = corpus
    urls = [f"{http.url}/150_inf/{n}" for n in names["150_inf"]]
    sizes = np.array([(out / "150_inf" / n).stat().st_size for n in names["150_inf"]], np.int64)
    cases = ((FetchOptions(read_ahead=2), 2), (FetchOptions(read_ahead=3, read_ahead_bytes=int(sizes.max())), 1))
    for opts, most in cases:
        http.gets.clear()
        f = ShardFetcher(urls, sizes, list(range(len(urls))), opts)
        try:
            for s in range(len(urls)):
                opened = f.open(s)
                assert opened.source is not None and opened.source.size == sizes[s]
                assert len(f.pending) <= most
                for future in list(f.pending.values()):
                    future.result()  # let them finish: still no more than the bound were started
                assert sum(http.gets.values()) <= s + 1 + most
        finally:
            f.close()
        assert sum(http.gets.values()) == len(urls)


def test_pipe_commands_are_retried_too(corpus, tmp_path):
    out = corpus[0]
    flag = tmp_path / "failed-once"
    shard = out / "0_150" / "data-00000.tar"
    url = f"pipe:if [ -e {flag} ]; then cat {shard}; else touch {flag}; echo busy >&2; exit 3; fi"
    copy, retries = fetch_shard(url, policy=RetryPolicy(backoff=0.01))
    assert retries == 1 and copy.read() == shard.read_bytes()
    with pytest.raises(FetchError, match="command exited with status 3: nope"):
        fetch_shard("pipe:echo nope >&2; exit 3", policy=RetryPolicy(retries=1, backoff=0.01))


def test_dry_run_cli_on_s3_with_fetch_options(corpus, s3, tmp_path):
    out, utts, tok, _ = corpus
    env = {**os.environ}
    trset = f"s3://{BUCKET}/corpus/*/data-*.tar"
    r = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--trset", trset, "--tokenizer", str(tok),
                        "--max-frames", "2500", "--dev", "--read-ahead", "1", "--cache-dir", str(tmp_path / "c"),
                        "--cache-bytes", str(50 << 20), "--retries", "1", "--retry-backoff", "0.01",
                        "--stats-json", str(tmp_path / "st.json")],
                       capture_output=True, text=True, env=env, timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    st = json.loads((tmp_path / "st.json").read_text())[0][0]
    assert st["utterances"] == len(utts) and st["retries"] == 0 and st["fetched_bytes"] == shard_bytes(out)
    assert list((tmp_path / "c" / "s3" / BUCKET / "corpus").rglob("*.tar"))
    r = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--plan", "--trset", trset, "--max-frames", "2500",
                        "--world-size", "2"], capture_output=True, text=True, env=env, timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    planned = int(re.search(r"utterances +([\d,]+) of ([\d,]+) indexed", r.stdout).group(1).replace(",", ""))
    tail = int(re.search(r"discarded tail +\d+ batch\(es\), ([\d,]+) utterances", r.stdout).group(1).replace(",", ""))
    assert planned + tail == len(utts) and f"of {len(utts):,} indexed" in r.stdout  # every utterance in the plan
    r = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--trset", "http://127.0.0.1:9/g/data-*.tar",
                        "--tokenizer", str(tok), "--max-frames", "2500"], capture_output=True, text=True, timeout=100)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot list files" in r.stderr


def test_make_hyper_writes_s3_and_https_patterns(corpus, s3, tmp_path):
    out, utts, tok, names = corpus
    script = Path(__file__).resolve().parent.parent / "egs" / "large" / "local" / "make_hyper.py"
    hyper = tmp_path / "hyper-p.json"
    base = [sys.executable, str(script), "--shards", str(out), "--tokenizer", str(tok), "--out", str(hyper),
            "--set", "bucket_size=2500", "--dev-shards", str(out)]
    subprocess.run(base + ["--remote", f"s3://{BUCKET}/corpus/", "--dev-remote", "https://web/shards/dev"],
                   check=True, capture_output=True, timeout=60)
    option = json.loads(hyper.read_text())["train"]["option"]
    assert option["ld"] == f"s3://{BUCKET}/corpus/{{0_150,150_inf}}/data-*.tar"
    assert option["dev_ld"] == brace_pattern("https://web/shards/dev", names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = wdsprep.make_loader_from_hyper(hyper, tokenizer=tok, read_ahead=1, train=False)
    assert sum(len(b.keys) for b in loader) == len(utts)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_ranks_under_torchrun_read_http_shards_through_faults(corpus, http, tmp_path):
    """2 ranks (gloo) over the web server with faults planted: equal steps, every batch one of the
    canonical plan's (the same plan as the local files), none twice, and every retry counted."""
    from test_ddp import canonical, check_epoch, torchrun

    out, utts, tok, names = corpus
    http.faults["/0_150/data-00001.tar"] = ["503", "503"]
    http.faults["/150_inf/data-00000.tar"] = ["truncate"]
    http.faults["/150_inf/data-00004.tar"] = ["reset"]
    ranks = torchrun(2, tmp_path / "o", brace_pattern(http.url, names), tok, "--epochs", "2", "--num-workers", "1",
                     "--retry-backoff", "0.01", "--read-ahead", "1", "--streams", "4")
    for e in range(2):
        check_epoch([r["epochs"][e] for r in ranks], canonical(f"{out}/*/data-*.tar", tok, e, streams=4))
    assert sum(r["epochs"][0]["stats"]["retries"] for r in ranks) == 4
    assert all(r["epochs"][1]["stats"]["retries"] == 0 for r in ranks)
    # Each rank fetched the shards of its own streams (and of batches lent to even out the steps),
    # not the corpus; a shard whose rows all fell in the discarded tail is not fetched at all.
    fetched = [r["epochs"][0]["stats"]["fetched_bytes"] for r in ranks]
    assert max(fetched) < shard_bytes(out) and sum(fetched) > 0.9 * shard_bytes(out)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_ranks_under_torchrun_read_s3_each_utterance_once(corpus, s3, tmp_path):
    from test_ddp import torchrun

    out, utts, tok, _ = corpus
    ranks = torchrun(2, tmp_path / "o", f"s3://{BUCKET}/corpus/*/data-*.tar", tok, "--epochs", "1", "--dev",
                     "--cache-dir", str(tmp_path / "cache"))
    seen = Counter(k for r in ranks for b in r["epochs"][0]["batches"] for k in b)
    assert set(seen) == set(utts) and max(seen.values()) == 1
    assert sum(r["epochs"][0]["stats"]["fetched_bytes"] for r in ranks) == shard_bytes(out)  # one node, one cache


def test_verify_names_in_remote_shards_what_it_names_in_local_ones(corpus, s3, tmp_path):
    """The same shards, one with a broken npy header (same size, so its index still fits), verified
    from disk, from S3 and from a web server: the same problems, named by URL."""
    import shutil

    from wdsprep.check.verify import verify_shards

    out, _, _, names = corpus
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    victim = bad / GROUPS[0] / names[GROUPS[0]][1]
    data = bytearray(victim.read_bytes())
    i = data.index(b"'descr'")
    data[i:i + 7] = b"'dxscr'"
    victim.write_bytes(bytes(data))
    # Indexed again as it now is: the index's checksum is the damaged shard's, so the remote copies are
    # read and checked (a shard whose bytes are not the indexed ones is refused unread: tested below).
    wdsprep.index_shards(f"{bad}/*/data-*.tar", refresh=True, progress=False)
    upload(s3, bad, "bad")

    def found(result, root: str) -> list[str]:
        # Locally the rewrite also changed the file's mtime, which the index records; remotely only sizes count.
        return [str(p).replace(root, "ROOT") for p in result.problems if "changed since it was indexed" not in p.what]

    local = verify_shards(f"{bad}/*/data-*.tar")
    expected = found(local, str(bad))
    assert any("npy header" in p for p in expected) and local.samples == 150
    from_s3 = verify_shards(f"s3://{BUCKET}/bad/*/data-*.tar")
    assert found(from_s3, f"s3://{BUCKET}/bad") == expected and from_s3.samples == 150
    with http_server(bad) as srv:
        from_http = verify_shards(brace_pattern(srv.url, names))
    assert found(from_http, srv.url) == expected and from_http.samples == 150

    good = verify_shards(f"s3://{BUCKET}/corpus/*/data-*.tar")
    assert good.ok and good.samples == 150, good.format()


def test_verify_names_remote_shards_the_loader_refuses_or_skips(corpus, s3, http, tmp_path):
    from wdsprep.check.verify import verify_shards

    out, _, _, names = corpus
    # A shard replaced after indexing (another size): the loader refuses it.
    swapped = tmp_path / "swapped"
    (swapped / GROUPS[0]).mkdir(parents=True)
    for p in (out / GROUPS[0]).iterdir():
        (swapped / GROUPS[0] / p.name).write_bytes(p.read_bytes())
    first, second = names[GROUPS[0]][:2]
    (swapped / GROUPS[0] / first).write_bytes((out / GROUPS[1] / names[GROUPS[1]][0]).read_bytes())
    upload(s3, swapped, "swapped")
    r = verify_shards(f"s3://{BUCKET}/swapped/{GROUPS[0]}/data-*.tar")
    url = f"s3://{BUCKET}/swapped/{GROUPS[0]}/{first}"
    assert [p.shard for p in r.problems] == [url], r.format()
    assert "its index says" in r.problems[0].what and "the loader refuses it" in r.problems[0].what

    # A folder uploaded without its index: the loader refuses it.
    bare = tmp_path / "bare"
    (bare / GROUPS[0]).mkdir(parents=True)
    (bare / GROUPS[0] / second).write_bytes((out / GROUPS[0] / second).read_bytes())
    upload(s3, bare, "bare")
    r = verify_shards(f"s3://{BUCKET}/bare/{GROUPS[0]}/data-*.tar")
    assert r.problems[0].shard == f"s3://{BUCKET}/bare/{GROUPS[0]}/index.json"
    assert "no index" in r.problems[0].what and r.samples == 15  # its content is still checked

    # A shard the server will not give: named, after the retries asked for.
    http.faults[f"/{GROUPS[0]}/{second}"] = ["503"] * 2
    r = verify_shards(f"{http.url}/{GROUPS[0]}/{{{first[:-4]},{second[:-4]}}}.tar", retries=1, retry_backoff=0)
    assert [p.shard for p in r.problems] == [f"{http.url}/{GROUPS[0]}/{second}"], r.format()
    assert "cannot be downloaded" in r.problems[0].what and "503" in r.problems[0].what

    with pytest.raises(ValueError, match="not commands"):
        verify_shards(f"pipe:cat {out / GROUPS[0] / first}")


def test_remote_shards_plan_with_their_speakers_as_local_ones(corpus, s3, http):
    """The speakers column comes from the index beside the shards: the speaker cap and the shuffle
    report work as on local files, and the keys are not fetched for it (pack stores the column)."""
    from wdsprep.format.keys import speaker_of

    out, _, tok, names = corpus
    local_got, local_st = epoch(f"{out}/*/data-*.tar", tok, max_utts_per_speaker=2)
    assert local_st.shuffle is not None
    for keys, _ in local_got:
        assert max(Counter(speaker_of(k) for k in keys).values()) <= 2
    for trset in (f"s3://{BUCKET}/corpus/*/data-*.tar", brace_pattern(http.url, names)):
        got, st = epoch(trset, tok, max_utts_per_speaker=2)
        assert same(got, local_got)
        assert st.shuffle == local_st.shuffle
    assert any(p.endswith("index.speakers.npy") for p in http.gets)
    assert not any(p.endswith("index.keys.txt") for p in http.gets), "the speakers are stored: no keys needed"
    assert all(n == 1 for p, n in http.gets.items() if "/index." in p), "an index file fetched twice for one loader"


def test_inspect_reads_remote_shards_from_the_index_beside_them(corpus, s3, http, tmp_path):
    """The numbers of the local inspect, from the index alone: no shard is downloaded; a folder
    uploaded without its index is downloaded and read, and says so."""
    from wdsprep.check.inspect import inspect_shards

    out, _, _, names = corpus

    def numbers(result):
        return [(g.name, [(s.path.rsplit("/", 1)[-1], s.source, s.frames.tolist(), s.text_lens.tolist())
                          for s in g.shards]) for g in result.groups], result.efficiency

    local = inspect_shards(f"{out}/*/data-*.tar")
    assert not local.problems
    assert numbers(inspect_shards(f"s3://{BUCKET}/corpus/*/data-*.tar")) == numbers(local)
    assert numbers(inspect_shards(brace_pattern(http.url, names))) == numbers(local)
    assert http.gets and not any(p.endswith(".tar") for p in http.gets), "a shard downloaded for inspect"

    bare = tmp_path / "bare" / GROUPS[0]
    bare.mkdir(parents=True)
    for name in names[GROUPS[0]]:
        (bare / name).write_bytes((out / GROUPS[0] / name).read_bytes())
    upload(s3, bare.parent, "inspect-bare")
    r = inspect_shards(f"s3://{BUCKET}/inspect-bare/{GROUPS[0]}/data-*.tar")
    assert [s.source for s in r.shards] == ["tar"] * len(names[GROUPS[0]])
    assert numbers(r)[0][0][1] == [x[:1] + ("tar",) + x[2:] for x in numbers(local)[0][0][1]]
    assert len(r.problems) == 1 and "no index" in r.problems[0] and "downloaded and read instead" in r.problems[0]


def test_a_fetched_shard_with_headers_only_tarfile_reads_is_read_from_its_copy(tmp_path):
    """pax records the fast walk leaves to Python's tarfile: the fallback reads the fetched bytes,
    not the URL as if it were a path."""
    import io
    import tarfile

    from wdsprep.format.samples import open_members
    from wdsprep.format.shardfile import ShardFile

    shard = tmp_path / "data-00000.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for key in ("a", "b"):
            for ext, data in (("npy", b"x" * 10), ("txt", b"hi")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.pax_headers = len(data), {"comment": "not one the fast walk reads"}
                tf.addfile(info, io.BytesIO(data))
    local = open_members(str(shard))
    assert [m[0] for m in local[1]] == ["a.npy", "a.txt", "b.npy", "b.txt"] and local[2] is None
    with http_server(tmp_path) as srv:
        url = f"{srv.url}/{shard.name}"
        copy, _ = fetch_shard(url)
        _, members, problem = open_members(url, source=ShardFile(url, copy))
    assert (members, problem) == (local[1], local[2])


# ---------------------------------------------------------------------------------------------
# Hostile servers and URLs (issue 30): each ends in a one-line error naming the URL (its secrets
# masked) and what to do, or is skipped and counted; never a hang, unbounded memory, a printed
# secret or silently different data.
# ---------------------------------------------------------------------------------------------

def served_copy(out: Path, dest: Path) -> Path:
    """A copy of the corpus folder (shards and index files) to change and serve."""
    import shutil

    shutil.copytree(out, dest)
    return dest


EXIT_SCRIPT = """
import sys, warnings
import wdsprep
trset, tok, on_error = sys.argv[1:4]
warnings.simplefilter("ignore")
loader = wdsprep.make_loader(trset, tok, max_frames=2500, train=False, on_error=on_error, read_ahead=10)
try:
    for b in loader:
        break  # a trainer that stops early: the shards read ahead are still held
    print("stopped; stale shards:", loader.stats.stale_shards)
except Exception as e:
    print("error:", type(e).__name__, e)
# the loader (its read-ahead copies, the generator holding the fetcher) is let go at exit
"""


@pytest.mark.parametrize("store", ["http", "s3"])
@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_a_process_that_met_a_changed_remote_shard_exits(corpus, s3, tmp_path, store, on_error):
    """Issue 30.1: at exit the fetched copies still referenced (read ahead, in the stopped epoch's
    frames) hand their buffers back; no thread may be started then (it would never run, and its
    start would wait for it for good): the process ends."""
    out, _, tok, names = corpus
    changed = served_copy(out, tmp_path / "changed")
    victim = changed / GROUPS[0] / names[GROUPS[0]][0]  # the first read: the others are read ahead meanwhile
    victim.write_bytes(victim.read_bytes() + b"\0" * 1024)  # its index still says the old size
    if store == "s3":
        upload(s3, changed, f"exits-{on_error}")
        trset = brace_pattern(f"s3://{BUCKET}/exits-{on_error}", names)  # braces: no listing catches it first
        server = None
    else:
        server = http_server(changed)
        trset = brace_pattern(server.__enter__().url, names)
    try:
        r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, trset, str(tok), on_error], capture_output=True,
                           text=True, timeout=60)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    assert r.returncode == 0, r.stderr[-2000:]
    if on_error == "raise":
        assert f"error: ShardError {trset.split('/{')[0]}/{GROUPS[0]}/{victim.name} has" in r.stdout, r.stdout
    else:
        assert "stopped; stale shards: 1" in r.stdout, r.stdout


def test_a_server_that_trickles_is_cut_off_by_the_minimum_rate(corpus, http, s3, monkeypatch):
    """Issue 30.6 (slow-loris): one byte every 0.3 s, in the body or in the headers, over HTTP and S3
    (a relay in front of moto): every attempt ends once it falls behind min_rate, and the error
    names the option."""
    import time

    out, _, _, names = corpus
    shard = f"{GROUPS[0]}/{names[GROUPS[0]][0]}"
    policy = RetryPolicy(retries=1, backoff=0.01, min_rate=1 << 20)  # a grace of 1 s: a fast test
    with http_server(upstream=s3) as relay:
        for server, url, path in ((http, f"{http.url}/{shard}", f"/{shard}"),
                                  (relay, f"s3://{BUCKET}/corpus/{shard}", f"/{BUCKET}/corpus/{shard}")):
            if server is relay:
                monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
            server.trickle_seconds = 0.3
            for fault in ("trickle", "trickle-headers"):
                server.faults[path] = [fault] * 2
                t0 = time.monotonic()
                with pytest.raises(FetchError, match=r"too slow: .* below the minimum rate of 1,048,576 bytes/s "
                                                     r"\(min_rate, --min-rate.*gave up after 2 attempt"):
                    fetch_shard(url, policy=policy)
                assert time.monotonic() - t0 < 8, f"{fault} over {url}: not cut off in time"
                assert server.gets[path] == 2
                server.gets.clear()
            server.faults.clear()


def test_a_trickling_shard_is_skipped_or_named_by_the_loader_and_verify(corpus, http, tmp_path):
    """The minimum rate as make_loader's option and the CLI's flag: the loader names the shard and
    the option (on_error='raise') or skips and counts it; verify --min-rate names it."""
    import time

    out, utts, tok, names = corpus
    bad = f"/{GROUPS[1]}/{names[GROUPS[1]][1]}"
    http.trickle_seconds = 0.3
    http.faults[bad] = ["trickle"] * 2
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=rf"{http.url}{bad}: too slow.*\(min_rate"):
        epoch(brace_pattern(http.url, names), tok, on_error="raise", retries=1, min_rate=1 << 20, **FAST)
    http.faults[bad] = ["trickle"] * 2
    with pytest.warns(RuntimeWarning, match=rf"{bad}: too slow.*unreachable_shard"):
        got, st = epoch(brace_pattern(http.url, names), tok, train=False, retries=1, min_rate=1 << 20, **FAST)
    assert st.unreachable_shards == 1 and sum(len(k) for k, _ in got) == len(utts) - 15
    assert time.monotonic() - t0 < 30
    http.faults[bad] = ["trickle"]
    r = subprocess.run([sys.executable, "-m", "wdsprep", "verify", f"{http.url}{bad}", "--retries", "0",
                        "--min-rate", str(1 << 20)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "too slow" in r.stdout and "min_rate" in r.stdout, r.stdout + r.stderr


def test_a_retry_after_of_years_waits_no_longer_than_the_policy(corpus, http):
    """A server's Retry-After is honoured up to the longest wait of the retry policy: a reader is
    never parked for good."""
    import time

    out, _, _, names = corpus
    shard = f"/{GROUPS[0]}/{names[GROUPS[0]][0]}"
    http.faults[shard] = ["503-wait"]
    t0 = time.monotonic()
    copy, retries = fetch_shard(f"{http.url}{shard}", policy=RetryPolicy(backoff=0.01, max_backoff=0.2))
    assert retries == 1 and copy.read() == (out / shard[1:]).read_bytes()
    assert time.monotonic() - t0 < 5


def test_closing_a_reader_ends_a_download_blocked_on_a_trickle(corpus, http):
    """No minimum rate, a server that trickles: the reader stops (its epoch ends early) and the fetch
    thread blocked in the read ends at once, not when the trickle ends (hours)."""
    import threading
    import time

    out, _, _, names = corpus
    urls = [f"{http.url}/{GROUPS[0]}/{n}" for n in names[GROUPS[0]]]
    sizes = np.array([(out / GROUPS[0] / n).stat().st_size for n in names[GROUPS[0]]], np.int64)
    http.trickle_seconds = 0.3
    http.faults[f"/{GROUPS[0]}/{names[GROUPS[0]][0]}"] = ["trickle"]
    f = ShardFetcher(urls, sizes, list(range(len(urls))), FetchOptions(read_ahead=1, min_rate=0))
    f._ahead(0)  # the first shard's download starts, and blocks in the trickle
    time.sleep(1)
    f.close()
    t0 = time.monotonic()
    while any(t.name.startswith("wdsprep-fetch") for t in threading.enumerate()) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not any(t.name.startswith("wdsprep-fetch") for t in threading.enumerate())


MEMORY_SCRIPT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: a hostile body would pass it
from functools import partial
from wdsprep.errors import DataError
from wdsprep.format.index import read_index_at
from wdsprep.remote.fetch import FetchError, RetryPolicy, fetch_file, fetch_shard
what, url = sys.argv[1:3]
try:
    if what == "index":
        read_index_at(url, partial(fetch_file, policy=RetryPolicy(retries=0)))
    else:
        fetch_shard(url, expected=int(sys.argv[3]), policy=RetryPolicy(retries=0))
    print("no error")
except (DataError, FetchError) as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize("fault,file", [("huge-length", "index.json"), ("endless", "index.json"),
                                        ("endless", "index.frames.npy"), ("huge-length", "index.text_lens.npy")])
def test_a_hostile_index_download_is_bounded(corpus, http, fault, file):
    """Issue 30.7: a Content-Length of 10^12 or an endless body for an index file, under a 1 GiB
    address-space limit: a one-line error naming the file and its bound, not ENOMEM."""
    http.faults[f"/{GROUPS[0]}/{file}"] = [fault]
    r = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, "index", f"{http.url}/{GROUPS[0]}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"DataError {http.url}/{GROUPS[0]}/{file}: more than the ") and \
        "bytes an index file can have here" in r.stdout, r.stdout
    assert r.stdout.count("\n") == 1


@pytest.mark.parametrize("fault,claimed", [("endless", None), ("huge-length", 10**12)])
def test_a_shard_download_is_bounded_by_its_index_size(corpus, http, fault, claimed):
    """A shard's body longer than its index's size is an error (no growth past it); an index that
    claims a shard larger than memory can hold gets a named error, not the OOM killer."""
    out, _, _, names = corpus
    shard = f"/{GROUPS[0]}/{names[GROUPS[0]][0]}"
    size = claimed or (out / shard[1:]).stat().st_size
    http.faults[shard] = [fault]
    r = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, "shard", f"{http.url}{shard}", str(size)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    want = "has more than the" if claimed is None else "cannot hold its bytes in memory"
    assert r.stdout.startswith(("ChangedError", "FetchError")) and f"{http.url}{shard}" in r.stdout, r.stdout
    assert want in r.stdout, r.stdout


def test_credentials_in_a_url_are_sent_and_never_printed(corpus, local, http, tmp_path):
    """Issue 30.8: a user and password in the URL go as basic auth (as curl sends them), a token in
    the query is sent as it is; no message (a warning, an error, verify's report) shows either."""
    out, utts, tok, names = corpus
    user, password = "reader", "hunter2:x@y"
    http.auth = (user, password)
    http.token = "s3cr3t-t0ken"
    base = http.url.replace("http://", "http://reader:hunter2%3Ax%40y@")
    shard_urls = [f"{base}/{g}/{n}?token=s3cr3t-t0ken" for g in GROUPS for n in names[g]]
    got, st = epoch(shard_urls, tok)
    assert same(got, local[0])
    sent = [h for p, hs in http.requests.items() for h in hs]
    assert sent and all(h.get("authorization") for h in sent)
    secrets = ("hunter2", "x@y", "s3cr3t-t0ken", "hunter2%3Ax%40y")

    def clean(text: str) -> None:
        assert not any(s in text for s in secrets), text
        assert "***" in text, text

    bad = f"/{GROUPS[1]}/{names[GROUPS[1]][1]}"
    http.faults[bad] = ["503"] * 3
    with pytest.warns(RuntimeWarning) as caught:
        epoch(shard_urls, tok, retries=1, train=False, **FAST)
    text = "\n".join(str(w.message) for w in caught)
    assert "unreachable_shard" in text
    clean(text)
    http.faults[bad] = ["503"] * 3
    with pytest.raises(FetchError) as e:
        epoch(shard_urls, tok, retries=1, on_error="raise", **FAST)
    clean(str(e.value))
    with pytest.raises(FetchError, match=r"HTTP 401 \(the server wants credentials") as e:  # none given
        wdsprep.make_loader(f"{http.url}/{GROUPS[0]}/{names[GROUPS[0]][0]}", tok, max_frames=2500, retries=0)
    wrong = base.replace("hunter2", "hunter3")
    with pytest.raises(FetchError, match=r"HTTP 401 \(the server refuses the user and password in the URL") as e:
        wdsprep.make_loader(f"{wrong}/{GROUPS[0]}/{names[GROUPS[0]][0]}", tok, max_frames=2500, retries=0)
    assert "hunter3" not in str(e.value) and "***@127.0.0.1" in str(e.value)
    http.faults[bad] = ["503"] * 2
    some = [u for u in shard_urls if f"/{GROUPS[1]}/" in u][:3]
    r = subprocess.run([sys.executable, "-m", "wdsprep", "verify", *some, "--retries", "1",
                        "--retry-backoff", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot be downloaded" in r.stdout, r.stdout + r.stderr
    clean(r.stdout + r.stderr)


def test_a_resumed_download_of_another_version_starts_over(corpus, http, tmp_path):
    """Issue 30.11: a server that ignores If-Range answers a resumed read with the tail of a new
    version (another ETag): the download starts over, counted, instead of stitching two versions."""
    import hashlib

    out, _, _, names = corpus
    root = tmp_path / "v"
    root.mkdir()
    old = (out / GROUPS[0] / names[GROUPS[0]][0]).read_bytes()
    new = bytes(reversed(old))  # another version of the same size
    (root / "s.tar").write_bytes(old)
    with http_server(root) as srv:
        srv.etags = True
        srv.swaps["/s.tar"] = new
        srv.faults["/s.tar"] = ["truncate-swap"]  # cut half-way, and the file replaced meanwhile
        copy, retries = fetch_shard(f"{srv.url}/s.tar", expected=len(old), policy=RetryPolicy(backoff=0.01))
        assert copy.read() == new and retries == 2
        ranges = [h.get("range") for h in srv.requests["/s.tar"]]
        assert ranges == [None, f"bytes={len(old) // 2}-", None]
        # Against the old version's checksum (its index), the new one is refused as changed.
        (root / "s.tar").write_bytes(old)
        srv.faults["/s.tar"] = ["truncate-swap"]
        with pytest.raises(FetchError, match=r"s.tar has other bytes than its index's checksum \(SHA-256\), at "
                                             r"the same size"):
            fetch_shard(f"{srv.url}/s.tar", expected=len(old), checksum=hashlib.sha256(old).hexdigest(),
                        policy=RetryPolicy(backoff=0.01))


def test_a_same_size_change_to_a_remote_shard_is_refused(corpus, local, http, tmp_path):
    """Issue 30.11: features rewritten in place (same size, same frames): the loader refuses the
    shard as changed by its checksum in the index (pack writes it), skipping or naming it; and a
    cache holding another version of the right size fetches it again."""
    import hashlib

    out, utts, tok, names = corpus
    index = json.loads((out / GROUPS[1] / "index.json").read_text())
    for entry in index["shards"]:
        assert entry["sha256"] == hashlib.sha256((out / GROUPS[1] / entry["name"]).read_bytes()).hexdigest()
    changed = served_copy(out, tmp_path / "same-size")
    victim = changed / GROUPS[1] / names[GROUPS[1]][0]
    data = bytearray(victim.read_bytes())
    at = data.index(b"NUMPY") + 200  # inside the first utterance's features
    data[at:at + 8] = bytes(8)
    victim.write_bytes(bytes(data))
    with http_server(changed) as srv:
        trset = brace_pattern(srv.url, names)
        with pytest.raises(ShardError, match=rf"{srv.url}/{GROUPS[1]}/{victim.name} has other bytes than its "
                                             rf"index's checksum"):
            epoch(trset, tok, on_error="raise")
        with pytest.warns(RuntimeWarning, match="checksum.*its utterances are skipped"):
            _, st = epoch(trset, tok, train=False)
        assert st.stale_shards == 1 and st.dropped == {"stale_shard": 15}
        # The cache holds the changed copy under the shard's name (an older version, of the right
        # size): it is not used, the shard is fetched again from a server that has the right one.
    cache = tmp_path / "cache"
    with http_server(out) as srv:
        port = srv.url.rsplit(":", 1)[1]
        cached = cache / "http" / f"127.0.0.1_{port}" / GROUPS[1] / victim.name
        cached.parent.mkdir(parents=True)
        cached.write_bytes(bytes(data))
        got, st = epoch(brace_pattern(srv.url, names), tok, cache_dir=cache)
        assert same(got, local[0]) and st.fetched_bytes == shard_bytes(out)
        assert cached.read_bytes() == (out / GROUPS[1] / victim.name).read_bytes()


def test_the_index_records_checksums_and_old_indexes_still_load(corpus, tmp_path):
    """wdsprep index writes each shard's SHA-256 too; an index written before (no sha256) loads,
    unchecked, and `wdsprep index` adds them."""
    import hashlib

    out, _, tok, names = corpus
    folder = served_copy(out / GROUPS[0], tmp_path / "g")
    doc = json.loads((folder / "index.json").read_text())
    for entry in doc["shards"]:
        del entry["sha256"]
    (folder / "index.json").write_text(json.dumps(doc))
    assert wdsprep.read_index(folder).checksums == [None] * len(names[GROUPS[0]])
    r = wdsprep.index_shards(f"{folder}/data-*.tar", progress=False)
    assert r.ok and "up to date" not in r.format()
    assert wdsprep.read_index(folder).checksums == [hashlib.sha256((folder / n).read_bytes()).hexdigest()
                                                    for n in names[GROUPS[0]]]
    assert "up to date" in wdsprep.index_shards(f"{folder}/data-*.tar", progress=False).format()


@pytest.mark.parametrize("store", ["http", "s3"])
def test_a_malformed_content_length_is_a_named_fetch_error(corpus, http, s3, monkeypatch, store):
    """Issue 30.13: Content-Length "abc": retried, then named (on_error='raise') or skipped and
    counted (warn); never a bare ValueError that ends the epoch."""
    out, utts, tok, names = corpus
    shard = f"{GROUPS[0]}/{names[GROUPS[0]][1]}"
    with http_server(upstream=s3) as relay:
        if store == "s3":
            monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
            server, trset, path = relay, f"s3://{BUCKET}/corpus/*/data-*.tar", f"/{BUCKET}/corpus/{shard}"
            url = f"s3://{BUCKET}/corpus/{shard}"
        else:
            server, trset, path, url = http, brace_pattern(http.url, names), f"/{shard}", f"{http.url}/{shard}"
        server.faults[path] = ["bad-length"] * 2
        with pytest.raises(FetchError, match=rf"{url}: .*malformed.*gave up after 2 attempt"):
            epoch(trset, tok, on_error="raise", retries=1, **FAST)
        server.faults[path] = ["bad-length"] * 2
        with pytest.warns(RuntimeWarning, match=rf"{url}: .*malformed.*unreachable_shard"):
            got, st = epoch(trset, tok, train=False, retries=1, **FAST)
        assert st.unreachable_shards == 1 and sum(len(k) for k, _ in got) == len(utts) - 15


def test_the_user_retries_reach_the_scan_of_a_shard_no_index_lists(corpus, tmp_path):
    """Issue 26: the format does not fetch; a pipe's shard that no index lists is fetched for its
    header scan with the loader's retries (here: fewer than the default), not a default policy."""
    out, _, tok, names = corpus
    flag = tmp_path / "failures"
    shard = out / GROUPS[0] / names[GROUPS[0]][0]
    # Fails twice, then cats the shard.
    cmd = (f"pipe:n=$(cat {flag} 2>/dev/null || echo 0); if [ $n -lt 2 ]; then echo $((n+1)) > {flag}; "
           f"echo busy >&2; exit 3; fi; cat {shard}")
    with pytest.raises(FetchError, match="gave up after 2 attempt.*retries=1"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wdsprep.make_loader(cmd, tok, max_frames=2500, retries=1, retry_backoff=0.01)
    flag.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = wdsprep.make_loader(cmd, tok, max_frames=2500, retries=2, retry_backoff=0.01, train=False)
    assert sum(len(b.keys) for b in loader) == 15


def test_inspect_takes_the_retry_options(corpus, http, tmp_path):
    """inspect downloads the shards of a folder without an index with the retries it is given."""
    from wdsprep.check.inspect import inspect_shards

    out, _, _, names = corpus
    bare = tmp_path / "bare" / GROUPS[0]
    bare.mkdir(parents=True)
    for name in names[GROUPS[0]][:2]:
        (bare / name).write_bytes((out / GROUPS[0] / name).read_bytes())
    with http_server(tmp_path / "bare") as srv:
        srv.faults[f"/{GROUPS[0]}/{names[GROUPS[0]][1]}"] = ["503"] * 2
        r = inspect_shards(f"{srv.url}/{GROUPS[0]}/{{{names[GROUPS[0]][0][:-4]},{names[GROUPS[0]][1][:-4]}}}.tar",
                           retries=1, retry_backoff=0, max_frames_list=[])
    assert [s.utts for s in r.shards] == [15]
    assert any("HTTP 503; gave up after 2 attempt(s) (retries=1)" in p for p in r.problems), r.problems


class _MemStream(Stream):
    def __init__(self, data: bytes, start: int) -> None:
        self.data, self.pos, self.start, self.total = data, start, start, len(data)

    def read(self, n: int) -> bytes:
        chunk = self.data[self.pos:self.pos + n]
        self.pos += len(chunk)
        return chunk


class _MemStore(Store):
    """Objects in a dict, with folders, globs and a listing: what a first-class gs:// would be."""

    name, prefixes = "mem", ("mem://",)
    has_folder = True
    glob_chars = "*?["

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.opened: Counter[str] = Counter()

    def globbed(self, url: str) -> str:
        return url[len("mem://"):]

    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> _MemStream:
        if url not in self.objects:
            raise Final("no such object", missing=True)
        self.opened[url] += 1
        return _MemStream(self.objects[url], start)

    def list(self, pattern: str, timeout: float) -> list[tuple[str, int]]:
        prefix = pattern[:first_glob_index(pattern)]
        return [(u, len(b)) for u, b in sorted(self.objects.items()) if u.startswith(prefix)]


def test_a_new_scheme_is_one_store_class_and_one_entry(corpus, local, monkeypatch, tmp_path):
    """A store added to STORES, and nothing else, serves the loader as S3 does: its glob listed, the
    index fetched from beside the shards, each shard fetched once into the cache, the same batches."""
    out, _, tok, _ = corpus
    objects = {f"mem://corpus/{p.relative_to(out).as_posix()}": p.read_bytes() for p in out.rglob("*") if p.is_file()}
    store = _MemStore(objects)
    monkeypatch.setattr(stores, "STORES", (*stores.STORES, store))
    pattern = "mem://corpus/*/data-*.tar"
    assert is_url(pattern) and is_glob(pattern) and has_folder(pattern) and not is_glob("mem://corpus/a.tar")
    cache = tmp_path / "cache"
    for e in (0, 1):
        got, st = epoch(pattern, tok, epoch=e, cache_dir=cache)
        assert same(got, local[e])
        assert st.fetched_bytes == (shard_bytes(out) if e == 0 else 0)
    shards = [u for u in objects if u.endswith(".tar")]
    assert {u: store.opened[u] for u in shards} == dict.fromkeys(shards, 1)
    assert all(store.opened[f"mem://corpus/{g}/index.json"] for g in GROUPS)
    assert sorted(p.parent.name for p in cache.rglob("*.tar")) == ["mem"] * len(shards)
