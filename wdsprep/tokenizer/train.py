"""Training a tokenizer on the transcripts the user has: each kind trains itself.

The transcripts come from Kaldi ``text`` files, or from anything that gives ``(uttid, transcript,
language)`` (:class:`Transcripts`): a manifest (``wdsprep.Manifest``, ``--from KIND PATH``: the
pack's own readers) or packed shards (:class:`ShardTranscripts`, ``--trset``).  Those are taken in
id order, as a Kaldi ``text`` lists them, so the same transcripts give the same tokenizer whichever
way they came; ``lang`` keeps one language's.  :func:`train_aggregate_tokenizer` trains one
tokenizer per language of them and lays their ids out in one (``aggregate``).
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from wdsprep.prep.kaldi import iter_table
from wdsprep.tokenizer.base import REGISTRY, PathLike, Specials, Tokenizer, trainable_kinds
from wdsprep.tokenizer.normalize import Normalizer, parse_normalize


@runtime_checkable
class Transcripts(Protocol):
    """Transcripts other than in Kaldi ``text`` files: a manifest, packed shards."""

    def transcripts(self) -> Iterable[tuple[str, str, str | None]]:
        """``(uttid, transcript, language or None)`` of each utterance."""


class ShardTranscripts:
    """The transcripts (and languages) of packed shards: a pack's folder or a shard pattern, local."""

    def __init__(self, patterns: str | os.PathLike | Sequence[str | os.PathLike]) -> None:
        self.patterns = patterns

    def __str__(self) -> str:
        named = [self.patterns] if isinstance(self.patterns, (str, os.PathLike)) else self.patterns
        return " ".join(map(str, named))

    def transcripts(self) -> Iterator[tuple[str, str, str | None]]:
        from wdsprep.format.keys import LANG
        from wdsprep.format.records import iter_records
        from wdsprep.format.shardlist import expand_shards, is_url

        for url in expand_shards(self.patterns):
            if is_url(url):
                raise ValueError(f"{url}: tokenizers train on local shards; copy them here first")
            for block in iter_records(url, fields=[LANG]):
                yield from zip(block.uttids.tolist(), block.texts.tolist(), (v[0] for v in block.values.tolist()))


TextSource = PathLike | Sequence[PathLike] | Transcripts


def train_tokenizer(kind: str, text_files: TextSource, out: PathLike, *, vocab_size: int | None = None,
                    model_type: str = "unigram", user_dict: PathLike | None = None, keep_spaces: bool = True,
                    character_coverage: float = 0.9995, spm_options: Mapping[str, Any] | None = None,
                    normalize: Normalizer | str | Sequence[str] | None = None, special_tokens: Sequence[str] = (),
                    overwrite: bool = False, lang: str | None = None) -> Tokenizer:
    """Train a tokenizer on transcripts, save it to ``out``, return it.

    ``text_files``: Kaldi ``text`` files, or :class:`Transcripts` (a ``wdsprep.Manifest``, a
    :class:`ShardTranscripts`), taken in id order as a Kaldi ``text`` lists them; ``lang``: only
    those of this language (theirs must say it).

    ``vocab_size`` counts every id including ``<s>`` and ``<unk>``; required for sentencepiece
    (except ``model_type="char"``), optional for char/jieba/simple (the most frequent pieces are
    kept).  ``simple``: the units the transcripts write with spaces between them (words, phones).
    ``model_type`` and ``character_coverage`` apply to sentencepiece, ``user_dict`` to jieba,
    ``keep_spaces`` to char: an option another kind takes is refused unless at its default.
    ``spm_options`` are passed to ``SentencePieceTrainer.train`` (e.g. ``input_sentence_size``),
    except options that would break the id convention.  Empty transcripts are skipped.
    ``normalize``: the text treatment the loader's ``normalize=`` applies (``tokenizer/normalize.py``),
    applied to every transcript before training, so the tokenizer learns the text it will be given.
    ``special_tokens``: symbols (``<|en|>``, ``<|transcribe|>``) each encoded as one id wherever they
    appear, in transcripts and text fields, never split and never changed by a text treatment.
    """
    cls = REGISTRY.get(kind)
    if cls is None or not cls.trainable():
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(trainable_kinds())}")
    if isinstance(text_files, Transcripts):
        texts = _by_language(text_files, "" if lang is None else lang).get("" if lang is None else lang, [])
        if not texts:
            raise ValueError(f"no transcript{'' if lang is None else f' of language {lang!r}'} to train on")
        return _train_texts(kind, texts, out, _name(text_files), vocab_size=vocab_size, model_type=model_type,
                            user_dict=user_dict, keep_spaces=keep_spaces, character_coverage=character_coverage,
                            spm_options=spm_options, normalize=normalize, special_tokens=special_tokens,
                            overwrite=overwrite)
    if lang is not None:
        raise ValueError(f"lang={lang!r} keeps one language of a manifest's or shards' transcripts; a Kaldi text names "
                         f"none: give that language's text file")
    # One path where a list was meant must not become a list of characters.
    files = [text_files] if isinstance(text_files, (str, os.PathLike)) else list(text_files)
    if not files:
        raise ValueError("no training text given; pass one or more Kaldi text files")
    options = {"model_type": model_type, "user_dict": user_dict, "keep_spaces": keep_spaces,
               "character_coverage": character_coverage, "spm_options": spm_options or None,
               "special_tokens": tuple(special_tokens)}
    takes = cls.train_options()
    defaults = inspect.signature(train_tokenizer).parameters
    for name, value in options.items():
        if name not in takes and value != defaults[name].default:
            others = [k for k in trainable_kinds() if name in REGISTRY[k].train_options()]
            raise ValueError(f"{name} is for --kind {' or '.join(others)}, not {kind!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    treatment = parse_normalize(normalize)
    with tempfile.TemporaryDirectory(prefix="wdsprep-normalized-") as tmp:
        if treatment is not None:
            specials = Specials(dict.fromkeys(special_tokens, 0))
            files = [_normalized(f, lambda x: specials.plain(x, treatment), Path(tmp) / f"text.{k}")
                     for k, f in enumerate(files)]
        tok = cls.train(files, vocab_size, **{name: options[name] for name in takes})
    tok.save(out, overwrite=overwrite)
    return tok  # type: ignore[return-value]


def _by_language(source: Transcripts, only: str | None) -> dict[str, list[tuple[str, str]]]:
    """Each language's ``(uttid, transcript)`` in id order, empty ones left out; ``only``: that language's
    alone (``""``: every transcript, whatever its language); None: by language, each with one."""
    out: dict[str, list[tuple[str, str]]] = {}
    seen: set[str] = set()
    without = 0
    for uttid, text, lang in source.transcripts():
        if uttid in seen or not text or not text.strip():
            continue
        seen.add(uttid)
        if only == "":
            key = ""
        elif lang is None:
            without += 1
            continue
        elif only is not None and lang != only:
            continue
        else:
            key = lang
        out.setdefault(key, []).append((uttid, " ".join(text.split())))  # a newline would end a Kaldi line
    if without and (only is None or not out):
        raise ValueError(f"{without:,} transcripts name no language (a manifest's lang key, the shards' KEY.lang); "
                         f"a tokenizer per language needs each one's: pack them with one, or train one tokenizer "
                         f"for all (no --lang)")
    return {k: sorted(v) for k, v in out.items()}


def _name(source: Transcripts) -> str:
    """How messages name where transcripts came from: a manifest's path, the shards' patterns."""
    return f"the transcripts of {getattr(source, 'path', None) or source}"


def _train_texts(kind: str, texts: list[tuple[str, str]], out: PathLike, name: str, **options: Any) -> Tokenizer:
    """:func:`train_tokenizer` on ``(uttid, transcript)`` written as the Kaldi ``text`` they are
    (``name`` says where they came from, in place of that file's name)."""
    with tempfile.TemporaryDirectory(prefix="wdsprep-text-") as tmp:
        text = Path(tmp) / "text"
        with open(text, "w", encoding="utf-8") as f:
            f.writelines(f"{uttid} {t}\n" for uttid, t in texts)
        try:
            return train_tokenizer(kind, [text], out, **options)
        except ValueError as e:
            raise ValueError(str(e).replace(str(text), name)) from None


def train_aggregate_tokenizer(kind: str, source: Transcripts, out: PathLike, *,
                              vocab_size: int | Mapping[str, int] | None = None, overwrite: bool = False,
                              **options: Any) -> Tokenizer:
    """One tokenizer of ``kind`` per language of ``source``'s transcripts (every one must name its
    language), laid out in one aggregate tokenizer at ``out`` (languages in name order), returned.
    ``vocab_size``: each language's, or ``{lang: size}``; ``options``: :func:`train_tokenizer`'s."""
    from wdsprep.tokenizer.aggregate import AggregateTokenizer

    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    by_lang = _by_language(source, None)
    if not by_lang:
        raise ValueError("no transcript to train on")
    sizes = dict(vocab_size) if isinstance(vocab_size, Mapping) else {lang: vocab_size for lang in by_lang}
    unsized = sorted(set(by_lang) - set(sizes))
    if unsized:
        raise ValueError(f"no vocab_size for language(s) {unsized}; the transcripts are in {sorted(by_lang)}")
    with tempfile.TemporaryDirectory(prefix="wdsprep-aggregate-") as tmp:
        each = {lang: _train_texts(kind, by_lang[lang], Path(tmp) / f"{lang}.json", f"{_name(source)} in {lang}",
                                   vocab_size=sizes[lang], **options) for lang in sorted(by_lang)}
    tok = AggregateTokenizer(each)
    tok.save(out, overwrite=overwrite)
    return tok


def _normalized(path: PathLike, treatment: Callable[[str], str], out: Path) -> Path:
    """A copy of Kaldi text file ``path`` with each transcript treated."""
    with open(out, "w", encoding="utf-8") as f:
        for e in iter_table(path, allow_empty_value=True):
            f.write(f"{e.uttid} {treatment(e.value)}\n")
    return out
