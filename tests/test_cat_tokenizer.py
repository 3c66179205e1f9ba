"""CAT's tokenizers come over with CAT's ids: ``import-cat`` reads the pickled ``.tknz`` without
unpickling it, refuses anything that is not a CAT tokenizer, and the result encodes ~600
transcripts exactly as CAT does (compared with ``cat_reference``, a model of CAT's behaviour)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from cat_reference import (
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
from wdsprep.tokenizer.cat import read_cat_pickle

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
