"""Which key of a manifest line (a column of a table) holds what: each kind's own, the user's, Canary's.

A reader asks :class:`Keys` for an utterance's values by their role (:data:`ROLES`: the audio, the
transcript, the language, the speaker, the id, the duration and the offset) and for the fields a
pack carries beside them.  A role's key is the one the user named (``Manifest(text_column=
"answer")``, ``--text-column answer``), else the first of the kind's own (:data:`DEFAULTS`) a line
has: NeMo's ``text``, else ``normalized_text``, else Canary's ``answer``; its ``lang``, else
Canary's ``target_lang`` (the language the text is in, as NeMo's Canary configs read it,
``lang_field: target_lang``).  A field is a key the user names (``--field NAME=KEY``), and a NeMo
manifest's Canary keys (:data:`CANARY_FIELDS`: ``source_lang``, ``target_lang``, ``pnc``,
``taskname``) are fields of their own names wherever a line has them.

Every key but the audio's is optional per line, as NeMo reads them (``dict.get``): a line without
a language is packed without one, a line without a field's key without that member (the pack
counts them in neither case; ``docs/import.md``).  A key the user named that no line has is
refused once the manifest is read, naming the keys its lines have: a typo must not pack a corpus
without its languages.
"""

from __future__ import annotations

from typing import Any, Mapping

from wdsprep.format.keys import check_field_name

# A role of a line's value -> the Manifest option that names its key.
ROLES = {"audio": "audio_column", "text": "text_column", "lang": "lang_column", "speaker": "speaker_column",
         "id": "id_column", "duration": "duration_column", "offset": "offset_column"}
CANARY_FIELDS = ("source_lang", "target_lang", "pnc", "taskname")
# Each kind's keys by role, first found first; a role a kind has no key for is left out.
DEFAULTS: dict[str, dict[str, tuple[str, ...]]] = {
    "nemo": {"audio": ("audio_filepath", "audio_filename"), "text": ("text", "normalized_text", "answer"),
             "lang": ("lang", "target_lang"), "speaker": ("speaker",), "id": ("id", "utt_id"),
             "duration": ("duration",), "offset": ("offset",)},
    "wenet": {"audio": ("wav",), "text": ("txt",), "lang": ("lang",), "speaker": ("spk",), "id": ("key",)},
    "hf": {"audio": (), "text": ("text", "sentence", "transcription", "transcript", "normalized_text"),
           "lang": ("language", "lang", "locale"), "speaker": ("speaker_id", "speaker", "client_id"),
           "id": ("id", "segment_id", "utt_id", "key"), "duration": (), "offset": ()},
}
DEFAULTS["nemo-tarred"] = DEFAULTS["nemo"]
AUTO_FIELDS = {"nemo": CANARY_FIELDS, "nemo-tarred": CANARY_FIELDS}


class Keys:
    """The keys a kind's reader takes each value from (see the module's doc).  ``named``: role ->
    the key the user named; ``fields``: field name -> key."""

    def __init__(self, kind: str, named: Mapping[str, str | None] | None = None,
                 fields: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self.named = {role: key for role, key in (named or {}).items() if key is not None}
        for role in self.named:
            if role not in ROLES:
                raise ValueError(f"no value of a manifest line is called {role!r}; the roles: {', '.join(ROLES)}")
        self.fields = {check_field_name(n): key for n, key in (fields or {}).items()}
        self.auto = tuple(n for n in AUTO_FIELDS.get(kind, ()) if n not in self.fields)
        # The keys named that no line read so far has, and the first line's keys (for the message).
        self.unseen = {*self.named.values(), *self.fields.values()}
        self.first: list[str] | None = None

    def line(self, entry: Mapping[str, Any]) -> Mapping[str, Any]:
        """``entry``, a line about to be read, its keys noted."""
        if self.first is None:
            self.first = sorted(k for k in entry if isinstance(k, str))
        if self.unseen:
            self.unseen.difference_update(entry)
        return entry

    def key(self, role: str, entry: Mapping[str, Any]) -> str | None:
        """The key of ``role`` in ``entry``: the named one, else the first default the line has."""
        if role in self.named:
            return self.named[role]
        return next((k for k in DEFAULTS[self.kind].get(role, ()) if k in entry), None)

    def value(self, role: str, entry: Mapping[str, Any]) -> Any:
        """The line's value of ``role`` (None when the line has no such key)."""
        key = self.key(role, entry)
        return None if key is None else entry.get(key)

    def raw_fields(self, entry: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
        """The line's fields it has a key of: name -> (key, value as the line holds it; checked by
        :func:`~wdsprep.pack.sources.untrusted.item`)."""
        return {name: (key, entry[key]) for name, key in [*self.fields.items(), *((n, n) for n in self.auto)]
                if key in entry}

    def check_named(self, source: str) -> None:
        """Refuse a key the user named that no line of ``source`` has (a typo), naming those they have."""
        if self.first is None:  # no line read: nothing to hold the names to
            return
        named = [(f"--{ROLES[r].replace('_', '-')} {k}", k) for r, k in self.named.items()]
        named += [(f"--field {n}={k}", k) for n, k in self.fields.items()]
        for flag, key in named:
            if key in self.unseen:
                raise ValueError(f"{flag}: no line of {source} has the key {key!r}; its first line has "
                                 f"{', '.join(self.first[:30])}")

    def given(self) -> dict[str, Any]:
        """What the user named, for the resume record (an empty dict when nothing)."""
        named: dict[str, Any] = {ROLES[r]: k for r, k in self.named.items()}
        return {**named, "fields": dict(self.fields)} if self.fields else named
