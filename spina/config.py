"""Job configuration: loaded and validated in one place, errors name the field."""
from __future__ import annotations

from dataclasses import dataclass, field

from spina import wire


class ConfigError(ValueError):
    """Bad configuration; the message names the offending field."""


@dataclass(frozen=True)
class WorkerAddr:
    rank: int
    host: str
    port: int


@dataclass(frozen=True)
class JobConfig:
    """One aggregation job as the switch and its agents see it.

    job: job id (16 bits on the wire). epoch: incarnation of the job; packets of another
    epoch are stale. workers: one address per rank 0..n-1. slot_base/nslots: the job's share
    of the switch's slot pool (also the agent's window: one outstanding packet per slot).
    block_size: elements per block (B). nlanes: blocks fused per packet (k).
    """
    job: int
    workers: tuple[WorkerAddr, ...]
    slot_base: int = 0
    nslots: int = 16
    block_size: int = 256
    nlanes: int = 56
    epoch: int = 1
    priority: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def nworkers(self) -> int:
        return len(self.workers)

    def validate(self, pool_slots: int | None = None, slot_capacity: int | None = None) -> "JobConfig":
        def need(cond, fieldname, msg):
            if not cond:
                raise ConfigError(f"job {self.job}: field '{fieldname}': {msg}")
        need(0 <= self.job < 1 << 16, "job", "must be in 0..65535")
        need(0 <= self.epoch < 1 << 16, "epoch", "must be in 0..65535")
        need(1 <= self.nworkers <= wire.MAX_WORKERS, "workers",
             f"need 1..{wire.MAX_WORKERS} workers, got {self.nworkers}")
        need([w.rank for w in self.workers] == list(range(self.nworkers)), "workers",
             "ranks must be 0..n-1 in order")
        need(self.nslots >= 1, "nslots", "must be at least 1")
        need(0 <= self.slot_base and self.slot_base + self.nslots <= (pool_slots or 1 << 16),
             "slot_base", f"slots {self.slot_base}..{self.slot_base + self.nslots - 1} "
             f"outside the pool of {pool_slots} slots")
        need(1 <= self.block_size < 1 << 16, "block_size", "must be in 1..65535")
        need(1 <= self.nlanes <= wire.MAX_LANES, "nlanes", f"must be in 1..{wire.MAX_LANES}")
        need(wire.packet_len(self.nlanes, self.block_size, self.nlanes) <= wire.MAX_UDP_PAYLOAD,
             "nlanes", f"{self.nlanes} lanes of {self.block_size} elements exceed a UDP datagram; "
             f"at most {wire.max_lanes_for(self.block_size)} fit")
        if slot_capacity is not None:
            need(self.nlanes * self.block_size <= slot_capacity, "block_size",
                 f"nlanes*block_size = {self.nlanes * self.block_size} exceeds the switch's "
                 f"slot capacity of {slot_capacity} elements")
        need(0 <= self.priority < 8, "priority", "must be in 0..7")
        return self

    @classmethod
    def from_dict(cls, d: dict) -> "JobConfig":
        known = {"job", "workers", "slot_base", "nslots", "block_size", "nlanes", "epoch", "priority"}
        for k in d:
            if k not in known:
                raise ConfigError(f"unknown field '{k}' (known: {', '.join(sorted(known))})")
        if "job" not in d or "workers" not in d:
            raise ConfigError("fields 'job' and 'workers' are required")
        try:
            workers = tuple(WorkerAddr(int(i), str(w["host"]), int(w["port"]))
                            for i, w in enumerate(d["workers"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"field 'workers': each needs 'host' and 'port' ({e})") from None
        kw = {k: int(d[k]) for k in known - {"workers"} if k in d}
        return cls(workers=workers, **kw).validate()
