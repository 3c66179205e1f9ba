"""A pack's output in a bucket (``--out s3://BUCKET/PREFIX``): the objects a local pack writes as files,
with the same commit rule, published in plan order, resumable, and spread over machines that
share nothing but the bucket.  :func:`open_output` picks a local folder's transaction
(:class:`~wdsprep.pack.output.LockedOutput`) or this one by the output's store.

The bucket is the source of truth; each run keeps a local working folder that mirrors its small
files (the marker, the plan, the published entries, read there by the local transaction's own
code) and holds no shard.  The steps, as a local pack's:

- **The lease** (in place of the folder's ``flock``): a whole pack, a ``--plan-only`` run and a
  commit create ``PREFIX/.pack.lock`` with a conditional write (``If-None-Match: *``: created only
  where no such object is), holding who took it and until when; a thread renews it every
  :data:`RENEW_EVERY` seconds (``If-Match``: only over its own version), so a pack that died lets
  it lapse after :data:`LEASE_SECONDS`, and the next takes it over (``If-Match`` on the lapsed
  version: of two takers one wins).  A part (``--part``) takes none and is refused while one is
  held.  A store that ignores the conditions lets two packs believe they hold it: after writing
  it, a pack reads it back and refuses when it is another's, which narrows the race to the same
  instant but cannot close it: there, do not start two packs into one prefix at once.
- **The marker**: ``PREFIX/PACK_INCOMPLETE`` is written before anything else changes and removed
  as the very last step, as a local pack's; the loader, ``inspect`` and ``verify`` refuse a folder
  whose marker (or its parent's) is there (:mod:`wdsprep.format.index.remote`).
- **Shards**: every worker (a local one, or an engine's on another machine) writes its shard in a
  temporary folder and stages it in the bucket, the shard and then its record
  (``FOLDER/.pack.staged/J.tar``, ``J.json``, :mod:`wdsprep.pack.sink`); publishing shard ``k`` of
  a folder, in plan order, is a copy within the bucket to its final name, then its entry
  ``FOLDER/.index.parts/NNNNNNNN.tar`` (the entry's files in one object) created with a
  conditional write: of two parts publishing the same next shard (their content is the same
  bytes, their record says so), one creates the entry and the other finds it and goes on.
- **The commit** checks every published shard against its entry and the plan (its size in the
  listing, the SHA-256 its object carries, its utterances), publishes what parts staged, writes
  what none wrote, uploads each folder's index (``index.json`` last) and the report, deletes the
  entries and the staged objects, and deletes the marker last.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wdsprep.errors import DataError
from wdsprep.files import write_text
from wdsprep.format.commit import ENTRIES_DIR, MARKER_NAME, PLAN_NAME, PackPlan, read_plan, write_plan
from wdsprep.format.index import FolderIndex, is_index_file, read_entry_record, write_entry
from wdsprep.format.index.entries import entry_dir
from wdsprep.pack.options import PackOptions, Part
from wdsprep.pack.output import (
    REPORT_NAME,
    LockedOutput,
    Published,
    Publisher,
    check_plan,
    check_same,
    finish,
    parse_staged,
    prepare_output,
    published_so_far,
)
from wdsprep.pack.plan import ShardPlan
from wdsprep.pack.sink import STAGED_DIR, WrittenShard, staged_name
from wdsprep.remote.clients import Precondition
from wdsprep.remote.stores import Store, writable_store
from wdsprep.report import Report

LEASE_NAME = ".pack.lock"
LEASE_SECONDS = 120.0  # a lease not renewed for this long belongs to a pack that is gone
RENEW_EVERY = 30.0
TIMEOUT = 60.0  # seconds without a byte before a request is given up
SMALL = 64 << 20  # the most bytes a plan, report, record or entry object may have


def open_output(d_out: str | os.PathLike, overwrite: bool, resume: bool = False, *,
                part: Part | None = None) -> LockedOutput:
    """The output of a pack, locked for it: a local folder's (:func:`~wdsprep.pack.output.prepare_output`)
    or a bucket's (:class:`BucketOutput`); a URL no store can write to is refused, naming it."""
    store = writable_store(str(d_out))
    if store is None:
        return prepare_output(d_out, overwrite, resume, part=part)
    return BucketOutput.open(store, str(d_out).rstrip("/"), overwrite, resume, part)


class Bucket:
    """A prefix of a store, its objects named by their path under it."""

    def __init__(self, store: Store, url: str) -> None:
        self.store, self.url = store, url

    def at(self, *names: str) -> str:
        return "/".join([self.url, *(n for n in names if n)])

    def relative(self, url: str) -> str:
        return url[len(self.url) + 1:]

    def listing(self, *names: str) -> dict[str, int]:
        """Path under the prefix -> size, of every object under ``names``'s folder."""
        found = self.store.listing(self.at(*names) + "/", timeout=TIMEOUT)
        return {self.relative(u): size for u, size in found.items()}

    def get(self, name: str) -> bytes | None:
        got = self.store.get(self.at(name), timeout=TIMEOUT, limit=SMALL)
        return None if got is None else got[0]

    def put(self, name: str, body: bytes | str, **kw: Any) -> str:
        return self.store.put(self.at(name), body, timeout=TIMEOUT, **kw)

    def delete(self, names: Sequence[str]) -> None:
        self.store.delete([self.at(n) for n in names], timeout=TIMEOUT)


class Lease:
    """``PREFIX/.pack.lock``: who writes the prefix now (see the module's doc)."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket, self.etag = bucket, ""
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "token": os.urandom(8).hex()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({**self.me, "until": time.time() + LEASE_SECONDS}).encode()

    def take(self) -> None:
        try:
            self.etag = self.bucket.put(LEASE_NAME, self._body(), if_absent=True)
        except Precondition:
            held = self.bucket.store.get(self.bucket.at(LEASE_NAME), timeout=TIMEOUT, limit=SMALL)
            doc = _json(held[0]) if held is not None else {}
            if held is not None and float(doc.get("until", 0)) > time.time():
                raise FileExistsError(refusal(self.bucket.url, doc)) from None
            try:  # lapsed (its pack is gone) or deleted meanwhile: taken over, by one taker only
                self.etag = self.bucket.put(LEASE_NAME, self._body(),
                                            **({"if_match": held[1]} if held is not None else {"if_absent": True}))
            except Precondition:
                raise FileExistsError(refusal(self.bucket.url, {})) from None
        back = self.bucket.get(LEASE_NAME)  # a store that ignores the conditions: the last writer holds it
        if back is None or _json(back).get("token") != self.me["token"]:
            raise FileExistsError(refusal(self.bucket.url, _json(back or b"{}")))
        self._thread = threading.Thread(target=self._renew, name="wdsprep-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY):
            try:
                self.etag = self.bucket.put(LEASE_NAME, self._body(), if_match=self.etag)
            except Exception:  # another took it (this pack stalled past the lease) or the store failed: retried
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(TIMEOUT)
            try:
                self.bucket.delete([LEASE_NAME])
            except Exception:  # it lapses by itself
                pass
            self._thread = None


def refusal(url: str, holder: dict) -> str:
    who = f" ({holder.get('host')} pid {holder.get('pid')})" if holder.get("host") else ""
    return (f"{url}: another pack is writing there now{who}: a whole pack, or the run that plans or commits parts; "
            f"wait for it to end or stop it (its lease {url}/{LEASE_NAME} lapses {LEASE_SECONDS:g} s after it "
            f"stops renewing it)")


def _json(data: bytes) -> dict:
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


class BucketOutput(LockedOutput):
    """A pack's output in a bucket, and the local working folder ``d`` that mirrors its small files."""

    bucket: Bucket
    lease: Lease | None

    @classmethod
    def open(cls, store: Store, url: str, overwrite: bool, resume: bool, part: Part | None) -> BucketOutput:
        """Lease the prefix (a part: find it free), mirror its plan and marker, and make it ready
        as :func:`~wdsprep.pack.output.prepare_output` makes a folder (the same refusals)."""
        if resume and overwrite:
            raise ValueError("--resume keeps what a stopped pack published, --overwrite replaces it: give one")
        if part is not None and overwrite:
            raise ValueError(f"--part {part} writes a share of the planned pack in {url}; --overwrite would remove the "
                             f"other parts' shards: redo the plan with --plan-only --overwrite instead")
        bucket = Bucket(store, url)
        lease = None
        if part is None:
            lease = Lease(bucket)
            lease.take()
        out = cls(Path(tempfile.mkdtemp(prefix="wdsprep-out-")), None)
        out.bucket, out.lease = bucket, lease
        try:
            out._ready(overwrite, resume, part)
        except BaseException:
            out.release()
            raise
        return out

    def _ready(self, overwrite: bool, resume: bool, part: Part | None) -> None:
        b = self.bucket
        objects = {n: s for n, s in b.listing().items() if n != LEASE_NAME}
        if part is not None:
            held = b.get(LEASE_NAME)
            if held is not None and float(_json(held).get("until", 0)) > time.time():
                raise FileExistsError(refusal(b.url, _json(held)))
        plan = b.get(PLAN_NAME) if PLAN_NAME in objects else None
        if plan is not None:
            (self.d / PLAN_NAME).write_bytes(plan)
            self.prior = read_plan(self.d)
        marked = MARKER_NAME in objects
        if part is not None:
            if self.prior is None:
                raise FileExistsError(f"{b.at(PLAN_NAME)}: missing; a part (--part {part}) writes shards of a planned "
                                      f"pack: run the same command with --plan-only (and no --part) first")
        elif not (resume and self.prior is not None):
            if objects:
                if resume and not marked:
                    raise FileExistsError(f"{b.url} holds no pack to resume (no {PLAN_NAME}); pick a new prefix or "
                                          f"pass --overwrite (overwrite=True) to replace the shards, indexes and "
                                          f"report there")
                if not overwrite and not resume:
                    raise FileExistsError(
                        f"{b.url} holds a pack that did not finish; pass --resume to finish it (keeping the shards "
                        f"it published), or --overwrite (overwrite=True) to redo it" if marked and plan is not None
                        else f"{b.url} is not empty; pick a new prefix or pass --overwrite (overwrite=True) to "
                             f"replace the shards, indexes and report an earlier pack wrote there")
            b.put(MARKER_NAME, _MARKER_TEXT)
            marked = True
            b.delete(sorted(n for n in objects if n != MARKER_NAME and _pack_output(n)))
            (self.d / PLAN_NAME).unlink(missing_ok=True)
            self.prior = None
        if marked:
            write_text(self.d / MARKER_NAME, _MARKER_TEXT.decode())

    @property
    def shown(self) -> str:
        return self.bucket.url

    @property
    def stage_url(self) -> str | None:
        return self.bucket.url

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        shutil.rmtree(self.d, ignore_errors=True)

    # -- the steps, on the bucket
    def committed_report(self) -> Report | None:
        if self.bucket.get(MARKER_NAME) is not None:
            return None
        return self._report()

    def _report(self) -> Report:
        data = self.bucket.get(REPORT_NAME)
        if data is None:
            raise DataError(f"{self.bucket.at(REPORT_NAME)}: missing from a committed pack; pack again with "
                            f"--overwrite")
        (self.d / REPORT_NAME).write_bytes(data)
        return Report.read(self.d / REPORT_NAME)

    def resumed_report(self, command: str, inputs: dict[str, Any], options: dict[str, Any]) -> Report | None:
        assert self.prior is not None
        check_same(self.bucket.url, self.prior, command, inputs, options)  # type: ignore[arg-type]
        objects = self.bucket.listing()
        if MARKER_NAME not in objects and REPORT_NAME not in objects:
            self.bucket.put(MARKER_NAME, _MARKER_TEXT)  # its marker was removed by hand: it goes on
            write_text(self.d / MARKER_NAME, _MARKER_TEXT.decode())
            return None
        if MARKER_NAME in objects:
            if REPORT_NAME not in objects:
                return None
            self.bucket.delete([n for n in objects if _is_entry(n) or f"/{STAGED_DIR}/" in f"/{n}"])
            self.bucket.delete([MARKER_NAME])
        report = self._report()
        print(report.summary(f"{command}: {self.bucket.url} is complete"))
        return report

    def record_plan(self, plan: ShardPlan, record: PackPlan, fmt: str) -> Published:
        if self.prior is None:
            write_plan(self.d, record)
            self.bucket.put(PLAN_NAME, (self.d / PLAN_NAME).read_bytes())
            return Published({f: 0 for f in plan.folders}, set())
        check_plan(self, record)
        done = self._published(plan, fmt)
        self._remove_unpublished(plan, done.count, fmt)
        return done

    def check_plan(self, record: PackPlan) -> None:
        check_plan(self, record)

    @contextmanager
    def publishing(self) -> Iterator[None]:
        yield  # no lock: an entry is created only where none is (see the module's doc)

    def published_done(self, plan: ShardPlan, fmt: str) -> set[int]:
        return self._published(plan, fmt).done

    def _published(self, plan: ShardPlan, fmt: str) -> Published:
        """The published shards, each checked against its entry and the plan (published_so_far,
        over the entries mirrored here and the bucket's listing)."""
        objects = self.bucket.listing()
        self.sync_entries(plan.folders, objects)

        def changed(folder: str, name: str, k: int, index: FolderIndex) -> str | None:
            path = f"{folder}/{name}" if folder else name
            if path not in objects:
                return "it is missing"
            if objects[path] != int(index.sizes[k]):
                return f"it changed since ({objects[path]:,} bytes, its entry says {int(index.sizes[k]):,})"
            head = self.bucket.store.head(self.bucket.at(path), timeout=TIMEOUT)
            if index.checksums[k] is not None and (head is None or head[2].get("sha256") != index.checksums[k]):
                return "the SHA-256 its object carries is not its entry's: it was replaced"
            return None

        return published_so_far(self.d, plan, fmt, changed, shown=self.bucket.url)

    def sync_entries(self, folders: Sequence[str], objects: dict[str, int] | None = None) -> None:
        """Mirror the bucket's published entries (0, 1, ... without a gap) of ``folders`` here."""
        objects = self.bucket.listing() if objects is None else objects
        for folder in folders:
            k = 0
            while _entry_name(folder, k) in objects:
                if not entry_dir(self.d / folder, k).is_dir():
                    data = self.bucket.get(_entry_name(folder, k))
                    if data is None:
                        break
                    _unpack_entry(data, entry_dir(self.d / folder, k), self.bucket.at(_entry_name(folder, k)))
                k += 1

    def _remove_unpublished(self, plan: ShardPlan, count: dict[str, int], fmt: str) -> None:
        """Shards copied to their final names whose entry never came, and entries past a gap: the
        shards are published again, byte for byte."""
        objects = self.bucket.listing()
        gone = []
        for folder in plan.folders:
            planned = sum(1 for s in plan.shards if s.folder == folder)
            gone += [n for n in (f"{folder}/{fmt % k}".lstrip("/") for k in range(count.get(folder, 0), planned))
                     if n in objects]
            gone += [n for n in objects if _is_entry(n) and n.startswith(f"{folder}/".lstrip("/"))
                     and _entry_number(n) >= count.get(folder, 0)]
        self.bucket.delete(gone)

    def staged(self, plan: ShardPlan, shards: Sequence[int]) -> dict[int, WrittenShard]:
        objects = self.bucket.listing()
        out = {}
        for j in shards:
            w = self._read_staged(plan, j, objects)
            if w is not None:
                out[j] = w
        return out

    def _read_staged(self, plan: ShardPlan, j: int, objects: dict[str, int] | None = None) -> WrittenShard | None:
        folder = plan.shards[j].folder
        tar = f"{folder}/{staged_name(j)}".lstrip("/")
        record = tar[:-len(".tar")] + ".json"
        if objects is not None and record not in objects:
            return None
        data = self.bucket.get(record)
        if data is None:
            return None
        size = objects.get(tar) if objects is not None else self._size(tar)
        return parse_staged(plan, j, data, size, self.bucket.at(record))

    def _size(self, name: str) -> int | None:
        head = self.bucket.store.head(self.bucket.at(name), timeout=TIMEOUT)
        return None if head is None else head[0]

    def remove_part_partial(self, plan: ShardPlan, shards: Sequence[int]) -> None:
        pass  # a write to a bucket is whole or not there: a part leaves nothing half-written in it

    def stage(self, w: WrittenShard) -> None:
        pass  # staged by the worker that wrote it (ShardWork.stage_url)

    def publisher(self, count: dict[str, int], options: PackOptions, utt2spk: dict[str, str] | None,
                  indexed: dict[str, dict[str, str]] | None) -> Publisher:
        return BucketPublisher(self, count, options, utt2spk, indexed)

    def drop_staged(self, folders: Sequence[str]) -> None:
        self.bucket.delete([n for n in self.bucket.listing() if f"/{STAGED_DIR}/" in f"/{n}"])

    def finish(self, folders: Sequence[str], report: Report, *, languages: dict[str, str] | None = None) -> Report:
        """The local transaction's end over the mirrored entries, then its files uploaded (each
        folder's ``index.json`` last, then the report), the entries deleted, the marker last."""
        self.sync_entries(folders)
        report = finish(self.d, folders, report, languages=languages)
        for folder in folders:
            where = self.d / folder
            names = sorted(p.name for p in where.iterdir() if p.is_file() and is_index_file(p.name)) \
                if where.is_dir() else []
            for name in sorted(names, key=lambda n: n == "index.json"):
                self.bucket.put(f"{folder}/{name}".lstrip("/"), str(where / name))
        self.bucket.put(REPORT_NAME, str(self.d / REPORT_NAME))
        self.bucket.delete([n for n in self.bucket.listing() if _is_entry(n)])
        self.bucket.delete([MARKER_NAME])
        return report

    def stopped(self, shards_total: int, part: tuple[Part, ShardPlan] | None = None) -> str | None:
        """What a stopped pack leaves: everything it staged or published stays for ``--resume`` (a
        new whole pack that published nothing removes what it wrote); what to tell."""
        try:
            objects = self.bucket.listing()
        except Exception:
            return None
        if part is not None:
            return (f"part {part[0]} stopped; what it staged or published in {self.bucket.url} is kept: run the same "
                    f"command (--part {part[0]}) again to finish it")
        published = sum(1 for n in objects if _is_entry(n))
        if published == 0 and self.prior is None:
            try:
                self.bucket.delete([n for n in objects if _pack_output(n) and n != PLAN_NAME])
                self.bucket.delete([PLAN_NAME, MARKER_NAME])
            except Exception:
                pass
            return None
        of = f" of {shards_total:,}" if shards_total else ""
        return (f"the pack stopped with {published:,}{of} shards published in {self.bucket.url}, which are kept: run "
                f"the same command with --resume to finish it")


class BucketPublisher(Publisher):
    """Publishes staged shards in a bucket: a copy to the final name, then the entry, created only
    where none is (another part may publish the same shard: its entry is the same)."""

    def __init__(self, out: BucketOutput, count: dict[str, int], options: PackOptions,
                 utt2spk: dict[str, str] | None, indexed: dict[str, dict[str, str]] | None) -> None:
        super().__init__(out.d, count, options, utt2spk, indexed)
        self.out, self.bucket = out, out.bucket

    def place(self, w: WrittenShard, final: str) -> tuple[int, int]:
        assert w.info is not None and w.size is not None
        self.bucket.store.copy(self.bucket.at(w.folder, w.info.name), self.bucket.at(w.folder, final),
                               timeout=TIMEOUT)
        return w.size, w.mtime_ns if w.mtime_ns is not None else 0

    def unplace(self, w: WrittenShard, final: str) -> None:
        pass  # the copy stays: the shard published next in its place is these bytes again

    def put_entry(self, where: Path, k: int, entry: FolderIndex, record: dict[str, Any]) -> None:
        folder = "" if where == self.d else where.name
        where.mkdir(parents=True, exist_ok=True)
        write_entry(where, k, entry, record)
        try:
            self.bucket.put(_entry_name(folder, k), _pack_entry(entry_dir(where, k)), if_absent=True)
        except Precondition:  # another part published it: the same planned shard, or the bucket was changed
            shutil.rmtree(entry_dir(where, k))
            self.out.sync_entries([folder])
            if read_entry_record(where, k).get("plan_shard") != record["plan_shard"]:
                raise DataError(f"{self.bucket.at(_entry_name(folder, k))}: names another planned shard than "
                                f"{record['plan_shard']}; pack again with --overwrite") from None

    def advance(self, plan: ShardPlan, folder: str, shard_ids: Sequence[int]) -> int:
        self.out.sync_entries([folder])
        return super().advance(plan, folder, shard_ids)

    def read_staged(self, plan: ShardPlan, j: int) -> WrittenShard | None:
        return self.out._read_staged(plan, j)


_MARKER_TEXT = (
    "wdsprep pack is writing this prefix, or was stopped before it finished (killed, failed).\n"
    "Until this object is gone the shards here may be a part of the corpus only: the loader, inspect and verify "
    "refuse them.\nRun the same pack command with --resume to finish it (the shards already published are kept), "
    "or with --overwrite to redo it.\n").encode()


def _entry_name(folder: str, k: int) -> str:
    return f"{folder}/{ENTRIES_DIR}/{k:08d}.tar".lstrip("/")


def _is_entry(name: str) -> bool:
    return f"/{ENTRIES_DIR}/" in f"/{name}" and name.endswith(".tar")


def _entry_number(name: str) -> int:
    stem = name.rsplit("/", 1)[-1][:-len(".tar")]
    return int(stem) if stem.isdigit() else -1


def _pack_output(name: str) -> bool:
    """Whether an object is an earlier pack's output (``--overwrite`` deletes it; other objects stay):
    at the top or one folder down, a ``.tar``, an index file, the report, the plan, an entry or a
    staged shard."""
    parts = name.split("/")
    if len(parts) == 1:
        return name.endswith(".tar") or is_index_file(name) or name in (REPORT_NAME, PLAN_NAME)
    if parts[-2] in (ENTRIES_DIR, STAGED_DIR):
        return len(parts) <= 3
    return len(parts) == 2 and (name.endswith(".tar") or is_index_file(parts[1]))


def _pack_entry(d: Path) -> bytes:
    """A published entry's files as one object (a plain tar, names sorted, times 0)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for p in sorted(d.iterdir()):
            info = tarfile.TarInfo(p.name)
            info.size, info.mtime, info.mode = p.stat().st_size, 0, 0o644
            with open(p, "rb") as f:
                tf.addfile(info, f)
    return buf.getvalue()


def _unpack_entry(data: bytes, d: Path, where: str) -> None:
    """An entry object's files into folder ``d`` (plain names, regular files only), whole or not at all."""
    tmp = d.with_name(f".tmp-{d.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf.getmembers():
                if not m.isreg() or "/" in m.name or m.name in ("", ".", ".."):
                    raise DataError(f"{where}: not a published entry (member {m.name!r}); pack again with --overwrite")
                src = tf.extractfile(m)
                assert src is not None
                (tmp / m.name).write_bytes(src.read())
    except tarfile.TarError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"{where}: not a published entry ({e}); pack again with --overwrite") from None
    os.rename(tmp, d)
