"""CAT's tokenizers come over with CAT's ids: ``import-cat`` reads the pickled ``.tknz`` without
unpickling it, refuses anything that is not a CAT tokenizer, and the result encodes ~600
transcripts exactly as CAT does (compared with ``cat_reference``, a model of CAT's behaviour)."""

from __future__ import annotations

import json
import os
import pickle
import re
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cat_reference import (
    CAT_MODULE,
    JiebaComposeLexiconTokenizer,
    JiebaTokenizer,
    LexiconTokenizer,
    SentencePieceTokenizer,
    SimpleTokenizer,
    cat_module,
    corpus,
    tknz,
)

from wdsprep.tokenizer import (
    TokenizerFileError,
    import_cat_tokenizer,
    load_tokenizer,
    read_cat_tokenizer,
    train_tokenizer,
)
from wdsprep.tokenizer.cat import MAX_DEPTH, MAX_NODES, read_cat_pickle

TEXTS = corpus()


def same_ids(ours, cat) -> int:
    """How many of the ~600 transcripts get CAT's ids; the test wants all of them."""
    return sum(ours.encode(t) == cat.encode(t) for t in TEXTS)


def imported(cat_tok, tmp: Path, name: str):
    """Save CAT's tokenizer as CAT does, import it with the CLI's function, load the JSON back."""
    path = tknz(cat_tok, tmp / f"{name}.tknz")
    assert "cat.shared.tokenizer" not in sys.modules  # CAT's classes are gone: only the bytes remain
    import_cat_tokenizer(path, tmp / f"{name}.json")
    assert "cat.shared.tokenizer" not in sys.modules  # ... and reading the pickle did not import them
    return load_tokenizer(tmp / f"{name}.json")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cat")
    (d / "corpus.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")  # CAT trains on bare transcripts
    (d / "text").write_text("".join(f"utt{i:04d} {t.strip()}\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    return d


def test_corpus_is_real_looking():
    assert len(TEXTS) == 600 and len(set(TEXTS)) > 450
    assert sum(t.isascii() for t in TEXTS) > 100 and sum(not t.isascii() for t in TEXTS) > 300
    assert any("\u3000" in t for t in TEXTS) and any("\t" in t for t in TEXTS)


@pytest.mark.parametrize("model_type,vocab_size,options", [
    ("unigram", 300, {}),
    ("bpe", 300, {}),
    # CAT's wenetspeech/aishell char recipes
    ("char", 2000, {"add_dummy_prefix": False, "use_all_vocab": True, "hard_vocab_limit": False}),
])
def test_sentencepiece_ids_are_cats(work: Path, tmp_path: Path, model_type: str, vocab_size: int, options: dict):
    prefix = tmp_path / "spm"
    SentencePieceTokenizer.train(str(work / "corpus.txt"), str(prefix), vocab_size, model_type=model_type, **options)
    cat = SentencePieceTokenizer(f"{prefix}.model")
    ours = imported(cat, tmp_path, "spm")
    assert ours.kind == "sentencepiece" and ours.vocab_size == cat.vocab_size
    assert same_ids(ours, cat) == len(TEXTS)
    # The .model beside the .tknz loads directly, with the same ids.
    assert same_ids(load_tokenizer(f"{prefix}.model"), cat) == len(TEXTS)


def test_cli_reproduces_cats_char_tokenizer(work: Path, tmp_path: Path):
    """CAT's char recipe trains sentencepiece with add_dummy_prefix=false; the CLI can say so now."""
    prefix = tmp_path / "spm"
    opts = {"add_dummy_prefix": False, "use_all_vocab": True, "hard_vocab_limit": False}
    SentencePieceTokenizer.train(str(work / "corpus.txt"), str(prefix), 2000, model_type="char", **opts)
    cat = SentencePieceTokenizer(f"{prefix}.model")
    out = tmp_path / "cli.json"
    r = subprocess.run([sys.executable, "-m", "wdsprep", "tokenizer", "train", "--kind", "sentencepiece",
                        "--model-type", "char", "--vocab-size", "2000", "--text", str(work / "text"), "--out", str(out),
                        *[a for k, v in opts.items() for a in ("--spm-option", f"{k}={str(v).lower()}")]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert same_ids(load_tokenizer(out), cat) == len(TEXTS)
    # Without the option (what the CLI could do before) most transcripts get other ids.
    plain = train_tokenizer("sentencepiece", [work / "text"], tmp_path / "plain.json", model_type="char",
                            vocab_size=2000, spm_options={"use_all_vocab": True, "hard_vocab_limit": False})
    assert same_ids(plain, cat) < len(TEXTS) // 2


@pytest.fixture(scope="module")
def cat_jieba() -> JiebaTokenizer:
    return JiebaTokenizer()  # jieba's whole dictionary: ~498k ids


def test_jieba_ids_are_cats_with_jiebas_whole_dictionary(cat_jieba: JiebaTokenizer, work: Path, tmp_path: Path):
    ours = imported(cat_jieba, tmp_path, "jieba")
    assert ours.kind == "jieba" and ours.vocab_size == cat_jieba.vocab_size > 490_000
    assert same_ids(ours, cat_jieba) == len(TEXTS)
    # The whitespace inside transcripts (tab, U+3000) is CAT's <unk>, not dropped.
    assert ours.encode("你好\u3000世界") == cat_jieba.encode("你好\u3000世界")
    assert 1 in ours.encode("你好\u3000世界")
    # A jieba tokenizer trained by wdsprep has other ids: why the import exists.
    retrained = train_tokenizer("jieba", [work / "text"], tmp_path / "retrained.json")
    assert same_ids(retrained, cat_jieba) < len(TEXTS) // 10


def test_jieba_with_cats_userdict(cat_jieba: JiebaTokenizer, tmp_path: Path):
    """CAT's userdict replaces jieba's dictionary, and only its words with a count are the vocabulary."""
    words = sorted({w for t in TEXTS for w in cat_jieba.cut(t) if not w.isascii()} | {"北京开会", "世界"})
    lines = [f"{w} {3 + (i % 7)} n" for i, w in enumerate(words)] + ["不存在 0"]
    cat = JiebaTokenizer("\n".join(lines).encode("utf-8"), cache_dir=tmp_path)
    ours = imported(cat, tmp_path, "jieba-ud")
    assert ours.vocab_size == cat.vocab_size == len(words) + 2
    assert same_ids(ours, cat) == len(TEXTS)
    # DataLoader workers started with spawn get a pickled copy: the dictionary and rule go along.
    assert same_ids(pickle.loads(pickle.dumps(ours)), cat) == len(TEXTS)
    assert json.loads((tmp_path / "jieba-ud.json").read_text(encoding="utf-8"))["version"] == 2


def test_simple_tokenizer_ids_are_cats(tmp_path: Path):
    # CAT's char setups with SimpleTokenizer write transcripts with a space between characters.
    chars = sorted({c for t in TEXTS for c in t if not c.isspace()})
    spaced = [" ".join(c for c in t if not c.isspace()) for t in TEXTS]
    cat = SimpleTokenizer(chars[::2])  # half the characters: the rest are <unk>
    ours = imported(cat, tmp_path, "simple")
    assert ours.kind == "simple" and ours.vocab_size == cat.vocab_size
    assert sum(ours.encode(t) == cat.encode(t) for t in spaced) == len(spaced)
    assert same_ids(ours, cat) == len(TEXTS)
    words = sorted({w for t in TEXTS for w in t.split()})
    cat = SimpleTokenizer(words[: len(words) // 2])
    assert same_ids(imported(cat, tmp_path, "words"), cat) == len(TEXTS)


def _lexicon_file(tmp: Path) -> Path:
    words = sorted({w for t in TEXTS for w in t.split()})
    rng_units = ["a", "b", "ch", "d", "e", "ng", "o", "zh", "i", "u"]
    lines = [f"{w} {' '.join(rng_units[(ord(c) + k) % len(rng_units)] for k, c in enumerate(w[:4]))}"
             for w in words[::2]]
    lines += [f"{words[0]} x y"]  # a second pronunciation: CAT keeps the first
    path = tmp / "lexicon.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_lexicon_tokenizers_ids_are_cats(cat_jieba: JiebaTokenizer, tmp_path: Path):
    lex = _lexicon_file(tmp_path)
    cat = LexiconTokenizer(str(lex))
    ours = imported(cat, tmp_path, "lexicon")
    assert ours.kind == "lexicon" and ours.vocab_size == cat.vocab_size
    assert same_ids(ours, cat) == len(TEXTS)
    # Jieba words through a lexicon of jieba's words (CAT's Mandarin phone recipes).
    jwords = sorted({w for t in TEXTS for w in cat_jieba.cut(t)})
    (tmp_path / "jlex.txt").write_text(
        "".join(f"{w} {' '.join(f'p{ord(c) % 40}' for c in w)}\n" for w in jwords[::3] if not w.isspace()),
        encoding="utf-8")
    compose = JiebaComposeLexiconTokenizer(str(tmp_path / "jlex.txt"))
    ours = imported(compose, tmp_path, "compose")
    assert ours.kind == "lexicon" and ours.vocab_size == compose.vocab_size
    assert same_ids(ours, compose) == len(TEXTS)
    assert same_ids(pickle.loads(pickle.dumps(ours)), compose) == len(TEXTS)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_pickle_protocol(tmp_path: Path, protocol: int):
    cat = LexiconTokenizer(str(_lexicon_file(tmp_path)))
    path = tknz(cat, tmp_path / "lex.tknz", protocol=protocol)
    assert same_ids(read_cat_tokenizer(path), cat) == len(TEXTS)
    simple = SimpleTokenizer(["我", "们", "hello"])
    assert read_cat_tokenizer(tknz(simple, tmp_path / "s.tknz", protocol=protocol)).encode("我 们 x") == [2, 3, 1]


# --- Nothing in the file is run ---------------------------------------------------------------


class _Payload:
    """Pickles as a call of ``func(*args)``; unpickling it would run that call."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _refused(tmp: Path, data: bytes, match: str) -> str:
    path = tmp / "evil.tknz"
    path.write_bytes(data)
    with pytest.raises(TokenizerFileError, match=match) as err:
        read_cat_tokenizer(path)
    assert str(path) in str(err.value)
    return str(err.value)


def test_code_in_the_pickle_is_refused_and_never_run(tmp_path: Path):
    canary = tmp_path / "ran"
    touch = _Payload(os.system, f"touch {canary}")
    # Alone, and hidden in a CAT tokenizer's state.
    _refused(tmp_path, pickle.dumps(touch), r"refers to posix\.system.*nothing in it was run")
    simple = SimpleTokenizer(["a"])
    simple._r_vocab["b"] = touch
    with cat_module():
        data = pickle.dumps(simple)
    _refused(tmp_path, data, r"posix\.system")
    for proto in (0, 2):
        _refused(tmp_path, pickle.dumps(_Payload(eval, "1+1"), protocol=proto), r"(builtins|__builtin__)\.eval")
    assert not canary.exists()
    # A callable CAT's module has but that is not a tokenizer class (CAT's bin2file writes files).
    with cat_module() as module:
        def bin2file(data, dest):
            raise AssertionError("called")
        bin2file.__module__, bin2file.__qualname__ = module.__name__, "bin2file"
        module.bin2file = bin2file
        data = pickle.dumps(_Payload(bin2file, b"x", str(canary)))
    _refused(tmp_path, data, r"cat\.shared\.tokenizer\.bin2file")
    # A CAT class called with arguments (REDUCE), rather than created empty and given its state.
    with cat_module() as module:
        data = pickle.dumps(_Payload(module.SimpleTokenizer, ["a"]))
    _refused(tmp_path, data, r"calls cat\.shared\.tokenizer\.SimpleTokenizer")
    # An allowed helper with arguments pickle never writes for CAT's objects.
    import collections

    _refused(tmp_path, pickle.dumps(_Payload(collections.OrderedDict, "ab")), r"calls collections\.OrderedDict")
    # Opcodes CAT's files never hold: extension codes, persistent ids.
    _refused(tmp_path, b"\x80\x02\x82\x01.", "opcode EXT1")
    _refused(tmp_path, b"\x80\x02X\x03\x00\x00\x00abcQ.", "opcode BINPERSID")
    assert not canary.exists()


def test_another_jiebas_dictionary_is_said(monkeypatch: pytest.MonkeyPatch):
    """CAT's vocabulary without a userdict is the dictionary CAT's jieba had; a different one here warns."""
    from wdsprep.tokenizer import cat as cat_import

    words = ["北京", "北", "今天", "今"]
    monkeypatch.setattr(cat_import, "default_dictionary_words", lambda: words)
    cat_import._check_default_dictionary(["<s>", "<unk>", *words], "x.tknz")  # the same: silent
    with pytest.warns(UserWarning, match=r"x.tknz: .*3 words\) is not this jieba's bundled dictionary .*1 differ"):
        cat_import._check_default_dictionary(["<s>", "<unk>", *words[:3]], "x.tknz")


def test_damaged_and_foreign_files(tmp_path: Path):
    with cat_module():
        good = pickle.dumps(SimpleTokenizer(["a", "b"]))
    _refused(tmp_path, good[: len(good) // 2], "damaged pickle")
    _refused(tmp_path, pickle.dumps({"vocab": ["a"]}), "not a CAT tokenizer")
    with pytest.raises(TokenizerFileError, match="not a CAT tokenizer"):
        read_cat_pickle(pickle.dumps([1, 2, 3]), "x.tknz")
    (tmp_path / "t.json").write_text('{"format": "wdsprep-tokenizer"}')
    with pytest.raises(TokenizerFileError, match="JSON, not CAT's pickled tokenizer"):
        read_cat_tokenizer(tmp_path / "t.json")
    (tmp_path / "junk.tknz").write_bytes(b"\x00\x01junk")
    with pytest.raises(TokenizerFileError, match="junk.tknz"):
        read_cat_tokenizer(tmp_path / "junk.tknz")
    # A SimpleTokenizer whose ids are not 0..n-1 cannot be a list of pieces: said, not guessed.
    cat = SimpleTokenizer(["a"])
    cat._r_vocab["b"] = 7
    with pytest.raises(TokenizerFileError, match=r"ids are not 0\.\.3"):
        read_cat_tokenizer(tknz(cat, tmp_path / "gap.tknz"))


# --- Crafted files: bounded nesting, nodes and memo reuse ------------------------------------
# Pickles written opcode by opcode (pickle itself never writes these shapes): protocol 2, a CAT
# object created empty (NEWOBJ) and given the state the middle opcodes push (BUILD).


def _cat_object(cls: str, state: bytes) -> bytes:
    return b"\x80\x02c" + f"{CAT_MODULE}\n{cls}\n".encode() + b")\x81" + state + b"b."


def _text(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s.encode())) + s.encode()  # BINUNICODE


def _vocab(*extra: bytes) -> bytes:
    """A SimpleTokenizer's state: {'<s>': 0, '<unk>': 1, then the (key, value) opcode pairs}."""
    return b"}(" + _text("<s>") + b"K\x00" + _text("<unk>") + b"K\x01" + b"".join(extra) + b"u"


def _doubled(steps: int) -> bytes:
    """A tuple holding the one before twice, ``steps`` over, through the memo (BINPUT, BINGET,
    TUPLE2): 5 bytes a step, 2**steps leaves."""
    return b")" + b"q\x00h\x00\x86" * steps


def _nested(depth: int) -> bytes:
    return b")" + b"\x85" * depth  # TUPLE1 over and over


def _import_cat_limited(tmp: Path, data: bytes, timeout: float = 60) -> subprocess.CompletedProcess:
    """``wdsprep tokenizer import-cat`` on ``data`` in a process held to 2 GiB of address space."""
    path = tmp / "crafted.tknz"
    path.write_bytes(data)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    cmd = [sys.executable, "-m", "wdsprep", "tokenizer", "import-cat", str(path), "--out", str(tmp / "out.json")]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"import-cat still ran after {timeout} s on a {len(data):,}-byte file")


CRAFTED = {
    # A tuple 2,000,000 deep as a dict key: hashing it overflowed the C stack (a segfault).
    "deep_key": (b"}" + _nested(2_000_000) + b"K\x00s", r"nests values more than 64 deep"),
    # ... as a value: repr() in the error message raised RecursionError.
    "deep_value": (_vocab(_text("w") + _nested(2_000_000)), r"nests values more than 64 deep"),
    # 2**80 leaves in ~450 bytes, hashed as a key, or written into a message by repr(): hung and grew to GBs.
    "shared_key": (b"}" + _doubled(80) + b"K\x00s", r"more than 50,000,000 nodes"),
    "shared_id": (_vocab(_text("w") + _doubled(80)), r"more than 50,000,000 nodes"),
    "shared_call": (b"\x80\x02ccollections\nOrderedDict\n" + _doubled(80) + b"\x85R.", r"more than 50,000,000 nodes"),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_structures_end_in_one_line(tmp_path: Path, name: str):
    """Items 2 and 3 of issue 30: depth, nodes and memo reuse are bounded while the opcodes are read."""
    data, expected = CRAFTED[name]
    body = data if data.startswith(b"\x80") else _cat_object("SimpleTokenizer", data)
    started = time.monotonic()
    r = _import_cat_limited(tmp_path, body)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # not -11 (SIGSEGV), not 2 (a usage error)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "crafted.tknz") in lines[0], r.stderr[-2000:]
    assert re.search(expected, lines[0]) and len(lines[0]) < 400, lines[0]
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out.json").exists()


def _tampered(tmp: Path, cat_tok, name: str) -> Path:
    return tknz(cat_tok, tmp / f"{name}.tknz")


def test_tknz_edge_cases_are_one_line_errors_naming_the_file(tmp_path: Path):
    """Values a damaged .tknz may hold that once escaped as a raw ValueError (the CLI's exit 2, no
    file named) or printed a BytesIO: each is now a TokenizerFileError naming the file."""
    simple = SimpleTokenizer(["a"])
    simple._r_vocab["b"] = "\u00b2"  # "²".isdigit() is True, but int() refuses it
    superscript = _tampered(tmp_path, simple, "superscript")
    simple = SimpleTokenizer(["a"])
    simple._r_vocab[("x",) * 3] = 10 ** 5000  # not text -> an id with no decimal repr (str() raises ValueError)
    both = _tampered(tmp_path, simple, "tuple_piece")
    lex = LexiconTokenizer(str(_lexicon_file(tmp_path)))
    lex._w2pid[next(iter(lex._w2pid))] = (99_999,)  # a unit id past the units
    lexicon = _tampered(tmp_path, lex, "lexicon")
    jieba = JiebaTokenizer("北京 3\n".encode(), cache_dir=tmp_path)
    jieba.byte_dict = "北京 3\n天安门 x\n".encode()  # line 2: a count that is no number
    dictionary = _tampered(tmp_path, jieba, "dictionary")
    cases = {superscript: r"maps 'b' to '²'", both: r"maps \('x', 'x', 'x'\) to <an integer of 16610 bits>",
             lexicon: r"99999 is outside the vocabulary",
             dictionary: r"invalid dictionary entry in the dictionary at Line 2: 天安门 x"}
    for path, expected in cases.items():
        with pytest.raises(TokenizerFileError, match=expected) as err:
            read_cat_tokenizer(path)
        message = str(err.value)
        assert message.startswith(str(path)) and "\n" not in message and len(message) < 400, message
        assert "BytesIO" not in message


def test_cycles_and_late_changes_are_refused():
    """A container may not hold itself, nor change once inside another: no cycle, no stale count."""
    cases = {
        b"]q\x00h\x00a": "a list inside itself",  # L.append(L)
        b"]q\x00h\x00\x85h\x00K\x01a": "changes a list already inside another",  # t = (L,); L.append(1)
        b"}q\x00K\x00h\x00s": "a dict inside itself",
    }
    for ops, expected in cases.items():
        with pytest.raises(TokenizerFileError, match=expected):
            read_cat_pickle(_cat_object("SimpleTokenizer", ops), "x.tknz")
    # A CAT object inside a value (its state holding another CAT object).
    inner = b"c" + f"{CAT_MODULE}\nSimpleTokenizer\n".encode() + b")\x81"
    with pytest.raises(TokenizerFileError, match="CAT SimpleTokenizer object inside another value"):
        read_cat_pickle(_cat_object("SimpleTokenizer", b"}" + _text("w") + inner + b"s"), "x.tknz")


def test_the_bounds_leave_room_for_cats_largest_tokenizer(cat_jieba: JiebaTokenizer, tmp_path: Path):
    """jieba's whole dictionary (498k words, twice) is CAT's largest state: well inside both bounds."""
    from wdsprep.tokenizer import cat as cat_import

    data = tknz(cat_jieba, tmp_path / "jieba.tknz").read_bytes()
    seen = []
    machine = cat_import._Machine
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cat_import, "_Machine", lambda: seen.append(machine()) or seen[-1])
        read_cat_pickle(data, "jieba.tknz")
    m = seen[0]
    assert 1_000_000 < m.nodes < MAX_NODES / 20
    assert max(depth for _, _, depth in m.shape.values()) < MAX_DEPTH / 10


def test_cli_import_then_train_with_cats_ids(tmp_path: Path):
    """The CAT user's path: import-cat once; load_tokenizer refuses the .tknz and says how."""
    cat = SimpleTokenizer(sorted({w for t in TEXTS for w in t.split()}))
    src = tknz(cat, tmp_path / "tokenizer.tknz")
    with pytest.raises(TokenizerFileError, match="import-cat"):
        load_tokenizer(src)
    out = tmp_path / "tokenizer.json"
    run = [sys.executable, "-m", "wdsprep", "tokenizer", "import-cat", str(src), "--out", str(out)]
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"vocab_size {cat.vocab_size}" in r.stderr, r.stderr
    assert same_ids(load_tokenizer(out), cat) == len(TEXTS)
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--overwrite" in r.stderr
    r = subprocess.run([*run[:-2], "--out", str(src), "--overwrite"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "replace CAT's file" in r.stderr
