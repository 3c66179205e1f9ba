"""The report of a data job: every utterance not carried through, by reason, and a summary.

Nothing is dropped silently: each job (``pack``, ``fbank``, ``pack-audio``) writes one of these
next to its output and prints its summary; ``--strict`` turns any drop into a failure.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from wdsprep.errors import DataError
from wdsprep.files import write_text


@dataclass
class Report:
    # reason -> [{"uttid": ..., "why": ...}]: utterances not in the output
    dropped: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    # kind -> [uttid]: utterances in the output but worth a look (e.g. empty transcripts)
    flagged: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    groups: dict[str, dict] = field(default_factory=dict)
    # language -> utterances written, when the inputs name each utterance's language
    languages: dict[str, int] = field(default_factory=dict)
    # what the audio read was like, where it was not what the output holds: recordings of several
    # channels (by count) and resampled ones (by rate); ``pack.from_audio.input_counts``
    inputs: dict = field(default_factory=dict)

    def drop(self, reason: str, uttid: str, why: str | None = None, also: Sequence[str] = ()) -> None:
        """Count ``uttid`` as not written for ``reason`` (once: ``also`` names the other reasons it had)."""
        entry: dict = {"uttid": uttid, "why": why} if why else {"uttid": uttid}
        if also:
            entry["also"] = list(also)
        self.dropped[reason].append(entry)

    def note(self, kind: str, uttid: str) -> None:
        self.flagged[kind].append(uttid)

    def merge(self, other: "Report") -> None:
        for reason, items in other.dropped.items():
            self.dropped[reason].extend(items)
        for kind, ids in other.flagged.items():
            self.flagged[kind].extend(ids)

    @property
    def num_dropped(self) -> int:
        return sum(len(v) for v in self.dropped.values())

    @property
    def num_flagged(self) -> int:
        return sum(len(v) for v in self.flagged.values())

    def counts(self) -> dict[str, int]:
        return {**{k: len(v) for k, v in self.dropped.items()}, **{k: len(v) for k, v in self.flagged.items()}}

    def to_json(self) -> dict:
        written = {"utterances": sum(g.get("utterances", 0) for g in self.groups.values()),
                   "hours": round(sum(g.get("hours", 0) for g in self.groups.values()), 4)}
        if self.languages:
            written["languages"] = dict(sorted(self.languages.items()))
        return {
            "written": written,
            **({"inputs": self.inputs} if self.inputs else {}),
            "groups": self.groups,
            "not_written": {k: sorted(v, key=lambda d: d["uttid"]) for k, v in sorted(self.dropped.items())},
            "flagged": {k: sorted(v) for k, v in sorted(self.flagged.items())},
            "counts": self.counts(),
        }

    def fragment(self) -> dict:
        """The drops and flags alone, as JSON (what a published shard's entry keeps of its report)."""
        return {"dropped": {k: list(v) for k, v in self.dropped.items()},
                "flagged": {k: list(v) for k, v in self.flagged.items()}}

    @classmethod
    def from_fragment(cls, doc: object, *, where: str) -> "Report":
        """A :meth:`fragment` read back; anything else is a ValueError naming ``where``."""
        ok = isinstance(doc, dict) and isinstance(doc.get("dropped"), dict) and isinstance(doc.get("flagged"), dict)
        ok = ok and all(isinstance(v, list) and all(isinstance(x, dict) and isinstance(x.get("uttid"), str) for x in v)
                        for v in doc["dropped"].values())
        ok = ok and all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in doc["flagged"].values())
        if not ok:
            raise DataError(f"{where}: a published shard's report is damaged; pack again with --overwrite")
        r = cls()
        for k, v in doc["dropped"].items():
            r.dropped[k].extend(v)
        for k, v in doc["flagged"].items():
            r.flagged[k].extend(v)
        return r

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Report":
        """A report :meth:`write` wrote (its drops, flags and groups)."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            r = cls.from_fragment({"dropped": doc["not_written"], "flagged": doc["flagged"]}, where=str(path))
            r.groups = dict(doc["groups"])
            r.languages = {str(k): int(v) for k, v in doc["written"].get("languages", {}).items()}
            r.inputs = dict(doc.get("inputs", {}))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a readable report ({e}); pack again with --overwrite") from None
        return r

    def write(self, path: str | os.PathLike) -> Path:
        return write_text(path, json.dumps(self.to_json(), ensure_ascii=False, indent=1) + "\n")

    def _input_lines(self) -> list[str]:
        """What the inputs were like (``inputs``), a line each."""
        got, n = self.inputs, self.inputs.get("recordings", 0)
        out = []
        if got.get("multichannel"):
            each = ", ".join(f"{k:,} of {c} channels" for c, k in sorted(got["multichannel"].items()))
            out.append(f"  inputs: {each} (of {n:,} recordings): {got.get('channels')}")
        if got.get("resampled"):
            each = ", ".join(f"{k:,} at {r} Hz" for r, k in got["resampled"].items())
            out.append(f"  inputs: {each} (of {n:,} recordings), resampled to {got.get('sample_rate')} Hz")
        return out

    def summary(self, title: str, *, table: bool = True) -> str:
        """A few lines a person reads at a glance; ``table``: the groups' table (a pack's folders)."""
        lines = [title]
        if self.groups and table:
            lines.append(f"  {'group':<16}{'utterances':>12}{'hours':>10}{'shards':>8}")
            for name, g in self.groups.items():
                lines.append(f"  {name:<16}{g['utterances']:>12,}{g['hours']:>10.2f}{g.get('shards', 0):>8}")
        if self.languages:
            lines.append("  languages: " + ", ".join(f"{k} {v:,}" for k, v in sorted(self.languages.items())))
        lines += self._input_lines()
        for reason, items in sorted(self.dropped.items()):
            example = items[0]["uttid"]
            lines.append(f"  not written, {reason}: {len(items):,} (e.g. {example})")
        for kind, ids in sorted(self.flagged.items()):
            lines.append(f"  written but flagged, {kind}: {len(ids):,} (e.g. {ids[0]})")
        return "\n".join(lines)
