"""What the controller tells a host agent: job, rank, slot range, sizes and the switch's address.

The controller writes one JSON file per worker (`controller deploy`, `job add`); the agent
reads it, so nothing is copied by hand:

    {"job": 7, "epoch": 1, "rank": 0, "slot_base": 0, "nslots": 16, "block_size": 256,
     "nlanes": 56, "priority": 0, "switch": ["127.0.0.1", 47000],
     "workers": [["127.0.0.1", 50000], ["127.0.0.1", 50001]]}

    >>> agent = connect("agents/job7-rank0.json")      # doctest: +SKIP
    >>> total = agent.allreduce(np.ones(1000, np.float32))  # doctest: +SKIP
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from spina.config import ConfigError, JobConfig, WorkerAddr

FIELDS = ("job", "epoch", "rank", "slot_base", "nslots", "block_size", "nlanes", "priority",
          "switch", "workers")


@dataclass(frozen=True)
class Assignment:
    job: JobConfig
    rank: int
    switch: tuple[str, int]

    def to_dict(self) -> dict:
        j = self.job
        return {"job": j.job, "epoch": j.epoch, "rank": self.rank, "slot_base": j.slot_base,
                "nslots": j.nslots, "block_size": j.block_size, "nlanes": j.nlanes,
                "priority": j.priority, "switch": list(self.switch),
                "workers": [[w.host, w.port] for w in j.workers]}

    @classmethod
    def from_dict(cls, d: dict) -> "Assignment":
        missing = [f for f in FIELDS if f not in d]
        if missing:
            raise ConfigError(f"assignment: field '{missing[0]}' is missing")
        try:
            job = JobConfig(job=int(d["job"]), epoch=int(d["epoch"]),
                            slot_base=int(d["slot_base"]), nslots=int(d["nslots"]),
                            block_size=int(d["block_size"]), nlanes=int(d["nlanes"]),
                            priority=int(d["priority"]),
                            workers=tuple(WorkerAddr(r, str(h), int(p))
                                          for r, (h, p) in enumerate(d["workers"]))).validate()
            switch = (str(d["switch"][0]), int(d["switch"][1]))
        except (TypeError, ValueError, IndexError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"assignment: {e}") from None
        rank = int(d["rank"])
        if not 0 <= rank < job.nworkers:
            raise ConfigError(f"assignment: field 'rank': {rank} outside 0..{job.nworkers - 1}")
        return cls(job, rank, switch)


def write(path, a: Assignment) -> bool:
    """Write `a` to `path` unless it already says the same; True if the file changed."""
    path = pathlib.Path(path)
    text = json.dumps(a.to_dict(), indent=1) + "\n"
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def load(path) -> Assignment:
    try:
        d = json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    try:
        return Assignment.from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def connect(path, **agent_kwargs):
    """A host agent for the assignment in `path` (keyword arguments go to Agent)."""
    from host_agent.agent import Agent
    a = load(path)
    return Agent(a.job, a.rank, a.switch, **agent_kwargs)
