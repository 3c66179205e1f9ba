"""What kind of failure: bad data (exit status 1) as opposed to a command line that cannot be run (2).

The CLI turns each into one line on stderr.  Plain ``ValueError`` is what the library raises for
an argument it cannot work with (a usage error, exit status 2); :class:`DataError` is raised for
input files, shards or pack output whose content is wrong, where the fix is in the data, not in
the command (exit status 1).  It is a ``ValueError`` too, so code catching that keeps working.
Every bad-data error is one (``ShardError``, ``TokenizerFileError``, ``KaldiDataError``, ...):
the CLI tests this one class.  :class:`StrictError` (exit status 1) is a job that ran under
``strict`` and dropped utterances.  :func:`failure` is what the CLI prints for each, and exits with.
A warning names the user's line that led to it (:func:`user_level`), not wdsprep's own.
"""

from __future__ import annotations

import errno
import importlib
import sys
from typing import Sequence


class DataError(ValueError):
    """The data is wrong (a malformed Kaldi file, an unfinished pack, features that do not agree);
    the message names the file and says what to do."""


class StrictError(RuntimeError):
    """Raised under ``strict=True`` when a job dropped or flagged utterances; the report is written."""


class LostError(StrictError):
    """Raised when a pack wrote none of its utterances, or lost a larger share of them than its
    ``max_lost``; the pack is committed and its report written, naming every one by reason."""


class OverLimit(Exception):
    """A download passed the bound its caller set (``remote.fetch.TooLargeError`` is one): the
    layers that set bounds catch it without importing what fetches."""


class MissingExtra(ImportError):
    """A feature needs a package that is not installed; the message names the extra that brings it
    (``pip install 'wdsprep[lhotse]'``)."""


def need_packages(packages: Sequence[str], extra: str | None, what: str) -> None:
    """Import each of ``packages`` for ``what`` (``--from lhotse``), or raise :class:`MissingExtra`
    naming the extra that installs them."""
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError as e:
            raise MissingExtra(f"{what} needs {package}, which does not import ({e}); install it: "
                               f"pip install 'wdsprep[{extra}]'") from None


class MeasurementError(RuntimeError):
    """A measurement too noisy to trust (``calibrate``'s fit misses held-out shapes by more than
    its bound): nothing was written; the message says what to do."""


class Unavailable(RuntimeError):
    """What a command asks for cannot run in this install (an fbank backend that does not import):
    the command line must change, as for a bad option."""


def user_level() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller name the first line outside
    wdsprep that led to it (the user's ``make_loader(...)``, say): a line of wdsprep's own, shown
    under the warning, would mean nothing to whoever reads it."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] == "wdsprep":
        frame, level = frame.f_back, level + 1
    return level


# -- what the CLI makes of an error: its exit status and its one line -------------------------------------

# Paths given on the command line that do not exist, are in the way or are of the wrong kind.
USAGE_OS_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)
# What to do about the OS errors a data job meets.
OS_ERROR_HINTS = {
    errno.ENOSPC: "the file system is full: free space or write elsewhere, then run the command again",
    errno.EDQUOT: "the disk quota is used up: free space or write elsewhere, then run the command again",
    errno.EACCES: "check the permissions of that file and its folder",
    errno.EPERM: "check the permissions of that file and its folder",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EIO: "the disk or network file system reports an I/O error: check it, then run the command again",
    errno.ENOTDIR: "a part of that path is a file, not a folder",
    errno.EISDIR: "that is a folder; give a file",
}


def describe_os_error(e: OSError) -> str:
    """One line for an OS error: the file, what happened and, where there is one, what to do."""
    if e.strerror is None:  # raised by wdsprep with a sentence of its own
        return str(e)
    where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else e.filename
    line = f"{where}: {e.strerror}" if where is not None else f"{e.strerror} (errno {e.errno})"
    hint = OS_ERROR_HINTS.get(e.errno)
    return f"{line}; {hint}" if hint else line


def failure(e: BaseException, command: str) -> tuple[int, str]:
    """Exit status and the one line to print for the exception that ended ``command`` (with the
    notes added to it on the way, e.g. that a stopped pack resumes)."""
    code, line = _failure(e, command)
    # A library message that names its command already ("pack-audio: wrote none ..."): named once.
    twice = f"wdsprep {command}: error: {command}: "
    if line.startswith(twice):
        line = twice[:-len(command) - 2] + line[len(twice):]
    notes = [n for n in getattr(e, "__notes__", []) if isinstance(n, str)]
    return code, "; ".join([line, *notes])


def _failure(e: BaseException, command: str) -> tuple[int, str]:
    if isinstance(e, KeyboardInterrupt):
        return 130, f"wdsprep {command}: interrupted"
    if isinstance(e, StrictError):  # the job ran: what it lost is the error
        return 1, f"wdsprep {command}: error: {e}"
    if isinstance(e, MeasurementError):
        return 1, f"wdsprep {command}: error: {e}"
    if isinstance(e, OSError):
        return (2 if isinstance(e, USAGE_OS_ERRORS) else 1), f"wdsprep {command}: error: {describe_os_error(e)}"
    if isinstance(e, MissingExtra):  # the command needs a package this install lacks
        return 2, f"wdsprep {command}: error: {e}"
    if isinstance(e, DataError):
        return 1, f"wdsprep {command}: error: {e}"
    if isinstance(e, (ValueError, Unavailable)):  # an option or argument the library cannot work with
        return 2, f"wdsprep {command}: error: {e}"
    return 1, (f"wdsprep {command}: error: {type(e).__name__}: {e} (unexpected; 'wdsprep --debug {command} ...' "
               f"shows where it happened, please report it)")
