"""Compression settings: one dataclass, validated in one place; errors name the field."""
from __future__ import annotations

import math
from dataclasses import dataclass

from spina.fields import checker, dataclass_kwargs

METHODS = ("none", "topk", "randomk", "scaled", "losscomp")
VOTES = ("sign", "ternary")  # votes.py: integer votes, their own hook (spina_vote_hook)
METHODS += VOTES


@dataclass(frozen=True)
class CompressionConfig:
    """What a compressor does to each gradient bucket.

    method: "none" (dense, the agent scans), "topk" (block top-k by L2 norm), "randomk" (k
        random blocks, the same on every rank: a control), "scaled" (per-layer block top-k,
        each layer's sent gradient rescaled to the norm of its fresh gradient: for LAMB/LARS),
        "losscomp" (blocks sampled by norm and by loss credit; the ratio follows the loss trend).
        Votes (votes.py, with spina_vote_hook; ratio is not used): "sign" (signSGD with
        majority vote, EF-signSGD's error feedback), "ternary" (TernGrad, a shared scale).
    ratio: fraction of a bucket's blocks each rank sends per step, in (0, 1].
    error_feedback: keep what was not sent in a residual and add it to the next gradient.
    momentum: DGC momentum correction (0 turns it off): the compressor keeps the velocity
        u = momentum * u + g and accumulates u instead of g; use a momentum-free optimiser.
        The votes vote on u (Signum with majority vote); momentum_masking does not apply.
    momentum_masking: DGC's momentum factor masking: clear u where blocks were sent. True is
        DGC; False keeps u, so that the total sent is exactly momentum SGD's total update (at
        ratio 1 it is momentum SGD; with masking it degrades to SGD without momentum).
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

    def validate(self) -> "CompressionConfig":
        def need(cond, name, msg):
            checker("compression: ")(cond, name, f"{msg} (got {getattr(self, name)!r})")

        need(self.method in METHODS, "method",
             f"unknown method; choose one of {', '.join(METHODS)}")
        for name in ("ratio", "warmup_ratio", "ratio_min", "ratio_max"):
            v = getattr(self, name)
            need(v is None or (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= 1),
                 name, "must be in (0, 1]")
        need(self.warmup_ratio >= self.ratio or self.warmup_steps == 0, "warmup_ratio",
             f"must be at least ratio={self.ratio} (warm-up starts denser)")
        need(self.ratio_bounds[0] <= self.ratio <= self.ratio_bounds[1], "ratio_min",
             "ratio_min <= ratio <= ratio_max must hold")
        need(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        need(math.isfinite(self.clip_sigma) and self.clip_sigma >= 0, "clip_sigma",
             "must be a finite number >= 0")
        need(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "warmup_steps",
             "must be a non-negative integer")
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
    def from_dict(cls, d: dict) -> "CompressionConfig":
        """From a YAML/JSON mapping; an unknown key is an error naming it."""
        return cls(**dataclass_kwargs(cls, d, "compression")).validate()
