"""Train a PyTorch model on the parameter server, workers as threads, with stragglers.

`train(task, policy, ...)` starts a LocalPS (shards and coordinator over gRPC on loopback),
one thread per worker running pull -> forward/backward -> push -> tick, and evaluates the
shards' weights on the task's test set every `eval_every` seconds; it returns the
time-to-accuracy curve, each worker's iterations and bytes, and the coordinator's grouping
and ratio history. The workers' compute is real but small: a straggler is made by
`StragglerInjector`, which sleeps (factor - 1) times the measured compute after each
backward pass and, where an uplink rate is set, bytes / rate after each push, so a 3x
straggler stays 3x slower however loaded the machine is.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ps.config import PolicyConfig
from ps.local import LocalPS
from spina.fields import checker


class Task(Protocol):
    """What `train` needs from a model and its data."""
    def make_model(self) -> torch.nn.Module: ...
    def batch(self, worker: int, step: int) -> tuple: ...   # (inputs, targets) of one worker's step
    def loss(self, model: torch.nn.Module, batch: tuple) -> torch.Tensor: ...
    def accuracy(self, model: torch.nn.Module) -> float: ...  # on held-out data, in percent


@dataclass(frozen=True)
class Straggler:
    """Worker `worker` runs `factor` times slower from its iteration `from_step` on (0: from the
    start; later: a worker slowed in the middle of a run), and pushes over an uplink of
    `uplink_mbps` Mbit/s (None: the run's common uplink)."""
    worker: int
    factor: float
    from_step: int = 0
    uplink_mbps: float | None = None


class StragglerInjector:
    """Slows workers down: sleep (factor - 1) x compute, and bytes / uplink after a push."""

    def __init__(self, nworkers: int, stragglers: tuple[Straggler, ...] = (),
                 uplink_mbps: float | None = None):
        need = checker("straggler: ")
        need(uplink_mbps is None or uplink_mbps > 0, "uplink_mbps", "must be positive (Mbit/s)")
        self.slow: dict[int, Straggler] = {}
        for s in stragglers:
            need(0 <= s.worker < nworkers, "worker", f"{s.worker} outside 0..{nworkers - 1}")
            need(s.worker not in self.slow, "worker", f"worker {s.worker} listed twice")
            need(s.factor >= 1.0, "factor", f"{s.factor} < 1 (a slowdown factor)")
            need(s.from_step >= 0, "from_step", "must be >= 0")
            need(s.uplink_mbps is None or s.uplink_mbps > 0, "uplink_mbps",
                 "must be positive (Mbit/s)")
            self.slow[s.worker] = s
        self.uplink = uplink_mbps

    def _active(self, w: int, step: int) -> Straggler | None:
        s = self.slow.get(w)
        return s if s is not None and step >= s.from_step else None

    def after_compute(self, w: int, step: int, seconds: float) -> None:
        s = self._active(w, step)
        if s is not None and s.factor > 1:
            time.sleep((s.factor - 1) * seconds)

    def after_push(self, w: int, step: int, nbytes: int) -> None:
        s = self._active(w, step)
        mbps = s.uplink_mbps if s is not None and s.uplink_mbps else self.uplink
        if mbps:
            time.sleep(nbytes * 8 / (mbps * 1e6))


def flat_params(model: torch.nn.Module) -> np.ndarray:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()


def _worker(w, task, client, injector, stop, max_steps, rec, errors):
    try:
        model = task.make_model()
        params = list(model.parameters())
        grant = client.tick(0)
        k = 0
        while not stop.is_set() and k < max_steps:
            t0 = time.perf_counter()
            torch.nn.utils.vector_to_parameters(torch.from_numpy(client.pull()), params)
            tc = time.perf_counter()
            model.zero_grad(set_to_none=False)
            task.loss(model, task.batch(w, k)).backward()
            g = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
            injector.after_compute(w, k, time.perf_counter() - tc)
            tp = time.perf_counter()
            nbytes = client.push(k + 1, g, grant["ratio"])
            injector.after_push(w, k, nbytes)
            t1 = time.perf_counter()
            k += 1
            rec["ratio"].append(grant["ratio"])
            rec["iter_time"].append(t1 - t0)
            grant = client.tick(k, {"t": t1 - t0, "push": t1 - tp, "ratio": grant["ratio"]})
        rec["steps"] = k
    except BaseException as e:  # handed to the main thread
        errors.append((w, e))
        stop.set()
    finally:
        try:
            client.leave()
        finally:
            client.close()


def train(task: Task, policy: PolicyConfig, nworkers: int, seconds: float, max_steps: int = 10 ** 9,
          stragglers: tuple[Straggler, ...] = (), uplink_mbps: float | None = None,
          nshards: int = 2, eval_every: float = 1.0, seed: int = 0) -> dict:
    """Train until `seconds` of wall-clock time pass or every worker did `max_steps` iterations.

    Returns a JSON-ready dict: "evals" [[seconds, accuracy %, total iterations], ...],
    per-worker "steps", "bytes_pushed", "bytes_pulled", mean "iter_time" and "ratio", the
    coordinator's "groups"/"history", the largest staleness granted, and the load average.
    """
    injector = StragglerInjector(nworkers, stragglers, uplink_mbps)
    torch.manual_seed(seed)
    probe = task.make_model()
    init = flat_params(probe)
    recs = [{"ratio": [], "iter_time": [], "steps": 0} for _ in range(nworkers)]
    errors: list = []
    stop = threading.Event()
    load0 = os.getloadavg()
    with LocalPS(init, nworkers, policy, nshards) as ps:
        clients = [ps.client(w) for w in range(nworkers)]
        threads = [threading.Thread(target=_worker, name=f"ps-worker-{w}",
                                    args=(w, task, clients[w], injector, stop, max_steps,
                                          recs[w], errors))
                   for w in range(nworkers)]

        def evaluate(t):
            torch.nn.utils.vector_to_parameters(torch.from_numpy(ps.weights()), probe.parameters())
            evals.append([round(t, 3), task.accuracy(probe), sum(s.updates for s in ps.shards[:1])])

        evals: list = []
        t0 = time.monotonic()
        evaluate(0.0)
        for t in threads:
            t.start()
        next_eval = eval_every
        while any(t.is_alive() for t in threads):
            now = time.monotonic() - t0
            if now >= seconds:
                stop.set()
                break
            if now >= next_eval:
                evaluate(now)
                next_eval += eval_every
            time.sleep(min(0.05, max(0.0, next_eval - now)))
        for t in threads:
            t.join()
        evaluate(time.monotonic() - t0)
        if errors:
            w, e = errors[0]
            raise RuntimeError(f"worker {w} failed: {e}") from e
        co = ps.coordinator
        return {
            "policy": policy.__dict__, "nworkers": nworkers, "nshards": nshards,
            "stragglers": [s.__dict__ for s in stragglers], "uplink_mbps": uplink_mbps,
            "evals": evals, "final_acc": evals[-1][1],
            "steps": [r["steps"] for r in recs],
            "bytes_pushed": [c.bytes_pushed for c in clients],
            "bytes_pulled": [c.bytes_pulled for c in clients],
            "iter_time": [float(np.mean(r["iter_time"])) if r["iter_time"] else None for r in recs],
            "mean_ratio": [float(np.mean(r["ratio"])) if r["ratio"] else None for r in recs],
            "groups": co.group, "history": co.history, "max_staleness": co.max_staleness(),
            "loadavg_before": load0, "loadavg_after": os.getloadavg(),
        }
