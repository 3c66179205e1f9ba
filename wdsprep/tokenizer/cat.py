"""Importing CAT's tokenizers: the pickled ``.tknz`` read without unpickling it.

CAT (``cat/shared/tokenizer.py``) saves a tokenizer with ``pickle.dump(obj)``: no wrapper, the
object of one of its classes in module ``cat.shared.tokenizer``, whose ``__getstate__`` returns a
plain state (``OrderedDict`` s, ``bytes``, ``str``, ``int``, tuples):

=============================  ==============================================================
CAT class                      pickled state
=============================  ==============================================================
SentencePieceTokenizer         ``{"model-data": <the .model file's bytes>}``
JiebaTokenizer                 ``{"vocab": {word: id}, "reverse-vocab": (word, ...),
                               "dict-data": <jieba dictionary bytes> or None}``
SimpleTokenizer                ``{word: id}``
LexiconTokenizer               its ``__dict__``: ``_w2pid`` {word: (unit id, ...)}, ``_units``
                               {unit: id}, ``_unk_token``, ...
JiebaComposeLexiconTokenizer   JiebaTokenizer's state + ``"w2p"``: a LexiconTokenizer pickled
                               on its own (read the same way)
=============================  ==============================================================

:func:`read_cat_pickle` walks the pickle's opcodes (``pickletools.genops``) on a stack of plain
values.  A global may name only those classes and the helpers pickle itself writes for them
(``collections.OrderedDict``; in protocols 0-2 ``copyreg._reconstructor``, ``builtins.object``,
``_codecs.encode`` and ``builtins.bytes``); REDUCE may call only those helpers, and only to build a
dict or bytes.  Anything else (``os.system``, another class or function, an extension code, a
persistent id) ends the read with an error before anything is built from it.  Nothing is
imported and nothing is called: the result is plain data, turned into a wdsprep tokenizer whose
``encode`` gives CAT's ids (:func:`from_cat`).
"""

from __future__ import annotations

import os
import pickletools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from wdsprep.tokenizer.base import BOS, UNK, PathLike, TokenizerBase, TokenizerFileError
from wdsprep.tokenizer.lexicon import LexiconTokenizer
from wdsprep.tokenizer.simple import SimpleTokenizer
from wdsprep.tokenizer.spm import sentencepiece_from_model
from wdsprep.tokenizer.words import JiebaTokenizer, default_dictionary_words

CAT_MODULE = "cat.shared.tokenizer"
CAT_CLASSES = ("SentencePieceTokenizer", "JiebaTokenizer", "SimpleTokenizer", "LexiconTokenizer",
               "JiebaComposeLexiconTokenizer", "RawTokenizer", "PretrainedTokenizer")


@dataclass
class CatObject:
    """An instance of a CAT tokenizer class as the pickle describes it: the class name and its state."""

    cls: str
    state: Any = None


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


# Helpers pickle writes for CAT's objects; any other global is refused.
_ORDERED_DICT = _Global("collections", "OrderedDict")
_RECONSTRUCTOR = {_Global("copyreg", "_reconstructor"), _Global("copy_reg", "_reconstructor")}
_OBJECT = {_Global("builtins", "object"), _Global("__builtin__", "object")}
_CODECS_ENCODE = _Global("_codecs", "encode")
_BYTES = {_Global("builtins", "bytes"), _Global("__builtin__", "bytes")}
_HELPERS = {_ORDERED_DICT, _CODECS_ENCODE, *_RECONSTRUCTOR, *_OBJECT, *_BYTES}

# Opcodes whose argument is the value pushed.
_VALUE_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
              "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
              "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}
_CONSTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_TUPLE": tuple, "EMPTY_SET": set}


class _Refused(Exception):
    """Why the pickle is not read; the caller adds the file and the byte offset."""


@dataclass
class _Machine:
    """The pickle virtual machine, restricted to building plain data and CatObjects."""

    stack: list[Any] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    memo: dict[int, Any] = field(default_factory=dict)

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise _Refused("damaged: an opcode wants a MARK that is not there")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def pop(self) -> Any:
        if not self.stack:
            raise _Refused("damaged: the stack is empty")
        return self.stack.pop()

    def global_(self, module: Any, name: Any) -> _Global:
        if not isinstance(module, str) or not isinstance(name, str):
            raise _Refused(f"a global named by {module!r} {name!r}")
        g = _Global(module, name)
        if g in _HELPERS or (module == CAT_MODULE and name in CAT_CLASSES):
            return g
        raise _Refused(f"refers to {module}.{name}, which is no part of a CAT tokenizer; refusing the file "
                       f"(nothing in it was run)")

    def reduce(self, func: Any, args: Any) -> Any:
        if not isinstance(args, tuple):
            raise _Refused("damaged: REDUCE without an argument tuple")
        if func == _ORDERED_DICT and (args == () or (len(args) == 1 and isinstance(args[0], list))):
            return dict(*args)  # items then come by SETITEMS; insertion order is kept
        if func in _RECONSTRUCTOR and len(args) == 3 and args[1] in _OBJECT and args[2] is None:
            return self.new(args[0])  # protocols 0 and 1: copyreg._reconstructor(cls, object, None)
        if func == _CODECS_ENCODE and len(args) == 2 and isinstance(args[0], str) and args[1] == "latin1":
            return args[0].encode("latin-1")  # protocols 0-2 write bytes this way
        if func in _BYTES and args == ():
            return b""
        what = f"{func.module}.{func.name}" if isinstance(func, _Global) else type(func).__name__
        raise _Refused(f"calls {what} with {_short(args)}, which CAT's tokenizers never pickle; refusing the file "
                       f"(nothing in it was run)")

    @staticmethod
    def new(cls: Any) -> CatObject:
        if not (isinstance(cls, _Global) and cls.module == CAT_MODULE and cls.name in CAT_CLASSES):
            raise _Refused(f"creates an object of {_short(cls)}, not of a CAT tokenizer class")
        return CatObject(cls.name)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def read_cat_pickle(data: bytes, where: str) -> CatObject:
    """The CAT tokenizer a pickle describes, as plain data; never imports or calls anything.

    Raises :class:`TokenizerFileError` naming ``where`` and the byte offset for anything else.
    """
    m = _Machine()
    pos = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name in _VALUE_OPS:
                m.stack.append(arg)
            elif name in _CONSTS:
                m.stack.append(_CONSTS[name])
            elif name in _EMPTY:
                m.stack.append(_EMPTY[name]())
            elif name == "BYTEARRAY8":
                m.stack.append(bytes(arg))
            elif name in ("PROTO", "FRAME"):
                pass
            elif name == "MARK":
                m.marks.append(len(m.stack))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                m.memo[arg] = m.stack[-1]
            elif name == "MEMOIZE":
                m.memo[len(m.memo)] = m.stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in m.memo:
                    raise _Refused(f"damaged: memo entry {arg} read before it was written")
                m.stack.append(m.memo[arg])
            elif name == "POP":
                m.pop()
            elif name == "POP_MARK":
                m.pop_mark()
            elif name == "DUP":
                m.stack.append(m.stack[-1])
            elif name == "LIST":
                m.stack.append(m.pop_mark())
            elif name == "TUPLE":
                m.stack.append(tuple(m.pop_mark()))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = [m.pop() for _ in range(n)][::-1]
                m.stack.append(tuple(items))
            elif name == "DICT":
                items = m.pop_mark()
                m.stack.append(dict(zip(items[::2], items[1::2])))
            elif name == "FROZENSET":
                m.stack.append(frozenset(m.pop_mark()))
            elif name == "APPEND":
                value = m.pop()
                _as(m.stack[-1], list, "APPEND").append(value)
            elif name == "APPENDS":
                items = m.pop_mark()
                _as(m.stack[-1], list, "APPENDS").extend(items)
            elif name == "SETITEM":
                value, key = m.pop(), m.pop()
                _as(m.stack[-1], dict, "SETITEM")[key] = value
            elif name == "SETITEMS":
                items = m.pop_mark()
                _as(m.stack[-1], dict, "SETITEMS").update(zip(items[::2], items[1::2]))
            elif name == "ADDITEMS":
                items = m.pop_mark()
                _as(m.stack[-1], set, "ADDITEMS").update(items)
            elif name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                m.stack.append(m.global_(module, attr))
            elif name == "STACK_GLOBAL":
                attr, module = m.pop(), m.pop()
                m.stack.append(m.global_(module, attr))
            elif name == "REDUCE":
                args, func = m.pop(), m.pop()
                m.stack.append(m.reduce(func, args))
            elif name == "NEWOBJ":
                args, cls = m.pop(), m.pop()
                if args != ():
                    raise _Refused(f"creates {_short(cls)} with arguments {_short(args)}; CAT's objects take none")
                m.stack.append(m.new(cls))
            elif name == "NEWOBJ_EX":
                kwargs, args, cls = m.pop(), m.pop(), m.pop()
                if args != () or kwargs != {}:
                    raise _Refused(f"creates {_short(cls)} with arguments; CAT's objects take none")
                m.stack.append(m.new(cls))
            elif name == "BUILD":
                state = m.pop()
                obj = m.stack[-1] if m.stack else None
                if not isinstance(obj, CatObject) or obj.state is not None:
                    raise _Refused(f"sets the state of {_short(obj)}, which is not a new CAT tokenizer object")
                obj.state = state
            elif name == "STOP":
                break
            else:
                # INST, OBJ, EXT*, PERSID, BINPERSID, buffers, Python 2 strings: never in CAT's files.
                raise _Refused(f"uses the pickle opcode {name}, which CAT's tokenizers never do; refusing the file")
    except _Refused as e:
        raise TokenizerFileError(f"{where}: {e} (at byte {pos})") from None
    except (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as e:
        # genops on a truncated or corrupt pickle, an unhashable dict key, a short stack ...
        raise TokenizerFileError(f"{where}: a damaged pickle ({type(e).__name__}: {e}) near byte {pos}; "
                                 f"copy the .tknz again from the CAT experiment") from None
    if len(m.stack) != 1 or not isinstance(m.stack[0], CatObject):
        raise TokenizerFileError(f"{where}: this pickle holds {_short(m.stack[0] if m.stack else None)}, not a CAT "
                                 f"tokenizer (classes of {CAT_MODULE}: {', '.join(CAT_CLASSES)})")
    return m.stack[0]


def _as(obj: Any, kind: type, op: str) -> Any:
    if not isinstance(obj, kind):
        raise _Refused(f"{op} on {type(obj).__name__}, not a {kind.__name__}")
    return obj


def _field(state: Any, key: str, types: type | tuple[type, ...], cls: str, where: str) -> Any:
    if not isinstance(state, Mapping) or key not in state or not isinstance(state[key], types):
        raise TokenizerFileError(f"{where}: CAT {cls} without a usable {key!r} in its state; the .tknz is damaged "
                                 f"or from a CAT version this wdsprep does not know")
    return state[key]


def _vocab_list(mapping: Mapping[Any, Any], cls: str, where: str) -> list[str]:
    """CAT's {piece: id} as the list wdsprep keeps (index = id); the ids must be 0..n-1."""
    by_id: dict[int, str] = {}
    for piece, i in mapping.items():
        # A SimpleTokenizer read from a word-and-index file keeps the index as text ("12").
        if isinstance(i, str) and i.strip().isdigit():
            i = int(i)
        if not isinstance(piece, str) or not isinstance(i, int) or isinstance(i, bool):
            raise TokenizerFileError(f"{where}: CAT {cls} maps {piece!r} to {i!r}; expected text -> integer id")
        if i in by_id:
            raise TokenizerFileError(f"{where}: CAT {cls} gives id {i} to both {by_id[i]!r} and {piece!r}; wdsprep "
                                     f"needs one piece per id")
        by_id[i] = piece
    n = len(by_id)
    if set(by_id) != set(range(n)):
        missing = sorted(set(range(n)) - set(by_id))[:5]
        raise TokenizerFileError(f"{where}: CAT {cls}'s ids are not 0..{n - 1} (no piece for {missing}); wdsprep "
                                 f"needs every id from 0 up to be a piece")
    return [by_id[i] for i in range(n)]


def _dictionary(state: Mapping[str, Any], cls: str, where: str) -> str | None:
    data = state.get("dict-data")
    if data is None:
        return None
    if not isinstance(data, bytes):
        raise TokenizerFileError(f"{where}: CAT {cls}'s 'dict-data' is {type(data).__name__}, not bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenizerFileError(f"{where}: CAT {cls}'s jieba dictionary is not UTF-8; jieba (and so CAT) could "
                                 f"not have read it either") from None


def _check_default_dictionary(vocab: list[str], where: str) -> None:
    # CAT built this vocabulary from the jieba dictionary it had; cutting with another would not
    # give CAT's words, so say so when this jieba's bundled dictionary is not the same.
    ours = default_dictionary_words()
    if vocab[2:] != ours:
        differ = len(set(vocab[2:]) ^ set(ours))
        warnings.warn(f"{where}: CAT's vocabulary ({len(vocab) - 2} words) is not this jieba's bundled dictionary "
                      f"({len(ours)} words, {differ} differ): another jieba version? Ids are CAT's, but words "
                      f"may be cut differently", UserWarning, stacklevel=3)


def _lexicon(obj: CatObject, where: str) -> tuple[list[str], dict[str, list[int]], list[int]]:
    state = obj.state
    w2pid = _field(state, "_w2pid", Mapping, obj.cls, where)
    units = _vocab_list(_field(state, "_units", Mapping, obj.cls, where), obj.cls, where)
    unk_token = _field(state, "_unk_token", str, obj.cls, where)
    lexicon: dict[str, list[int]] = {}
    for word, ids in w2pid.items():
        if not isinstance(word, str) or not isinstance(ids, (tuple, list)) or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TokenizerFileError(f"{where}: CAT {obj.cls} maps {word!r} to {_short(ids)}; expected unit ids")
        lexicon[word] = list(ids)
    if unk_token not in lexicon:
        raise TokenizerFileError(f"{where}: CAT {obj.cls} has no lexicon entry for its unknown-word symbol "
                                 f"{unk_token!r}")
    return units, lexicon, lexicon[unk_token]


def from_cat(obj: CatObject, where: str) -> TokenizerBase:
    """The wdsprep tokenizer that encodes as CAT's object did, with the same ids and vocabulary size."""
    cls, state = obj.cls, obj.state
    if cls == "SentencePieceTokenizer":
        proto = _field(state, "model-data", bytes, cls, where)
        tok = sentencepiece_from_model(proto, where)
        if tok is None:
            raise TokenizerFileError(f"{where}: CAT SentencePieceTokenizer holds a damaged sentencepiece model")
        return tok
    if cls == "JiebaTokenizer":
        vocab = _vocab_list(_field(state, "vocab", Mapping, cls, where), cls, where)
        reverse = _field(state, "reverse-vocab", (tuple, list), cls, where)
        if list(reverse) != vocab:
            raise TokenizerFileError(f"{where}: CAT JiebaTokenizer's 'vocab' and 'reverse-vocab' disagree; the .tknz "
                                     f"is damaged")
        if vocab[:2] != [BOS, UNK]:
            raise TokenizerFileError(f"{where}: CAT JiebaTokenizer's ids 0 and 1 are {vocab[:2]}, not {BOS}, {UNK}")
        dictionary = _dictionary(state, cls, where)
        if dictionary is None:
            _check_default_dictionary(vocab, where)
        return JiebaTokenizer(vocab, dictionary=dictionary, whitespace="cat")
    if cls == "SimpleTokenizer":
        if not isinstance(state, Mapping):
            raise TokenizerFileError(f"{where}: CAT SimpleTokenizer's state is {type(state).__name__}, not its "
                                     f"word -> id mapping")
        vocab = _vocab_list(state, cls, where)
        if vocab[:2] != [BOS, UNK]:
            raise TokenizerFileError(f"{where}: CAT SimpleTokenizer's ids 0 and 1 are {vocab[:2]}, not {BOS}, {UNK}")
        return SimpleTokenizer(vocab)
    if cls == "LexiconTokenizer":
        units, lexicon, unk = _lexicon(obj, where)
        return LexiconTokenizer(units, lexicon, unk=unk, segment="whitespace")
    if cls == "JiebaComposeLexiconTokenizer":
        inner = read_cat_pickle(_field(state, "w2p", bytes, cls, where), f"{where} (its lexicon)")
        if inner.cls != "LexiconTokenizer":
            raise TokenizerFileError(f"{where}: CAT JiebaComposeLexiconTokenizer's lexicon is a {inner.cls}")
        units, lexicon, unk = _lexicon(inner, f"{where} (its lexicon)")
        return LexiconTokenizer(units, lexicon, unk=unk, segment="jieba", dictionary=_dictionary(state, cls, where))
    if cls == "RawTokenizer":
        raise TokenizerFileError(f"{where}: CAT RawTokenizer (transcripts that are already ids) has no wdsprep kind; "
                                 f"write the shards' transcripts as text and use a tokenizer")
    raise TokenizerFileError(f"{where}: CAT {cls} holds a pickled Hugging Face tokenizer, which cannot be read "
                             f"without running its code; wdsprep does not import it")


def read_cat_tokenizer(path: PathLike) -> TokenizerBase:
    """The tokenizer in CAT's ``.tknz`` (a pickle, read without unpickling) or sentencepiece ``.model``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such CAT tokenizer file (CAT writes exp/NAME/tokenizer.tknz)") from None
    except IsADirectoryError:
        raise TokenizerFileError(f"{path}: is a directory; pass CAT's tokenizer.tknz") from None
    if raw.lstrip()[:1] == b"{":
        raise TokenizerFileError(f"{path}: JSON, not CAT's pickled tokenizer; if it is a wdsprep tokenizer file, "
                                 f"use it as it is")
    if raw[:1] != b"\x80":
        # A sentencepiece .model is CAT's too; older pickle protocols are tried as pickles.
        tok = sentencepiece_from_model(raw, str(path))
        if tok is not None:
            return tok
    return from_cat(read_cat_pickle(raw, str(path)), str(path))


def import_cat_tokenizer(path: PathLike, out: PathLike, *, overwrite: bool = False) -> TokenizerBase:
    """Convert CAT's tokenizer (``.tknz`` or sentencepiece ``.model``) to a wdsprep JSON file; return it.

    The result encodes every transcript to CAT's ids and has CAT's vocabulary size, so a model
    trained with CAT keeps working.  ``out`` is refused when it exists, unless ``overwrite``.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    if os.path.abspath(out) == os.path.abspath(path):
        raise ValueError(f"{out}: the output would replace CAT's file; pick another name (e.g. tokenizer.json)")
    tok = read_cat_tokenizer(path)
    tok.save(out, overwrite=overwrite)
    return tok


__all__ = ["CAT_CLASSES", "CAT_MODULE", "CatObject", "read_cat_pickle", "from_cat", "read_cat_tokenizer",
           "import_cat_tokenizer"]
