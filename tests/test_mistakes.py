"""What a new user trips on (issue 35), said out loud or made right: the same epoch twice, idle
workers, a batch budget in the wrong unit or below the utterances, typos and misplaced keys in
hyper-p.json, dry-run --plan's --stats-json and --plot, a small corpus cut into the same batches
every epoch, a resume state of an older plan, path mistakes, the pattern of an uploaded pack, and
the small things of the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.hyper import loader_options
from wdsprep.loader import make_loader


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    out, utts = build(root, n=200, utts_per_shard=20)
    return root, f"{out}/data-*.tar", utts, train_char_tokenizer(root, root / "kaldi-cat-0" / "text")


def _warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught]


def test_a_second_pass_over_the_same_epoch_warns_once(data):
    root, trset, utts, tok = data
    loader = make_loader(trset, tok, max_frames=3000, seed=1)
    first = [b.keys for b in loader]
    again = _warnings(lambda: [b.keys for b in loader])
    assert any("again without set_epoch" in w for w in again)
    assert not _warnings(lambda: list(loader))  # once
    # set_epoch between passes: silent; a dev loader reads the same data every pass: silent too
    fresh = make_loader(trset, tok, max_frames=3000, seed=1)
    assert not [w for w in _warnings(lambda: [(fresh.set_epoch(e), list(fresh)) for e in range(2)]) if "set_epoch" in w]
    dev = make_loader(trset, tok, max_frames=3000, train=False)
    assert not [w for w in _warnings(lambda: [list(dev) for _ in range(2)]) if "set_epoch" in w]
    assert first  # the pass warned about gave the first pass's batches, as promised


def test_idle_workers_warn_on_a_small_corpus_too(data):
    root, trset, utts, tok = data
    loader = make_loader(trset, tok, max_frames=3000, num_workers=3, streams=1)
    said = _warnings(lambda: list(loader))
    assert any("2 of 3 DataLoader workers get no batches" in w and "at most 1 workers" in w for w in said), said


def test_a_budget_below_the_utterances_or_above_the_corpus_is_named(data, tmp_path):
    root, trset, utts, tok = data
    longest = max(len(f) for f, _ in utts.values())
    said = _warnings(lambda: make_loader(trset, tok, max_frames=longest - 1))
    assert any("exceed max_frames=" in w and "alone: each is a batch of its own" in w for w in said), said
    # a max_cost in the wrong unit: the whole stream would be one batch
    cost = {"per_frame": 1.0, "subsampling": 1}
    said = _warnings(lambda: make_loader(trset, tok, cost=cost, max_cost=1e12))
    assert any("every stream is a single batch" in w for w in said), said
    # ... and one below every utterance: each its own batch
    said = _warnings(lambda: make_loader(trset, tok, cost=cost, max_cost=1.0))
    assert any(f"{len(utts)} of {len(utts)} utterances (100.0%) exceed max_cost=1 alone" in w for w in said), said
    # a sensible budget says nothing
    assert not [w for w in _warnings(lambda: make_loader(trset, tok, max_frames=3000)) if "budget" in w or "alone" in w]
    # said once for every rank (rank 0's), naming the user's line, not one of wdsprep's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_loader(trset, tok, max_frames=longest - 1)
    (said,) = [w for w in caught if "alone: each is a batch of its own" in str(w.message)]
    assert said.filename == __file__, said.filename
    assert not [w for w in _warnings(lambda: make_loader(trset, tok, max_frames=longest - 1, rank=1, world_size=2))
                if "alone" in w]


def _hyper(**option):
    return {"train": {"option": {"ld": "x/*/data-*.tar", "tokenizer": "t.json", "bucket_size": 4000, **option}}}


def test_hyper_typos_and_misplaced_loader_options_warn_naming_the_key():
    said = _warnings(lambda: loader_options(_hyper(ld_shuffle_bufer=100), world_size=1))
    assert any("'ld_shuffle_bufer'" in w and "did you mean 'ld_shuffle_buffer'" in w for w in said), said
    said = _warnings(lambda: loader_options(_hyper(max_frames=9000), world_size=1))
    assert any("'max_frames' is not read there" in w and "ld object" in w and "bucket_size" in w for w in said), said
    # CAT's own keys pass through silently
    assert not _warnings(lambda: loader_options(_hyper(amp=True, grad_accum_fold=2, workers=4), world_size=1))


def test_an_ld_object_takes_every_loader_option_but_refuses_unknown_keys_and_double_bounds():
    ld = {"shards": "x/*/data-*.tar", "max_frames": 3000, "ctc_subsampling": 4, "num_workers": 2,
          "subword_sampling": 0.1, "on_error": "raise"}
    kw = loader_options({"train": {"option": {"ld": ld, "tokenizer": "t.json"}}}, world_size=2).loader_kwargs
    assert kw["max_frames"] == 3000 and kw["ctc_subsampling"] == 4 and kw["num_workers"] == 2  # per rank, as given
    assert kw["subword_sampling"].alpha == 0.1 and kw["on_error"] == "raise"
    with pytest.raises(ValueError, match=r"ld has \['shuffle_bufer'\]"):
        loader_options({"train": {"option": {"ld": {**ld, "shuffle_bufer": 9}, "tokenizer": "t.json"}}}, world_size=1)
    with pytest.raises(ValueError, match="ld max_frames and train:option bucket_size both set max_frames"):
        loader_options({"train": {"option": {"ld": ld, "tokenizer": "t.json", "bucket_size": 8000}}}, world_size=1)
    with pytest.raises(ValueError, match="ld on_error must be one of"):
        loader_options({"train": {"option": {"ld": {**ld, "on_error": "ignore"}, "tokenizer": "t"}}}, world_size=1)


def test_dry_run_plan_writes_its_stats_json_and_refuses_a_plot_without_a_mixture(data, tmp_path):
    root, trset, utts, tok = data
    stats = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--plan", "--trset", trset, "--max-frames", "3000",
                        "--epochs", "2", "--world-size", "2", "--stats-json", str(stats)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(stats.read_text())
    assert [d["epoch"] for d in doc] == [0, 1] and sum(d["utterances"] for d in doc[:1]) <= len(utts)
    r = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--plan", "--trset", trset, "--max-frames", "3000",
                        "--plot", str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--plot draws the mixture of named corpora" in r.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.fixture(scope="module")
def demo_audio(tmp_path_factory):
    """The bundled corpus's train set as pack-audio packs it with egs/demo's conf/pack.conf (FLAC:
    no features computed; the plan needs only the index)."""
    import os
    from pathlib import Path

    from wdsprep import pack_audio

    demo = Path(__file__).resolve().parents[1] / "egs" / "demo"
    conf = dict(line.split(maxsplit=1) for line in (demo / "conf" / "pack.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    out = tmp_path_factory.mktemp("demo") / "shards"
    cwd = os.getcwd()
    os.chdir(demo)  # wav.scp paths are relative to the recipe
    try:
        pack_audio("data/train/wav.scp", "data/train/text", out, filter_group=conf["--filter-group"].split(),
                   utts_per_shard=int(conf["--utts-per-shard"]), store="flac", progress=False)
    finally:
        os.chdir(cwd)
    return f"{out}/*/data-*.tar", train_char_tokenizer(out.parent, demo / "data" / "train" / "text")


def test_a_small_corpus_is_cut_into_other_batches_every_epoch(demo_audio):
    """The demo corpus (173 utterances, one stream: the same pool every epoch) at max_frames 1000:
    two epochs shared 15 of 22 batches.  Now, over ten seeds, at most 5% of the batches that hold
    more than one utterance come again in the next epoch (a batch of one utterance the budget lets
    nothing share is the same every epoch), at a padding efficiency of at least 0.95."""
    from wdsprep.plan.stats import padding_efficiency

    trset, tok = demo_audio
    repeated, multi, effs = 0, 0, []
    for seed in range(10):
        source = make_loader(trset, tok, max_frames=1000, seed=seed).source
        frames = source.shards.frames
        epochs = []
        for epoch in range(2):
            run = source.run(source.start(epoch))
            batches = [source.rows(bid) for w in run.windows(0) for bid in w.refs]
            assert sum(len(b) for b in batches) == source.shards.num_utts  # every utterance once
            epochs.append({frozenset(b.tolist()) for b in batches})
            effs.append(padding_efficiency([frames[b] for b in batches]))
        repeated += sum(len(b) > 1 for b in epochs[0] & epochs[1])
        multi += sum(len(b) > 1 for b in epochs[1])
    assert repeated / multi <= 0.05, f"{repeated} of {multi} batches came again"
    assert np.mean(effs) >= 0.95 and min(effs) >= 0.93, effs


def test_a_state_of_an_older_plan_revision_is_refused_saying_to_start_the_next_epoch(data):
    from wdsprep.plan.state import StateError

    root, trset, utts, tok = data
    loader = make_loader(trset, tok, max_frames=3000, seed=1)
    loader.set_epoch(2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    assert state["plan_revision"] >= 2
    older = {k: v for k, v in state.items() if k != "plan_revision"}
    older["fingerprint"] = "0" * 16  # what its rules gave
    fresh = make_loader(trset, tok, max_frames=3000, seed=1)
    with pytest.raises(StateError, match=r"cut its plans by other rules .*loader\.set_epoch\(3\)"):
        fresh.load_state_dict(older)
    fresh.load_state_dict(state)  # the state of this revision resumes
    assert len(fresh) == len(loader) and len(fresh) - fresh.position().step == len(loader) - 1


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_a_folder_or_the_files_a_shell_expanded_are_the_shard_set_meant(data, tmp_path):
    """A pack's folder is its shards, for every command that reads shards, by --trset or by position;
    so are the files an unquoted glob expanded to.  What is no shard set is named."""
    root, trset, utts, tok = data
    folder = trset.rsplit("/", 1)[0]
    planned = _cli("dry-run", "--plan", "--trset", trset, "--max-frames", "3000")
    assert planned.returncode == 0, planned.stderr
    r = _cli("dry-run", "--plan", "--trset", folder, "--max-frames", "3000")
    assert r.returncode == 0 and r.stdout == planned.stdout, r.stderr
    files = sorted(str(p) for p in Path(folder).glob("data-*.tar"))
    r = _cli("dry-run", "--plan", "--trset", *files, "--max-frames", "3000")
    assert r.returncode == 0 and r.stdout == planned.stdout, r.stderr
    for command in (["inspect", folder], ["inspect", "--trset", folder], ["verify", folder],
                    ["verify", "--trset", folder], ["index", "--trset", folder],
                    ["tokenizer", "count-labels", "--trset", folder, "--tokenizer", str(tok)]):
        r = _cli(*command)
        assert r.returncode == 0, (command, r.stderr)
    r = _cli("verify", folder, "--trset", folder)
    assert r.returncode == 2 and "given twice" in r.stderr, r.stderr
    assert "give the shards" in _cli("inspect").stderr
    r = _cli("inspect", str(root))  # a folder holding none
    assert r.returncode == 2 and "no shards in it or in a length group under it" in r.stderr, r.stderr
    assert "unrecognized arguments: --bogus" in _cli("dry-run", "--plan", "--trset", trset, "--bogus").stderr
    # make_loader and export take the folder; the README's grouped pattern on a pack without groups
    # names what the folder holds
    by_folder, by_pattern = make_loader(folder, tok, max_frames=3000), make_loader(trset, tok, max_frames=3000)
    assert [b.keys for b in by_folder] == [b.keys for b in by_pattern]
    r = _cli("export", "lhotse", "--trset", folder, "--out", str(tmp_path / "cuts.jsonl.gz"))
    assert r.returncode == 0 and f"{len(utts):,} utterances" in r.stderr, r.stderr
    r = _cli("inspect", f"{folder}/*/data-*.tar")
    assert r.returncode == 2 and f"the pack folder {folder} holds '{folder}/data-*.tar'" in r.stderr, r.stderr


def test_the_pattern_command_prints_a_packs_pattern_local_and_uploaded(data):
    root, trset, utts, tok = data
    folder = trset.rsplit("/", 1)[0]
    assert _cli("pattern", folder).stdout.strip() == f"{folder}/data-*.tar"
    n = len(list(Path(folder).glob("data-*.tar")))
    web = _cli("pattern", folder, "--remote", "https://host/corpus/").stdout.strip()
    assert web == f"https://host/corpus/data-{{00000..{n - 1:05d}}}.tar"  # a web server cannot list: ranges
    assert _cli("pattern", folder, "--remote", "s3://b/p").stdout.strip() == "s3://b/p/data-*.tar"
    from wdsprep.format.shardlist import expand_shards

    assert [u.rsplit("/", 1)[1] for u in expand_shards(web)] == [f"data-{i:05d}.tar" for i in range(n)]


def test_small_things_a_new_user_meets(data, tmp_path):
    from wdsprep.check.inspect import curve_budgets, inspect_shards

    root, trset, utts, tok = data
    # inspect's padding curve spans this corpus's lengths, not a fixed 5k-80k
    frames = np.array([len(f) for f, _ in utts.values()])
    budgets = curve_budgets(frames)
    assert len(budgets) == 5 and budgets[0] == pytest.approx(2 * np.quantile(frames, 0.95), rel=0.05)
    curves = inspect_shards(trset).efficiency
    assert curves and all(set(curve) == set(budgets) for curve in curves.values())
    # fbank takes --out, as pack does
    from wdsprep.cli import build_parser

    assert build_parser().parse_args(["fbank", "--wav-scp", "w", "--out", "d"]).out_dir == "d"
    # the checkout tools' usage names the command typed
    assert _cli("demo", "--help").stdout.startswith("usage: wdsprep demo")
    # dry-run --help shows what most runs set; --help-all every option
    short, full = _cli("dry-run", "--help").stdout, _cli("dry-run", "--help-all").stdout
    assert len(short.splitlines()) < 110 < len(full.splitlines())
    assert "--max-frames" in short and "--max-duration" in short
    assert "--prefetch-factor" not in short and "--prefetch-factor" in full and "--help-all" in short


def test_a_pack_that_writes_nothing_or_loses_too_much_exits_1_and_a_growing_loader_stops_waiting(tmp_path):
    """pack-audio run from the wrong folder (the demo's wav.scp paths are relative to egs/demo) packs
    none of the utterances: exit 1 naming the reason and the report; a growing loader on its folder
    says so at once instead of waiting out wait_timeout.  A pack losing more than max_lost fails too,
    and passes when the share is allowed."""
    from shardsets import make_kaldi_dir

    from wdsprep.errors import DataError, LostError
    from wdsprep.pack import pack_data

    demo = Path(__file__).resolve().parent.parent / "egs" / "demo" / "data" / "train"
    n = len((demo / "wav.scp").read_text().splitlines())
    out = tmp_path / "audio"
    r = _cli("pack-audio", "--wav-scp", str(demo / "wav.scp"), "--text", str(demo / "text"), "--out", str(out),
             "--store", "flac", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"wrote none of its {n} utterances: " in r.stderr and str(out / "pack_report.json") in r.stderr, r.stderr
    assert r.stderr.startswith("wdsprep pack-audio: error: wrote none"), r.stderr  # the command named once
    assert (out / "pack_report.json").is_file() and not (out / "PACK_INCOMPLETE").exists()
    tok = train_char_tokenizer(tmp_path, demo / "text")
    t0 = time.monotonic()
    with pytest.raises(DataError, match=r"ended with no shards.*pack_report.json"):
        make_loader(f"{out}/*/data-*.tar", tok, growing=True, wait_timeout=300, max_frames=3000)
    assert time.monotonic() - t0 < 60

    kd = tmp_path / "kaldi"
    make_kaldi_dir(kd, 50, seed=3)
    lines = (kd / "text").read_text().splitlines()
    (kd / "text").write_text("\n".join(lines[3:]) + "\n")  # 3 of 50 (6%) without a transcript
    with pytest.raises(LostError, match=r"lost 3 of 50 utterances \(6.0%\), more than max_lost=0.01.*missing_label 3"):
        pack_data(kd / "feats.scp", kd / "text", tmp_path / "lossy", progress=False)
    assert (tmp_path / "lossy" / "pack_report.json").is_file()  # committed, every loss named
    report = pack_data(kd / "feats.scp", kd / "text", tmp_path / "allowed", max_lost=0.1, progress=False)
    assert len(report.dropped["missing_label"]) == 3
    with pytest.raises(ValueError, match="max_lost=nan"):
        pack_data(kd / "feats.scp", kd / "text", tmp_path / "nan", max_lost=float("nan"), progress=False)


def test_a_folder_copied_without_its_times_loads_by_content_and_a_changed_byte_is_refused(data, tmp_path):
    """cp -r (no -p) gives every shard a new modification time: the loader checks such shards
    against the SHA-256 their index records and loads the copy, with the batches of the original,
    saying how to skip the check; a byte changed in place (same size) is refused by content."""
    import shutil

    from wdsprep import verify_shards
    from wdsprep.plan.shardset import StaleIndexError

    root, trset, utts, tok = data
    folder = Path(trset).parent
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, copy_function=shutil.copy)  # as cp -r: contents, not times
    first = sorted(copy.glob("*.tar"))[0]
    assert first.stat().st_mtime_ns != (folder / first.name).stat().st_mtime_ns

    def batches(pattern):
        loader = make_loader(pattern, tok, max_frames=3000, seed=1)
        loader.set_epoch(0)
        return [tuple(b.keys) for b in loader]

    said = _warnings(lambda: batches(f"{copy}/data-*.tar"))
    assert any("matched the index's SHA-256" in w and f"--refresh '{copy}/*.tar'" in w for w in said), said
    assert batches(f"{copy}/data-*.tar") == batches(trset)
    assert verify_shards(f"{copy}/data-*.tar").ok  # verify judges it alike
    assert subprocess.run([sys.executable, "-m", "wdsprep", "index", "--refresh", f"{copy}/*.tar"],
                          capture_output=True, text=True, timeout=120).returncode == 0
    assert not any("SHA-256" in w for w in _warnings(lambda: batches(f"{copy}/data-*.tar")))  # times recorded

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad, copy_function=shutil.copy)
    shard = sorted(bad.glob("*.tar"))[1]
    data_bytes = bytearray(shard.read_bytes())
    data_bytes[2000] ^= 0x01  # inside the first member's payload: the same size, other bytes
    shard.write_bytes(bytes(data_bytes))
    with pytest.raises(StaleIndexError, match=rf"{shard.name} changed since it was indexed \(its bytes differ from "
                                              r"the SHA-256"):
        batches(f"{bad}/data-*.tar")
    result = verify_shards(f"{bad}/data-*.tar")
    assert not result.ok and "SHA-256" in result.format() and shard.name in result.format()


def _demo_subset(d: Path, n: int) -> tuple[Path, Path]:
    """A wav.scp (absolute paths) and text of the demo corpus's first ``n`` train utterances."""
    demo = Path(__file__).resolve().parent.parent / "egs" / "demo"
    d.mkdir(parents=True, exist_ok=True)
    wavs = (demo / "data" / "train" / "wav.scp").read_text().splitlines()[:n]
    texts = (demo / "data" / "train" / "text").read_text(encoding="utf-8").splitlines()[:n]
    (d / "wav.scp").write_text("".join(f"{u} {demo / p}\n" for u, p in (w.split(" ", 1) for w in wavs)))
    (d / "text").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return d / "wav.scp", d / "text"


def test_a_refused_resume_names_every_difference_by_its_flag(tmp_path):
    """Resumed with --store flac and another --sample-rate: both named as the command line spells
    them, none hidden as "1 more difference", and not the layout --store decides."""
    wav, text = _demo_subset(tmp_path / "kaldi", 4)
    out = tmp_path / "out"
    base = ["pack-audio", "--wav-scp", str(wav), "--text", str(text), "--out", str(out)]
    assert _cli(*base, "--store", "wav").returncode == 0
    r = _cli(*base, "--store", "flac", "--sample-rate", "8000", "--no-shuffle", "--resume")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for said in ("--store flac (the pack started with --store wav)",
                 "--sample-rate 8000 (the pack started with --sample-rate 16000)",
                 "--no-shuffle (the pack started with --shuffle)"):
        assert said in r.stderr, r.stderr
    assert "layout" not in r.stderr and "more difference" not in r.stderr, r.stderr


def test_the_small_things_of_a_first_hour(data, tmp_path):
    """fbank says what it wrote where it was asked to, without a pack's table; an aggregate
    tokenizer asks for --lang as a flag; every recipe keeps what it makes out of git."""
    from wdsprep.tokenizer import aggregate_tokenizers

    root, trset, utts, tok = data
    wav, _ = _demo_subset(tmp_path / "kaldi", 3)
    r = _cli("fbank", "--wav-scp", str(wav), "--out", "feats", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith("wrote 3 utterances (0.00 h) to feats/feats.scp"), r.stdout
    assert "group" not in r.stdout and str(tmp_path) not in r.stdout, r.stdout
    aggregate_tokenizers({"en": tok, "zh": tok}, tmp_path / "agg.json")
    r = _cli("tokenizer", "encode", "--tokenizer", str(tmp_path / "agg.json"), "hello")
    assert r.returncode == 2 and "give the language of the text with --lang, e.g. --lang en" in r.stderr, r.stderr
    assert "encode(text" not in r.stderr
    r = _cli("tokenizer", "encode", "--tokenizer", str(tmp_path / "agg.json"), "--lang", "en", "hello")
    assert r.returncode == 0 and r.stdout.strip()
    r = _cli("tokenizer", "encode", "--tokenizer", str(tok), "--lang", "en", "hello")
    assert r.returncode == 2 and "give --lang only with an aggregate tokenizer" in r.stderr, r.stderr
    egs = Path(__file__).resolve().parent.parent / "egs"
    for recipe in sorted(p for p in egs.iterdir() if (p / "run.sh").is_file()):
        assert (recipe / ".gitignore").is_file() and "/exp/" in (recipe / ".gitignore").read_text(), recipe
