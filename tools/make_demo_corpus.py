#!/usr/bin/env python3
"""Synthesize a small English + Mandarin speech corpus with espeak-ng, as a Kaldi data dir.

    python tools/make_demo_corpus.py --out egs/demo/data --num-utts 206 --seed 0

Writes
    OUT/train/{wav.scp,text,utt2spk,spk2utt,utt2dur}
    OUT/dev/{wav.scp,text,utt2spk,spk2utt,utt2dur}
    OUT/audio/<uttid>.flac          16 kHz, mono, 16-bit FLAC

Paths in wav.scp are RELATIVE TO THE PARENT OF --out (override with --root, or use --abs-paths).
For the committed corpus (--out egs/demo/data) that is egs/demo/, the directory the recipe runs
from, as Kaldi recipes do: `data/audio/en_m1_r1.00_p50-0001.flac`.

The tool needs espeak-ng and sox on PATH (apt-get install -y espeak-ng sox); the corpus it writes
needs neither. Sentences are composed from the hand-written word lists below (nothing is
downloaded); English goes to `-v en-us+VARIANT`, Mandarin pinyin with tone digits goes to
`-v cmn-latn-pinyin+VARIANT` while the Kaldi `text` holds the hanzi.

Transcript conventions: English is UPPER CASE words separated by single spaces, no punctuation
(LibriSpeech style); Mandarin is hanzi with no spaces and no punctuation (AISHELL style, so jieba
and character tokenizers see real Chinese).

Determinism: all choices come from one `random.Random(seed)` passed around explicitly; espeak-ng
and sox are deterministic, so the same seed with the same espeak-ng/sox builds gives the same
corpus (byte-identical text files, sample-identical audio).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import soundfile as sf

SAMPLE_RATE = 16000
ESPEAK_RATE = 22050
BASE_WPM = 175          # espeak-ng default speaking rate (words per minute)
# Peak-normalise every utterance to -24 dBFS. Quieter audio needs fewer bits: FLAC of this
# synthetic speech measured ~15.5 KB/s at -18 dBFS and ~13.2 KB/s at -24 dBFS, which is what lets
# 200+ utterances fit in 3 MB. Speech RMS then sits near -40 dBFS, still ~55 dB above 16-bit
# quantisation noise; log-mel features are insensitive to the overall level.
PEAK = 0.0625
PAD_S = 0.05            # silence kept at each end after trimming
TRIM_THRESHOLD = "0.1%"  # sox `silence` threshold: trims only (near-)digital silence

# Length classes (seconds). Each utterance draws a class, then its text is re-composed until the
# synthesized audio falls inside the class range, so the classes map onto frame groups
# `:200`, `200:400`, `400:` (10 ms frames) exactly.
LENGTH_CLASSES = {
    "short": (0.5, 1.2),
    "medium": (2.0, 4.0),
    "long": (4.0, 7.0),
}
# Default mix chosen so that the committed ~206 utterances fit in < 3 MB: most are short, but
# every frame group gets some. Counts per class are quotas (rounded), not random draws.
DEFAULT_MIX = {"short": 0.89, "medium": 0.07, "long": 0.04}
MAX_TRIES = 40


# --------------------------------------------------------------------------------------------
# Speakers: (language, espeak variant, rate factor, pitch). The id encodes them, fixed width, so
# ids sort the same way as their utterances and no speaker id is a prefix of another. The rate
# factor puts a dot in every id, on purpose: downstream code must cope with dotted Kaldi ids.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Speaker:
    lang: str      # "en" or "zh"
    variant: str   # espeak-ng variant (espeak-ng --voices=variant), e.g. m3, f2
    rate: float    # multiple of BASE_WPM
    pitch: int     # espeak-ng -p, 0..99
    part: str      # "train" or "dev"

    @property
    def id(self) -> str:
        return f"{self.lang}_{self.variant}_r{self.rate:.2f}_p{self.pitch:02d}"

    @property
    def voice(self) -> str:
        base = "en-us" if self.lang == "en" else "cmn-latn-pinyin"
        return f"{base}+{self.variant}"

    @property
    def wpm(self) -> int:
        return int(round(BASE_WPM * self.rate))


SPEAKERS = [
    Speaker("en", "m1", 1.05, 50, "train"),
    Speaker("en", "m3", 1.15, 40, "train"),
    Speaker("en", "f2", 1.00, 60, "train"),
    Speaker("en", "f4", 1.40, 55, "train"),
    Speaker("en", "m5", 1.20, 35, "train"),
    Speaker("en", "f1", 1.10, 70, "train"),
    Speaker("en", "m2", 1.15, 45, "dev"),
    Speaker("en", "f3", 1.05, 65, "dev"),
    Speaker("zh", "m1", 1.05, 50, "train"),
    Speaker("zh", "m4", 1.20, 40, "train"),
    Speaker("zh", "f2", 1.00, 60, "train"),
    Speaker("zh", "f5", 1.10, 70, "train"),
    Speaker("zh", "m6", 1.35, 45, "train"),
    Speaker("zh", "f3", 1.05, 55, "train"),
    Speaker("zh", "m3", 1.15, 50, "dev"),
    Speaker("zh", "f1", 1.10, 65, "dev"),
]

# --------------------------------------------------------------------------------------------
# English word lists (lower case here; transcripts are upper-cased).
# --------------------------------------------------------------------------------------------
EN_SHORT = [
    "yes", "no", "hello", "thank you", "good morning", "good night", "see you soon",
    "open the door", "close the window", "turn left", "turn right", "stop here", "come in",
    "well done", "not today", "maybe later", "all right", "play music", "call home",
    "next please", "seven", "twelve", "forty two", "one hundred", "red apple", "green light",
    "quiet please", "wake up", "sit down", "good luck", "happy birthday", "excuse me",
]
EN_ADJ = ["small", "old", "red", "quiet", "happy", "tall", "young", "busy", "clever", "tired",
          "brave", "gentle", "lazy", "careful", "friendly", "strange"]
EN_NOUN = ["dog", "teacher", "farmer", "child", "doctor", "bird", "driver", "student", "cat",
           "painter", "sailor", "baker", "neighbor", "captain", "singer", "horse"]
EN_VERB = ["walked", "ran", "looked", "waited", "sang", "danced", "worked", "slept", "played",
           "talked", "listened", "wandered"]
EN_PREP = ["near", "behind", "inside", "across", "beside", "around", "under", "past"]
EN_PLACE = ["river", "market", "station", "garden", "library", "bridge", "kitchen", "village",
            "harbor", "school", "forest", "museum", "hospital", "bakery", "mountain", "office"]
EN_TIME = ["this morning", "last night", "every day", "on sunday", "after lunch", "before dawn",
           "in the evening", "yesterday", "at noon", "in winter"]
EN_CONJ = ["and then", "while", "because", "but", "so", "after that", "and"]


def en_clause(rng: random.Random) -> str:
    """One clause of roughly six to nine words."""
    form = rng.randrange(3)
    if form == 0:
        words = ["the", rng.choice(EN_ADJ), rng.choice(EN_NOUN), rng.choice(EN_VERB),
                 rng.choice(EN_PREP), "the", rng.choice(EN_PLACE)]
    elif form == 1:
        words = ["a", rng.choice(EN_NOUN), rng.choice(EN_VERB), rng.choice(EN_PREP), "the",
                 rng.choice(EN_ADJ), rng.choice(EN_PLACE), rng.choice(EN_TIME)]
    else:
        words = [rng.choice(EN_TIME), "the", rng.choice(EN_NOUN), rng.choice(EN_VERB),
                 rng.choice(EN_PREP), "the", rng.choice(EN_PLACE)]
    return " ".join(words)


def en_sentence(rng: random.Random, cls: str) -> tuple[str, str]:
    """Return (transcript, text for espeak-ng)."""
    if cls == "short":
        spoken = rng.choice(EN_SHORT)
        if rng.random() < 0.3:
            spoken = f"{rng.choice(EN_ADJ)} {rng.choice(EN_NOUN)}"
        parts = [spoken]
    elif cls == "medium":
        parts = [en_clause(rng)]
    else:
        parts = [en_clause(rng)]
        for _ in range(rng.randint(1, 3)):
            parts.append(rng.choice(EN_CONJ) + " " + en_clause(rng))
    transcript = " ".join(" ".join(parts).split()).upper()
    return transcript, ", ".join(parts)


# --------------------------------------------------------------------------------------------
# Mandarin word lists: hanzi -> pinyin with tone digits (5 = neutral tone). espeak-ng speaks
# the pinyin (-v cmn-latn-pinyin); the transcript is the hanzi.
# --------------------------------------------------------------------------------------------
ZH_SHORT = {
    "你好": "ni3 hao3", "谢谢": "xie4 xie5", "再见": "zai4 jian4", "对不起": "dui4 bu5 qi3",
    "没关系": "mei2 guan1 xi5", "好的": "hao3 de5", "早上好": "zao3 shang5 hao3",
    "不客气": "bu2 ke4 qi5", "晚安": "wan3 an1", "请进": "qing3 jin4", "明白": "ming2 bai5",
    "当然": "dang1 ran2", "可以": "ke3 yi3", "加油": "jia1 you2", "欢迎": "huan1 ying2",
    "太好了": "tai4 hao3 le5", "没问题": "mei2 wen4 ti2", "开门": "kai1 men2",
    "关灯": "guan1 deng1", "慢一点": "man4 yi4 dian3", "生日快乐": "sheng1 ri4 kuai4 le4",
    "一百": "yi4 bai3", "三十五": "san1 shi2 wu3", "往左走": "wang3 zuo3 zou3",
}
ZH_SUBJ = {
    "我": "wo3", "你": "ni3", "他": "ta1", "她": "ta1", "我们": "wo3 men5", "老师": "lao3 shi1",
    "学生": "xue2 sheng1", "妈妈": "ma1 ma5", "爸爸": "ba4 ba5", "朋友": "peng2 you5",
    "医生": "yi1 sheng1", "小王": "xiao3 wang2", "他们": "ta1 men5", "哥哥": "ge1 ge5",
}
ZH_TIME = {
    "今天": "jin1 tian1", "明天": "ming2 tian1", "昨天": "zuo2 tian1", "早上": "zao3 shang5",
    "晚上": "wan3 shang5", "周末": "zhou1 mo4", "下午": "xia4 wu3", "每天": "mei3 tian1",
}
ZH_PLACE = {
    "学校": "xue2 xiao4", "公园": "gong1 yuan2", "医院": "yi1 yuan4",
    "图书馆": "tu2 shu1 guan3", "商店": "shang1 dian4", "北京": "bei3 jing1",
    "上海": "shang4 hai3", "饭馆": "fan4 guan3", "超市": "chao1 shi4", "车站": "che1 zhan4",
    "办公室": "ban4 gong1 shi4", "咖啡店": "ka1 fei1 dian4",
}
ZH_VO = {
    "看书": "kan4 shu1", "喝茶": "he1 cha2", "吃饭": "chi1 fan4", "买水果": "mai3 shui3 guo3",
    "学习中文": "xue2 xi2 zhong1 wen2", "写字": "xie3 zi4", "打电话": "da3 dian4 hua4",
    "听音乐": "ting1 yin1 yue4", "跑步": "pao3 bu4", "做饭": "zuo4 fan4", "开会": "kai1 hui4",
    "见朋友": "jian4 peng2 you5", "唱歌": "chang4 ge1", "画画": "hua4 hua4",
    "买面包": "mai3 mian4 bao1", "上课": "shang4 ke4",
}
ZH_CONJ = {
    "然后": "ran2 hou4", "但是": "dan4 shi4", "所以": "suo3 yi3", "而且": "er2 qie3",
    "因为": "yin1 wei4",
}


def _pick(rng: random.Random, table: dict[str, str]) -> tuple[str, str]:
    key = rng.choice(sorted(table))
    return key, table[key]


def zh_clause(rng: random.Random) -> list[tuple[str, str]]:
    """One clause as a list of (hanzi, pinyin) words."""
    form = rng.randrange(3)
    subj, time, place, vo = (_pick(rng, ZH_SUBJ), _pick(rng, ZH_TIME), _pick(rng, ZH_PLACE),
                             _pick(rng, ZH_VO))
    if form == 0:
        return [time, subj, ("去", "qu4"), place, vo]
    if form == 1:
        return [subj, time, ("在", "zai4"), place, vo]
    return [subj, ("喜欢", "xi3 huan5"), ("在", "zai4"), place, vo]


def zh_sentence(rng: random.Random, cls: str) -> tuple[str, str]:
    """Return (hanzi transcript, pinyin for espeak-ng)."""
    if cls == "short":
        if rng.random() < 0.3:
            words = [[_pick(rng, ZH_SUBJ), _pick(rng, ZH_VO)]]
        else:
            words = [[_pick(rng, ZH_SHORT)]]
    elif cls == "medium":
        words = [zh_clause(rng)]
    else:
        words = [zh_clause(rng)]
        for _ in range(rng.randint(1, 3)):
            words.append([_pick(rng, ZH_CONJ)] + zh_clause(rng))
    transcript = "".join(h for clause in words for h, _ in clause)
    spoken = ", ".join(" ".join(p for _, p in clause) for clause in words)
    return transcript, spoken


# --------------------------------------------------------------------------------------------
# Audio
# --------------------------------------------------------------------------------------------
def synthesize(spk: Speaker, spoken: str) -> np.ndarray:
    """espeak-ng -> sox (resample to 16 kHz, trim silence) -> float32 samples at PEAK."""
    espeak = subprocess.run(
        ["espeak-ng", "-v", spk.voice, "-s", str(spk.wpm), "-p", str(spk.pitch), "--stdout",
         spoken],
        check=True, capture_output=True)
    sox = subprocess.run(
        ["sox", "-D", "-t", "wav", "-", "-t", "raw", "-e", "floating-point", "-b", "32",
         "-r", str(SAMPLE_RATE), "-c", "1", "-",
         "silence", "1", "0.01", TRIM_THRESHOLD, "reverse",
         "silence", "1", "0.01", TRIM_THRESHOLD, "reverse"],
        input=espeak.stdout, check=True, capture_output=True)
    x = np.frombuffer(sox.stdout, dtype="<f4").astype(np.float64)
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak > 0:
        x = x * (PEAK / peak)
    pad = np.zeros(int(PAD_S * SAMPLE_RATE))
    return np.concatenate([pad, x, pad])


def to_int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


@dataclass
class Utt:
    uttid: str
    spk: Speaker
    cls: str
    transcript: str = ""
    samples: np.ndarray | None = None


def realize(utt: Utt, seed: int) -> Utt:
    """Compose text and synthesize until the duration falls in the utterance's length class.

    Each utterance gets its own Random derived from (seed, uttid), so the result does not depend
    on the order in which worker threads finish."""
    rng = random.Random(f"{seed}/{utt.uttid}")
    lo, hi = LENGTH_CLASSES[utt.cls]
    compose = en_sentence if utt.spk.lang == "en" else zh_sentence
    best = None
    for _ in range(MAX_TRIES):
        transcript, spoken = compose(rng, utt.cls)
        samples = synthesize(utt.spk, spoken)
        dur = len(samples) / SAMPLE_RATE
        if lo <= dur < hi:
            utt.transcript, utt.samples = transcript, samples
            return utt
        # Keep the closest miss in case no try lands inside the class.
        miss = lo - dur if dur < lo else dur - hi
        if best is None or miss < best[0]:
            best = (miss, transcript, samples)
    _, utt.transcript, utt.samples = best
    print(f"warning: {utt.uttid}: no text for class {utt.cls} {LENGTH_CLASSES[utt.cls]} s in "
          f"{MAX_TRIES} tries; kept {len(utt.samples) / SAMPLE_RATE:.2f} s", file=sys.stderr)
    return utt


# --------------------------------------------------------------------------------------------
# Corpus plan and Kaldi files
# --------------------------------------------------------------------------------------------
def plan(rng: random.Random, num_utts: int, dev_fraction: float,
         mix: dict[str, float]) -> list[Utt]:
    """Assign every utterance a part, a speaker (round-robin within the part, so both languages
    get the same share) and a length class."""
    n_dev = max(2, int(round(num_utts * dev_fraction))) if dev_fraction > 0 else 0
    counts = {"train": num_utts - n_dev, "dev": n_dev}
    utts = []
    for part in ("train", "dev"):
        n = counts[part]
        # length classes by quota, so small corpora still reach every frame group
        quota = {c: int(round(n * w / sum(mix.values()))) for c, w in mix.items() if c != "short"}
        classes = [c for c in sorted(quota) for _ in range(quota[c])]
        classes = (classes + ["short"] * n)[:n]
        rng.shuffle(classes)
        spks = [s for s in SPEAKERS if s.part == part]
        # interleave languages: en, zh, en, zh, ...
        en = [s for s in spks if s.lang == "en"]
        zh = [s for s in spks if s.lang == "zh"]
        order = [s for pair in zip(en, zh) for s in pair]
        next_idx = {s.id: 1 for s in spks}
        for i in range(n):
            spk = order[i % len(order)]
            uttid = f"{spk.id}-{next_idx[spk.id]:04d}"
            next_idx[spk.id] += 1
            utts.append(Utt(uttid, spk, classes[i]))
    return utts


def write_kaldi(out: str, root: str, utts: list[Utt], abs_paths: bool) -> None:
    audio_dir = os.path.join(out, "audio")
    os.makedirs(audio_dir, exist_ok=True)
    for part in ("train", "dev"):
        rows = sorted((u for u in utts if u.spk.part == part), key=lambda u: u.uttid)
        d = os.path.join(out, part)
        os.makedirs(d, exist_ok=True)
        spk2utt: dict[str, list[str]] = {}
        with open(os.path.join(d, "wav.scp"), "w", encoding="utf-8") as scp, \
                open(os.path.join(d, "text"), "w", encoding="utf-8") as text, \
                open(os.path.join(d, "utt2spk"), "w", encoding="utf-8") as u2s, \
                open(os.path.join(d, "utt2dur"), "w", encoding="utf-8") as u2d:
            for u in rows:
                path = os.path.join(audio_dir, u.uttid + ".flac")
                sf.write(path, to_int16(u.samples), SAMPLE_RATE, format="FLAC",
                         subtype="PCM_16", compression_level=1.0)
                ref = os.path.abspath(path) if abs_paths else os.path.relpath(path, root)
                scp.write(f"{u.uttid} {ref}\n")
                text.write(f"{u.uttid} {u.transcript}\n")
                u2s.write(f"{u.uttid} {u.spk.id}\n")
                u2d.write(f"{u.uttid} {len(u.samples) / SAMPLE_RATE:.3f}\n")
                spk2utt.setdefault(u.spk.id, []).append(u.uttid)
        with open(os.path.join(d, "spk2utt"), "w", encoding="utf-8") as f:
            for spk in sorted(spk2utt):
                f.write(f"{spk} {' '.join(spk2utt[spk])}\n")


def parse_mix(s: str) -> dict[str, float]:
    vals = [float(v) for v in s.split(",")]
    if len(vals) != 3 or min(vals) < 0 or sum(vals) <= 0:
        raise argparse.ArgumentTypeError(f"--mix wants three non-negative weights "
                                         f"short,medium,long; got {s!r}")
    return dict(zip(("short", "medium", "long"), vals))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output data dir (gets train/, dev/, audio/)")
    p.add_argument("--num-utts", type=int, default=206, help="utterances in train + dev")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dev-fraction", type=float, default=0.16)
    p.add_argument("--mix", type=parse_mix,
                   default=",".join(str(DEFAULT_MIX[c]) for c in ("short", "medium", "long")),
                   help="weights of the short (0.5-1.2 s), medium (2-4 s) and long (4-7 s) "
                        "classes, default %(default)s")
    p.add_argument("--root", help="wav.scp paths are relative to this (default: parent of --out)")
    p.add_argument("--abs-paths", action="store_true", help="write absolute wav.scp paths")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)

    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            p.error(f"{tool} not found on PATH; install it with: apt-get install -y espeak-ng sox")
    if args.num_utts < 4:
        p.error("--num-utts must be at least 4 (both languages in train and dev)")
    out = os.path.abspath(args.out)
    root = os.path.abspath(args.root) if args.root else os.path.dirname(out)
    for part in ("train", "dev"):
        if os.path.exists(os.path.join(out, part)):
            shutil.rmtree(os.path.join(out, part))
    if os.path.exists(os.path.join(out, "audio")):
        shutil.rmtree(os.path.join(out, "audio"))

    rng = random.Random(args.seed)
    utts = plan(rng, args.num_utts, args.dev_fraction, args.mix)
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        utts = list(ex.map(lambda u: realize(u, args.seed), utts))
    write_kaldi(out, root, utts, args.abs_paths)

    total = sum(len(u.samples) for u in utts) / SAMPLE_RATE
    size = sum(os.path.getsize(os.path.join(out, "audio", f))
               for f in os.listdir(os.path.join(out, "audio")))
    print(f"wrote {len(utts)} utterances, {total:.1f} s of audio, {size} bytes of FLAC to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
