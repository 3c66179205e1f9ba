"""What kind of failure: bad data (exit status 1) as opposed to a command line that cannot be run (2).

The CLI turns each into one line on stderr.  Plain ``ValueError`` is what the library raises for
an argument it cannot work with (a usage error, exit status 2); :class:`DataError` is raised for
input files, shards or pack output whose content is wrong, where the fix is in the data, not in
the command (exit status 1).  It is a ``ValueError`` too, so code catching that keeps working.
Every bad-data error is one (``ShardError``, ``TokenizerFileError``, ``KaldiDataError``, ...):
the CLI tests this one class.  :class:`StrictError` (exit status 1) is a job that ran under
``strict`` and dropped utterances.
"""

from __future__ import annotations

import importlib
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
