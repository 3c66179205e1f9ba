"""Turning shard patterns into shard lists: brace patterns, globs, lists of them, URLs.

A glob in a URL is answered by the store's listing, which the caller hands in (``list_glob``:
``wdsprep.remote.listing.lister`` with the user's retries); the format itself never lists or
fetches.
"""

from __future__ import annotations

import glob
import os
import stat
from typing import Callable, Sequence

from braceexpand import braceexpand

from wdsprep.format.commit import check_committed, pending
from wdsprep.remote.urls import SCHEMES as URL_SCHEMES  # noqa: F401  (the names this module always had)
from wdsprep.remote.urls import folder_of, has_folder, is_glob, is_url, redact


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
        for p in braceexpand(pattern):
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
                raise FileNotFoundError(f"shard pattern {pattern!r}: {p!r} matches no file")
            for m in matches:
                try:
                    mode = os.stat(m).st_mode  # never opened here: opening a FIFO would block
                except OSError as e:  # a dangling symlink
                    raise FileNotFoundError(f"shard pattern {pattern!r}: {m!r}: {e.strerror}") from None
                if not stat.S_ISREG(mode):
                    raise ValueError(f"shard pattern {pattern!r} matches {m!r}, a {file_kind(mode)}: only regular "
                                     f"files (or URLs) are shards; rename or remove it, or narrow the pattern")
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
