"""Tokenizers: training on Kaldi text, the one-file JSON format, CAT ids, sampling, jieba user dicts, CLI."""

from __future__ import annotations

import base64
import inspect
import itertools
import json
import os
import pickle
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import wdsprep.tokenizer as tk
from wdsprep.prep.kaldi import KaldiDataError
from wdsprep.tokenizer import (
    SubwordSampling,
    Tokenizer,
    TokenizerFileError,
    derive_seed,
    load_tokenizer,
    train_tokenizer,
)
from wdsprep.tokenizer import base as tk_base
from wdsprep.tokenizer.base import BOS, UNK
from wdsprep.tokenizer.simple import SimpleTokenizer

ENGLISH = ["the quick brown fox jumps over the lazy dog", "speech recognition with subword units",
           "recognition of speech in noisy rooms", "the dog recognised the speaker",
           "units of speech are called phones", "a lazy speaker jumps over noisy units"]
MANDARIN = ["我们今天去北京开会", "今天天气很好 我们去公园", "语音识别是一个有趣的问题", "我爱 hello world 语音识别",
            "北京的天气今天很好"]
SPM_OPTS = dict(vocab_size=80, character_coverage=1.0, spm_options={"hard_vocab_limit": False})
KINDS = ["char", "jieba", "sentencepiece", "simple"]
STDERR_SPAM = ("trainer_interface", "Building prefix dict", "Loading model cost", "unigram_model_trainer")


def transcripts() -> list[str]:
    # Word-order variations give SentencePiece enough text to learn subwords, deterministically.
    out = list(ENGLISH) + list(MANDARIN)
    for a, b in itertools.permutations(ENGLISH[:5], 2):
        out.append(f"{a} {b}")
    return out


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text"
    lines = [f"utt{i:03d} {t}" for i, t in enumerate(transcripts())]
    lines.insert(3, "utt_empty")  # an empty transcript is legal in Kaldi text and must be skipped
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toks(text_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    out = tmp_path_factory.mktemp("tok")
    return {
        "char": train_tokenizer("char", [text_file], out / "char.json"),
        "jieba": train_tokenizer("jieba", [text_file], out / "jieba.json"),
        "sentencepiece": train_tokenizer("sentencepiece", [text_file], out / "spm.json", **SPM_OPTS),
        "simple": train_tokenizer("simple", [text_file], out / "simple.json"),
    }


@pytest.mark.parametrize("kind", KINDS)
def test_cat_id_convention_and_unknowns(toks: dict[str, Tokenizer], kind: str) -> None:
    tok = toks[kind]
    assert tok.kind == kind
    assert (tok.id_to_piece(0), tok.id_to_piece(1)) == ("<s>", "<unk>")
    for t in transcripts():
        ids = tok.encode(t)
        assert ids and 0 not in ids and 1 not in ids, (t, ids)  # training text is fully in-vocabulary
        assert all(0 <= i < tok.vocab_size for i in ids)
    # Characters never seen in training ("火星", a snowman) must map to <unk>, never to a real id.
    assert 1 in tok.encode("火星 ☃")
    assert tok.encode("") == [] and tok.encode("   ") == []
    assert tok.encode_batch(["", "the dog"])[0] == []


@pytest.mark.parametrize("kind", ["char", "sentencepiece", "simple"])
def test_round_trip(toks: dict[str, Tokenizer], kind: str) -> None:
    tok = toks[kind]
    for t in transcripts():
        assert tok.decode(tok.encode(t)) == " ".join(t.split())
    assert tok.decode([0, *tok.encode("the dog"), 0]) == "the dog"  # the blank carries no text


def test_jieba_words_spaces_and_latin(toks: dict[str, Tokenizer]) -> None:
    tok = toks["jieba"]
    pieces = [tok.id_to_piece(i) for i in tok.encode("我爱 hello world 语音识别")]
    assert "hello" in pieces and "world" in pieces  # Latin words stay whole
    assert not any(p.isspace() for p in pieces)
    # Documented decode rule: a space only between two Latin/digit edges.
    assert tok.decode(tok.encode("我爱 hello world 语音识别")) == "我爱hello world语音识别"
    assert tok.decode(tok.encode("speech recognition with subword units")) == "speech recognition with subword units"
    # A space is a word boundary jieba never cuts across, but never a token itself.
    assert [tok.id_to_piece(i) for i in tok.encode("今天 天气")] == ["今天", "天气"]


def test_vocab_size_caps_char_and_jieba(text_file: Path, tmp_path: Path) -> None:
    for kind in ("char", "jieba", "simple"):
        tok = train_tokenizer(kind, [text_file], tmp_path / f"{kind}.json", vocab_size=12)
        assert tok.vocab_size == 12
        ids = [i for t in transcripts() for i in tok.encode(t)]
        assert 1 in ids and max(ids) < 12  # rare pieces fell out and became <unk>
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer("sentencepiece", [text_file], tmp_path / "s.json")
    with pytest.raises(ValueError, match="too high"):
        train_tokenizer("sentencepiece", [text_file], tmp_path / "s.json", vocab_size=5000)


def test_char_drop_spaces(text_file: Path, tmp_path: Path) -> None:
    tok = train_tokenizer("char", [text_file], tmp_path / "c.json", keep_spaces=False)
    assert "<space>" not in {tok.id_to_piece(i) for i in range(tok.vocab_size)}
    assert tok.decode(tok.encode("今天天气很好 我们去公园")) == "今天天气很好我们去公园"


def test_spm_bpe_and_char_model_types(text_file: Path, tmp_path: Path) -> None:
    for mt, kw in (("bpe", SPM_OPTS), ("char", dict(character_coverage=1.0))):
        tok = train_tokenizer("sentencepiece", [text_file], tmp_path / f"{mt}.json", model_type=mt, **kw)
        assert (tok.id_to_piece(0), tok.id_to_piece(1)) == ("<s>", "<unk>")
        for t in transcripts():
            assert tok.decode(tok.encode(t)) == " ".join(t.split())


@pytest.mark.parametrize("kind", KINDS)
def test_saved_file_is_json_and_reloads(toks: dict[str, Tokenizer], tmp_path: Path, kind: str) -> None:
    path = tmp_path / "t.json"
    toks[kind].save(path)
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert raw[:1] == b"{" and doc["format"] == "wdsprep-tokenizer" and doc["kind"] == kind
    # Version 1 readers can read what they know; a new kind says version 2, so they refuse it.
    assert doc["version"] == (2 if kind == "simple" else 1)
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(raw)
    loaded = load_tokenizer(path)
    assert loaded.vocab_size == toks[kind].vocab_size == doc["vocab_size"]
    assert [loaded.encode(t) for t in transcripts()] == [toks[kind].encode(t) for t in transcripts()]
    with pytest.raises(FileExistsError, match="overwrite"):
        toks[kind].save(path)
    # In-memory pickling (DataLoader workers started with spawn) must work too.
    clone = pickle.loads(pickle.dumps(loaded))
    assert clone.encode("我们今天去北京") == loaded.encode("我们今天去北京")


def test_load_errors(toks: dict[str, Tokenizer], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")
    pkl = tmp_path / "cat.tknz"
    pkl.write_bytes(pickle.dumps({"vocab": [1, 2]}))
    with pytest.raises(TokenizerFileError, match="pickle"):
        load_tokenizer(pkl)
    good = tmp_path / "spm.json"
    toks["sentencepiece"].save(good)
    doc = json.loads(good.read_text(encoding="utf-8"))
    cases = {
        "not a wdsprep tokenizer": {"hello": 1},
        "unknown tokenizer kind": {**doc, "kind": "wordpiece"},
        "version": {**doc, "version": 99},
        "versions 1 to 3": {**doc, "version": 0},
        "damaged": {**doc, "model": base64.b64encode(b"not a model proto").decode()},
        "lacks the 'model' field": {k: v for k, v in doc.items() if k != "model"},
    }
    for expected, bad in cases.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(TokenizerFileError, match=expected) as err:
            load_tokenizer(path)
        assert str(path) in str(err.value)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        toks["char"].decode([toks["char"].vocab_size])


_HEAD = {"format": "wdsprep-tokenizer", "version": 2}
_VOCAB = ["<s>", "<unk>", "<space>", "北京"]
# What a damaged or crafted tokenizer file may hold, and what its one-line error must say: each
# was once a RecursionError, a raw ValueError / AttributeError / OverflowError naming no file, a
# message of a megabyte, or a file that loaded and encoded differently (or failed at the first
# transcript, in the middle of training).
HOSTILE: dict[str, tuple[object, str]] = {
    "nested_json": ('{"format": "wdsprep-tokenizer", "version": 1, "kind": "char", "vocab": '
                    + "[" * 100_000 + "]" * 100_000 + "}", "cannot be read as a tokenizer.*recursion"),
    "huge_number": ('{"format": "wdsprep-tokenizer", "version": 1, "kind": "char", "vocab_size": ' + "9" * 5000
                    + "}", r"cannot be read as a tokenizer.*4300 digits"),
    "version_true": ({**_HEAD, "version": True, "kind": "simple", "vocab": _VOCAB}, "version True"),
    "keep_spaces_text": ({**_HEAD, "kind": "char", "vocab": _VOCAB, "keep_spaces": "false"},
                         "field 'keep_spaces' = 'false', which must be true or false"),
    "vocab_number": ({**_HEAD, "kind": "char", "vocab": 5, "keep_spaces": True}, "field 'vocab' = 5"),
    "vocab_nested": ({**_HEAD, "kind": "simple", "vocab": [*_VOCAB, ["x"]]}, "field 'vocab' = .*list of strings"),
    "model_number": ({**_HEAD, "kind": "sentencepiece", "model": 5}, "field 'model' = 5"),
    "kind_huge": ({**_HEAD, "kind": "x" * 1_000_000}, r"unknown tokenizer kind 'xxx+\.\.\."),
    "vocab_size_huge": ({**_HEAD, "kind": "simple", "vocab": _VOCAB, "vocab_size": "9" * 100_000},
                        r"says vocab_size '999+\.\.\. but holds 4"),
    "user_dict_inf": ({**_HEAD, "kind": "jieba", "vocab": _VOCAB[:2], "user_dict": [["北京", 1e309]]},
                      r"field 'user_dict' = \[\['北京', inf\]\]"),
    "user_dict_negative": ({**_HEAD, "kind": "jieba", "vocab": _VOCAB[:2], "user_dict": [["北京", -5]]},
                           "field 'user_dict'"),
    "dictionary_number": ({**_HEAD, "kind": "jieba", "vocab": _VOCAB[:2], "dictionary": 5}, "field 'dictionary' = 5"),
    "dictionary_negative": ({**_HEAD, "kind": "jieba", "vocab": _VOCAB[:2], "dictionary": "北京 -3\n"},
                            "negative count"),
    "dictionary_bad_line": ({**_HEAD, "kind": "jieba", "vocab": _VOCAB[:2], "dictionary": "北京 3\n我们 x\n"},
                            "in the dictionary at Line 2: 我们 x"),
    "lexicon_list": ({**_HEAD, "kind": "lexicon", "units": _VOCAB, "lexicon": [], "unk": [1]},
                     "field 'lexicon' = \\[\\]"),
    "lexicon_inf": ({**_HEAD, "kind": "lexicon", "units": _VOCAB, "lexicon": {"北京": [1e309]}, "unk": [1]},
                    "field 'lexicon'"),
    "lexicon_text_ids": ({**_HEAD, "kind": "lexicon", "units": _VOCAB, "lexicon": {"北京": "12"}, "unk": [1]},
                         "field 'lexicon'"),
    "lexicon_huge_id": ('{"format": "wdsprep-tokenizer", "version": 2, "kind": "lexicon", "units": ["<s>", "<unk>"], '
                        '"lexicon": {"w": [' + "9" * 4000 + ']}, "unk": [1]}', "token id <an integer of 13288 bits>"),
    "unk_number": ({**_HEAD, "kind": "lexicon", "units": _VOCAB, "lexicon": {"北京": [3]}, "unk": 1},
                   "field 'unk' = 1"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_tokenizer_files_are_one_line_errors(tmp_path: Path, name: str) -> None:
    content, expected = HOSTILE[name]
    path = tmp_path / f"{name}.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(TokenizerFileError) as err:
        tok = load_tokenizer(path)
        tok.encode("我们 北京 a")  # what the loader does next must not be where it fails
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 400, message[:1000]
    assert re.search(expected, message), message


@pytest.mark.timeout(120)
def test_a_fifo_as_tokenizer_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "tok.json"
    os.mkfifo(fifo)
    code = ("import sys\nfrom wdsprep.tokenizer import load_tokenizer, read_cat_tokenizer\n"
            "for read in (load_tokenizer, read_cat_tokenizer):\n"
            "    try:\n        read(sys.argv[1])\n    except Exception as e:\n        print(type(e).__name__, e)\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading a FIFO as a tokenizer file waited for a writer")
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"TokenizerFileError {fifo}: is a FIFO") for line in lines), r


def test_no_tokenizer_module_imports_one_that_imports_it_back() -> None:
    """Issue 26: no import cycle in wdsprep/tokenizer, imports inside functions included."""
    import grimp

    graph = grimp.build_graph("wdsprep")
    ours = {m for m in graph.modules if m.startswith("wdsprep.tokenizer.")}
    cycles = [(a, b) for a in sorted(ours) for b in sorted(graph.find_modules_directly_imported_by(a) & ours)
              if graph.chain_exists(importer=b, imported=a)]
    assert not cycles, cycles
    # The public names are the same objects wherever they are reached from.
    import wdsprep
    import wdsprep.tokenizer as tk

    assert set(tk.__all__) >= {"load_tokenizer", "train_tokenizer", "Tokenizer", "TokenizerFileError",
                               "import_cat_tokenizer", "read_cat_tokenizer", "SubwordSampling"}
    assert all(getattr(wdsprep, n) is getattr(tk, n) for n in tk.__all__ if hasattr(wdsprep, n))


def test_training_text_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "text"
    bad.write_bytes("utt1 你好\n".encode() + "utt2 你好\n".encode("gbk"))
    for kind in KINDS:
        with pytest.raises(KaldiDataError, match=f"{bad}:2"):
            train_tokenizer(kind, [bad], tmp_path / f"{kind}.json", vocab_size=50)
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        train_tokenizer("bytes", [bad], tmp_path / "x.json")


def test_options_of_another_kind_are_refused_unless_at_their_default(text_file: Path, tmp_path: Path) -> None:
    for kind, option, why in (("char", {"user_dict": text_file}, "user_dict is for --kind jieba, not 'char'"),
                              ("jieba", {"spm_options": {"split_digits": True}},
                               "spm_options is for --kind sentencepiece, not 'jieba'"),
                              ("char", {"model_type": "bpe"}, "model_type is for --kind sentencepiece"),
                              ("sentencepiece", {"keep_spaces": False}, "keep_spaces is for --kind char")):
        with pytest.raises(ValueError, match=why):
            train_tokenizer(kind, [text_file], tmp_path / "t.json", **option)
    assert not (tmp_path / "t.json").exists()
    # at their defaults (what the CLI passes for every kind) they are no one's business
    train_tokenizer("char", [text_file], tmp_path / "t.json", model_type="unigram", spm_options={}, keep_spaces=True)


class LowerWords(SimpleTokenizer):
    """A kind as a new module would add one: words looked up in lower case, trained on lower-cased text."""

    kind = "lower-words"

    def encode(self, text: str) -> list[int]:
        return super().encode(text.lower())

    @classmethod
    def train(cls, text_files, vocab_size, *, keep_spaces: bool = True) -> LowerWords:
        words = Counter(w.lower() for t in tk_base.transcripts(text_files) for w in t.split())
        return cls(tk_base.vocabulary(words, vocab_size, [BOS, UNK]))


def test_a_registered_kind_is_trained_read_and_offered_with_no_other_change(text_file, tmp_path, monkeypatch,
                                                                             capsys) -> None:
    """The registry is the one list of kinds: the file reader, train_tokenizer (with the kind's own
    options) and the CLI's --kind choices all take a kind that registers itself."""
    from wdsprep.cli import main

    assert tk.KINDS == tk_base.trainable_kinds() == tuple(KINDS)
    assert set(tk.FILE_KINDS) == set(KINDS) | {"lexicon", "aggregate"}
    assert not tk_base.REGISTRY["lexicon"].trainable() and not tk_base.REGISTRY["aggregate"].trainable()
    signature = inspect.signature(train_tokenizer).parameters
    assert all(o in signature for k in tk.FILE_KINDS for o in tk_base.REGISTRY[k].train_options())
    monkeypatch.setitem(tk_base.REGISTRY, LowerWords.kind, LowerWords)
    tok = train_tokenizer("lower-words", [text_file], tmp_path / "lw.json", keep_spaces=True)
    assert isinstance(tok, LowerWords) and tok.encode("The DOG") == tok.encode("the dog") != [1, 1]
    again = load_tokenizer(tmp_path / "lw.json")
    assert type(again) is LowerWords and again.encode("THE dog") == tok.encode("the dog")
    with pytest.raises(ValueError, match="model_type is for --kind sentencepiece, not 'lower-words'"):
        train_tokenizer("lower-words", [text_file], tmp_path / "x.json", model_type="bpe")
    assert main(["tokenizer", "train", "--kind", "lower-words", "--text", str(text_file), "--out",
                 str(tmp_path / "cli.json")]) == 0
    assert type(load_tokenizer(tmp_path / "cli.json")) is LowerWords
    with pytest.raises(SystemExit):
        main(["tokenizer", "train", "--kind", "lexicon", "--text", str(text_file), "--out", str(tmp_path / "l.json")])
    err = capsys.readouterr().err.splitlines()[-1]
    assert "invalid choice: 'lexicon'" in err and [k for k in (*KINDS, "lower-words") if k not in err] == []


def _segmentations(tok: Tokenizer, texts: list[str], sampling: SubwordSampling, calls: int) -> list[tuple[int, ...]]:
    return [tuple(ids) for _ in range(calls) for ids in tok.encode_batch(texts, sampling=sampling)]


def test_subword_sampling_is_seeded(toks: dict[str, Tokenizer]) -> None:
    tok = toks["sentencepiece"]
    texts = ["speech recognition with subword units", "the lazy dog recognised the speaker"] * 4
    sampling = SubwordSampling(alpha=0.5)
    tok.seed(derive_seed(1, 0, 0, 0))
    first = _segmentations(tok, texts, sampling, calls=3)
    tok.seed(derive_seed(1, 0, 0, 0))
    assert _segmentations(tok, texts, sampling, calls=3) == first  # same seed, same segmentations
    tok.seed(derive_seed(1, 1, 0, 0))
    assert _segmentations(tok, texts, sampling, calls=3) != first  # next epoch differs
    # Sampling really samples: one sentence gets several segmentations, across items and across calls.
    assert len({s for s, t in zip(first, texts * 3) if t == texts[0]}) > 2
    assert len(set(first[: len(texts)]) | set(first[len(texts):])) > len(set(first[: len(texts)]))
    # Every sample is a valid segmentation of its text; without sampling, batch == per-item encode.
    assert all(tok.decode(s) == t for s, t in zip(first, texts * 3))
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_sampling_validation(toks: dict[str, Tokenizer]) -> None:
    for kind in ("char", "jieba", "simple"):
        with pytest.raises(ValueError, match="sentencepiece"):
            toks[kind].encode_batch(["the dog"], sampling=SubwordSampling())
        toks[kind].seed(3)  # a no-op, but callable for every kind
        assert toks[kind].encode_batch(["the dog"]) == [toks[kind].encode("the dog")]
    for bad in (dict(nbest_size=1), dict(nbest_size=0), dict(alpha=0.0)):
        with pytest.raises(ValueError):
            SubwordSampling(**bad)


def test_jieba_user_dict_changes_segmentation_and_is_embedded(text_file: Path, tmp_path: Path) -> None:
    import jieba

    ud = tmp_path / "user.dict"
    ud.write_text("语音识别 100 n\n有趣的问题 50\n", encoding="utf-8")
    with_ud = train_tokenizer("jieba", [text_file], tmp_path / "ud.json", user_dict=str(ud))
    # Trained after: the user dictionary must not leak into other tokenizers in the process.
    plain = train_tokenizer("jieba", [text_file], tmp_path / "plain.json")
    text = "语音识别是一个有趣的问题"
    assert [plain.id_to_piece(i) for i in plain.encode(text)] != [with_ud.id_to_piece(i) for i in with_ud.encode(text)]
    assert "语音识别" in [with_ud.id_to_piece(i) for i in with_ud.encode(text)]
    ud.unlink()  # the dictionary lives inside the tokenizer file
    reloaded = load_tokenizer(tmp_path / "ud.json")
    assert reloaded.encode(text) == with_ud.encode(text)
    # Nor into jieba's global tokenizer.
    assert "语音识别" not in jieba.dt.FREQ
    bad = tmp_path / "bad.dict"
    bad.write_text("好词 10 n\n坏 行 多 了\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{bad}:2"):
        train_tokenizer("jieba", [text_file], tmp_path / "x.json", user_dict=str(bad))


def test_training_is_quiet(text_file: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    train_tokenizer("sentencepiece", [text_file], tmp_path / "s.json", **SPM_OPTS)
    train_tokenizer("jieba", [text_file], tmp_path / "j.json")
    err = capfd.readouterr().err
    assert not any(s in err for s in STDERR_SPAM), err


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def test_cli_train_and_encode(text_file: Path, toks: dict[str, Tokenizer], tmp_path: Path) -> None:
    ud = tmp_path / "user.dict"
    ud.write_text("语音识别 100\n", encoding="utf-8")
    out = tmp_path / "jieba.json"
    # A fresh process builds jieba's prefix dict: the place its log line would appear.
    r = _cli("tokenizer", "train", "--kind", "jieba", "--text", str(text_file), "--out", str(out),
             "--user-dict", str(ud))
    assert r.returncode == 0, r.stderr
    assert not any(s in r.stderr for s in STDERR_SPAM), r.stderr
    jtok = load_tokenizer(out)
    r = _cli("tokenizer", "encode", "--tokenizer", str(out), stdin="我爱语音识别\nthe dog\n")
    assert r.returncode == 0 and not any(s in r.stderr for s in STDERR_SPAM), r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    pieces, ids = lines[0].split("\t")
    assert "语音识别" in pieces.split()  # --user-dict reached the tokenizer
    assert list(map(int, ids.split())) == jtok.encode("我爱语音识别")
    assert pieces.split() == [jtok.id_to_piece(i) for i in jtok.encode("我爱语音识别")]

    spm_path = tmp_path / "spm.json"
    toks["sentencepiece"].save(spm_path)
    r = _cli("tokenizer", "encode", "--tokenizer", str(spm_path), "--ids-only", "the lazy dog", "语音识别")
    assert r.returncode == 0, r.stderr
    assert [list(map(int, line.split())) for line in r.stdout.splitlines()] == [
        toks["sentencepiece"].encode("the lazy dog"), toks["sentencepiece"].encode("语音识别")]

    r = _cli("tokenizer", "encode", "--tokenizer", str(tmp_path / "nope.json"), "x")
    assert r.returncode == 2 and "nope.json" in r.stderr
    with pytest.raises(FileExistsError, match="overwrite"):
        train_tokenizer("char", [text_file], out)


def test_cli_spm_options_reach_the_trainer(text_file: Path, tmp_path: Path) -> None:
    """Every option of train_tokenizer is reachable from the CLI, sentencepiece's trainer options included."""
    from wdsprep.cli import key_value

    assert key_value("add_dummy_prefix=false") == ("add_dummy_prefix", False)
    assert key_value("input_sentence_size=1000") == ("input_sentence_size", 1000)
    assert key_value("split_by_whitespace=True") == ("split_by_whitespace", True)
    assert key_value("seed_sentencepiece_size=1e3") == ("seed_sentencepiece_size", 1000.0)
    assert key_value("user_defined_symbols=<a>,<b>") == ("user_defined_symbols", "<a>,<b>")
    opts = {"add_dummy_prefix": False, "use_all_vocab": True}
    api = train_tokenizer("sentencepiece", [text_file], tmp_path / "api.json", model_type="char",
                          character_coverage=1.0, spm_options=opts)
    r = _cli("tokenizer", "train", "--kind", "sentencepiece", "--model-type", "char", "--character-coverage", "1.0",
             "--text", str(text_file), "--out", str(tmp_path / "cli.json"),
             "--spm-option", "add_dummy_prefix=false", "--spm-option", "use_all_vocab=true")
    assert r.returncode == 0, r.stderr
    cli = load_tokenizer(tmp_path / "cli.json")
    default = train_tokenizer("sentencepiece", [text_file], tmp_path / "default.json", model_type="char",
                              character_coverage=1.0)
    texts = transcripts()
    assert [cli.encode(t) for t in texts] == [api.encode(t) for t in texts]
    assert [default.encode(t) for t in texts] != [api.encode(t) for t in texts]  # the option made a difference
    r = _cli("tokenizer", "train", "--kind", "sentencepiece", "--text", str(text_file), "--out", str(tmp_path / "x"),
             "--vocab-size", "50", "--spm-option", "add_dummy_prefix")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr
    r = _cli("tokenizer", "train", "--kind", "sentencepiece", "--text", str(text_file), "--out", str(tmp_path / "x"),
             "--vocab-size", "50", "--spm-option", "bos_id=3")
    assert r.returncode == 2 and "bos_id" in r.stderr
    with pytest.raises(ValueError, match="for --kind sentencepiece"):
        train_tokenizer("char", [text_file], tmp_path / "c.json", spm_options=opts)


def test_sentencepiece_model_file_loads_directly(toks: dict[str, Tokenizer], text_file: Path, tmp_path: Path) -> None:
    """A CAT user's spm .model (protobuf, no pickle) is a tokenizer as it is, with the model's own ids."""
    import warnings

    import sentencepiece as spm

    model = tmp_path / "spm.model"
    model.write_bytes(base64.b64decode(toks["sentencepiece"].to_dict()["model"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CAT's convention: no warning
        tok = load_tokenizer(model)
    assert [tok.encode(t) for t in transcripts()] == [toks["sentencepiece"].encode(t) for t in transcripts()]
    # A model trained with sentencepiece's defaults (<unk>=0, <s>=1, </s>=2): ids kept, with a warning.
    plain_text = tmp_path / "plain.txt"
    plain_text.write_text("\n".join(transcripts()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(plain_text), model_prefix=str(tmp_path / "plain"), vocab_size=60,
                                   character_coverage=1.0, minloglevel=2)
    with pytest.warns(UserWarning, match=r"id 0 is '<unk>'.*blank.*ids are kept"):
        plain = load_tokenizer(tmp_path / "plain.model")
    ref = spm.SentencePieceProcessor(model_file=str(tmp_path / "plain.model"))
    assert [plain.encode(t) for t in transcripts()] == [ref.encode(t) for t in transcripts()]
    assert plain.vocab_size == ref.vocab_size()
    junk = tmp_path / "junk.model"
    junk.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(TokenizerFileError, match="nor a sentencepiece .model"):
        load_tokenizer(junk)
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(TokenizerFileError, match="nor a sentencepiece .model"):
        load_tokenizer(tmp_path / "empty.model")


DEMO = Path(__file__).resolve().parents[1] / "egs" / "demo"


def test_a_manifest_or_packed_shards_train_the_tokenizer_their_kaldi_text_trains(tmp_path: Path) -> None:
    """tokenizer train --from nemo manifest.json and --trset SHARDS give, byte for byte, the tokenizer
    the same transcripts in a Kaldi text give (a real sentencepiece, the demo corpus's English and
    Mandarin); a language's alone, and one per language laid out as an aggregate, from the
    manifest's languages."""
    import gzip
    import random

    from wdsprep import ShardTranscripts, pack_audio, train_aggregate_tokenizer
    from wdsprep.cli import main

    lines = (DEMO / "data" / "train" / "text").read_text(encoding="utf-8").splitlines()
    texts = dict(line.split(" ", 1) for line in lines)
    wavs = {u: str(DEMO / p) for u, p in (x.split(" ", 1) for x in (DEMO / "data" / "train" / "wav.scp")
                                            .read_text().splitlines())}
    text = tmp_path / "text"
    text.write_text("".join(f"{u} {texts[u]}\n" for u in sorted(texts)), encoding="utf-8")  # Kaldi: sorted
    ids = sorted(texts)
    random.Random(0).shuffle(ids)  # a manifest in any order
    manifest = tmp_path / "train.json"
    manifest.write_text("".join(json.dumps({"audio_filepath": wavs[u], "duration": 1.0, "text": texts[u],
                                            "lang": u[:2], "id": u}) + "\n" for u in ids), encoding="utf-8")
    (tmp_path / "wav.scp").write_text("".join(f"{u} {p}\n" for u, p in wavs.items()))
    pack_audio(tmp_path / "wav.scp", text, tmp_path / "shards", store="flac", utts_per_shard=40, progress=False)
    spm = ["--kind", "sentencepiece", "--vocab-size", "150"]
    for source, out in ((["--text", str(text)], "kaldi"), (["--from", "nemo", str(manifest)], "nemo"),
                        (["--trset", str(tmp_path / "shards")], "shards")):
        assert main(["tokenizer", "train", *spm, *source, "--out", str(tmp_path / f"{out}.json")]) == 0
    kaldi = (tmp_path / "kaldi.json").read_bytes()
    assert (tmp_path / "nemo.json").read_bytes() == kaldi and (tmp_path / "shards.json").read_bytes() == kaldi

    for lang in ("en", "zh"):
        (tmp_path / f"text.{lang}").write_text("".join(f"{u} {texts[u]}\n" for u in sorted(texts) if u[:2] == lang),
                                               encoding="utf-8")
        train_tokenizer("char", [tmp_path / f"text.{lang}"], tmp_path / f"{lang}.json")
    assert main(["tokenizer", "train", "--kind", "char", "--from", "nemo", str(manifest), "--lang", "zh", "--out",
                 str(tmp_path / "zh-nemo.json")]) == 0
    assert (tmp_path / "zh-nemo.json").read_bytes() == (tmp_path / "zh.json").read_bytes()
    assert main(["tokenizer", "aggregate", "--from", "nemo", str(manifest), "--kind", "char", "--out",
                 str(tmp_path / "agg.json")]) == 0
    agg = load_tokenizer(tmp_path / "agg.json")
    assert list(agg.tokenizers) == ["en", "zh"]
    assert all(agg.tokenizers[lang].to_dict() == load_tokenizer(tmp_path / f"{lang}.json").to_dict()
               for lang in ("en", "zh"))
    with pytest.raises(ValueError, match="173 transcripts name no language"):  # the shards carry none
        train_aggregate_tokenizer("char", ShardTranscripts(tmp_path / "shards"), tmp_path / "none.json")
    gz = tmp_path / "train.json.gz"
    gz.write_bytes(gzip.compress(manifest.read_bytes()))
    with pytest.raises(KaldiDataError, match="gzip-compressed, not a Kaldi table.*--from KIND PATH"):
        train_tokenizer("char", [gz], tmp_path / "gz.json")
