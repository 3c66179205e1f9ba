"""A pack whose output is a bucket (moto's S3 server on 127.0.0.1): three parts run as separate
processes in separate working folders, sharing nothing but the bucket, one killed in mid-shard and
run again, then committed, give the objects a local pack gives as files; the loader trains from the
bucket; ``verify`` and ``index`` work on the bucket's folder in place."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from remote_servers import BUCKET, client, s3_server, use_endpoint
from shardsets import train_char_tokenizer
from test_pack_parts import KILLED, corpus, digests  # noqa: F401  (corpus: the fixture)
from test_remote import epoch, same

from wdsprep.format.commit import UncommittedPackError

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def s3(monkeypatch):
    with s3_server() as endpoint:
        use_endpoint(monkeypatch, endpoint)
        yield endpoint


def run(args: list[str], cwd: Path, *, script: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """The command in its own working folder (what a machine of a job array has of its own)."""
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "wdsprep", *args] if script is None else [sys.executable, "-c", script, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def download(endpoint: str, prefix: str, dest: Path) -> list[str]:
    """Every object under ``prefix`` into ``dest`` (as files at its relative paths); their names."""
    c = client(endpoint)
    names = [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])]
    for key in names:
        path = dest / key[len(prefix) + 1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        c.download_file(BUCKET, key, str(path))
    return sorted(n[len(prefix) + 1:] for n in names)


def test_parts_sharing_only_a_bucket_one_killed_commit_the_objects_of_a_local_pack(corpus, s3, tmp_path):  # noqa: F811
    url = f"s3://{BUCKET}/train"
    whole = tmp_path / "whole"
    run([*corpus, "--out", str(whole)], tmp_path)
    out = [*corpus, "--out", url]
    run([*out, "--plan-only"], tmp_path / "planner")
    run([*out, "--part", "2/3"], tmp_path / "machine2")
    killed = run([*out, "--part", "1/3"], tmp_path / "machine1", script=KILLED, check=False)
    assert killed.returncode == -9
    c = client(s3)
    staged = [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix="train/0_200/.pack.staged/")["Contents"]]
    assert "train/0_200/.pack.staged/00000001.json" in staged  # its first shard, staged before the kill
    again = run([*out, "--part", "1/3"], tmp_path / "machine1-again")
    assert "part 1/3 wrote 3 of its 4 shards" in again.stdout
    run([*out, "--part", "0/3"], tmp_path / "machine0")
    tok = train_char_tokenizer(tmp_path, Path(corpus[4]))
    pattern = f"{url}/{{0_200,200_inf}}/data-*.tar"
    with pytest.raises(UncommittedPackError, match="PACK_INCOMPLETE"):  # the marker is there until the commit
        epoch(pattern, tok)
    committed = run([*out, "--resume"], tmp_path / "committer")
    assert "not written by a part" not in committed.stdout
    names = download(s3, "train", tmp_path / "bucket")
    assert "PACK_INCOMPLETE" not in names and not any(".pack." in n or ".index.parts" in n for n in names)
    got, want = digests(tmp_path / "bucket"), digests(whole)
    assert len(want) == 26 and got == want
    report = json.loads((tmp_path / "bucket" / "pack_report.json").read_text())
    assert report["counts"] == {"missing_features": 1} and report["written"]["utterances"] == 46

    # The loader trains from the bucket: the batches of the local pack.
    for e in (0, 1):
        assert same(epoch(pattern, tok, epoch=e)[0], epoch(f"{whole}/{{0_200,200_inf}}/data-*.tar", tok, epoch=e)[0])

    # verify and index on the bucket's folder, in place: an intact index is kept without a download.
    glob = f"{url}/*/data-*.tar"
    assert run(["verify", glob], tmp_path).returncode == 0
    kept = run(["index", glob], tmp_path)
    assert kept.stdout.count("up to date") == 2 and "12 shards (0 read)" in kept.stdout
    c.delete_object(Bucket=BUCKET, Key="train/200_inf/index.json")
    rebuilt = run(["index", glob], tmp_path)
    assert "indexed in place: 7 shards, 7 downloaded" in rebuilt.stdout and "up to date" in rebuilt.stdout
    assert run(["verify", glob], tmp_path).returncode == 0
    assert same(epoch(pattern, tok)[0], epoch(f"{whole}/{{0_200,200_inf}}/data-*.tar", tok)[0])


def test_a_whole_pack_into_a_bucket_resumes_and_a_second_one_is_refused(corpus, s3, tmp_path):  # noqa: F811
    url = f"s3://{BUCKET}/one"
    killed = run([*corpus, "--out", url], tmp_path / "a", script=KILLED, check=False)
    assert killed.returncode == -9  # killed holding the lease: it lapses, or is taken over once it has
    c = client(s3)
    keys = {o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix="one/")["Contents"]}
    assert "one/PACK_INCOMPLETE" in keys and "one/.pack.lock" in keys
    refused = run([*corpus, "--out", url, "--resume"], tmp_path / "b", check=False)
    assert refused.returncode == 2 and "another pack is writing there now" in refused.stderr
    lease = json.loads(c.get_object(Bucket=BUCKET, Key="one/.pack.lock")["Body"].read())
    lease["until"] = 0  # as if its holder had stopped renewing it long ago
    c.put_object(Bucket=BUCKET, Key="one/.pack.lock", Body=json.dumps(lease).encode())
    run([*corpus, "--out", url, "--resume"], tmp_path / "b")
    whole = tmp_path / "whole"
    run([*corpus, "--out", str(whole)], tmp_path)
    download(s3, "one", tmp_path / "got")
    assert digests(tmp_path / "got") == digests(whole)
    again = run([*corpus, "--out", url], tmp_path / "c", check=False)
    assert again.returncode == 2 and "not empty" in again.stderr


@pytest.mark.parametrize("out,says", [("http://127.0.0.1:9/x", "a web server is read, not written"),
                                      ("s3:/bucket/x", "names no store"), ("gs://b/x", "not written")])
def test_an_output_no_store_can_write_is_refused_naming_it(corpus, tmp_path, out, says):  # noqa: F811
    done = run([*corpus, "--out", out], tmp_path, check=False)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s3:").exists()
