"""What the controller tells a host agent: the job (id, epoch, slot range, block size, nlanes,
every worker's address), the switch's address and, per worker, its rank.

The controller writes, per job, `job<ID>.json` in the job-file format every other consumer reads
(spina.config.JobFile: `host_agent.torch_hook.agent_from_env`, the agent daemon's `attach`),
and per worker `job<ID>-rank<R>.json`: the same object plus `"rank"`, for a host agent that
knows nothing but its file. Nothing is copied by hand.

    {"rank": 1, "switch": {"host": "127.0.0.1", "port": 47000},
     "job": {"job": 7, "epoch": 1, "slot_base": 0, "nslots": 16, "block_size": 256,
             "nlanes": 56, "workers": [{"host": "127.0.0.1", "port": 50000}, ...], ...}}

    >>> agent = connect("agents/job7-rank0.json")            # doctest: +SKIP
    >>> total = agent.allreduce(np.ones(1000, np.float32))   # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

from spina.config import ConfigError, JobConfig, JobFile


@dataclass(frozen=True)
class Assignment:
    job: JobConfig
    rank: int
    switch: tuple[str, int]
    rendezvous: tuple[str, int] | None = None  # spina.rendezvous: each run's epoch

    def to_dict(self) -> dict:
        return {"rank": self.rank, **JobFile(self.job, self.switch, self.rendezvous).to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Assignment":
        if not isinstance(d, dict) or "rank" not in d:
            raise ConfigError("assignment: field 'rank' is missing")
        d = dict(d)
        rank = d.pop("rank")
        jf = JobFile.from_dict(d)
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < jf.job.nworkers:
            raise ConfigError(f"assignment: field 'rank': {rank!r} outside "
                              f"0..{jf.job.nworkers - 1}")
        return cls(jf.job, rank, jf.switch, jf.rendezvous)


def _write_text(path: pathlib.Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees half a file
    return True


def write(path, a: Assignment) -> bool:
    """Write a worker's file unless it already says the same; True if the file changed."""
    return _write_text(pathlib.Path(path), json.dumps(a.to_dict(), indent=1) + "\n")


def write_job_file(path, job: JobConfig, switch: tuple[str, int],
                   rendezvous: tuple[str, int] | None = None) -> bool:
    """Write the job's spina.config.JobFile unless unchanged; True if the file changed."""
    return _write_text(pathlib.Path(path),
                       json.dumps(JobFile(job, switch, rendezvous).to_dict(), indent=1) + "\n")


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
    return Agent(a.job, a.rank, a.switch, rendezvous=a.rendezvous, **agent_kwargs)
