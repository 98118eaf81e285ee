"""How a job's DDP model communicates: the job file's optional "communication" section and
the settings it delegates to (compression and votes, local SGD), validated in one place; errors
name the field. Data only: host_agent.hooks.registry builds and registers the hook a section names.

    "communication": {"method": "dense"}                                  # the default
    "communication": {"method": "topk", "ratio": 0.01, "momentum": 0.9}   # CompressionConfig's
    "communication": {"method": "sign", "momentum": 0.9}                  # Signum, majority vote
    "communication": {"method": "dense", "local_sgd": {"period": 4, "warmup_steps": 100}}

Here and not in host_agent: spina/config.py's JobFile reads the section, and spina imports
nothing above it (docs/architecture.md).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from spina.fields import ConfigError, checker, dataclass_kwargs, mapping

METHODS = ("none", "topk", "randomk", "scaled", "losscomp")
VOTES = ("sign", "ternary")  # compression/votes.py: integer votes, their own hook (spina_vote_hook)
METHODS += VOTES


@dataclass(frozen=True)
class CompressionConfig:
    """What a compressor does to each gradient bucket.

    method: "none" (dense, the agent scans), "topk" (block top-k by L2 norm), "randomk" (k
        random blocks, the same on every rank: a control), "scaled" (per-layer block top-k,
        each layer's sent gradient rescaled to the norm of its fresh gradient: for LAMB/LARS),
        "losscomp" (blocks sampled by norm and by loss credit; the ratio follows the loss trend).
        Votes (compression/votes.py, with spina_vote_hook; ratio is not used): "sign" (signSGD with
        majority vote, EF-signSGD's error feedback), "ternary" (TernGrad, a shared scale).
    ratio: fraction of a bucket's blocks each rank sends per step, in (0, 1].
    error_feedback: keep what was not sent in a residual and add it to the next gradient.
    momentum: DGC momentum correction (0 turns it off): the compressor keeps the velocity
        u = momentum * u + g and accumulates u instead of g; use a momentum-free optimiser.
        The votes vote on u (Signum with majority vote); momentum_masking does not apply.
    momentum_masking: DGC's momentum factor masking: clear u where blocks were sent. True is
        DGC; False keeps u, so that the total sent is exactly momentum SGD's total update (at
        ratio 1 it is momentum SGD; with masking it degrades to SGD without momentum).
    mask_repeats: with momentum_masking, also clear u of a block the bucket sent in its
        previous step too (True: DGC). False masks only blocks that waited: a block sent step
        after step carries no stale velocity, and clearing it makes it plain SGD (the
        sequence model's dense head lost 19 points that way, docs/compression.md).
    min_blocks_per_param: each bucket sends at least this many blocks per parameter (tensor)
        in it, chosen by norm across the bucket (0: only the ratio's, at least 1 block).
    warmup_steps / warmup_ratio: the ratio starts at warmup_ratio and falls geometrically to
        `ratio` over warmup_steps steps (DGC's warm-up); 0 steps turns it off.
    seed: random-k's and LossComp's random stream (the same seed on every rank).
    loss_window: LossComp: steps per loss-trend window, also the credit's averaging horizon.
    credit_weight: LossComp: a block's weight is norm^2 * exp(credit_weight * credit), credit
        in [-1, 1] (the blocks that were sent before the loss fell have credit > 0).
    temperature: LossComp: sampling sharpness (weights ** (1 / temperature)); small: top-k.
    ratio_min / ratio_max: LossComp's ratio bounds (default ratio / 4 and min(1, 4 ratio)).
    ratio_step: LossComp: factor by which the ratio moves after each window.
    clip_sigma: ternary: clip p to +-clip_sigma times its layer's root mean square before
        ternarising (TernGrad's gradient clipping, c = 2.5 in the paper); 0: no clipping.
    trend_threshold: LossComp: a window whose mean loss fell by more than this fraction
        against the previous window lowers the ratio; otherwise it rises.
    """
    method: str = "topk"
    ratio: float = 0.01
    error_feedback: bool = True
    momentum: float = 0.0
    momentum_masking: bool = True
    mask_repeats: bool = True
    min_blocks_per_param: int = 0
    warmup_steps: int = 0
    warmup_ratio: float = 0.25
    seed: int = 0
    loss_window: int = 20
    credit_weight: float = 1.0
    temperature: float = 0.25
    ratio_min: float | None = None
    ratio_max: float | None = None
    ratio_step: float = 1.25
    trend_threshold: float = 0.02
    clip_sigma: float = 2.5

    def validate(self, what: str = "compression") -> "CompressionConfig":
        """This config, or a ConfigError `WHAT: field 'NAME': ...` naming the bad field."""
        def need(cond, name, msg):
            checker(f"{what}: ")(cond, name, f"{msg} (got {getattr(self, name)!r})")

        need(self.method in METHODS, "method",
             f"unknown method; choose one of {', '.join(METHODS)}")
        for name in ("ratio", "warmup_ratio", "ratio_min", "ratio_max"):
            v = getattr(self, name)
            need(v is None or (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= 1),
                 name, "must be in (0, 1]")
        need(self.warmup_ratio >= self.ratio or self.warmup_steps == 0, "warmup_ratio",
             f"must be at least ratio={self.ratio} (warm-up starts denser)")
        lo, hi = self.ratio_bounds
        need(lo <= self.ratio, "ratio_min", f"must be at most ratio={self.ratio}")
        need(self.ratio <= hi, "ratio_max", f"must be at least ratio={self.ratio}")
        need(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        need(math.isfinite(self.clip_sigma) and self.clip_sigma >= 0, "clip_sigma",
             "must be a finite number >= 0")
        for name in ("warmup_steps", "min_blocks_per_param"):
            v = getattr(self, name)
            need(type(v) is int and v >= 0, name, "must be a non-negative integer")
        need(isinstance(self.loss_window, int) and self.loss_window >= 1, "loss_window",
             "must be a positive integer")
        need(self.temperature > 0, "temperature", "must be positive")
        need(self.ratio_step > 1, "ratio_step", "must be greater than 1")
        need(self.credit_weight >= 0, "credit_weight", "must be non-negative")
        return self

    @property
    def ratio_bounds(self) -> tuple[float, float]:
        lo = self.ratio_min if self.ratio_min is not None else self.ratio / 4
        hi = self.ratio_max if self.ratio_max is not None else min(1.0, 4 * self.ratio)
        return lo, hi

    @classmethod
    def from_dict(cls, d: dict, what: str = "compression") -> "CompressionConfig":
        """From a YAML/JSON mapping; an unknown key is an error naming it (`what` first)."""
        return cls(**dataclass_kwargs(cls, d, what)).validate(what)

    def changed_fields(self) -> dict:
        """The fields that differ from the defaults (a file's short form of this config)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}


# The defaults by rule (docs/compression.md "Defaults by rule"): one place, pinned by
# tests/test_compression.py::test_defaults_follow_the_rule.
DEFAULT_RATIO = 0.01          # 1% of the blocks: the bytes target (<= 3% of dense) with room
WARMUP_FRACTION = 0.1         # DGC's warm-up over the first 10% of the steps
LOSS_WINDOWS = 50             # LossComp: a trend window is 1/50 of the run, at least 5 steps
MIN_BLOCKS_PER_PARAM = 1      # a bucket's k: at least a block per tensor in it (DGC: per tensor)


def compression_defaults(method: str, *, steps: int, momentum: float = 0.0,
                         ratio: float = DEFAULT_RATIO) -> CompressionConfig:
    """The settings a model gets by rule, given how many steps it trains and the momentum of
    its SGD (which moves into the compressor: DGC's momentum correction).

    ratio: `ratio` (1%), and a bucket sends at least one block per parameter in it;
    warm-up: ceil(10% of `steps`) steps from 25% of the blocks down to the ratio (none when
    that is under 2 steps); error feedback on; momentum correction = `momentum` (the
    optimiser then runs without it), DGC's masking only for blocks that waited (a block sent
    in the bucket's previous step too keeps its velocity); LossComp (not the
    default method: docs/compression.md says where it lost to top-k at the same bytes): its
    ratio held at `ratio` (ratio_min = ratio_max: its controller only traded accuracy for
    bytes), a trend window of steps / 50 (at least 5), the rest its class defaults. Steps is
    the run's number of optimiser steps; the rule uses no model size: the ratio is a
    fraction of every bucket's blocks and at least 1 block.
    """
    warmup = math.ceil(WARMUP_FRACTION * steps)
    fields = dict(method=method, ratio=ratio, error_feedback=True, momentum=momentum,
                  warmup_steps=warmup if warmup >= 2 else 0, mask_repeats=False,
                  min_blocks_per_param=MIN_BLOCKS_PER_PARAM)
    if method == "losscomp":
        fields.update(ratio_min=ratio, ratio_max=ratio,
                      loss_window=max(5, steps // LOSS_WINDOWS))
    return CompressionConfig(**fields).validate()


@dataclass(frozen=True)
class LocalSGDConfig:
    """Local SGD's schedule (host_agent/hooks/local_sgd.py): every `period` (H >= 1) steps the
    weights are averaged; the first `warmup_steps` (S >= 0) steps are synchronous (post-local
    SGD; 0: local SGD from the first step)."""
    period: int
    warmup_steps: int = 0

    def validate(self, what: str = "local SGD") -> "LocalSGDConfig":
        need = checker(f"{what}: ")
        need(type(self.period) is int and self.period >= 1, "period",
             f"must be an integer >= 1 (got {self.period!r})")
        need(type(self.warmup_steps) is int and self.warmup_steps >= 0, "warmup_steps",
             f"must be an integer >= 0 (got {self.warmup_steps!r})")
        return self

    @classmethod
    def from_dict(cls, d, what: str = "local SGD") -> "LocalSGDConfig":
        mapping(d, what, {"period"}, {"warmup_steps"})
        return cls(**dataclass_kwargs(cls, d, what)).validate(what)

    def to_dict(self) -> dict:
        return {"period": self.period, "warmup_steps": self.warmup_steps}


DENSE = "dense"  # every bucket summed through SpINA as it is (host_agent.hooks.dense)
# The section's methods: dense, or a compressor or vote by CompressionConfig's name ("none",
# its dense compressor, would be a second name for dense).
COMM_METHODS = (DENSE,) + tuple(m for m in METHODS if m != "none")
_SECTION = "communication"


@dataclass(frozen=True)
class Communication:
    """The job file's "communication" section: how each rank's DDP model sums its gradients.

    method: "dense" (the default: SpINA's all-reduce hook), a compressor ("topk", "randomk",
        "scaled", "losscomp") or a vote ("sign", "ternary"); COMM_METHODS.
    compression: the compressor's or vote's settings (None for dense). In the file they sit
        beside "method", by CompressionConfig's field names, which validates them.
    local_sgd: (post-)local SGD's schedule, {"period": H, "warmup_steps": S}; dense only
        (its synchronous steps sum dense gradients, hooks/local_sgd.py).
    """
    method: str = DENSE
    compression: CompressionConfig | None = None
    local_sgd: LocalSGDConfig | None = None

    @classmethod
    def from_dict(cls, d) -> "Communication":
        """The section from its JSON form; a ConfigError names the field
        (`communication.ratio: ...`, `communication.local_sgd: field 'period': ...`)."""
        options = {f.name for f in dataclasses.fields(CompressionConfig)} - {"method"}
        mapping(d, _SECTION, set(), {"method", "local_sgd"} | options)
        method = d.get("method", DENSE)
        if method not in COMM_METHODS:
            raise ConfigError(f"{_SECTION}.method: {method!r} is not one of "
                              f"{', '.join(COMM_METHODS)}")
        given = {k: v for k, v in d.items() if k in options}
        if method == DENSE and given:
            raise ConfigError(f"{_SECTION}.{sorted(given)[0]}: method 'dense' takes no "
                              "compression settings (name a compressor or vote as method)")
        compression = (None if method == DENSE else
                       CompressionConfig.from_dict({"method": method, **given}, _SECTION))
        local = d.get("local_sgd")
        if local is not None and method != DENSE:
            raise ConfigError(f"{_SECTION}.local_sgd: needs method 'dense' (the synchronous "
                              f"steps sum dense gradients), got method {method!r}")
        local = (None if local is None
                 else LocalSGDConfig.from_dict(local, f"{_SECTION}.local_sgd"))
        return cls(method, compression, local)

    def to_dict(self) -> dict:
        """The inverse of `from_dict`: the method, its settings that differ from the defaults."""
        d = {"method": self.method}
        if self.compression is not None:
            d.update({k: v for k, v in self.compression.changed_fields().items()
                      if k != "method"})
        if self.local_sgd is not None:
            d["local_sgd"] = self.local_sgd.to_dict()
        return d

    def check_lanes(self, lane_bits: int) -> "Communication":
        """Refuse votes on a narrow-lane job, naming both fields: the votes are int32 tensors,
        which travel as int32 on any job, so narrow lanes would save no byte of them and only
        round their float32 scale message stochastically (without error feedback)."""
        if self.method in VOTES and lane_bits != 32:
            raise ConfigError(
                f"{_SECTION}.method: {self.method!r} votes travel as int32 on any job, so "
                f"job.lane_bits {lane_bits} would only round their scale message: give the "
                "job lane_bits 32")
        return self
