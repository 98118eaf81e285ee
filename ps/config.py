"""The parameter server's policy configuration: one dataclass, validated in one place.

Every error is a spina.config.ConfigError whose message names the offending field.
"""
from __future__ import annotations

from dataclasses import dataclass

from spina.fields import checker, dataclass_kwargs

POLICIES = ("bsp", "asp", "ssp", "gssp")


@dataclass(frozen=True)
class PolicyConfig:
    """How workers are synchronised and what they push.

    policy: bsp (every worker waits for all: SSP with staleness 0), asp (nobody waits), ssp
        (a worker may be at most `staleness` clocks ahead of the slowest worker), gssp (the
        same bound, but only within the worker's group; groups never wait for each other).
    staleness: the SSP/GSSP bound s in clocks (iterations).
    ngroups: GSSP: at most this many speed groups. split_ratio: GSSP: two workers land in
        different groups only where sorted iteration times jump by more than this factor.
    warmup: GSSP: coordinator ticks (one per worker iteration) measured before the first
        grouping; until then every worker is in one group (plain SSP).
    regroup_every: GSSP: ticks between regrouping decisions (0: group once after warmup).
    lr: server-side SGD step; each push applies w -= lr / nworkers * g (so BSP is
        synchronous SGD on the mean gradient).
    topk_ratio: fraction of blocks each push carries (block top-k with error feedback;
        1.0 sends dense gradients). block_size: elements per block.
    gdtopk: GSSP only: each group gets its own top-k ratio, adjusted every `adjust_every`
        ticks in [min_ratio, max_ratio] so that slower groups send less (ps/topk.py).
    timeout: seconds any RPC or any wait for other workers may take before it is an error.
    """
    policy: str = "ssp"
    staleness: int = 3
    ngroups: int = 2
    split_ratio: float = 1.5
    warmup: int = 20
    regroup_every: int = 50
    lr: float = 0.05
    topk_ratio: float = 1.0
    block_size: int = 64
    gdtopk: bool = False
    min_ratio: float = 0.05
    max_ratio: float = 1.0
    adjust_every: int = 20
    timeout: float = 30.0

    @property
    def bound(self) -> float:
        """The staleness bound the coordinator enforces (inf: none)."""
        return {"bsp": 0, "asp": float("inf")}.get(self.policy, self.staleness)

    def validate(self) -> "PolicyConfig":
        need = checker("ps policy: ")
        need(self.policy in POLICIES, "policy",
             f"{self.policy!r} is not one of {', '.join(POLICIES)}")
        for name in ("staleness", "ngroups", "warmup", "regroup_every", "block_size",
                     "adjust_every"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool), name, f"{v!r} is not an integer")
        need(self.staleness >= 0, "staleness", "must be >= 0 clocks")
        need(self.ngroups >= 1, "ngroups", "must be >= 1")
        need(self.split_ratio > 1.0, "split_ratio",
             "must be > 1 (a factor between iteration times)")
        need(self.warmup >= 0, "warmup", "must be >= 0 ticks")
        need(self.regroup_every >= 0, "regroup_every", "must be >= 0 ticks (0: group once)")
        need(self.lr > 0, "lr", "must be positive")
        need(0 < self.topk_ratio <= 1, "topk_ratio", "must be in (0, 1]")
        need(self.block_size >= 1, "block_size", "must be >= 1 element")
        need(isinstance(self.gdtopk, bool), "gdtopk", f"{self.gdtopk!r} is not a boolean")
        need(not self.gdtopk or self.policy == "gssp", "gdtopk",
             "needs policy 'gssp' (ratios are per group)")
        need(0 < self.min_ratio <= 1, "min_ratio", "must be in (0, 1]")
        need(self.min_ratio <= self.max_ratio <= 1, "max_ratio", "must be in [min_ratio, 1]")
        need(self.adjust_every >= 1, "adjust_every", "must be >= 1 tick")
        need(self.timeout > 0, "timeout", "must be positive (seconds)")
        return self

    @classmethod
    def from_dict(cls, d: dict) -> "PolicyConfig":
        """From JSON/YAML data; unknown fields and wrong types are errors naming the field."""
        return cls(**dataclass_kwargs(cls, d, "ps policy")).validate()
