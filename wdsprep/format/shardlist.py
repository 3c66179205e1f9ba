"""Shard patterns: turned into shard lists (brace patterns, globs, lists of them, URLs), and written
for a pack's folder, local or uploaded (:func:`folder_pattern`, :func:`url_pattern`).

A glob in a URL is answered by the store's listing, which the caller hands in (``list_glob``:
``wdsprep.remote.listing.lister`` with the user's retries); the format itself never lists or
fetches.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator, Sequence

from braceexpand import braceexpand

from wdsprep.format.commit import check_committed, pending, read_plan
from wdsprep.remote.urls import can_list, folder_of, has_folder, is_glob, is_url, redact

GROUP_FOLDER = re.compile(r"\d+_(\d+|inf)")  # a length group's folder, as a pack names it


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def index_place(shard: str) -> tuple[str, str]:
    """(folder, name): where the index that lists ``shard`` is (a URL's folder URL, a local path's
    absolute directory) and the name it lists the shard by."""
    if is_url(shard):
        return folder_of(shard), shard.split("?", 1)[0].rsplit("/", 1)[-1]
    return os.path.dirname(os.path.abspath(shard)), os.path.basename(shard)


def refuse_commands(shards: Sequence[str], tool: str) -> None:
    """ValueError naming the first ``pipe:`` (or other) command among ``shards``: ``tool`` reads
    local files and S3 or web objects, beside which an index can be."""
    commands = [s for s in shards if is_url(s) and not has_folder(s)]
    if commands:
        raise ValueError(f"{tool} reads files, s3:// and http(s):// shards, not commands such as "
                         f"{redact(commands[0])!r}; "
                         f"run the command into a local file and {tool} that")


def in_growing_pack(path: str) -> bool:
    """Whether ``path`` (a shard path or pattern) lies in a folder a pack has not finished writing."""
    for d in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        if d and not glob.has_magic(d) and pending(d) is not None:
            return True
    return False


def expand_shards(patterns: str | os.PathLike | Sequence[str | os.PathLike], *, check_commit: bool = True,
                  list_glob: Callable[[str], list[str]] | None = None, growing: bool = False) -> list[str]:
    """Every shard a pattern (or list of patterns) names, in a stable order.

    A local folder is the shard set a pack wrote into it: its length groups' shards (or its own),
    as :func:`folder_pattern` finds them.
    ``DIR/{10_1000,1000_2000}/data-*.tar`` expands braces first, then globs each result;
    ``data-0000{0..9}.tar`` is a brace range.  URLs are brace-expanded; a glob in a URL is answered
    by ``list_glob(url)`` (the bucket listed for ``s3://``; an error for http(s), as a web server
    cannot list; without ``list_glob``, an error), and other URLs (``pipe:cat ...``) are kept as
    they are.  A local pattern that matches nothing, or matches
    anything but a regular file (a directory, a FIFO), is an error naming it.  So is a folder of
    local shards written by a pack that did not finish (:mod:`wdsprep.format.commit`;
    ``check_commit=False`` leaves that to the caller, as ``verify`` reports it among its problems).
    ``growing``: folders a pack is still writing are followed, not refused: a pattern into one that
    matches nothing yet is no error, and nothing at all is an empty list (the loader waits).
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    shards: list[str] = []
    for pattern in map(str, patterns):
        for p in _folders_as_patterns(braceexpand(pattern), growing):
            if is_url(p):
                if is_glob(p):
                    if list_glob is None:
                        raise ValueError(f"shard pattern {redact(pattern)!r}: a glob in a URL is answered by listing "
                                         f"the store, which this command does not do; name the shards")
                    found = list_glob(p)
                    if not found:
                        raise FileNotFoundError(f"shard pattern {redact(pattern)!r}: {redact(p)!r} matches no object")
                    shards.extend(found)
                else:
                    shards.append(p)
                continue
            matches = sorted(glob.glob(p)) if glob.has_magic(p) else ([p] if os.path.lexists(p) else [])
            if not matches and growing and in_growing_pack(p):
                continue
            if not matches:
                raise FileNotFoundError(f"shard pattern {pattern!r}: {p!r} matches no file{_meant(p)}")
            for m in matches:
                try:
                    mode = os.stat(m).st_mode  # never opened here: opening a FIFO would block
                except OSError as e:  # a dangling symlink
                    raise FileNotFoundError(f"shard pattern {pattern!r}: {m!r}: {e.strerror}") from None
                if not stat.S_ISREG(mode):
                    hint = ""
                    if stat.S_ISDIR(mode):
                        try:  # a pack's output folder given where its shards' pattern goes
                            hint = f"; its shards: {folder_pattern(m)!r}"
                        except FileNotFoundError:
                            pass
                    raise ValueError(f"shard pattern {pattern!r} matches {m!r}, a {file_kind(mode)}: only regular "
                                     f"files (or URLs) are shards; rename or remove it, or narrow the pattern{hint}")
            shards.extend(matches)
    seen = set()
    duplicates = [s for s in shards if s in seen or seen.add(s)]
    if duplicates:
        raise ValueError(f"shard {redact(duplicates[0])!r} is named twice by {redact(str(list(map(str, patterns))))}; "
                         f"each shard may be read once per epoch")
    if not shards and not growing:
        raise FileNotFoundError(f"no shards in {redact(str(list(map(str, patterns))))}")
    if check_commit:
        for folder in dict.fromkeys(index_place(s)[0] for s in shards if not is_url(s)):
            check_committed(folder, growing=growing)
    return shards


def _meant(pattern: str) -> str:
    """For a local pattern that matches nothing: the shards of the pack folder it starts in, if any."""
    parts = Path(pattern).parts
    stem = next((k for k, part in enumerate(parts) if glob.has_magic(part)), len(parts) - 1)
    if stem < 1:
        return ""
    folder = os.path.join(*parts[:stem])
    try:
        return f"; the pack folder {folder} holds {folder_pattern(folder)!r} (or give the folder itself)"
    except OSError:  # FileNotFoundError: no pack folder there
        return ""


def _folders_as_patterns(paths: Iterator[str], growing: bool) -> Iterator[str]:
    """``paths`` with each local folder (no glob in it) turned into the pattern of its shards, as
    ``wdsprep pattern`` writes it: a pack's output folder is a shard set (a pack still writing into
    it, with ``growing``: the groups its plan will fill)."""
    for p in paths:
        if is_url(p) or glob.has_magic(p) or p.endswith(".tar") or not os.path.isdir(p):  # a .tar is named a shard
            yield p
            continue
        planned = growing and pending(p) is not None
        try:
            inner = folder_pattern(p, "*.tar", planned=planned)
        except FileNotFoundError:
            raise FileNotFoundError(f"{p}: a folder with no shards in it or in a length group under it; give the "
                                    f"folder a pack wrote (pack --out), or a shard pattern") from None
        yield from braceexpand(inner)


def shard_pattern(folder: str | os.PathLike, *, remote: str | None = None, planned: bool = False) -> str:
    """The pattern the loader, ``inspect`` and ``verify`` take for the shards a pack wrote into
    ``folder``: local (:func:`folder_pattern`; ``planned``: of a pack still writing them), or once
    uploaded to ``remote`` (:func:`url_pattern`: what to give for shards on S3 or a web server)."""
    if remote is not None:
        if planned:
            raise ValueError("an uploaded folder is a finished one: give remote or planned, not both")
        return url_pattern(folder, remote)
    return folder_pattern(folder, planned=planned)


def group_folders(folder: str | os.PathLike, planned: bool = False) -> list[str]:
    """The ``LO_HI`` folders under ``folder`` that hold a shard, by LO (other folders are not its
    groups); with ``planned``, those the
    plan of a pack still writing them will fill (``["*"]`` before it has planned)."""
    folder = Path(folder)
    if planned:
        plan = read_plan(folder) if folder.is_dir() else None
        if plan is None:
            return ["*"]
        names = [n for n in plan.folders if n]
    else:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder of shards")
        # A length group's folder is named LO_HI (pack/groups.py); other folders under it (another
        # pack's, say train/ beside dev/) are not this pack's shards.
        names = [p.name for p in folder.iterdir() if p.is_dir() and GROUP_FOLDER.fullmatch(p.name)
                 and any(p.glob("*.tar"))]

    def lo(name: str) -> float:
        try:
            return float(name.split("_", 1)[0])
        except ValueError:
            return float("inf")
    return sorted(names, key=lo)


def folder_pattern(folder: str | os.PathLike, fmt_glob: str = "data-*.tar", planned: bool = False) -> str:
    """The pattern of a pack's shards: ``DIR/{a_b,b_c}/data-*.tar`` over its filled length groups, or
    ``DIR/data-*.tar`` without groups; ``planned``: the groups a pack still writing will fill."""
    groups = group_folders(folder, planned)
    folder = str(folder).rstrip("/")
    if not groups:
        if not planned and not glob.glob(os.path.join(glob.escape(folder), "*.tar")):
            raise FileNotFoundError(f"{folder}: no shards in it or in a length group under it")
        return f"{folder}/{fmt_glob}"
    inner = groups[0] if len(groups) == 1 else "{" + ",".join(groups) + "}"
    return f"{folder}/{inner}/{fmt_glob}"


def url_pattern(folder: str | os.PathLike, remote: str) -> str:
    """The shards under the local ``folder`` as one pattern of URLs, once uploaded to ``remote``:
    ``s3://bucket/prefix`` (the groups as a brace list with a glob: S3 lists), ``http(s)://host/path``
    (every shard as brace ranges, written out from the local copy: a web server cannot list), or a
    template holding ``{shard}``, replaced by each group's ``LO_HI/data-{00000..000NN}.tar`` (e.g.
    ``pipe:aws s3 cp s3://b/p/{shard} -``)."""
    base = remote.rstrip("/")
    if "{shard}" not in remote and can_list(base):
        return folder_pattern(folder).replace(str(folder).rstrip("/"), base, 1)
    if "{shard}" not in remote and has_folder(base):
        remote = base + "/{shard}"
    if "{shard}" not in remote:
        raise ValueError(f"remote {redact(remote)!r} must be the URL of the uploaded folder (s3://, http(s)://), or "
                         f"a template holding {{shard}}")
    parts = []
    for group in group_folders(folder) or ["."]:
        names = sorted(p.name for p in (Path(folder) / group).glob("*.tar"))
        if names:
            parts.append(_name_range(names, "" if group == "." else f"{group}/"))
    if not parts:
        raise FileNotFoundError(f"{folder}: no shards in it or in a length group under it")
    inner = parts[0] if len(parts) == 1 else "{" + ",".join(parts) + "}"
    return remote.replace("{shard}", inner)


def _name_range(names: list[str], prefix: str) -> str:
    """``["data-00000.tar", "data-00001.tar"]`` -> ``PREFIXdata-{00000..00001}.tar``."""
    m = [re.fullmatch(r"(.*?)(\d+)(\.tar)", n) for n in names]
    if all(m) and len({(x.group(1), x.group(3), len(x.group(2))) for x in m if x}) == 1:
        nums = [int(x.group(2)) for x in m if x]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            first = m[0]
            assert first is not None
            stem, width, ext = first.group(1), len(first.group(2)), first.group(3)
            if len(nums) == 1:
                return f"{prefix}{names[0]}"
            return f"{prefix}{stem}{{{nums[0]:0{width}d}..{nums[-1]:0{width}d}}}{ext}"
    return prefix + (names[0] if len(names) == 1 else "{" + ",".join(names) + "}")
