"""Special tokens (a language tag, a task prompt): one id each wherever they appear, in transcripts and
text fields, never split or changed by a text treatment, shared by every language of an aggregate
tokenizer, and warned about when a text field is mostly symbols the tokenizer does not know."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from shardsets import make_multilingual_dir

from wdsprep import load_tokenizer, make_loader, pack_data
from wdsprep.plan.transforms import Transforms
from wdsprep.tokenizer import SubwordSampling, aggregate_tokenizers, parse_normalize, train_tokenizer

SPECIALS = ["<|en|>", "<|zh|>", "<|transcribe|>"]
KINDS = {"char": {}, "simple": {}, "jieba": {}, "sentencepiece": {"model_type": "char"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """English and Mandarin utterances whose field ``prompt`` is their language's tag and the task,
    packed with the language and the prompt; a tokenizer of each kind with the special tokens."""
    root = tmp_path_factory.mktemp("specials")
    kd = root / "kaldi"
    utts = make_multilingual_dir(kd, {"en": 60, "zh": 40})
    (kd / "prompt").write_text("".join(f"{u} <|{lang}|><|transcribe|>\n" for u, (lang, _, _) in utts.items()))
    out = root / "shards"
    pack_data(kd / "feats.scp", kd / "text", out, utts_per_shard=25, utt2lang=kd / "utt2lang",
              fields={"prompt": kd / "prompt"}, progress=False)
    toks = {kind: train_tokenizer(kind, [kd / "text"], root / f"{kind}.json", special_tokens=SPECIALS, **kw)
            for kind, kw in KINDS.items()}
    return root, kd, out, utts, toks


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_special_token_is_one_id_and_the_text_after_it_is_encoded_as_alone(corpus, kind):
    root, _, _, _, toks = corpus
    tok = load_tokenizer(root / f"{kind}.json")  # as saved and read back
    ids = {s: tok.encode(s) for s in SPECIALS}
    assert all(len(i) == 1 for i in ids.values()) and len({i[0] for i in ids.values()}) == 3
    hello = tok.encode("hello")
    assert tok.encode("<|en|><|transcribe|>hello") == ids["<|en|>"] + ids["<|transcribe|>"] + hello
    assert [tok.id_to_piece(i[0]) for i in ids.values()] == SPECIALS
    assert tok.special_tokens == tuple(SPECIALS)
    assert tok.encode_batch(["<|zh|>hello", "hello"]) == [ids["<|zh|>"] + hello, hello]


def test_the_cli_trains_with_special_tokens_and_encode_shows_them(corpus, tmp_path):
    _, kd, _, _, _ = corpus
    w = [sys.executable, "-m", "wdsprep", "tokenizer"]
    subprocess.run(w + ["train", "--kind", "char", "--text", str(kd / "text"), "--out", str(tmp_path / "c.json"),
                        "--special-tokens", "<|en|>", "<|transcribe|>"], check=True, capture_output=True)
    r = subprocess.run(w + ["encode", "--tokenizer", str(tmp_path / "c.json"), "<|en|><|transcribe|>hello"],
                       check=True, capture_output=True, text=True)
    pieces, ids = r.stdout.rstrip("\n").split("\t")
    assert pieces.split() == ["<|en|>", "<|transcribe|>", "h", "e", "l", "l", "o"]
    assert ids.split()[:2] == ["3", "4"]  # after <s>, <unk> and <space>


def test_an_aggregate_trained_from_the_shards_shares_the_special_tokens(corpus, tmp_path):
    """tokenizer aggregate --trset --kind char --special-tokens: a tokenizer per packed language, the
    symbols one id each before the languages' ranges, shared by both."""
    _, _, out, _, _ = corpus
    subprocess.run([sys.executable, "-m", "wdsprep", "tokenizer", "aggregate", "--trset", f"{out}/data-*.tar",
                    "--kind", "char", "--special-tokens", "<|en|>", "<|transcribe|>", "--out",
                    str(tmp_path / "agg.json")], check=True, capture_output=True)
    agg = load_tokenizer(tmp_path / "agg.json")
    assert agg.special_tokens == ("<|en|>", "<|transcribe|>") and set(agg.offsets) == {"en", "zh"}
    assert min(agg.offsets.values()) == 4
    for lang in ("en", "zh"):
        assert agg.encode("<|en|><|transcribe|>", lang) == [2, 3]

def test_an_aggregate_tokenizer_gives_each_special_token_one_id_shared_by_every_language(corpus, tmp_path):
    root, _, _, _, _ = corpus
    plain = {lang: train_tokenizer("char", [root / "kaldi" / "text"], tmp_path / f"{lang}.json")
             for lang in ("en", "zh")}
    agg = aggregate_tokenizers({"en": tmp_path / "en.json", "zh": root / "char.json"}, tmp_path / "agg.json",
                               special_tokens=["<|nospeech|>"])
    agg = load_tokenizer(tmp_path / "agg.json")
    # The given one first, then the languages' own: ids 2, 3, ... before the languages' ranges.
    assert agg.special_tokens == ("<|nospeech|>", *SPECIALS)
    assert agg.offsets["en"] == 2 + 4 and agg.offsets["zh"] == 6 + plain["en"].vocab_size - 2
    for lang in ("en", "zh"):
        ids = agg.encode("<|nospeech|><|en|><|transcribe|>hello", lang)
        assert ids[:3] == [2, 3, 5] and agg.decode(ids).startswith("<|nospeech|> <|en|> <|transcribe|>")
        assert all(agg.language_of(i)[0] == lang for i in ids[3:])


def test_a_prompt_field_of_special_tokens_reaches_the_batch_as_their_ids(corpus):
    """The field holds '<|en|><|transcribe|>' per utterance; tokenized like the labels (text_fields),
    it is those two ids in every batch, for each utterance's language, with a text treatment that
    would have broken the tags (strip_punct, upper)."""
    root, _, out, utts, toks = corpus
    tok = load_tokenizer(root / "char.json")
    loader = make_loader(f"{out}/data-*.tar", root / "char.json", max_frames=2000, text_fields=["prompt"],
                         normalize=["upper", "strip_punct"])
    loader.set_epoch(0)
    seen = 0
    for b in loader:
        for k, key in enumerate(b.keys):
            lang = utts[key][0]
            n = int(b.field_lens["prompt"][k])
            assert b.field_tokens["prompt"][k, :n].tolist() == tok.encode(f"<|{lang}|><|transcribe|>")
            seen += 1
    assert seen == len(utts)


def test_a_text_treatment_leaves_special_tokens_whole():
    t = Transforms(load_tokenizer_like(), parse_normalize(["lower", "strip_punct"]))
    assert t.encode(["<|EN|> Hello, World!"], langs=None) == t.encode(["<|EN|>hello world"], langs=None)


def load_tokenizer_like():
    from wdsprep.tokenizer import CharTokenizer

    return CharTokenizer(["<s>", "<unk>", "<space>", "<|EN|>", "h", "e", "l", "o", "w", "r", "d"],
                         special_tokens=["<|EN|>"])


def test_subword_sampling_never_splits_a_special_token(tmp_path):
    words = "speech recognition with subword units the lazy dog recognised the speaker quickly".split()
    rng = np.random.default_rng(0)
    (tmp_path / "text").write_text("".join(f"u{k} {' '.join(rng.choice(words, 6))}\n" for k in range(300)))
    tok = train_tokenizer("sentencepiece", [tmp_path / "text"], tmp_path / "u.json", vocab_size=36,
                          special_tokens=SPECIALS)
    tok.seed(3)
    ids = tok.encode_batch(["<|en|><|transcribe|>speech recognition with subword units"] * 20,
                           sampling=SubwordSampling(alpha=0.01))  # flat: a small model samples at all
    head = tok.encode("<|en|><|transcribe|>")
    assert all(x[:2] == head for x in ids) and len({tuple(x) for x in ids}) > 1  # sampled, tags whole


def test_a_field_of_symbols_the_tokenizer_does_not_know_warns_once_naming_it(corpus, tmp_path):
    root, kd, out, _, _ = corpus
    train_tokenizer("char", [kd / "text"], tmp_path / "plain.json")
    loader = make_loader(f"{out}/data-*.tar", tmp_path / "plain.json", max_frames=2000, text_fields=["prompt"])
    loader.set_epoch(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
    said = [str(w.message) for w in caught if "text field 'prompt'" in str(w.message)]
    assert len(said) == 1 and "<|" in said[0] and "--special-tokens" in said[0], said


def test_a_model_without_the_symbols_is_refused_naming_them(corpus, tmp_path):
    root, kd, _, _, _ = corpus
    import json

    plain = train_tokenizer("sentencepiece", [kd / "text"], tmp_path / "p.json", model_type="char")
    doc = json.loads((tmp_path / "p.json").read_text())
    doc.update(version=3, special_tokens=["<|fr|>"])
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"special tokens \['<\|fr\|>'\] are no pieces of this sentencepiece model"):
        load_tokenizer(tmp_path / "bad.json")
    assert np.array_equal(plain.encode("<|en|>"), load_tokenizer(tmp_path / "p.json").encode("<|en|>"))
