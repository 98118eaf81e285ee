"""A worker's end of the parameter server: pull weights, push (compressed) gradients, tick.

Every call carries a gRPC deadline, so a crashed or hung server is an error naming it within
the policy's timeout (ShardError names the shard and its address, CoordinatorError the
coordinator), never a hang.
"""
from __future__ import annotations

import grpc
import numpy as np

from ps import wire
from ps.config import PolicyConfig
from ps.server import COORDINATOR_SERVICE, GRPC_OPTIONS, SHARD_SERVICE
from ps.topk import BlockTopK


class PSError(RuntimeError):
    """A parameter-server call that failed; the message names the server."""


class ShardError(PSError):
    """A shard did not answer in time or refused a call; `.shard` is its index."""

    def __init__(self, msg: str, shard: int):
        super().__init__(msg)
        self.shard = shard


class CoordinatorError(PSError):
    """The coordinator did not answer in time or refused a call."""


class PSClient:
    """Worker `worker`'s connection to the shards and the coordinator.

    Args:
        worker: this worker's number, 0..nworkers-1.
        shards: "host:port" of each shard, in shard order.
        ranges: each shard's [lo, hi) in the flat parameter vector (server.shard_ranges).
        coordinator: "host:port" of the coordinator.
        policy: its `timeout`, `block_size` apply here.

    Example:
        >>> c = PSClient(0, ["127.0.0.1:5001"], [(0, 100)], "127.0.0.1:5000",
        ...              PolicyConfig())  # doctest: +SKIP
        >>> w = c.pull(); c.push(1, grad, ratio=1.0); grant = c.tick(1)  # doctest: +SKIP
    """

    def __init__(self, worker: int, shards: list[str], ranges: list[tuple[int, int]],
                 coordinator: str, policy: PolicyConfig):
        self.worker, self.addrs, self.ranges, self.cfg = worker, list(shards), list(ranges), policy
        self.n = ranges[-1][1]
        self._channels = [grpc.insecure_channel(a, options=GRPC_OPTIONS) for a in shards]
        self._coord_channel = grpc.insecure_channel(coordinator, options=GRPC_OPTIONS)
        self.coordinator = coordinator
        self._pull = [c.unary_unary(f"/{SHARD_SERVICE}/Pull") for c in self._channels]
        self._push = [c.unary_unary(f"/{SHARD_SERVICE}/Push") for c in self._channels]
        self._tick = self._coord_channel.unary_unary(f"/{COORDINATOR_SERVICE}/Tick")
        self._leave = self._coord_channel.unary_unary(f"/{COORDINATOR_SERVICE}/Leave")
        self.compressor = BlockTopK(self.n, policy.block_size)
        self.bytes_pushed = 0
        self.bytes_pulled = 0
        self._last_push: list[bytes] = []

    def _shard_error(self, i: int, e: grpc.RpcError) -> ShardError:
        return ShardError(f"server shard {i} at {self.addrs[i]}: {e.code().name}: {e.details()}", i)

    def _all(self, stubs, bodies) -> list[bytes]:
        """Send one body to each shard at once; wait for every answer (bounded)."""
        futs = [s.future(b, timeout=self.cfg.timeout) for s, b in zip(stubs, bodies)]
        out = []
        for i, f in enumerate(futs):
            try:
                out.append(f.result())
            except grpc.RpcError as e:
                for g in futs:
                    g.cancel()
                raise self._shard_error(i, e) from None
        return out

    def pull(self) -> np.ndarray:
        """The current flat weights (float32), one range from each shard."""
        req = wire.pack({"worker": self.worker})
        answers = self._all(self._pull, [req] * len(self._pull))
        self.bytes_pulled += sum(len(a) for a in answers) + len(req) * len(answers)
        return np.concatenate([wire.unpack(a)[1][0] for a in answers])

    def push(self, clock: int, grad: np.ndarray, ratio: float = 1.0) -> int:
        """Push this worker's gradient of iteration `clock` (1, 2, ...), block top-k compressed
        with error feedback when `ratio` < 1; returns the bytes sent."""
        B = self.cfg.block_size
        head = {"worker": self.worker, "clock": clock}
        if ratio >= 1.0:
            bodies = [wire.pack(dict(head, sparse=False), grad[lo:hi]) for lo, hi in self.ranges]
        else:
            idx, vals = self.compressor.compress(grad, ratio)
            vals = vals.reshape(len(idx), B)
            bodies = []
            for lo, hi in self.ranges:
                sel = (idx >= lo // B) & (idx < -(-hi // B))
                bodies.append(wire.pack(dict(head, sparse=True), idx[sel] - lo // B, vals[sel]))
        self._last_push = bodies
        self._all(self._push, bodies)
        sent = sum(len(b) for b in bodies)
        self.bytes_pushed += sent
        return sent

    def resend_last(self) -> None:
        """Send the last push again, byte for byte: what a retry after an ambiguous failure
        (a timeout after the shard may have applied it) does. Shards acknowledge it without
        applying it twice."""
        self._all(self._push, self._last_push)

    def tick(self, clock: int, stats: dict | None = None) -> dict:
        """Report `clock` finished; returns when the policy lets this worker go on:
        {"group", "epoch", "ratio"}."""
        req = wire.pack({"worker": self.worker, "clock": clock, "stats": stats})
        try:  # the coordinator's own wait is bounded by the timeout: give its answer room
            return wire.unpack(self._tick(req, timeout=self.cfg.timeout + 5))[0]
        except grpc.RpcError as e:
            raise CoordinatorError(f"coordinator at {self.coordinator}: {e.code().name}: "
                                   f"{e.details()}") from None

    def leave(self) -> None:
        """Tell the coordinator this worker stops (others no longer wait for it)."""
        try:
            self._leave(wire.pack({"worker": self.worker}), timeout=self.cfg.timeout)
        except grpc.RpcError as e:
            raise CoordinatorError(f"coordinator at {self.coordinator}: {e.code().name}: "
                                   f"{e.details()}") from None

    def close(self) -> None:
        for c in self._channels + [self._coord_channel]:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
