"""A whole parameter server in one process: shards and the coordinator, each its own gRPC
server on loopback, and clients for the workers (threads of the same process, or others).

    >>> with LocalPS(np.zeros(1000, np.float32), nworkers=4,
    ...              policy=PolicyConfig()) as ps:  # doctest: +SKIP
    ...     client = ps.client(0)
"""
from __future__ import annotations

import numpy as np

from ps.client import PSClient
from ps.config import PolicyConfig
from ps.server import Coordinator, ShardServer, shard_ranges


class LocalPS:
    """`nshards` shards holding `init` and a coordinator for `nworkers` workers under `policy`."""

    def __init__(self, init: np.ndarray, nworkers: int, policy: PolicyConfig, nshards: int = 2):
        self.policy = policy.validate()
        self.nworkers = nworkers
        init = np.asarray(init, np.float32).reshape(-1)
        self.ranges = shard_ranges(len(init), nshards, policy.block_size)
        self.shards: list[ShardServer] = []
        self.coordinator: Coordinator | None = None
        try:
            for i, (lo, hi) in enumerate(self.ranges):
                self.shards.append(ShardServer(i, lo, init[lo:hi], nworkers, policy).start())
            self.coordinator = Coordinator(nworkers, policy).start()
        except BaseException:
            self.close()
            raise

    def client(self, worker: int) -> PSClient:
        return PSClient(worker, [s.address for s in self.shards], self.ranges,
                        self.coordinator.address, self.policy)

    def weights(self) -> np.ndarray:
        """The flat weights, read in-process from every shard."""
        return np.concatenate([s.weights() for s in self.shards])

    def close(self) -> None:
        for s in self.shards + ([self.coordinator] if self.coordinator else []):
            s.stop(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
