"""make_loader's options, each in the group that uses it: the one home of every loader option.

``LoaderOptions`` holds one value per group: the plan's (``streams.PlanOptions``), how named corpora
mix, how a loader follows growing folders, how readers read and treat the data, how they fetch
remote shards (``FetchOptions``, here) and the worker processes'.  Every field is an
:func:`~wdsprep.options.option`, so the CLI's flags, ``hyper-p.json``'s ``ld`` keys and the
options table of ``docs/loader.md`` follow from these classes; ``make_loader`` takes a
``LoaderOptions`` or the options by name (``**overrides``, given to :meth:`LoaderOptions.of`), and
its docstring's options are generated from here.  Each group checks
its own values when it is made; :meth:`LoaderOptions.of` the rules between groups.  Torch-free.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from wdsprep.format.index import AudioIndex
from wdsprep.format.keys import LANG, check_field_name
from wdsprep.format.samples import ON_ERROR, check_on_error
from wdsprep.options import (
    JSON_OBJECT,
    JSON_OR_FILE,
    LEVELS,
    NAMES,
    NUMBER,
    PATH,
    SCHEDULE,
    SWITCH,
    WEIGHTS,
    choice,
    option,
    options_of,
)
from wdsprep.plan.augment import Augment, parse_augment
from wdsprep.plan.streams import PlanOptions
from wdsprep.prep.options import FbankOptions
from wdsprep.remote.fetch import RetryPolicy
from wdsprep.tokenizer import Normalizer, SubwordSampling, parse_normalize

# Settings of the loader's fbank= that may differ from the index's (sample_rate: the readers resample to it).
FBANK_KEYS = ("num_mel_bins", "dither", "backend", "sample_rate")
# What batches of audio shards carry: fbank computed by the readers, or the (augmented) waveform.
FEATURES = ("fbank", "waveform")


def check_waveform_augment(augment: Augment | None, where: str = "") -> None:
    """Refuse effects acting on features with ``features='waveform'``: the loader computes none."""
    effects = [p.name for p in augment.chain(on_audio=False)] if augment is not None else []
    if effects:
        raise ValueError(f"{where}augment {effects} acts on features, and features='waveform' delivers none: apply "
                         f"wdsprep.SpecAugmentModule to wdsprep.Fbank's output on the device instead")


def _sampling(alpha: float) -> SubwordSampling:
    return SubwordSampling(alpha=alpha)


def _checked_augment(spec: Any) -> Any:
    """``spec`` as given, once it parses: a bad one is refused where it is written (the flag, the
    ``ld`` key), naming the file."""
    parse_augment(spec)
    return spec


def _temperature(value: Any) -> float | tuple[float, ...]:
    """A temperature: one number, or one per level of the mixture (across corpora, then across the
    subsets ``mix_by`` makes of each)."""
    levels = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not 1 <= len(levels) <= 2 or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
                                            for t in levels):
        raise ValueError(f"temperature must be a number > 0, or two (across corpora, then across the subsets mix_by "
                         f"makes of each), got {value!r}")
    return float(levels[0]) if not isinstance(value, (list, tuple)) else tuple(float(t) for t in levels)


@dataclass(frozen=True)
class MixOptions:
    """How named corpora mix in training: one way of weights, or their own sizes; and, with
    ``mix_by``, how each corpus is split into subsets that mix as corpora do."""

    weights: Mapping[str, float] | None = option(
        None, "each named corpus's share of the utterances, e.g. en=1 zh=3 (default: their own sizes); with "
              "--mix-by, each subset's (CORPUS/VALUE, or VALUE for one unnamed corpus)", kind=WEIGHTS, plan=True,
        common=True,
        doc="named corpora's shares of the utterances drawn, {'en': 1, 'zh': 3} (with mix_by, each subset's: VALUE,"
            " or CORPUS/VALUE for named corpora). Without weights, temperature or schedule: their own "
            "proportions, as if they were one corpus")
    # A number applies at every level; two numbers are (across corpora, across each corpus's subsets).
    temperature: float | tuple[float, ...] | None = option(
        None, "weights from hours: hours^(1/T), e.g. 5; with --mix-by, one T for every level or two: across corpora, "
              "then across each corpus's subsets", kind=LEVELS, to_value=_temperature, plan=True, common=True,
        doc="weights ∝ each corpus's hours^(1/temperature) (1: as large as they are); with mix_by, one number "
            "applies at every level, or (T_corpora, T_subsets): across the corpora by their hours, then across each"
            " corpus's subsets by theirs")
    schedule: Sequence[tuple[int, Mapping[str, float]]] | None = option(
        None, "weights over training steps, linear in between: 0:en=9,zh=1 1000:en=1,zh=1", kind=SCHEDULE,
        plan=True, common=True,
        doc="[(step, {name: weight}), ...]: weights over the global training step, linear between points, "
            "constant after the last")
    steps_per_epoch: int | None = option(None, "steps of a mixed epoch (default: one pass's worth of batches)",
                                         plan=True,
                                         doc="steps of a mixed loader epoch (default: one pass's worth of every "
                                             "corpus's batches, divided over the ranks)")
    mix_unit: str = option("batch", "what is mixed: whole batches, each of one corpus, or utterances, so a batch holds "
                                    "several corpora", kind=choice("batch", "utterance"), plan=True, common=True,
                           doc="what is mixed: 'batch' (each batch of one corpus, the corpora's own batches in "
                               "turn) or 'utterance' (the corpora's utterances merged before pools and batches are "
                               "cut, so a batch holds several corpora, each utterance with its own corpus's "
                               "tokenizer, text treatment and augmentation; batch.corpus names each)")
    mix_by: str | None = option(None, "split each corpus by this index column (lang: each utterance's language, "
                                      "pack --utt2lang) into subsets mixed as named corpora are", kind=PATH,
                                metavar="FIELD", plan=True, common=True,
                                doc="split each corpus (named or not) by this index column (lang) into subsets, "
                                    "mixed as named corpora are (weights and schedule name the subsets VALUE, or "
                                    "CORPUS/VALUE for named corpora; temperature per level); loader.corpora and "
                                    "batch.corpus name the subsets")

    def __post_init__(self) -> None:
        ways = [name for name in ("weights", "temperature", "schedule") if getattr(self, name) is not None]
        if len(ways) > 1:
            raise ValueError(f"give the mixture one way: weights, temperature or schedule, not {' and '.join(ways)}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {self.steps_per_epoch}")
        if self.temperature is not None:
            object.__setattr__(self, "temperature", _temperature(self.temperature))
            if isinstance(self.temperature, tuple) and self.mix_by is None:
                raise ValueError("a temperature per level needs mix_by (levels: across corpora, then across the "
                                 "subsets mix_by makes of each); give one number")
        if self.mix_by is not None:
            check_field_name(self.mix_by)

    def given(self) -> dict[str, Any]:
        """The mixing options set, by name (``mix_unit`` when not its default)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None and getattr(self, f.name) != f.default}


# Read-ahead sized to the store: at most this many bytes started ahead per reader, and this many
# downloads at once (docs/remote.md: the wait and memory measured through a latency relay).
READ_AHEAD_BYTES = 1 << 30
MAX_REQUESTS = 16


@dataclass(frozen=True)
class FetchOptions:
    """How a reader brings its shards: read-ahead, the optional cache, retries (make_loader's options)."""

    read_ahead: int | None = option(
        None, "shards each reader fetches ahead of the one in use (default: as many as cover the store's latency at "
              "the rate the reader reads, within --read-ahead-bytes and --max-requests); 0 fetches each when needed",
        metavar="SHARDS",
        doc="shards each reader fetches ahead of the one in use, in the order it reads them (remote: downloaded in "
            "the background; local: into the page cache, 2 ahead). Default (None): sized to the store: each shard "
            "is started once it would arrive late otherwise, by the store's measured first-byte latency and "
            "per-connection bandwidth and the seconds this reader takes per batch (until measured, as many as "
            "read_ahead_bytes allows), within read_ahead_bytes and max_requests (docs/remote.md); a number fixes "
            "it, 0 fetches each when needed")
    read_ahead_bytes: int | None = option(READ_AHEAD_BYTES, "at most this many bytes of remote shards fetched ahead "
                                                            "(started and not yet opened), per reader; the next "
                                                            "shard always is", metavar="BYTES",
                                          doc="at most this many bytes of remote shards fetched ahead (downloading "
                                              "or downloaded, not yet opened) per reader, the next shard always "
                                              "(None: no bound); what read-ahead may add to a reader's memory")
    max_requests: int = option(MAX_REQUESTS, "most downloads each reader has in flight at once (a store that "
                                             "throttles: fewer)", metavar="N")
    cache_dir: str | None = option(None, "keep fetched remote shards in this local directory (shareable by the ranks "
                                         "of a node)", kind=PATH, metavar="DIR",
                                   doc="keep fetched remote shards in this local directory and read them from "
                                       "there (safe to share between the ranks of a node); without it they are "
                                       "held in memory while used")
    cache_bytes: int | None = option(None, "bound on --cache-dir; least recently used shards go first",
                                     metavar="BYTES")
    retries: int = option(RetryPolicy.retries, "retries of a remote fetch whose connection drops, that gets HTTP "
                                               "5xx or a cut-off body",
                          doc="attempts after the first for a remote shard or index whose connection drops, whose"
                              " server answers 5xx or whose body is cut short; each is counted in stats.retries. "
                              "A shard still not fetched is an error (on_error='raise') or skipped and counted")
    retry_backoff: float = option(RetryPolicy.backoff, "seconds before the first retry, doubling each time (at most "
                                                       "30 s)", kind=NUMBER, metavar="SECONDS")
    min_rate: float = option(RetryPolicy.min_rate, "bytes/s a remote download must average after a grace of the "
                                                   "time 1 MiB takes at it, else it is cut off and retried (0: no "
                                                   "minimum)", kind=NUMBER, metavar="BYTES_PER_S",
                             doc="bytes/s a remote download must average, after a grace of the time 1 MiB takes "
                                 "at that rate (at least 1 s); a slower one (a server that trickles) is cut off "
                                 "and retried, and the error names this option. 0: no minimum (the read timeout "
                                 "alone)")
    timeout: float = RetryPolicy.timeout  # seconds to connect or between two reads before an attempt fails

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if self.read_ahead is not None and self.read_ahead < 0:
            raise ValueError(f"read_ahead must be >= 0 (shards) or None (sized to the store), got {self.read_ahead}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if self.read_ahead_bytes is not None and self.read_ahead_bytes < 0:
            raise ValueError(f"read_ahead_bytes must be >= 0, got {self.read_ahead_bytes}")
        if self.cache_bytes is not None and self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")
        if self.cache_bytes is not None and self.cache_dir is None:
            raise ValueError("cache_bytes bounds the shard cache: give cache_dir too")
        self.policy()  # checks retries, backoff and min_rate

    def policy(self) -> RetryPolicy:
        """The retries of these options (what verify, inspect and the index reads use too: :data:`RETRY_OPTIONS`)."""
        return RetryPolicy(retries=self.retries, backoff=self.retry_backoff, timeout=self.timeout,
                           min_rate=self.min_rate)


# The options of a fetch's retries, which whatever reads remote shards or indexes takes.
RETRY_OPTIONS = ("retries", "retry_backoff", "min_rate")


@dataclass(frozen=True)
class GrowOptions:
    """Following folders a pack is still writing."""

    growing: bool = option(False, "plan every epoch over the shards published when it starts (pack and pack-audio "
                                  "publish them one by one); without it such a folder is refused", kind=SWITCH,
                           plan=True, common=True,
                           doc="follow shard folders a pack is still writing (pack and pack-audio publish shards "
                               "one by one): every epoch is planned over the shards published when "
                               "Loader.set_epoch is called (rank 0's view, shared), len(loader) is exact for it, "
                               "and the state records it, so a resume plans the same epoch. Once the pack is "
                               "complete an epoch is the one an ordinary loader plans; loader.stats.growing says "
                               "how much of the final corpus the epoch covers. Without it such a folder is "
                               "refused")
    min_shards: int | None = option(None, "with --growing: wait for N shards before the first epoch")
    min_hours: float | None = option(None, "with --growing: wait for H hours before the first epoch", kind=NUMBER,
                                     metavar="H")
    wait_timeout: float = option(3600.0, "with --growing: give up waiting for the first epoch's shards after this "
                                         "long", kind=NUMBER, metavar="SECONDS")

    def __post_init__(self) -> None:
        t = self.wait_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf:
            # NaN compares false with every time waited: it waited forever
            raise ValueError(f"wait_timeout must be a finite number of seconds >= 0, got {t!r}")
        m = self.min_shards
        if m is not None and (isinstance(m, bool) or not isinstance(m, int)):
            raise ValueError(f"min_shards must be a whole number of shards, got {m!r}")
        h = self.min_hours
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not h < math.inf):
            raise ValueError(f"min_hours must be a finite number of hours, got {h!r}")
        if (self.min_shards is not None or self.min_hours is not None) and not self.growing:
            raise ValueError("min_shards/min_hours wait for shards a pack is still publishing: pass growing=True too")
        if self.min_shards is not None and self.min_shards < 0 or self.min_hours is not None and self.min_hours < 0:
            raise ValueError(f"min_shards and min_hours must be >= 0, got {self.min_shards} and {self.min_hours}")


def _check_fbank(given: Mapping[str, Any] | None) -> None:
    """``fbank`` refused when the loader is built, naming the option, rather than each utterance's
    features failing in the reader: a non-object, an option it does not take, a value of the wrong
    type or out of range (a NaN dither, an unknown backend)."""
    if given is None:
        return
    if not isinstance(given, Mapping):
        raise ValueError(f"fbank must be an object of options such as {{\"num_mel_bins\": 40}}, got {given!r}")
    unknown = sorted(set(given) - set(FBANK_KEYS))
    if unknown:
        raise ValueError(f"fbank has {unknown}; the loader's fbank options are {list(FBANK_KEYS)}")
    FbankOptions(**{k: given[k] for k in FBANK_KEYS if k in given})  # each value checked, named


@dataclass(frozen=True)
class ReadOptions:
    """What a reader makes of the rows it reads: labels, features, augmentation, errors."""

    on_error: str = option("warn", "a damaged shard: warn and count, or stop", kind=choice(*ON_ERROR),
                           doc="a damaged shard: 'warn' (skip the rest of it, counted) or 'raise'")
    subword_sampling: SubwordSampling | None = option(None, "SentencePiece subword sampling with this alpha",
                                                      kind=NUMBER, metavar="ALPHA", to_value=_sampling,
                                                      doc="SentencePiece subword sampling in training (a "
                                                          "SubwordSampling; the command line and hyper-p.json "
                                                          "give its alpha), reseeded per (seed, epoch, shard)")
    tokenize_group: int = option(256, "utterances per block when a shard is read")
    augment: Augment | None = option(
        None, "augmentation in training, e.g. '{\"speed\": {\"factors\": [0.9, 1.0, 1.1]}, \"specaugment\": {}}' "
              "(also noise: {\"dir\": D, \"snr\": [10, 20]}, reverb: {\"dir\": D}, clip, lowpass, "
              "codec: {\"formats\": [\"mulaw\", \"opus\"]}), or a JSON file of it "
              "(docs/audio.md)", kind=JSON_OR_FILE, to_value=_checked_augment, plan=True, common=True,
        doc="augmentation in training, every draw a function of (seed, corpus epoch, utterance) (docs/audio.md): "
            "{'speed': {'factors': [0.9, 1.0, 1.1], 'probs': [...]}, 'noise': {'dir': D, 'snr': [10, 20], 'prob':"
            " 1}, 'reverb': {'dir': D, 'prob': 1}, 'specaugment': {'freq_masks': 2, 'freq_width': 27, "
            "'time_masks': 2, 'time_width': 40, 'max_time_ratio': 0.2, 'time_warp': 0, 'fill': 'mean'}} (any "
            "effect, or its dataclass from wdsprep.plan.augment), its JSON text or a JSON file. Speed, noise and "
            "reverb need audio shards; speed is drawn by the plan, which cuts batches with the perturbed lengths "
            "(batch.keys then name a perturbed utterance sp0.9-ID)")
    fbank: Mapping[str, Any] | None = option(
        None, "audio shards: fbank options in place of the index's, e.g. '{\"num_mel_bins\": 40}' (num_mel_bins, "
              "dither, backend, sample_rate: audio at other rates is resampled to it)", kind=JSON_OBJECT,
        doc="for audio shards, fbank options in place of their index's: num_mel_bins, dither (seeded per "
            "utterance; backend numpy only), backend (numpy, kaldi-native-fbank, torchaudio), sample_rate (the "
            "readers resample every row to it)")
    features: str = option(
        "fbank", "audio shards: what batches carry, fbank (batch.feats) or waveform (batch.audio, batch.audio_lens, "
                 "augmented as for fbank; compute features on the device with wdsprep.Fbank)",
        kind=choice(*FEATURES),
        doc="for audio shards, what batches carry: 'fbank' (batch.feats), or 'waveform': batch.audio float32 [B, "
            "S] zero-padded and batch.audio_lens int64 [B], speed-perturbed, noised, reverberated, clipped, "
            "low-passed and coded as for fbank (the same draws, plan, keys and len), to compute fbank on the "
            "device with wdsprep.Fbank (batch.feats is then empty, [B, T, 0], feat_lens the frames fbank will "
            "give). Refused for feature shards and with SpecAugment (use wdsprep.SpecAugmentModule)")
    fields: Sequence[str] | None = option(
        None, "fields of the samples to deliver as strings, batch.fields[NAME] (pack --field NAME=FILE; batch.lang "
              "comes with any language)", kind=NAMES,
        doc="fields of the samples (pack --field NAME=FILE) to deliver as strings, batch.fields[NAME]; batch.lang"
            " holds each utterance's language whenever the index has one. A field the shards' index does not list"
            " is refused")
    text_fields: Sequence[str] | None = option(
        None, "fields delivered tokenized and padded like the labels too: batch.field_tokens[NAME], "
              "batch.field_lens[NAME] (e.g. prev_text)", kind=NAMES,
        doc="fields delivered tokenized too, like the labels (the utterance's tokenizer, language and text "
            "treatment): batch.field_tokens[NAME] (padded with 0) and batch.field_lens[NAME]; e.g. a "
            "previous-text prompt")
    normalize: Normalizer | None = option(
        None, "the text treatment before tokenizing, steps in order: nfkc, nfc, lower, upper, strip_punct, "
              "collapse_spaces, remove_spaces, strip, or MODULE:FUNC (as tokenizer train --normalize)", kind=NAMES,
        to_value=parse_normalize,
        doc="the text treatment before tokenizing, its steps in order (nfkc, nfc, lower, upper, strip_punct, "
            "collapse_spaces, remove_spaces, strip) or MODULE:FUNC; tokenizer train --normalize applies the same."
            " A resume with another treatment is refused")

    @property
    def read_fields(self) -> tuple[str, ...]:
        """The fields read with each row, in order: ``fields`` then the other ``text_fields``."""
        return tuple(dict.fromkeys([*(self.fields or ()), *(self.text_fields or ())]))

    def fbank_for(self, audio: AudioIndex | None) -> FbankOptions | None:
        """What the features of shards holding ``audio`` are computed with: their index's fbank
        options, with this ``fbank``'s (``num_mel_bins``, ``dither``, ``backend``) in their place;
        None for shards of features (``fbank`` must then be None).  A dither drawn by a backend's own
        unseedable generator is refused: the features would differ run to run."""
        given = dict(self.fbank or {})
        if audio is None:
            if given:
                raise ValueError("fbank options apply to audio shards; these hold features computed at pack time")
            if self.features == "waveform":
                raise ValueError("features='waveform' needs audio shards (pack-audio); these hold features computed "
                                 "at pack time: use features='fbank'")
            return None
        unknown = sorted(set(given) - set(FBANK_KEYS))
        if unknown:
            raise ValueError(f"fbank has {unknown}; the loader's fbank options are {list(FBANK_KEYS)}")
        opts = FbankOptions(num_mel_bins=given.get("num_mel_bins", audio.num_mel_bins),
                            sample_rate=given.get("sample_rate", audio.sample_rate),
                            dither=given.get("dither", audio.dither), backend=given.get("backend", audio.backend))
        if opts.dither and opts.backend != "numpy":
            raise ValueError(f"fbank dither {opts.dither} with backend {opts.backend!r}: its dither comes from a "
                             f"generator that cannot be seeded, so batches would differ run to run; use backend "
                             f"'numpy' (seeded per utterance) or dither 0")
        if opts.dither and self.features == "waveform":
            raise ValueError(f"fbank dither {opts.dither} with features='waveform': the loader computes no fbank and "
                             f"its batches do not carry the draw keys wdsprep.Fbank dithers with; give fbank="
                             f"{{'dither': 0}} (Kaldi's reproducible setting) or features='fbank'")
        return opts

    def __post_init__(self) -> None:
        check_on_error(self.on_error)
        _check_fbank(self.fbank)
        object.__setattr__(self, "augment", parse_augment(self.augment))
        if self.features not in FEATURES:
            raise ValueError(f"features must be one of {list(FEATURES)}, got {self.features!r}")
        if self.features == "waveform":
            check_waveform_augment(self.augment)
        object.__setattr__(self, "normalize", parse_normalize(self.normalize))
        for what in ("fields", "text_fields"):
            names = getattr(self, what)
            if isinstance(names, str):
                names = [names]
            if names is not None:
                for name in names:
                    check_field_name(name)
                if what == "text_fields" and LANG in names:
                    raise ValueError("text_fields: lang is a language, not a text to tokenize")
                object.__setattr__(self, what, tuple(names) or None)


@dataclass(frozen=True)
class WorkerOptions:
    """The processes that read: DataLoader workers per rank, and the ranks' meetings."""

    num_workers: int = option(0, "DataLoader worker processes per rank; the rank's streams are split among them",
                              common=True)
    prefetch_factor: int | None = option(None, "batches each worker prepares ahead (torch's default: 2)")
    pin_memory: bool = option(False, "page-locked batches for asynchronous copies to the GPU (CUDA)", kind=SWITCH,
                              doc="page-locked batches for asynchronous host-to-GPU copies: the main process "
                                  "copies each batch into pinned memory (CUDA only; without CUDA it warns and "
                                  "does nothing)")
    persistent_workers: bool = option(True, "start the workers anew every epoch", kind=SWITCH,
                                      flag="--no-persistent-workers",
                                      doc="keep the worker processes (and their buffers) from one epoch to the "
                                          "next instead of starting them every epoch (the flag "
                                          "--no-persistent-workers starts them anew); the batches are the same "
                                          "either way")
    collective_timeout: float = option(300.0, "seconds a rank waits for the others before naming those that did "
                                              "not come", kind=NUMBER, metavar="SECONDS",
                                       doc="seconds a rank waits for the others at the loader's start and at the "
                                           "end of each epoch (under DDP) before naming the ranks that did not "
                                           "come")
    rank: int | None = option(None, "this rank (default: torch.distributed's, else 0)", flag=False, ld=False)
    world_size: int | None = option(None, "ranks (default: torch.distributed's, else 1)", flag=False, ld=False)

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.rank is not None and self.world_size is not None and not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")


# The groups under LoaderOptions, by attribute, with the title the CLI's --help gives each.
GROUPS: dict[str, tuple[type, str]] = {
    "plan": (PlanOptions, "batches and the epoch plan"),
    "read": (ReadOptions, "reading: labels, features, augmentation (docs/audio.md)"),
    "workers": (WorkerOptions, "worker processes and ranks"),
    "fetch": (FetchOptions, "remote shards: read-ahead, cache, retries (docs/remote.md)"),
    "grow": (GrowOptions, "following folders a pack is still writing"),
    "mix": (MixOptions, "mixing named corpora (given with --corpus; one of --weights, --temperature, --schedule)"),
}


@dataclass(frozen=True)
class LoaderOptions:
    """Every option of :func:`~wdsprep.make_loader`, in its group (:data:`GROUPS`)."""

    seed: int = option(0, "with the epoch, decides every shuffle and draw, on any world size and workers",
                       plan=True, common=True)
    plan: PlanOptions = field(default_factory=PlanOptions)
    read: ReadOptions = field(default_factory=ReadOptions)
    workers: WorkerOptions = field(default_factory=WorkerOptions)
    fetch: FetchOptions = field(default_factory=FetchOptions)
    grow: GrowOptions = field(default_factory=GrowOptions)
    mix: MixOptions = field(default_factory=MixOptions)

    @classmethod
    def of(cls, **kwargs: Any) -> LoaderOptions:
        """The options of make_loader's keyword arguments, each checked by its group (TypeError for a
        name that is none of them, ValueError for a value its group refuses)."""
        given: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        top = {}
        for key, value in kwargs.items():
            group = OWNER.get(key)
            if group is None:
                raise TypeError(f"make_loader got an unexpected option {key!r}")
            if group == "":
                top[key] = value
            else:
                given[group][key] = value
        read = ReadOptions(**given["read"])
        if read.augment is not None and not given["plan"].get("train", True):
            raise ValueError("augment is for training: a dev loader (train=False) reads the data as it is")
        plan = PlanOptions(**given["plan"], speed=None if read.augment is None else read.augment.speed)
        return cls(**top, plan=plan, read=read, **{g: GROUPS[g][0](**given[g]) for g in ("workers", "fetch", "grow",
                                                                                       "mix")})

    def values(self) -> dict[str, Any]:
        """Every option's value by name, as held (what :meth:`of` takes back)."""
        groups = {"": self, **{g: getattr(self, g) for g in GROUPS}}
        return {name: getattr(groups[group], name) for name, group in OWNER.items()}

    def replaced(self, **overrides: Any) -> LoaderOptions:
        """These options with ``overrides`` in place of their values, checked as :meth:`of` checks them."""
        return LoaderOptions.of(**{**self.values(), **overrides}) if overrides else self

    def with_topology(self, rank: int, world_size: int) -> LoaderOptions:
        """These options on ``rank`` of ``world_size``."""
        return replace(self, workers=replace(self.workers, rank=rank, world_size=world_size))

    @property
    def rank(self) -> int:
        return self.workers.rank or 0

    @property
    def world_size(self) -> int:
        return self.workers.world_size or 1


def option_names() -> dict[str, str]:
    """Every loader option's name -> its group's attribute ("" for the top level)."""
    out = {f.name: "" for f, _ in options_of(LoaderOptions)}
    for group, (cls, _) in GROUPS.items():
        out.update({f.name: group for f, _ in options_of(cls)})
    return out


OWNER = option_names()

