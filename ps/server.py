"""The servers: parameter shards (data) and the coordinator (policy), each a gRPC service.

A shard holds one contiguous, block-aligned range of the flat parameter vector and applies
pushes to it (SGD: w -= lr / nworkers * g). It remembers, per worker, the last clock it
applied: a resent push (same worker and clock) is acknowledged and not applied again, and a
push that skips a clock is refused naming the clocks that went missing, so no update is lost
or applied twice without an error.

The coordinator enforces the policy. Each worker calls Tick after its pushes of clock c were
acknowledged by every shard; Tick records the clock and returns once the worker may start
iteration c + 1: at once under ASP, when the slowest worker it waits for has finished
c - s iterations under SSP (s = staleness) and BSP (s = 0), and under GSSP the same but only
over the worker's own speed group. Because a clock is only reported after its pushes were
applied, a worker that starts clock c sees every update of clocks <= c - s of the workers it
waits for (the SSP guarantee). Tick also carries the worker's measured iteration and push
times, from which the coordinator groups workers by speed (GSSP) and sets each group's
top-k ratio (GDTopK). Every wait is bounded by the policy's timeout; the error names the
workers that were waited for.

Both services are plain classes: any number of them can run in one process (tests) or one
per process (`python -m ps shard`, `python -m ps coordinator`).
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import grpc
import numpy as np

from ps import wire
from ps.config import PolicyConfig
from ps.topk import gdtopk_ratios, group_by_speed

log = logging.getLogger("spina.ps")

GRPC_OPTIONS = [("grpc.max_send_message_length", 256 << 20),
                ("grpc.max_receive_message_length", 256 << 20)]
SHARD_SERVICE = "spina.ps.Shard"
COORDINATOR_SERVICE = "spina.ps.Coordinator"


def shard_ranges(n: int, nshards: int, block_size: int) -> list[tuple[int, int]]:
    """`nshards` contiguous [lo, hi) ranges covering 0..n, cut on block boundaries so that a
    block of a compressed push belongs to exactly one shard."""
    nb = -(-n // block_size)
    cuts = [min(n, (nb * i // nshards) * block_size) for i in range(nshards + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(nshards)]


class _GrpcService:
    """A gRPC server on `host:port` (0: any free port) whose methods take and return bytes."""

    def __init__(self, service: str, methods: dict, host: str, port: int, threads: int):
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(threads),
                                   options=GRPC_OPTIONS)
        handlers = {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in methods.items()}
        generic = grpc.method_handlers_generic_handler(service, handlers)
        self._server.add_generic_rpc_handlers((generic,))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"

    def start(self):
        self._server.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        self._server.stop(grace).wait()


class ShardServer(_GrpcService):
    """Shard `index`: the parameters [lo, hi) of the flat vector, initially `init`.

    Args:
        index: the shard's number (named in every error about it).
        lo: offset of the shard's first element in the flat parameter vector.
        init: the shard's initial weights (float32).
        nworkers: pushes are scaled by 1 / nworkers.
        policy: its `lr` and `block_size` apply here.
    """

    def __init__(self, index: int, lo: int, init: np.ndarray, nworkers: int, policy: PolicyConfig,
                 host: str = "127.0.0.1", port: int = 0, threads: int = 8):
        self.index, self.lo = index, lo
        self.w = np.array(init, np.float32).reshape(-1)
        self.step = np.float32(policy.lr / nworkers)
        self.B = policy.block_size
        if lo % self.B:
            raise ValueError(f"shard {index}: offset {lo} is not on a block boundary ({self.B})")
        self.applied: dict[int, int] = {}  # worker -> last clock applied
        self.updates = 0                   # pushes applied
        self.duplicates = 0                # pushes acknowledged without applying (resends)
        self.bytes_in = 0
        self.bytes_out = 0
        self._lock = threading.Lock()
        super().__init__(SHARD_SERVICE, {"Pull": self._pull, "Push": self._push}, host, port,
                         threads)

    def weights(self) -> np.ndarray:
        with self._lock:
            return self.w.copy()

    def _pull(self, body: bytes, context) -> bytes:
        with self._lock:
            out = wire.pack({"shard": self.index, "updates": self.updates}, self.w)
            self.bytes_in += len(body)
            self.bytes_out += len(out)
        return out

    def _push(self, body: bytes, context) -> bytes:
        head, arrays = wire.unpack(body)
        w, clock = int(head["worker"]), int(head["clock"])
        with self._lock:
            self.bytes_in += len(body)
            last = self.applied.get(w, 0)
            if clock <= last:
                self.duplicates += 1
                return wire.pack({"applied": False, "duplicate": True})
            if clock != last + 1:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"shard {self.index}: worker {w} pushed clock {clock} but its last "
                              f"applied clock is {last}: clocks {last + 1}..{clock - 1} were lost")
            if head["sparse"]:
                idx, vals = arrays
                blocks = vals.reshape(len(idx), self.B)
                for j, b in enumerate(idx.tolist()):  # a partial last block is cut to the shard
                    seg = self.w[b * self.B:(b + 1) * self.B]
                    seg -= self.step * blocks[j, :len(seg)]
            else:
                (g,) = arrays
                if len(g) != len(self.w):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"shard {self.index}: dense push of {len(g)} elements, "
                                  f"holds {len(self.w)}")
                self.w -= self.step * g
            self.applied[w] = clock
            self.updates += 1
        return wire.pack({"applied": True, "duplicate": False})


class Coordinator(_GrpcService):
    """Clocks, speed groups and top-k ratios of `nworkers` workers under `policy`.

    `grants` logs every permission given: (worker, its clock since the last regrouping, the
    smallest such clock among the workers it waits for, group, grouping epoch); a test checks
    the staleness bound on it. `history` logs regroupings and ratio changes with their time.
    """

    def __init__(self, nworkers: int, policy: PolicyConfig, host: str = "127.0.0.1", port: int = 0,
                 threads: int | None = None):
        self.n, self.cfg = nworkers, policy.validate()
        self.clock = [0] * nworkers
        self.base = [0] * nworkers           # clock at the last regrouping
        self.left = [False] * nworkers
        self.group = [0] * nworkers
        self.epoch = 0                       # grouping epoch
        self.ratio = {0: policy.topk_ratio if not policy.gdtopk else policy.max_ratio}
        self.meas = [None] * nworkers        # per worker EMA of {"t", "push", "ratio"}
        self.ticks = 0
        self.grants: list[tuple[int, int, int, int, int]] = []
        self.history: list[dict] = []
        self.t0 = time.monotonic()
        self._cond = threading.Condition()
        super().__init__(COORDINATOR_SERVICE, {"Tick": self._tick, "Leave": self._leave}, host,
                         port, threads or 2 * nworkers + 4)

    # ----------------------------------------------------------------- policy
    def _members(self, w: int) -> list[int]:
        """The workers `w` waits for (itself included), excluding those that left."""
        if self.cfg.policy == "gssp":
            ws = [v for v in range(self.n) if self.group[v] == self.group[w]]
        else:
            ws = range(self.n)
        return [v for v in ws if not self.left[v] or v == w]

    def _slowest(self, w: int) -> int:
        return min(self.clock[v] - self.base[v] for v in self._members(w))

    def _allowed(self, w: int) -> bool:
        return self.clock[w] - self.base[w] - self._slowest(w) <= self.cfg.bound

    def _measure(self, w: int, stats: dict | None) -> None:
        if not stats:
            return
        m = self.meas[w]
        self.meas[w] = dict(stats) if m is None else {k: 0.7 * m[k] + 0.3 * stats[k] for k in m}

    def _regroup(self) -> None:
        cfg = self.cfg
        if cfg.policy != "gssp" or self.ticks < cfg.warmup or any(m is None for m in self.meas):
            return
        first = self.epoch == 0
        if not first and (cfg.regroup_every == 0 or self.ticks % cfg.regroup_every):
            return
        # Ratio-independent speed: the compute part plus a dense push, so that GDTopK's own
        # savings never move a slow worker into the fast group.
        times = [m["t"] - m["push"] + m["push"] / max(m["ratio"], 1e-9) for m in self.meas]
        new = group_by_speed(times, cfg.ngroups, cfg.split_ratio)
        if first or new != self.group:
            self.group = new
            self.base = list(self.clock)
            self.epoch += 1
            self.ratio = {g: self.ratio.get(g, cfg.max_ratio if cfg.gdtopk else cfg.topk_ratio)
                          for g in set(new)}
            self.history.append({"t": time.monotonic() - self.t0, "event": "groups",
                                 "groups": list(new), "times": [round(x, 5) for x in times]})
            log.info("ps: grouping %d: %s (iteration times %s)", self.epoch, new, times)

    def _adjust(self) -> None:
        cfg = self.cfg
        if not cfg.gdtopk or self.epoch == 0 or self.ticks % cfg.adjust_every:
            return
        per = {}
        for g in set(self.group):
            ms = [self.meas[v] for v in range(self.n) if self.group[v] == g and not self.left[v]]
            if ms:
                per[g] = {k: sum(m[k] for m in ms) / len(ms) for k in ("t", "push", "ratio")}
        if len(per) > 1:
            self.ratio.update(gdtopk_ratios(per, self.ratio, cfg.min_ratio, cfg.max_ratio))
            self.history.append({"t": time.monotonic() - self.t0, "event": "ratios",
                                 "ratios": {str(g): round(r, 4) for g, r in self.ratio.items()},
                                 "group_times": {str(g): round(m["t"], 5) for g, m in per.items()}})

    # ----------------------------------------------------------------- API (also in-process)
    def tick(self, w: int, clock: int, stats: dict | None = None) -> dict:
        """Worker `w` has finished (pushed) `clock` iterations; block until it may start the
        next one. Returns {"group", "epoch", "ratio"}. Raises TimeoutError naming the workers
        it waited for."""
        if not 0 <= w < self.n:
            raise ValueError(f"worker {w} outside 0..{self.n - 1}")
        deadline = time.monotonic() + self.cfg.timeout
        with self._cond:
            if clock < self.clock[w]:
                raise ValueError(f"worker {w} reported clock {clock} after {self.clock[w]}")
            self.clock[w] = clock
            self.left[w] = False
            self._measure(w, stats)
            self.ticks += 1
            self._regroup()
            self._adjust()
            self._cond.notify_all()
            while not self._allowed(w):
                left = deadline - time.monotonic()
                if left <= 0:
                    mine = self.clock[w] - self.base[w]
                    late = [v for v in self._members(w)
                            if mine - (self.clock[v] - self.base[v]) > self.cfg.bound]
                    raise TimeoutError(
                        f"worker {w} at clock {clock} waited {self.cfg.timeout} s for workers "
                        f"{late} (clocks {[self.clock[v] for v in late]}) under "
                        f"{self.cfg.policy} with staleness bound {self.cfg.bound}")
                self._cond.wait(left)
            self.grants.append((w, self.clock[w] - self.base[w], self._slowest(w), self.group[w],
                                self.epoch))
            g = self.group[w]
            return {"group": g, "epoch": self.epoch,
                    "ratio": self.ratio.get(g, self.cfg.topk_ratio)}

    def leave(self, w: int) -> None:
        """Worker `w` stops training: nobody waits for it any more."""
        with self._cond:
            self.left[w] = True
            self._cond.notify_all()

    def _tick(self, body: bytes, context) -> bytes:
        head, _ = wire.unpack(body)
        try:
            return wire.pack(self.tick(int(head["worker"]), int(head["clock"]), head.get("stats")))
        except TimeoutError as e:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _leave(self, body: bytes, context) -> bytes:
        head, _ = wire.unpack(body)
        self.leave(int(head["worker"]))
        return wire.pack({})

    def max_staleness(self) -> float:
        """The largest (own clock - slowest waited-for clock) at any grant."""
        return max((mine - slow for _, mine, slow, _, _ in self.grants), default=0)
