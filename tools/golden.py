"""Golden batches: a digest of everything the plan and the packs decide, to hold a refactor against.

    python tools/golden.py build WORK          # corpora, packs and tokenizers (once)
    python tools/golden.py record WORK OUT     # every case's digest, as JSON
    python tools/golden.py compare A.json B.json
    GOLDEN_BASE_RULES=1 python tools/golden.py record WORK OUT   # main without its deliberate changes

Each case is a loader (or a pack) built through the public API only, so the same script runs on
any commit: one corpus on several topologies (ranks x workers, each rank its own loader with an
explicit rank), named corpora mixed three ways, cost-sized batches, a loader following a killed
pack (growing), audio shards with speed perturbation and SpecAugment, dev mode, a resume on
another world size, ``dry-run --plan --dump-keys``, ``hyper-p.json``, and the bytes of the packs.
A batch's digest covers its keys, features, labels and lengths; a refactor that keeps the
batches keeps every digest.  ``GOLDEN_BASE_RULES=1`` records a wdsprep whose batches changed on
purpose since the base commit 1feb993 with those changes switched off (:func:`base_rules`), so the
rest of it compares digest for digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "egs" / "demo"
sys.path.insert(0, str(REPO / "tests"))

TOPOLOGIES = [(1, 0), (2, 2), (3, 1)]  # (world_size, num_workers)

# A pack killed at its n-th shard publication (the growing case), as tests/test_growing.py does.
KILLED_PACK = r"""
import fnmatch, json, os, signal, sys
spec = json.loads(sys.argv[1])
op, pattern, n = spec["kill"]
real, calls = getattr(os, op), [0]
def deadly(*args, **kw):
    names = [os.path.basename(os.fspath(a)) for a in args[:2]]
    if any(fnmatch.fnmatch(name, pattern) for name in names):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kw)
setattr(os, op, deadly)
import wdsprep
wdsprep.pack_data(**spec["kwargs"])
"""


# The work folder's path, written as WORK wherever it appears (pack plans, reports, messages), so
# digests recorded in two folders compare.
WORK = ""


def sha(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(str(p.dtype).encode() + str(p.shape).encode())
            h.update(np.ascontiguousarray(p).tobytes())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).replace(WORK + "/", "WORK/").encode())
    return h.hexdigest()[:16]


def base_rules() -> None:
    """Switch off what changed the batches on purpose since 1feb993: training pools shaken and their
    first batch cut at a random point (issue 35.8), token-cost pools ordered in bands and laid out
    over 128 typical batches instead of ``pool_size`` (issue 37).  The patches draw nothing from the
    plan's generators, so every other draw is where base made it."""
    try:
        from wdsprep.plan import batching, corpus
        from wdsprep.plan import streams as plan
    except ImportError:  # a commit before the plan had a package of its own
        from wdsprep.loading import batching, corpus, plan  # type: ignore[no-redef]

    batching.shaken = lambda order, rng: order
    batching.varied_cuts = lambda fit, lens, tokens, rng: fit.cut(lens, tokens)
    batching.band_order = lambda order, lens, tokens: order
    corpus.layout = lambda options, *args, **kw: plan.layout(options, *args, **kw)._replace(pool=options.pool_size)


# A dry-run in a process of its own, under base_rules when they are asked for.
DRY_RUN = """
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import golden
if os.environ.get("GOLDEN_BASE_RULES") == "1":
    golden.base_rules()
from wdsprep.cli import main
sys.exit(main(sys.argv[2:]))
"""


def build(work: Path) -> None:
    from shardsets import make_kaldi_dir

    from wdsprep import pack_audio, pack_data, train_tokenizer

    work.mkdir(parents=True, exist_ok=True)
    kd = work / "kaldi"
    make_kaldi_dir(kd, 600, seed=11)
    make_kaldi_dir(work / "kaldi-b", 250, seed=12, prefix="b-")
    train_tokenizer("char", [kd / "text", work / "kaldi-b" / "text"], work / "char.json")
    train_tokenizer("sentencepiece", [DEMO / "data" / "train" / "text"], work / "spm.json", vocab_size=200)
    pack_data(kd / "feats.scp", kd / "text", work / "a", filter_group=["0:150", "150:"], utts_per_shard=20,
              utt2spk=None, progress=False)
    pack_data(work / "kaldi-b" / "feats.scp", work / "kaldi-b" / "text", work / "b", utts_per_shard=25,
              progress=False)
    cwd = os.getcwd()
    os.chdir(DEMO)
    try:
        d = DEMO / "data" / "train"
        pack_audio(d / "wav.scp", d / "text", work / "flac", filter_group=["0:120", "120:"], utts_per_shard=12,
                   utt2spk=d / "utt2spk", store="flac", progress=False)
        pack_audio(d / "wav.scp", d / "text", work / "fbank", filter_group=["0:120", "120:"], utts_per_shard=12,
                   backend="kaldi-native-fbank", progress=False)
    finally:
        os.chdir(cwd)
    kwargs = {"f_scps": str(kd / "feats.scp"), "f_labels": str(kd / "text"), "d_out": str(work / "killed"),
              "filter_group": ["0:150", "150:"], "utts_per_shard": 20, "progress": False}
    r = subprocess.run([sys.executable, "-c", KILLED_PACK, json.dumps({"kwargs": kwargs,
                                                                        "kill": ["rename", ".tmp-*", 12]})])
    assert r.returncode == -signal.SIGKILL, r.returncode
    option = {"ld": str(work / "a" / "*" / "data-*.tar"), "tokenizer": str(work / "char.json"),
              "bucket_size": 6000, "batch_size": 40, "ld_shuffle_buffer": 100, "seed": 3}
    (work / "hyper-p.json").write_text(json.dumps({"train": {"option": option}}))


def batch_digest(b: Any) -> list[Any]:
    return [list(b.keys), sha(b.feats.numpy(), b.feat_lens.numpy(), b.labels.numpy(), b.label_lens.numpy()),
            b.corpus.numpy().tolist() if getattr(b, "corpus", None) is not None else None]


def epochs(make: Callable[[int, int], Any], world_size: int, num_workers: int, n_epochs: int = 2,
           stop: int | None = None) -> dict[str, Any]:
    """Every rank's batches over ``n_epochs`` (each rank its own loader); with ``stop``, also every
    rank's state after ``stop`` steps of epoch 1."""
    out: dict[str, Any] = {}
    for rank in range(world_size):
        loader = make(rank, world_size, num_workers)
        per = []
        for e in range(n_epochs):
            loader.set_epoch(e)
            n = len(loader)
            got = [batch_digest(b) for b in loader]
            assert len(got) == n, (len(got), n)
            per.append(got)
        out[f"rank{rank}"] = per
        del loader
    return out


def resumed(make: Callable[[int, int, int], Any], before: tuple[int, int], after: tuple[int, int],
            epoch: int = 1, steps: int = 3) -> dict[str, Any]:
    """Rank 0 of ``before`` stops after ``steps`` steps of ``epoch``; ``after`` resumes from its state."""
    ws, nw = before
    loader = make(0, ws, nw)
    loader.set_epoch(epoch)
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = loader.state_dict()
    del it, loader
    ws2, nw2 = after
    # The plan's revision is a key base's states did not have; the position and the batches after it are compared.
    out = {"state": {k: v for k, v in state.items() if k not in ("fingerprint", "options", "plan_revision")}}
    for rank in range(ws2):
        fresh = make(rank, ws2, nw2)
        fresh.load_state_dict(json.loads(json.dumps(state)))
        out[f"rank{rank}"] = [batch_digest(b) for b in fresh]
    return out


def pack_digest(d: Path) -> dict[str, str]:
    """Every file of a pack, byte for byte, but the clock's and the folder's: the index's modification
    times, and the plan's digests of its inputs."""
    out = {}
    for p in sorted(d.rglob("*")):
        if not p.is_file():
            continue
        rel = str(p.relative_to(d))
        if p.name == "index.json" or (p.parent.parent.name == ".index.parts"):
            doc = json.loads(p.read_text()) if p.suffix == ".json" else None
            if doc is not None:
                for s in doc.get("shards", []):
                    s.pop("mtime_ns", None)
                out[rel] = sha(doc)
                continue
        if p.name in ("pack_report.json", "pack_plan.json"):
            doc = json.loads(p.read_text())
            doc.pop("seconds", None)
            if p.name == "pack_plan.json":  # the inputs' digests cover paths (feats.scp) and mtimes (arks)
                doc.pop("inputs", None)
                doc.pop("digest", None)
            out[rel] = sha(doc)
            continue
        out[rel] = hashlib.sha256(p.read_bytes().replace(WORK.encode() + b"/", b"WORK/")).hexdigest()[:16]
    return out


def record(work: Path, out_file: Path) -> None:
    global WORK
    WORK = str(work.resolve())
    import wdsprep
    from wdsprep import make_loader

    warnings.simplefilter("ignore")
    if os.environ.get("GOLDEN_BASE_RULES") == "1":
        base_rules()
    a = str(work / "a" / "*" / "data-*.tar")
    b = str(work / "b" / "*data-*.tar")
    char = str(work / "char.json")
    cases: dict[str, Callable[[], Any]] = {}

    def loader_case(trset: Any, tok: str, **kw: Any) -> Callable[[int, int, int], Any]:
        return lambda rank, ws, nw: make_loader(trset, tok, rank=rank, world_size=ws, num_workers=nw, **kw)

    base = dict(max_frames=3000, seed=7, shuffle_buffer=50, pool_size=200)
    for ws, nw in TOPOLOGIES:
        cases[f"single/{ws}x{nw}"] = (lambda ws=ws, nw=nw: epochs(loader_case(a, char, **base), ws, nw))
    cases["single/streams-speakers"] = lambda: epochs(
        loader_case(a, char, **base, streams=4, max_utts_per_speaker=3, max_batch_size=12, min_frames=30,
                    max_utt_frames=380, ctc_subsampling=4), 2, 1)
    cases["dev"] = lambda: epochs(loader_case(a, char, **base, train=False), 2, 0)
    named = {"a": a, "b": b}
    for label, mix in (("weights", {"weights": {"a": 1, "b": 3}}), ("temperature", {"temperature": 2.0}),
                       ("schedule", {"schedule": [(0, {"a": 9, "b": 1}), (20, {"a": 1, "b": 1})],
                                     "steps_per_epoch": 30})):
        for ws, nw in ((1, 0), (2, 1)):
            cases[f"mix-{label}/{ws}x{nw}"] = (lambda mix=mix, ws=ws, nw=nw: epochs(
                loader_case(named, char, **base, **mix), ws, nw))
    cost = {"per_utt": 50.0, "per_frame": 1.0, "per_frame2": 0.01, "per_token": 4.0, "per_token2": 0.5,
            "subsampling": 4}
    for ws, nw in ((1, 0), (2, 2)):
        cases[f"cost/{ws}x{nw}"] = (lambda ws=ws, nw=nw: epochs(
            loader_case(a, char, seed=7, cost=cost, max_cost=4000.0, shuffle_buffer=50), ws, nw))
    cases["cost+frames/1x0"] = lambda: epochs(loader_case(a, char, **base, cost=cost, max_cost=5000.0), 1, 0)
    killed = str(work / "killed" / "*" / "data-*.tar")
    for ws, nw in ((1, 0), (2, 1)):
        cases[f"growing/{ws}x{nw}"] = (lambda ws=ws, nw=nw: epochs(
            loader_case(killed, char, **base, growing=True), ws, nw))
    cases["growing/resume"] = lambda: resumed(loader_case(killed, char, **base, growing=True), (2, 0), (3, 1))
    flac = str(work / "flac" / "*" / "data-*.tar")
    spm = str(work / "spm.json")
    aug = {"speed": {"factors": [0.9, 1.0, 1.1]}, "specaugment": {"freq_masks": 2, "time_masks": 2}}
    for ws, nw in ((1, 0), (2, 1)):
        cases[f"audio-aug/{ws}x{nw}"] = (lambda ws=ws, nw=nw: epochs(
            loader_case(flac, spm, max_frames=2500, seed=3, shuffle_buffer=30, augment=aug,
                        fbank={"backend": "numpy"}), ws, nw))
    cases["audio-fbank-feats/1x0"] = lambda: epochs(
        loader_case(str(work / "fbank" / "*" / "data-*.tar"), spm, max_frames=2500, seed=3,
                    augment={"specaugment": {}}), 1, 0)
    cases["resume/single"] = lambda: resumed(loader_case(a, char, **base), (2, 1), (3, 0))
    cases["resume/mix"] = lambda: resumed(loader_case(named, char, **base, temperature=2.0), (1, 0), (2, 1))
    cases["resume/audio"] = lambda: resumed(
        loader_case(flac, spm, max_frames=2500, seed=3, augment=aug, fbank={"backend": "numpy"}), (1, 0), (2, 0),
        epoch=0)
    cases["hyper/2"] = lambda: epochs(
        lambda rank, ws, nw: wdsprep.make_loader_from_hyper(work / "hyper-p.json", rank=rank, world_size=ws,
                                                            num_workers=nw), 2, 0)

    def plan_cli(*args: str) -> Callable[[], Any]:
        def run() -> Any:
            dump = work / "dump.tsv"
            r = subprocess.run([sys.executable, "-c", DRY_RUN, __file__, "dry-run", "--plan", "--dump-keys", str(dump),
                                *args], capture_output=True, text=True)
            text = "\n".join(line for line in r.stdout.splitlines() if "planned for" not in line)
            return {"rc": r.returncode, "stdout": sha(text), "dump": sha(dump.read_text()) if dump.exists() else None,
                    "err": r.stderr[-300:] if r.returncode else ""}
        return run

    cases["plan/frames"] = plan_cli("--trset", a, "--world-size", "3", "--epochs", "2", "--max-frames", "3000",
                                    "--seed", "7", "--shuffle-buffer", "50", "--pool-size", "200")
    cases["plan/mix"] = plan_cli("--corpus", f"a={a}", "--corpus", f"b={b}", "--tokenizer", char, "--world-size", "2",
                                 "--max-frames", "3000", "--temperature", "2")
    cases["plan/cost"] = plan_cli("--trset", a, "--tokenizer", char, "--world-size", "2", "--cost",
                                  str(work / "cost.json"), "--max-cost", "4000")
    cases["plan/growing"] = plan_cli("--trset", killed, "--growing", "--world-size", "2", "--max-frames", "3000")
    cases["plan/speed"] = plan_cli("--trset", flac, "--world-size", "2", "--max-frames", "2500", "--augment",
                                   json.dumps(aug))
    cases["plan/hyper"] = plan_cli("--hyper", str(work / "hyper-p.json"), "--world-size", "2")
    (work / "cost.json").write_text(json.dumps(cost))
    for name in ("a", "b", "flac", "fbank", "killed"):
        cases[f"pack/{name}"] = (lambda name=name: pack_digest(work / name))

    only = os.environ.get("GOLDEN_ONLY")
    results = {}
    for name, fn in cases.items():
        if only and not any(name.startswith(o) for o in only.split(",")):
            continue
        try:
            results[name] = sha(fn()) if not name.startswith("pack/") else fn()
        except Exception as e:  # a case that fails is recorded as its error: the comparison shows it
            results[name] = f"ERROR {type(e).__name__}: {e}"[:300]
        print(f"{name}: {results[name] if isinstance(results[name], str) else 'files ' + str(len(results[name]))}",
              flush=True)
    out_file.write_text(json.dumps(results, indent=1, sort_keys=True))


def compare(a: Path, b: Path) -> int:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(x) | set(y)):
        if x.get(name) != y.get(name):
            bad += 1
            print(f"DIFFERS {name}: {str(x.get(name))[:200]} | {str(y.get(name))[:200]}")
    same = len(set(x) & set(y)) - bad
    print(f"{same} cases the same, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(Path(sys.argv[2]))
    elif cmd == "record":
        record(Path(sys.argv[2]), Path(sys.argv[3]))
    elif cmd == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
