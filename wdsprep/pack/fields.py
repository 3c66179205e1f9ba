"""Each utterance's fields: its language and any other value a pack carries into the shards.

A pack takes them from Kaldi-style tables (``--utt2lang FILE``, ``--field NAME=FILE``: ``uttid
value``) and from the source's own inputs (:attr:`~wdsprep.pack.driver.PackSource.fields`, e.g. a
manifest's language and the keys ``--field NAME=KEY`` names).  Every field becomes a member
``KEY.NAME`` of each utterance in the shards (``format/keys.py``); the language, and the fields
named by ``--index-field``, become columns of the index too.  A table is meant to cover every
utterance: one it has no value for is not packed, reported as ``missing_lang`` or
``missing_field`` (naming the field and its files).  A manifest's keys are optional per line, as
NeMo and Lhotse read them: an utterance whose line leaves one out is packed without that member
(the index's column holds no value for it).  No field is ever written with an empty value.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from wdsprep.errors import DataError
from wdsprep.format.keys import LANG, check_field_name
from wdsprep.pack.options import PathOrPaths, as_list
from wdsprep.prep.kaldi import read_field, read_utt2lang

# The reason an utterance without a value of the field is reported under.
MISSING = {LANG: "missing_lang"}
MISSING_FIELD = "missing_field"


def field_files(utt2lang: PathOrPaths | None, fields: Mapping[str, PathOrPaths] | None) -> dict[str, list[str]]:
    """The tables of a pack's fields by name (``utt2lang`` is field ``lang``'s), names checked."""
    out = {} if utt2lang is None else {LANG: as_list(utt2lang)}
    for name, files in (fields or {}).items():
        check_field_name(name)
        if name in out:
            raise ValueError(f"field {name!r} is given twice" + (" (as --utt2lang and --field lang=...)"
                                                                  if name == LANG else ""))
        out[name] = as_list(files)
    return out


class ItemFields:
    """The fields of a pack's utterances: from its tables (read here, so a bad one fails before the
    output folder is touched) and from its source's own inputs."""

    def __init__(self, files: Mapping[str, list[str]], own: Mapping[str, Mapping[str, str]]) -> None:
        clash = sorted(set(files) & set(own))
        if clash:
            raise ValueError(f"field(s) {clash} come from the source's own inputs; do not give them as tables too")
        for name in own:
            check_field_name(name)
        self.files = dict(files)
        self.tables: dict[str, Mapping[str, Any]] = {
            name: read_utt2lang(paths) if name == LANG else read_field(paths, name) for name, paths in files.items()}
        self.tables.update(own)
        self.names = tuple(sorted(self.tables))

    def check_indexed(self, indexed: Sequence[str]) -> None:
        """Refuse index fields no field is given for, and indexed values an index cannot hold."""
        unknown = sorted(set(indexed) - set(self.names))
        if unknown:
            raise ValueError(f"index field(s) {unknown} name no field given (--field NAME=FILE, or --utt2lang for "
                             f"lang); the fields are {list(self.names)}")
        for name in indexed:
            for uttid, value in self.tables[name].items():
                text = getattr(value, "value", value)
                if "\n" in text or (name == LANG and (not text or len(text.split()) != 1)):
                    raise DataError(f"utterance {uttid!r}: {name} {text!r} cannot be indexed: "
                                    + ("a language is one word (e.g. en)" if name == LANG else "it holds a newline"))

    def inputs(self) -> dict[str, list[str]]:
        """What a resume must find unchanged, by input name: each table's files."""
        return {("utt2lang" if name == LANG else f"field {name}"): paths for name, paths in self.files.items()}

    def of(self, uttid: str) -> tuple[dict[str, str] | None, tuple[str, str] | None]:
        """(the utterance's values by field, or None; (reason, detail) of the first table it has no
        value in).  A field of the source's own inputs it has no value of is left out of its values."""
        if not self.names:
            return None, None
        out: dict[str, str] = {}
        for name in self.names:
            value = self.tables[name].get(uttid)
            if value is None and name in self.files:
                return None, (MISSING.get(name, MISSING_FIELD), f"field {name}: no value in "
                                                                f"{', '.join(self.files[name])}")
            if value is not None:
                out[name] = getattr(value, "value", value)
        return out, None

    def indexed(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        """uttid -> value of each field in ``names`` (what the index's columns are made from)."""
        return {n: {u: getattr(v, "value", v) for u, v in self.tables[n].items()} for n in names}
