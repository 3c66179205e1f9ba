"""A manifest is input from strangers: how every kind's reader takes its lines, values and paths.

Manifests come from other people's pipelines and downloads, and the shards made from them are
shared, so a reader trusts nothing a manifest says:

- **Lines**: :func:`json_lines` reads JSON lines (plain or gzip) a line at a time, each at most
  :data:`~wdsprep.files.MAX_LINE_BYTES` decompressed: a longer one (a gzip bomb's line of
  gigabytes) ends the read with an error naming the file and line, before it is held.  A line
  that is not UTF-8, not JSON, nested deeper than the parser goes or not an object is left out,
  counted as ``bad_line`` naming its file and line, and the rest is read on.
- **Values**: every value an :class:`~wdsprep.pack.sources.items.Item` is made of is typed and
  checked by :func:`item`: ids and speakers are strings (or whole numbers) held to the index's rule
  for names (:func:`~wdsprep.format.keys.name_problem`), a language too; a transcript is a string;
  a time is a finite number of seconds up to :data:`MAX_SECONDS`.  What fails is left out, counted
  by reason (``bad_id``, ``bad_speaker``, ``bad_language``, ``bad_text``, ``bad_segment``), naming
  the file and line: never packed as its Python ``repr``, never an error that ends the pack.
- **Paths**: audio may be anywhere (NeMo manifests name audio by absolute paths) but is only ever
  read as audio: decoded by soundfile, never run as a command (a path ending in ``|``, which a
  ``wav.scp`` runs, is refused) and nothing but its decoded samples reaches a shard.  A text file a
  manifest names (NeMo's ``text_filepath``) is read by :func:`read_text_file` only when it lies
  under the manifest's folder, or under a folder the user names (``text_root``), and is a regular
  file of at most :data:`MAX_TEXT_FILE_BYTES`: never a device, a FIFO or a secret elsewhere.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
from contextlib import contextmanager
from typing import IO, Any, Iterator, Mapping, Sequence

from wdsprep.errors import DataError
from wdsprep.files import MAX_LINE_BYTES, bounded_lines, file_kind, read_small
from wdsprep.format.keys import name_problem
from wdsprep.pack.sources.items import Blob, Item
from wdsprep.report import Report

MAX_SECONDS = 1e6  # a time in a manifest (about 11.6 days): beyond it, no recording is meant
MAX_TEXT_FILE_BYTES = 1 << 20  # a transcript file (text_filepath)
MAX_TEXT_CHARS = 1 << 20  # a transcript
MAX_JSON_BYTES = 1 << 30  # a manifest that is one JSON document (Lhotse's .json), read whole


class Bad(Exception):
    """A line or a value a pack leaves out: the reason it is counted under, and why (naming the file
    and line).  ``uttid``: the utterance's id when it is known; ``also``: the line's other problems
    (:func:`merged`), reported with it."""

    def __init__(self, reason: str, why: str, uttid: Any = None, also: Sequence[Bad] = ()) -> None:
        super().__init__(why)
        self.reason, self.why, self.uttid, self.also = reason, why, uttid, list(also)

    def count(self, report: Report, where: str) -> None:
        """Count it in ``report`` (under ``where``, the file and line, when the id is not a usable one),
        once, under its first reason, its other problems named with it."""
        known = isinstance(self.uttid, str) and name_problem(self.uttid) is None
        report.drop(self.reason, self.uttid if known else where, self.why, also=[b.reason for b in self.also])


def merged(problems: Sequence[Bad], where: str, uttid: Any = None) -> Bad:
    """One :class:`Bad` for every problem of a line (at ``where``): counted under the first's reason,
    saying each (``where`` once)."""
    first, *rest = problems
    said = [first.why, *(b.why.removeprefix(f"{where}: ") for b in rest)]
    return Bad(first.reason, "; ".join(said) + (f" ({len(problems)} problems)" if rest else ""),
               uttid if uttid is not None else first.uttid, rest)


@contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """A manifest opened for reading bytes (gunzipped when it ends in ``.gz``); refused unless it is a
    regular file: a FIFO would wait for a writer, a device never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, without a writer
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is {file_kind(mode)}, not a regular file; give the manifest file")
        os.set_blocking(fd, True)
        if not path.endswith(".gz"):
            yield f
            return
        with gzip.GzipFile(fileobj=f) as g:
            yield g  # type: ignore[misc]


def json_lines(path: str, report: Report, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSON-lines manifest; a line that is no JSON
    object is counted in ``report`` as ``bad_line`` (naming ``path`` and the line) and read past.
    ``what``: the manifest's kind, for the messages."""
    line = 0
    with open_input(path) as f:
        try:
            for line, raw in bounded_lines(f):
                if raw is None:
                    raise DataError(f"{path}:{line}: a line longer than {MAX_LINE_BYTES:,} bytes (decompressed), "
                                    f"which no {what} manifest has; the file is not read on")
                if not raw.strip():
                    continue
                try:
                    entry = parse_line(raw, what)
                except Bad as e:
                    report.drop(e.reason, f"{path}:{line}", f"{path}:{line}: {e.why}")
                    continue
                yield line, entry
        except (OSError, EOFError) as e:  # a damaged .gz (BadGzipFile is an OSError)
            raise DataError(f"{path}: cannot be read past line {line} ({e}); is the file whole?") from None


def parse_line(raw: bytes, what: str) -> Any:
    """One line of JSON; :class:`Bad` (``bad_line``) saying why it is not a JSON object."""
    try:
        entry = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise Bad("bad_line", f"not UTF-8 ({e.reason} at byte {e.start}); a {what} manifest is UTF-8") from None
    except RecursionError:
        raise Bad("bad_line", "JSON nested deeper than Python's parser goes; no manifest line is") from None
    except ValueError as e:
        raise Bad("bad_line", f"not JSON ({e}); a {what} manifest has one JSON object per line") from None
    if not isinstance(entry, dict):
        raise Bad("bad_line", f"a JSON {type(entry).__name__}, not an object")
    return entry


# -- values ---------------------------------------------------------------------------------------------


def seconds(value: Any, what: str, where: str, *, required: bool = False) -> float | None:
    """A time in seconds (None when absent, unless ``required``); :class:`Bad` (``bad_segment``) for
    anything but a finite number from 0 to :data:`MAX_SECONDS` (NaN, 1e308, a string)."""
    if value is None:
        if required:
            raise Bad("bad_segment", f"{where}: no {what}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Bad("bad_segment", f"{where}: {what} must be a number of seconds, got {_brief(value)}")
    if not 0 <= value <= MAX_SECONDS:  # NaN fails every comparison
        raise Bad("bad_segment", f"{where}: {what} {value!r} is no time in a recording (0 to {MAX_SECONDS:g} s)")
    return float(value)


def name(value: Any, what: str, where: str, reason: str, *, number: bool = True) -> str:
    """An id, speaker or language as a string held to the index's rule for names; ``number``: a whole
    number is taken too (speaker ids often are); :class:`Bad` (``reason``) otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and number:
        value = str(value)
    if not isinstance(value, str):
        raise Bad(reason, f"{where}: {what} must be a string, got {_brief(value)}")
    problem = name_problem(value)
    if problem is not None:
        raise Bad(reason, f"{where}: {what} {_brief(value)} {problem}")
    return value


def text(value: Any, where: str, uttid: str) -> str:
    """A transcript: a string (None: empty) of at most :data:`MAX_TEXT_CHARS`; :class:`Bad` (``bad_text``)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Bad("bad_text", f"{where}: the transcript must be a string, got {_brief(value)}", uttid)
    if len(value) > MAX_TEXT_CHARS or "\0" in value:
        raise Bad("bad_text", f"{where}: a transcript of {len(value):,} characters"
                  + (" holding a NUL" if "\0" in value else f", more than {MAX_TEXT_CHARS:,}"), uttid)
    return value


def item(file: str, line: int, *, uttid: Any, audio: str | Blob, text_value: Any, speaker: Any = None,
         language: Any = None, start: float | None = None, end: float | None = None, channel: int | None = None,
         duration: float | None = None, fields: Mapping[str, tuple[str, Any]] | None = None,
         problems: Sequence[Bad] = ()) -> Item:
    """An :class:`Item` of checked values (see the module's doc), or :class:`Bad` naming every value
    that fails (:func:`merged`), with ``problems`` the reader found in the line already, and the
    audio file missing when it is (a line with problems is not probed later).  ``start``/``end``/
    ``duration`` are already :func:`seconds`; ``end`` None: to the end of the audio.  ``fields``:
    name -> (key, the line's value), each made the text of its member (:func:`field_text`)."""
    where = f"{file}:{line}"
    found = list(problems)

    def check(make: Any) -> Any:
        try:
            return make()
        except Bad as e:
            found.append(e)
            return None

    uid = check(lambda: name(uttid, "the utterance id", where, "bad_id"))
    if isinstance(audio, str) and audio.rstrip().endswith("|"):
        found.append(Bad("bad_audio", f"{where}: audio {audio!r} ends in '|': a manifest names audio files, and "
                                      f"wdsprep runs no command a manifest names"))
    spk = None if speaker is None else check(lambda: name(speaker, "the speaker", where, "bad_speaker"))
    lang = None if language is None else check(lambda: name(language, "the language", where, "bad_language",
                                                             number=False))
    if end is not None and start is not None and end <= start:
        found.append(Bad("bad_segment", f"{where}: the segment [{start:g}, {end:g}) s ends before it starts"))
    transcript = check(lambda: text(text_value, where, uid))
    values = {n: check(lambda n=n, k=k, v=v: field_text(v, f"{where}: field {n} ({k!r})"))
              for n, (k, v) in (fields or {}).items()}
    if found:
        if isinstance(audio, str) and audio and not audio.rstrip().endswith("|") and not os.path.lexists(audio):
            found.append(Bad("missing_file", f"{where}: audio {audio!r}: no such file"))
        raise merged(found, where, uid if uid is not None else uttid)
    return Item(uid, file, line, audio, transcript, speaker=spk, language=lang, start=start or 0.0,
                end=-1.0 if end is None else end, channel=channel, duration=duration,
                fields={n: v for n, v in values.items() if v is not None})


def field_text(value: Any, where: str) -> str | None:
    """A field's value as the text its member holds: a string as it is, a number or a boolean as
    JSON writes it (``true``, ``0.5``); None (no member) for no value or an empty string; :class:`Bad`
    (``bad_field``) for a list, an object, a NaN or a string too long or holding a NUL."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS or "\0" in value:
            raise Bad("bad_field", f"{where}: a value of {len(value):,} characters"
                      + (" holding a NUL" if "\0" in value else f", more than {MAX_TEXT_CHARS:,}"))
        return value
    if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
        return json.dumps(value)
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise Bad("bad_field", f"{where}: {shown} is no text, number or boolean a field can hold")


def _brief(value: Any) -> str:
    """A value for a message: its repr, cut short."""
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


# -- files a manifest names -----------------------------------------------------------------------------


def read_text_file(named: str, manifest: str, roots: Sequence[str], where: str, uttid: str) -> str:
    """The transcript in the file a manifest line names (NeMo's ``text_filepath``): resolved (a
    relative path from the manifest's folder), read only when it lies under the manifest's folder
    or one of ``roots`` (the user's ``text_root``) and is a regular file of at most
    :data:`MAX_TEXT_FILE_BYTES` of UTF-8; its newlines are dropped.  :class:`Bad` (``bad_text``)
    saying why not."""
    here = os.path.dirname(os.path.abspath(manifest))
    path = os.path.realpath(os.path.join(here, os.path.expanduser(named)))
    allowed = [os.path.realpath(d) for d in (here, *roots)]
    if not any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in allowed):
        raise Bad("bad_text", f"{where}: text_filepath {named!r} is outside the manifest's folder {here}"
                  + (f" and {', '.join(roots)}" if roots else "")
                  + "; a manifest's text files are read there only (name another folder with --text-root)", uttid)
    try:
        data = read_small(path, MAX_TEXT_FILE_BYTES, "a transcript file")
    except FileNotFoundError:
        raise Bad("missing_file", f"{where}: text_filepath {named!r}: no such file", uttid) from None
    except (OSError, ValueError) as e:
        raise Bad("bad_text", f"{where}: text_filepath {named!r}: {e}", uttid) from None
    try:
        return data.decode("utf-8").replace("\n", "")
    except UnicodeDecodeError as e:
        raise Bad("bad_text", f"{where}: text_filepath {named!r} is not UTF-8 ({e.reason} at byte {e.start})",
                  uttid) from None
