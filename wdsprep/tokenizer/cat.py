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

A few hundred bytes of opcodes can describe a structure far larger than the file: the memo lets
one tuple be put into the next twice (2^80 nodes after 80 steps), and 2 MB of TUPLE1 nest a tuple
2,000,000 deep; hashing such a dict key, comparing it or writing its ``repr`` would run for ever
or overflow the C stack.  So the reader keeps, for every container it builds, its node count (a
shared part counted each time it is placed) and its depth, and refuses the file as soon as a
container is nested deeper than ``MAX_DEPTH`` or the nodes exceed ``MAX_NODES``: every later
walk (a key's hash, a comparison) is then bounded by what was counted.  A container may not
change once it is inside another (so no cycle, and no count goes stale), and messages describe
values with :func:`~wdsprep.tokenizer.base.describe`, which looks at a few items only.  CAT's
states are at most 3 containers deep (a lexicon: its state, ``_w2pid``, a word's tuple); the
largest, jieba's whole dictionary, has 1.5 million nodes.
"""

from __future__ import annotations

import os
import pickletools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from wdsprep.tokenizer.base import (
    BOS,
    UNK,
    PathLike,
    TokenizerBase,
    TokenizerFileError,
    describe,
    read_tokenizer_file,
)
from wdsprep.tokenizer.lexicon import LexiconTokenizer
from wdsprep.tokenizer.simple import SimpleTokenizer
from wdsprep.tokenizer.spm import sentencepiece_from_model
from wdsprep.tokenizer.words import JiebaTokenizer, default_dictionary_words

CAT_MODULE = "cat.shared.tokenizer"
CAT_CLASSES = ("SentencePieceTokenizer", "JiebaTokenizer", "SimpleTokenizer", "LexiconTokenizer",
               "JiebaComposeLexiconTokenizer", "RawTokenizer", "PretrainedTokenizer")


@dataclass(repr=False)
class CatObject:
    """An instance of a CAT tokenizer class as the pickle describes it: the class name and its state."""

    cls: str
    state: Any = None

    def __repr__(self) -> str:
        # The state may be large; a repr names the class and what kind of state it holds.
        return f"<CAT {self.cls} object, state {describe(self.state)}>"


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
_CONTAINERS = (tuple, list, dict, set, frozenset)

# How deep containers may nest: CAT's states are at most 3 deep in every protocol; hashing or
# comparing a 2,000,000-deep tuple overflows the C stack.
MAX_DEPTH = 64
# How many nodes what was built may have as a tree, a part placed twice counted twice: the bound
# on every walk of it.  CAT's largest state (jieba's whole dictionary: 498k words, in 'vocab' and
# again in 'reverse-vocab') has 1.5 million.
MAX_NODES = 50_000_000


class _Refused(Exception):
    """Why the pickle is not read; the caller adds the file and the byte offset."""


@dataclass
class _Machine:
    """The pickle virtual machine, restricted to building plain data and CatObjects.

    ``shape`` holds, by ``id``, each container built so far (kept alive there, so an id is never
    reused) with its node count and depth; a value not in it is a leaf (1 node, depth 0).
    ``placed`` are the containers already inside another.  ``nodes`` counts the nodes of
    everything built as a tree: a container's own nodes count once, when they go into it, and a
    container placed a second time (a memo entry or DUP reused) counts all of its nodes again.
    """

    stack: list[Any] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    memo: dict[int, Any] = field(default_factory=dict)
    shape: dict[int, tuple[Any, int, int]] = field(default_factory=dict)
    placed: set[int] = field(default_factory=set)
    nodes: int = 0

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

    def top(self) -> Any:
        if not self.stack:
            raise _Refused("damaged: the stack is empty")
        return self.stack[-1]

    def _place(self, container: Any, items: Sequence[Any]) -> tuple[int, int]:
        """Count ``items`` going into ``container`` (checking the bounds before anything walks
        them); return their node count and depth."""
        shape, placed = self.shape, self.placed
        nodes = depth = cost = 0
        for x in items:
            known = shape.get(id(x))
            if known is None:  # every container is in shape: a leaf
                if isinstance(x, CatObject):
                    raise _Refused(f"puts a CAT {x.cls} object inside another value; CAT's files never do")
                nodes += 1
                cost += 1
                continue
            if x is container:
                raise _Refused(f"puts a {type(x).__name__} inside itself; CAT's tokenizers hold no cycles")
            n, d = known[1], known[2]
            nodes, depth = nodes + n, max(depth, d)
            if id(x) in placed:
                cost += n  # a second copy of all of it
            else:
                cost += 1  # its items were counted as they went into it
                placed.add(id(x))  # inside another now: a change would make its counts stale
        self.nodes += cost
        if self.nodes > MAX_NODES:
            raise _Refused(f"describes more than {MAX_NODES:,} nodes (a part of the pickle reused over and "
                           f"over?); CAT's tokenizers are far smaller, so the file is damaged or crafted")
        if depth + 1 > MAX_DEPTH:
            raise _Refused(f"nests values more than {MAX_DEPTH} deep; CAT's tokenizers nest a few levels, so the "
                           f"file is damaged or crafted")
        return nodes, depth

    def make(self, container: Any, items: Sequence[Any]) -> Any:
        """``container``, built from ``items``, counted (``items`` are not walked before)."""
        nodes, depth = self._place(container, items)
        if isinstance(container, _CONTAINERS):
            self.shape[id(container)] = (container, 1 + nodes, 1 + depth)
        return container

    def build(self, kind: type, items: list[Any]) -> Any:
        """A new ``kind`` (tuple, list, frozenset) of ``items``; counted before it is made, as a
        frozenset hashes them."""
        marker = object()
        nodes, depth = self._place(marker, items)
        made = kind(items)
        self.shape[id(made)] = (made, 1 + nodes, 1 + depth)
        return made

    def add(self, container: Any, kind: type, op: str, items: Sequence[Any]) -> Any:
        """``container`` (which must be a ``kind`` not yet inside another), about to take ``items``."""
        if not isinstance(container, kind):
            raise _Refused(f"{op} on {type(container).__name__}, not a {kind.__name__}")
        if id(container) in self.placed:
            raise _Refused(f"{op} changes a {kind.__name__} already inside another value; pickle never writes that "
                           f"for CAT's tokenizers (a cycle?)")
        nodes, depth = self._place(container, items)
        _, n, d = self.shape.get(id(container), (container, 1, 1))
        self.shape[id(container)] = (container, n + nodes, max(d, 1 + depth))
        return container

    def global_(self, module: Any, name: Any) -> _Global:
        if not isinstance(module, str) or not isinstance(name, str):
            raise _Refused(f"a global named by {describe(module)} {describe(name)}")
        g = _Global(module, name)
        if g in _HELPERS or (module == CAT_MODULE and name in CAT_CLASSES):
            return g
        raise _Refused(f"refers to {describe(module, bare=True)}.{describe(name, bare=True)}, which is no part of a "
                       f"CAT tokenizer; refusing the file (nothing in it was run)")

    def reduce(self, func: Any, args: Any) -> Any:
        # Type checks first: ``in`` a set hashes its operand, and a crafted one may be large.
        if not isinstance(func, _Global):
            raise _Refused(f"calls {describe(func)}, which is not a global; the pickle is damaged")
        if not isinstance(args, tuple):
            raise _Refused("damaged: REDUCE without an argument tuple")
        if func == _ORDERED_DICT and (args == () or (len(args) == 1 and isinstance(args[0], list))):
            # Items then come by SETITEMS (insertion order is kept); in protocols 0-1 as a list of pairs.
            pairs = args[0] if args else []
            if not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
                raise _Refused(f"calls collections.OrderedDict with {describe(args)}, not a list of pairs")
            made = self.make({}, [x for p in pairs for x in p])
            made.update(pairs)
            return made
        if func in _RECONSTRUCTOR and len(args) == 3 and isinstance(args[1], _Global) and args[1] in _OBJECT \
                and args[2] is None:
            return self.new(args[0])  # protocols 0 and 1: copyreg._reconstructor(cls, object, None)
        if func == _CODECS_ENCODE and len(args) == 2 and isinstance(args[0], str) and args[1] == "latin1":
            return args[0].encode("latin-1")  # protocols 0-2 write bytes this way
        if func in _BYTES and args == ():
            return b""
        raise _Refused(f"calls {func.module}.{func.name} with {describe(args)}, which CAT's tokenizers never pickle; "
                       f"refusing the file (nothing in it was run)")

    @staticmethod
    def new(cls: Any) -> CatObject:
        if not (isinstance(cls, _Global) and cls.module == CAT_MODULE and cls.name in CAT_CLASSES):
            raise _Refused(f"creates an object of {describe(cls)}, not of a CAT tokenizer class")
        return CatObject(cls.name)


def read_cat_pickle(data: bytes, where: str) -> CatObject:
    """The CAT tokenizer a pickle describes, as plain data; never imports or calls anything.

    Raises :class:`TokenizerFileError` naming ``where`` and the byte offset for anything else,
    including a structure nested deeper than ``MAX_DEPTH`` or larger than ``MAX_NODES``.
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
                m.stack.append(m.make(_EMPTY[name](), []))
            elif name == "BYTEARRAY8":
                m.stack.append(bytes(arg))
            elif name in ("PROTO", "FRAME"):
                pass
            elif name == "MARK":
                m.marks.append(len(m.stack))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                m.memo[arg] = m.top()
            elif name == "MEMOIZE":
                m.memo[len(m.memo)] = m.top()
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in m.memo:
                    raise _Refused(f"damaged: memo entry {arg} read before it was written")
                m.stack.append(m.memo[arg])
            elif name == "POP":
                m.pop()
            elif name == "POP_MARK":
                m.pop_mark()
            elif name == "DUP":
                m.stack.append(m.top())
            elif name == "LIST":
                m.stack.append(m.build(list, m.pop_mark()))
            elif name == "TUPLE":
                m.stack.append(m.build(tuple, m.pop_mark()))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = [m.pop() for _ in range(n)][::-1]
                m.stack.append(m.build(tuple, items))
            elif name == "DICT":
                items = m.pop_mark()
                made = m.add({}, dict, name, items)
                made.update(zip(items[::2], items[1::2]))
                m.stack.append(made)
            elif name == "FROZENSET":
                m.stack.append(m.build(frozenset, m.pop_mark()))
            elif name == "APPEND":
                value = m.pop()
                m.add(m.top(), list, name, [value]).append(value)
            elif name == "APPENDS":
                items = m.pop_mark()
                m.add(m.top(), list, name, items).extend(items)
            elif name == "SETITEM":
                value, key = m.pop(), m.pop()
                m.add(m.top(), dict, name, [key, value])[key] = value
            elif name == "SETITEMS":
                items = m.pop_mark()
                m.add(m.top(), dict, name, items).update(zip(items[::2], items[1::2]))
            elif name == "ADDITEMS":
                items = m.pop_mark()
                m.add(m.top(), set, name, items).update(items)
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
                if not isinstance(args, tuple) or args != ():
                    raise _Refused(f"creates {describe(cls)} with arguments {describe(args)}; CAT's objects take none")
                m.stack.append(m.new(cls))
            elif name == "NEWOBJ_EX":
                kwargs, args, cls = m.pop(), m.pop(), m.pop()
                if not isinstance(args, tuple) or args != () or not isinstance(kwargs, dict) or kwargs != {}:
                    raise _Refused(f"creates {describe(cls)} with arguments; CAT's objects take none")
                m.stack.append(m.new(cls))
            elif name == "BUILD":
                state = m.pop()
                obj = m.stack[-1] if m.stack else None
                if not isinstance(obj, CatObject) or obj.state is not None:
                    raise _Refused(f"sets the state of {describe(obj)}, which is not a new CAT tokenizer object")
                m.make(obj, [state])  # counted and sealed like an item of a container
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
        raise TokenizerFileError(f"{where}: a damaged pickle ({type(e).__name__}: {describe(str(e), bare=True)}) "
                                 f"near byte {pos}; copy the .tknz again from the CAT experiment") from None
    if len(m.stack) != 1 or not isinstance(m.stack[0], CatObject):
        raise TokenizerFileError(f"{where}: this pickle holds {describe(m.stack[0] if m.stack else None)}, not a CAT "
                                 f"tokenizer (classes of {CAT_MODULE}: {', '.join(CAT_CLASSES)})")
    return m.stack[0]


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
        if isinstance(i, str) and i.strip().isascii() and i.strip().isdigit() and len(i.strip()) < 20:
            i = int(i)
        if not isinstance(piece, str) or not isinstance(i, int) or isinstance(i, bool):
            raise TokenizerFileError(f"{where}: CAT {cls} maps {describe(piece)} to {describe(i)}; expected text -> "
                                     f"integer id")
        if i in by_id:
            raise TokenizerFileError(f"{where}: CAT {cls} gives id {describe(i)} to both {describe(by_id[i])} and "
                                     f"{describe(piece)}; wdsprep needs one piece per id")
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
            raise TokenizerFileError(f"{where}: CAT {obj.cls} maps {describe(word)} to {describe(ids)}; expected unit "
                                     f"ids")
        lexicon[word] = list(ids)
    if unk_token not in lexicon:
        raise TokenizerFileError(f"{where}: CAT {obj.cls} has no lexicon entry for its unknown-word symbol "
                                 f"{describe(unk_token)}")
    return units, lexicon, lexicon[unk_token]


def from_cat(obj: CatObject, where: str) -> TokenizerBase:
    """The wdsprep tokenizer that encodes as CAT's object did, with the same ids and vocabulary size."""
    try:
        return _from_cat(obj, where)
    except TokenizerFileError:
        raise
    except ValueError as e:  # what the tokenizer itself refuses: a unit id past the units, a bad dictionary line
        raise TokenizerFileError(f"{where}: CAT {obj.cls} that wdsprep cannot rebuild: "
                                 f"{describe(str(e), bare=True, limit=200)}; the .tknz is damaged") from None


def _from_cat(obj: CatObject, where: str) -> TokenizerBase:
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
            raise TokenizerFileError(f"{where}: CAT JiebaTokenizer's ids 0 and 1 are {describe(vocab[:2])}, not {BOS}, "
                                     f"{UNK}")
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
            raise TokenizerFileError(f"{where}: CAT SimpleTokenizer's ids 0 and 1 are {describe(vocab[:2])}, not "
                                     f"{BOS}, {UNK}")
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
    raw = read_tokenizer_file(path, "CAT's tokenizer.tknz", "no such CAT tokenizer file (CAT writes "
                              "exp/NAME/tokenizer.tknz)")
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
