"""Hugging Face audio datasets (``--from hf``): a ``Dataset`` that ``save_to_disk`` wrote, or its parquet files.

PATH is a folder ``save_to_disk`` wrote (one split: a ``DatasetDict``'s split folder), or a parquet
file or a folder of them (one split's, e.g. a Hub repository's ``data/train-*.parquet``).  The
dataset is found with ``datasets`` (``load_from_disk``) and read with ``pyarrow``: each row's audio
cell is ``{bytes, path}`` (an ``Audio`` column read undecoded), decoded here with soundfile (so no
torchcodec is needed), or the file ``path`` names when the cell has no bytes.

In Python the ``Dataset`` itself may be given (``load_dataset``'s, ``load_from_disk``'s, one split
of a ``DatasetDict``): its Arrow files are read as a saved dataset's are.

Which columns hold what (``keys.py``): ``audio_column`` (default: the ``Audio`` column),
``text_column`` (default: the first of text, sentence, transcription, transcript,
normalized_text), ``lang_column`` (language, lang, locale), ``speaker_column`` (speaker_id,
speaker, client_id), ``id_column`` (id, segment_id, utt_id, key; else the audio file's name
without its extension, else the row number), ``duration_column`` and ``offset_column`` (none: a
row is its whole audio), and the fields (``--field NAME=COLUMN``).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wdsprep.errors import DataError
from wdsprep.pack.sources.items import Blob, Imported, Item
from wdsprep.pack.sources.keys import DEFAULTS, ROLES, Keys
from wdsprep.pack.sources.untrusted import Bad, item, seconds
from wdsprep.report import Report


@dataclass(frozen=True)
class ArrowCell(Blob):
    """The audio bytes in one row of an Arrow file ``save_to_disk`` wrote, or of a parquet row group."""

    file: str
    group: int  # the parquet row group; -1 for an Arrow file
    row: int  # in the file, or in the row group
    column: str

    @property
    def key(self) -> str:  # type: ignore[override]
        return f"{self.file}[{self.row if self.group < 0 else f'{self.group}:{self.row}'}]"

    def read(self) -> bytes:
        cell = _table(self.file, self.group).column(self.column)[self.row].as_py()
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if not data:
            raise DataError(f"{self.key}: the {self.column} cell has no bytes (the dataset changed since it was read?)")
        return data


# Tables of the files being read, in this process: Arrow files memory-mapped, parquet row groups decoded.
_TABLES: OrderedDict[tuple[str, int], Any] = OrderedDict()
_KEEP = 4


def _table(file: str, group: int) -> Any:
    key = (file, group)
    table = _TABLES.get(key)
    if table is None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if group < 0:
            with pa.memory_map(file) as source:
                table = pa.ipc.open_stream(source).read_all()
        else:
            table = pq.ParquetFile(file).read_row_group(group)
        _TABLES[key] = table
        while len(_TABLES) > _KEEP:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return table


def _parts(path: str | Any) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The dataset's (file, row group) parts in row order (row group -1: a whole Arrow file), and its
    features as JSON."""
    if not isinstance(path, str):  # the Dataset itself (Manifest checked that its rows are its files)
        return [(f, -1) for f in arrow_files(path)], path.features.to_dict()
    p = Path(path)
    if p.is_dir() and (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        raise ValueError(f"{path} holds a DatasetDict (splits: {', '.join(splits)}); give one split's folder, e.g. "
                         f"{p / (splits[0] if splits else 'train')}")
    if p.is_dir() and (p / "state.json").is_file():
        import datasets

        ds = datasets.load_from_disk(str(p))
        if getattr(ds, "_indices", None) is not None:
            raise DataError(f"{path}: the dataset keeps an indices mapping; save it again after "
                            f"dataset.flatten_indices()")
        return [(f["filename"], -1) for f in ds.cache_files], ds.features.to_dict()
    files = sorted(str(f) for f in p.rglob("*.parquet")) if p.is_dir() else [str(p)]
    if not files:
        raise FileNotFoundError(f"{path}: neither a dataset save_to_disk wrote (state.json) nor parquet files")
    import pyarrow.parquet as pq

    parts, features = [], {}
    for f in files:
        try:
            meta = pq.ParquetFile(f)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{f}: not a readable parquet file ({e})") from None
        parts += [(f, g) for g in range(meta.num_row_groups)]
        if not features:
            features = _hf_features(f, meta.schema_arrow)
    return parts, features


def arrow_files(dataset: Any) -> list[str]:
    """The Arrow files a Hugging Face ``Dataset``'s rows are, in order; none when its table is held in
    memory or was changed since it was read (a slice, a rename: ``datasets`` replays those on the
    file's table, which a reader of the file would not)."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    table = dataset.data
    rows = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    if any(len(row) != 1 for row in rows):  # tables side by side (columns added): no one file holds a row
        return []
    blocks = [row[0] for row in rows]
    if any(not isinstance(b, MemoryMappedTable) or b.replays for b in blocks):
        return []
    return [b.path for b in blocks]


def _hf_features(file: str, schema: Any) -> dict[str, Any]:
    """The ``datasets`` features a parquet file's metadata lists, of the columns it has (a column
    dropped after the metadata was written is not one); DataError naming the file for metadata that
    is not the JSON ``datasets`` writes."""
    hf = (schema.metadata or {}).get(b"huggingface")
    if not hf:
        return {}
    try:
        doc = json.loads(hf)
        features = doc.get("info", {}).get("features", {})
        if not isinstance(features, dict):
            raise ValueError(f"features are a {type(features).__name__}")
    except (ValueError, RecursionError, AttributeError) as e:
        raise DataError(f"{file}: its huggingface metadata is not what datasets writes ({type(e).__name__}: "
                        f"{str(e)[:200]}); rewrite the file with datasets, or drop the metadata "
                        f"(pyarrow: table.replace_schema_metadata())") from None
    return {k: v for k, v in features.items() if k in schema.names}


def _pick(given: str | None, defaults: tuple[str, ...], names: list[str], what: str, flag: str,
          required: bool = False) -> str | None:
    """The column named (``flag`` is how it was named: ``--text-column``, ``--field NAME=``), else the
    first default there; ValueError naming the columns there is for one missing."""
    if given is not None:
        if given not in names:
            raise ValueError(f"{flag}{'' if flag.endswith('=') else ' '}{given}: no such column (the columns: "
                             f"{', '.join(names)})")
        return given
    found = next((c for c in defaults if c in names), None)
    if found is None and required:
        raise ValueError(f"no {what} column among {', '.join(names)}; name it with {flag}")
    return found


_WHAT = {"text": "transcript", "lang": "language"}


def read_dataset(path: str | Any, *, keys: Keys | None = None) -> Imported:
    """The utterances of a Hugging Face audio dataset (see the module's doc): its folder or parquet
    files, or the ``Dataset`` itself; ``keys``: which column holds what (``keys.py``)."""
    keys = keys or Keys("hf")
    parts, features = _parts(path)
    names = [f.name for f in _table(*parts[0]).schema] if parts else list(features)
    audio_column = keys.named.get("audio")
    if audio_column is None:
        audio = [c for c, f in features.items() if isinstance(f, dict) and f.get("_type") == "Audio"]
        if len(audio) != 1:
            raise ValueError(f"{_name(path)}: {'no' if not audio else len(audio)} Audio column(s) "
                             f"({', '.join(audio)}); name the audio column with --audio-column")
        audio_column = audio[0]
    columns = {role: _pick(keys.named.get(role), DEFAULTS["hf"][role], names, _WHAT.get(role, role),
                           f"--{option.replace('_', '-')}", required=role == "text")
               for role, option in ROLES.items() if role != "audio"}
    columns["audio"] = _pick(audio_column, (), names, "audio", "--audio-column", True)
    for name, column in keys.fields.items():
        _pick(column, (), names, "field", f"--field {name}=", True)
    report = Report()
    items: list[Item] = []
    roles = ("text", "lang", "speaker", "id", "duration", "offset")
    wanted = [c for c in [columns["audio"], *(columns[r] for r in roles), *keys.fields.values()] if c is not None]
    folder = path if isinstance(path, str) and os.path.isdir(path) else os.path.dirname(path) if isinstance(path, str) \
        else ""
    seen: dict[str, int] = {}  # rows of each file before the part being read
    for file, group in parts:
        table = _table(file, group)
        lacking = [c for c in wanted if c not in table.column_names]
        if lacking:
            raise DataError(f"{file}: no column {lacking[0]!r}, which {parts[0][0]} has; give the files of one dataset")
        first = seen.get(file, 0)
        seen[file] = first + table.num_rows
        has_bytes, named = _audio_cells(table, columns["audio"])
        values = [table.column(columns[r]).to_pylist() if columns[r] is not None else [None] * table.num_rows
                  for r in roles]
        extra = {n: table.column(c).to_pylist() for n, c in keys.fields.items()}
        for row, (there, name, text, lang, speaker, uid, duration, offset) in enumerate(zip(has_bytes, named, *values)):
            where = f"{file}:{first + row + 1}"
            try:
                items.append(_row_item(ArrowCell(file, group, row, columns["audio"]), there, name, folder, where,
                                       text=text, lang=lang, speaker=speaker, uid=uid, duration=duration,
                                       offset=offset, row=first + row,
                                       fields={n: (keys.fields[n], v[row]) for n, v in extra.items()}))
            except Bad as e:
                e.count(report, where)
    given = {f"{role}_column": column for role, column in columns.items() if role in ("audio", "text", "lang",
                                                                                        "speaker", "id")}
    given.update({ROLES[r]: columns[r] for r in ("duration", "offset") if columns[r] is not None})
    if keys.fields:
        given["fields"] = dict(keys.fields)
    data = sorted({f for f, _ in parts}) + [it.audio for it in items if isinstance(it.audio, str)]
    return Imported("hf", items, report, data=data, given=given)


def _row_item(cell: ArrowCell, there: bool, name: Any, folder: str, where: str, *, text: Any, lang: Any,
              speaker: Any, uid: Any, duration: Any, offset: Any, row: int,
              fields: dict[str, tuple[str, Any]]) -> Item:
    """One row's item: its audio cell's bytes, else the file its path names (beside the dataset when
    it is there); :class:`Bad` naming every problem of the row."""
    problems = []
    source: str | Blob = ""
    if there:
        source = cell
    elif isinstance(name, str) and name and "\0" in name:
        problems.append(Bad("missing_file", f"{cell.key}: the {cell.column} cell's path holds a NUL"))
    elif isinstance(name, str) and name:
        beside = os.path.join(folder, name)
        source = name if os.path.isabs(name) or not folder or not os.path.isfile(beside) else beside
    else:
        problems.append(Bad("missing_file", f"{cell.key}: the {cell.column} cell has neither bytes nor a path"))
    start = end = seconds_of = None
    try:
        seconds_of = seconds(duration, "duration", where)
        start = seconds(offset, "offset", where)
        end = None if start is None or seconds_of is None else start + seconds_of
    except Bad as e:
        problems.append(e)
    if uid is None:
        uid = os.path.splitext(os.path.basename(name))[0] if isinstance(name, str) and name else f"{row:08d}"
    file, line = where.rsplit(":", 1)
    return item(file, int(line), uttid=uid, audio=source, text_value=text, speaker=speaker, language=lang,
                start=start, end=end, duration=seconds_of if start is None else None, fields=fields,
                problems=problems)


def _name(path: Any) -> str:
    """How messages name the dataset: its path, or the Dataset's own name."""
    return path if isinstance(path, str) else f"the {type(path).__name__}"


def _audio_cells(table: Any, column: str) -> tuple[list[bool], list[str | None]]:
    """Per row of an audio column (``{bytes, path}`` cells): whether the cell holds bytes, and its path;
    the bytes themselves are not read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(column)
    if not pa.types.is_struct(col.type) or {f.name for f in col.type} < {"bytes", "path"}:
        raise ValueError(f"column {column} holds {col.type}, not audio cells {{bytes, path}}; name the audio column "
                         f"with --audio-column")
    return (pc.is_valid(pc.struct_field(col, "bytes")).to_pylist(), pc.struct_field(col, "path").to_pylist())
