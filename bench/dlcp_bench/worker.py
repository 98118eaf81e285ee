"""A worker process in its namespace: its SpINA agent and gloo group, one timed step of
every layer's all-reduce (checked against the exact sum on rank 0), and the training loop."""
from __future__ import annotations

import os
import time
import zlib
from datetime import timedelta

import numpy as np

from bench.dlcp_bench.fabric import WORKER_PORT
from bench.dlcp_bench.model import VARIANTS, make_gradient, mlp_accuracy, mlp_grad, mlp_init
from bench.paired import guarded
from bench.procs import requests
from examples.digits import flat_split


def worker_main(rank: int, ns: str, n: int, sizes: list[int], gloo_port: int, conn,
                barrier, ip: str, ip0: str, ifname: str) -> None:
    """Rank `rank` in namespace `ns` at `ip` on interface `ifname` (rank 0's address `ip0`:
    gloo's store)."""
    guarded(rank, conn, barrier, _worker, rank, ns, n, sizes, gloo_port, conn, barrier, ip,
            ip0, ifname)


def _worker(rank, ns, n, sizes, gloo_port, conn, barrier, ip, ip0, ifname):
    import dataclasses

    from host_agent import dlcp
    from host_agent.agent import Agent
    from host_agent.recovery import RttEstimator
    from spina.net import bound_udp_socket
    from spina.netns import enter
    enter(ns)
    sock = bound_udp_socket(ip, WORKER_PORT)
    conn.send(sock.getsockname())
    job, switch_addr = conn.recv()
    agent = Agent(job, rank, switch_addr, sock=sock, timeout=60.0)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    dist.init_process_group("gloo", init_method=f"tcp://{ip0}:{gloo_port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=300))
    grads = [make_gradient(sizes, rank, v) for v in range(VARIANTS)]
    exact = None
    if rank == 0:  # the exact sums (float64) and |x| sums, to check every result against
        exact = []
        for v in range(VARIANTS):
            per = [make_gradient(sizes, r, v) for r in range(n)]
            exact.append([(sum(g[i].astype(np.float64) for g in per),
                           sum(np.abs(g[i]).astype(np.float64) for g in per),
                           max(float(np.abs(g[i]).max()) for g in per))
                          for i in range(len(sizes))])
    bufs = [np.empty(s, np.float32) for s in sizes]
    tens = [torch.from_numpy(b) for b in bufs]  # same memory: gloo all-reduces in place
    base = job
    # One latency estimator per configuration, as a job running only that configuration
    # would have: the auto loss deadline (and every timer) follows its own rounds, not the
    # previous configuration's (the step-by-step interleaving changes it every step).
    rtts = {}
    try:
        for req in requests(conn):
            cfg, variant = req[:2]
            if cfg.method == "spina":
                agent.job = dlcp.with_policy(dataclasses.replace(base, priority=cfg.priority),
                                             cfg.bounded_loss, cfg.priority_policy,
                                             cfg.loss_tolerant_policy, cfg.loss_deadline)
                agent.rtt = rtts.setdefault(cfg.name, RttEstimator(agent.rtt.min_rto))
            if variant == "train":
                conn.send(_train(rank, n, cfg, agent, dist, barrier, *req[2:]))
                continue
            conn.send(_step(rank, n, cfg, agent, dist, grads[variant], bufs, tens,
                            exact[variant] if exact else None, barrier))
    finally:
        dist.destroy_process_group()
        agent.close()


def _step(rank, n, cfg, agent, dist, grad, bufs, tens, exact, barrier) -> dict:
    """One step: every layer's gradient all-reduced, last layer first."""
    nl = len(bufs)
    for b, g in zip(bufs, grad):
        np.copyto(b, g)
    stats = dict(blocks=0, blocks_lost=0, partial_rounds=0, loss_tolerant_packets=0,
                 resends=0, timeout_resends=0, calls_lost=[], deadlines=[])
    barrier.wait()
    t0 = time.perf_counter()
    for i in reversed(range(nl)):  # backward: the last layer's gradient is ready first
        if cfg.method == "spina":
            agent.allreduce(bufs[i], inplace=True, layer=(i, nl))
            s = agent.last_stats
            stats["calls_lost"].append(s.blocks_lost)
            stats["deadlines"].append(s.loss_deadline)
            for k in ("blocks_lost", "partial_rounds", "loss_tolerant_packets", "resends",
                      "timeout_resends"):
                stats[k] += getattr(s, k)
        else:
            dist.all_reduce(tens[i])
    dt = time.perf_counter() - t0
    barrier.wait()
    stats.update(time=dt, crc=0, wrong=[], max_err=0.0)
    for b in bufs:
        stats["blocks"] += -(-len(b) // 256)
        stats["crc"] = zlib.crc32(b.view(np.uint8), stats["crc"])
    if exact is not None:
        for b, (total, abssum, maxabs) in zip(bufs, exact):
            err = np.abs(b.astype(np.float64) - total)
            bound = abssum * (n * 2.0 ** -23)
            if cfg.method == "spina":  # the quantization step (bench/procs.check_result)
                e = int(np.frexp(maxabs)[1])
                bound = bound + n * 2.0 ** (e + (int(np.ceil(np.log2(n))) if n > 1 else 0) - 31)
            bad = ~(err <= bound)
            pad = (-len(b)) % 256
            wrong = np.pad(bad, (0, pad)).reshape(-1, 256).any(axis=1)
            stats["wrong"].append(int(np.count_nonzero(wrong)))
            ok = ~bad
            stats["max_err"] = max(stats["max_err"], float(err[ok].max()) if ok.any() else 0.0)
        stats["wrong"].reverse()  # in call order (last layer first), as calls_lost
    return stats


def _train(rank, n, cfg, agent, dist, barrier, widths, steps, every, batch, lr):
    """Data-parallel SGD on digits through the fabric: every worker the same initial weights,
    its own shard, one all-reduce per layer per step (last layer first, with its position).
    Rank 0 evaluates every `every` steps; the clock stops while it does. Returns the curve
    [(step, training seconds, test accuracy)], the losses, and a crc of the final weights."""
    import torch
    xtr, ytr, xte, yte = flat_split(0)
    xs, ys = xtr[rank::n], ytr[rank::n]
    params = mlp_init(widths, 20261201)
    rng = np.random.default_rng([rank, 7])
    nl = len(params)
    curve, lost, partial, elapsed = [], 0, 0, 0.0
    barrier.wait()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        idx = rng.choice(len(ys), batch, replace=False)
        grads = mlp_grad(params, widths, xs[idx], ys[idx])
        for i in reversed(range(nl)):
            if cfg.method == "spina":
                g = agent.allreduce(grads[i], layer=(i, nl))
                lost += agent.last_stats.blocks_lost
                partial += agent.last_stats.partial_rounds
            else:
                t = torch.from_numpy(grads[i])
                dist.all_reduce(t)
                g = grads[i]
            params[i] -= np.float32(lr / n) * g
        elapsed += time.perf_counter() - t0
        if step % every == 0 or step == steps:
            barrier.wait()  # every worker's clock stops here; rank 0 evaluates
            if rank == 0:
                curve.append((step, elapsed, mlp_accuracy(params, widths, xte, yte)))
            barrier.wait()
    crc = 0
    for p in params:
        crc = zlib.crc32(p.view(np.uint8), crc)
    return dict(curve=curve, blocks_lost=lost, partial_rounds=partial, crc=crc,
                seconds=elapsed)
