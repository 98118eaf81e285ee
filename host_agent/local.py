"""A whole job in one process: a software switch thread and N agents on loopback.

For tests, notebooks and single-machine use:

    >>> with LocalCluster(4) as c:                       # doctest: +SKIP
    ...     sums = c.allreduce([np.ones(10, np.float32)] * 4)
"""
from __future__ import annotations

import concurrent.futures

from host_agent.agent import Agent
from host_agent.recovery import MIN_RTO
from softswitch.udp import UdpSwitch
from spina.config import JobConfig, WorkerAddr
from spina.net import bound_udp_socket


class LocalCluster:
    """A software switch (thread) and `nworkers` agents, each with its own loopback socket."""

    def __init__(self, nworkers: int, job: int = 1, timeout: float = 10.0, rto: float = MIN_RTO,
                 switch: UdpSwitch | None = None, **job_fields):
        self.own_switch = switch is None
        self.switch = switch or UdpSwitch(port=0).start()
        socks = [bound_udp_socket() for _ in range(nworkers)]
        workers = tuple(WorkerAddr(r, *s.getsockname()) for r, s in enumerate(socks))
        self.job = JobConfig(job=job, workers=workers, **job_fields)
        self.switch.add_job(self.job)
        self.agents = [Agent(self.job, r, self.switch.address, sock=s, timeout=timeout, rto=rto)
                       for r, s in enumerate(socks)]
        self._pool = concurrent.futures.ThreadPoolExecutor(nworkers)

    def allreduce(self, tensors, ranks=None, blocks=None):
        """Run all-reduce on every agent (or on `ranks` only) at once; returns their results.

        blocks: optional per-rank list of `Agent.allreduce` block hints (indexed like tensors)."""
        ranks = range(len(self.agents)) if ranks is None else ranks
        hints = blocks if blocks is not None else [None] * len(tensors)
        futs = [self._pool.submit(self.agents[r].allreduce, tensors[r], False, hints[r])
                for r in ranks]
        return [f.result() for f in futs]

    def reduce_scatter(self, tensors, ranks=None, blocks=None):
        """Run reduce-scatter on every agent (or on `ranks` only) at once, rank r with
        tensors[r] (and blocks[r], if given); returns their shards."""
        ranks = range(len(self.agents)) if ranks is None else ranks
        hints = blocks if blocks is not None else [None] * len(tensors)
        futs = [self._pool.submit(self.agents[r].reduce_scatter, tensors[r], hints[r])
                for r in ranks]
        return [f.result() for f in futs]

    def allgather(self, shards, ranks=None):
        """Run all-gather on every agent (or on `ranks` only) at once, rank r with shards[r];
        returns their results."""
        ranks = range(len(self.agents)) if ranks is None else ranks
        futs = [self._pool.submit(self.agents[r].allgather, shards[r]) for r in ranks]
        return [f.result() for f in futs]

    def close(self) -> None:
        self._pool.shutdown()
        for a in self.agents:
            a.close()
        if self.own_switch:
            self.switch.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
