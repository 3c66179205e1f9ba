"""What kind of failure: bad data (exit status 1) as opposed to a command line that cannot be run (2).

The CLI turns each into one line on stderr.  Plain ``ValueError`` is what the library raises for
an argument it cannot work with (a usage error, exit status 2); :class:`DataError` is raised for
input files, shards or pack output whose content is wrong, where the fix is in the data, not in
the command (exit status 1).  It is a ``ValueError`` too, so code catching that keeps working.
"""

from __future__ import annotations


class DataError(ValueError):
    """The data is wrong (a malformed Kaldi file, an unfinished pack, features that do not agree);
    the message names the file and says what to do."""


class OverLimit(Exception):
    """A download passed the bound its caller set (``remote.fetch.TooLargeError`` is one): the
    layers that set bounds catch it without importing what fetches."""
