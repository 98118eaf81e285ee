"""Child processes of the benchmark: the software switch, SpINA workers and gloo workers.

Every participant runs in its own process (spawned, so none inherits a big parent heap),
all on 127.0.0.1. Each worker builds its own tensor from a seed (same seed in every method,
so SpINA and gloo sum the same tensors) and times its own calls between barriers; the
parent takes the slowest worker of each repeat as the repeat's time.
"""
from __future__ import annotations

import cProfile
import os
import resource
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np

from spina.net import init_loopback_gloo

DATA_SEED = 20261129


@dataclass(frozen=True)
class Point:
    """One measurement point of the sweep."""
    sweep: str          # which factor this point varies ("base" for the base point itself)
    workers: int
    elements: int
    density: float      # fraction of non-zero data blocks per worker
    block_size: int     # SpINA block size B
    nlanes: int         # SpINA blocks per packet
    data_block: int     # block size of the generated sparsity pattern
    nslots: int = 16
    rto: float | None = None  # agent's first retransmission timeout (None: Agent's default)
    loss: float | None = None  # random loss each way in network namespaces (None: loopback)

    def key(self) -> tuple:
        return (self.workers, self.elements, self.density, self.block_size, self.nlanes,
                self.data_block, self.nslots, self.rto, self.loss)


# ----------------------------------------------------------------------------- data
def make_tensor(p: Point, rank: int) -> np.ndarray:
    """Worker `rank`'s float32 tensor: a fraction p.density of its data blocks non-zero.

    Each worker picks its own blocks (independent draws), values standard normal, so the
    union over workers is denser than any one worker (as with per-worker top-k).
    """
    rng = np.random.default_rng([DATA_SEED, p.elements, int(p.density * 1e6), p.data_block, rank])
    nblocks = -(-p.elements // p.data_block)
    nnz = max(1, round(p.density * nblocks)) if p.density > 0 else 0
    x = np.zeros(nblocks * p.data_block, np.float32)
    if nnz == nblocks:
        x[:] = rng.standard_normal(len(x), np.float32)
    elif nnz:
        blocks = np.sort(rng.choice(nblocks, nnz, replace=False))
        view = x.reshape(nblocks, p.data_block)
        view[blocks] = rng.standard_normal((nnz, p.data_block), np.float32)
    return x[:p.elements]


@dataclass
class Expected:
    """The exact answer for a point, from numpy in float64."""
    total: np.ndarray    # sum over workers
    abssum: np.ndarray   # sum of |x| over workers (bounds float32 rounding under cancellation)
    maxabs: float        # largest |value| at any worker (bounds SpINA's quantization step)


def expected_sum(p: Point) -> Expected:
    total = np.zeros(p.elements, np.float64)
    abssum = np.zeros(p.elements, np.float64)
    maxabs = 0.0
    for r in range(p.workers):
        x = make_tensor(p, r)
        total += x
        a = np.abs(x)
        abssum += a
        maxabs = max(maxabs, float(a.max()) if len(a) else 0.0)
    return Expected(total, abssum, maxabs)


def check_result(got: np.ndarray, want: Expected, nworkers: int, quantized: bool) -> float:
    """Max abs error of `got`; raises AssertionError if it exceeds the documented bound.

    SpINA quantizes with a shift agreed per slot from the largest exponent, so each
    element's error is at most nworkers * 2**(E + headroom - 31) (docs/aggregation.md),
    plus float32 rounding of the result; elements that are zero at every worker must be
    exactly zero. The gloo baselines sum in float32 (rounding only: n * 2**-24 * sum |x|).
    """
    exact = want.total
    if got.shape != exact.shape:
        raise AssertionError(f"result shape {got.shape} != expected {exact.shape}")
    step = 0.0
    if quantized and want.maxabs > 0:
        e = int(np.frexp(want.maxabs)[1])
        headroom = int(np.ceil(np.log2(nworkers))) if nworkers > 1 else 0
        step = nworkers * 2.0 ** (e + headroom - 31)
    worst = 0.0
    chunk = 1 << 22  # bounded temporaries, even at 100M elements
    for lo in range(0, len(exact), chunk):
        g, x, a = (v[lo:lo + chunk] for v in (got, exact, want.abssum))
        err = np.abs(g.astype(np.float64) - x)
        bound = a * (nworkers * 2.0 ** -23) + step
        bad = ~(err <= bound)  # also catches NaN
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise AssertionError(f"{int(bad.sum())} wrong elements in chunk at {lo}; first at "
                                 f"{lo + i}: got {g[i]!r}, expected {x[i]!r}, bound {bound[i]:.3g}")
        if (g[a == 0] != 0).any():
            raise AssertionError(f"non-zero result where every worker's tensor is zero "
                                 f"(chunk at {lo})")
        worst = max(worst, float(err.max()) if len(err) else 0.0)
    return worst


def _cpu() -> float:
    """CPU seconds (user + system) of this process so far, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ----------------------------------------------------------------------------- switch
def switch_main(conn, profile_path: str | None, netns: str | None = None,
                host: str = "127.0.0.1") -> None:
    """The software switch in its own process, listening on `host` (any free port), in
    network namespace `netns` if given.

    Protocol on `conn`: send our address; receive a JobConfig (admit it, start serving);
    receive "stop" -> reply with packet/byte counters and the CPU time spent serving.
    """
    from bench.netns import enter
    from softswitch.udp import UdpSwitch

    enter(netns)
    sw = UdpSwitch(host, port=0)
    conn.send(sw.address)
    job = conn.recv()
    sw.add_job(job)
    conn.send("admitted")
    cpu0, wall0 = _cpu(), time.perf_counter()

    def serve():
        if profile_path:
            # CPU time of this thread: blocking in recvfrom while idle is not switch work.
            prof = cProfile.Profile(time.thread_time)
            prof.runcall(sw.serve_forever)
            prof.dump_stats(profile_path)
        else:
            sw.serve_forever()

    t = threading.Thread(target=serve, name="switch")
    t.start()
    conn.recv()  # "stop"
    sw._stop.set()
    t.join()
    cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    conn.send(dict(packets_in=sw.packets_in, packets_out=sw.packets_out, bytes_in=sw.bytes_in,
                   bytes_out=sw.bytes_out, cpu_s=cpu, wall_s=wall,
                   counters=sw.pipeline.job_counters(job.job)))
    sw.sock.close()


# ----------------------------------------------------------------------------- SpINA worker
def spina_worker(rank: int, p: Point, repeats: int, conn, barrier, profile_path: str | None,
                 memory: bool, netns: str | None = None, host: str = "127.0.0.1") -> None:
    """One SpINA worker: bind, report the port, get the job, then warm up and time repeats
    (in network namespace `netns` if given, bound to `host`)."""
    reporting_failure(rank, conn, barrier, _spina_worker, rank, p, repeats, conn, barrier,
                      profile_path, memory, netns, host)


def reporting_failure(rank: int, conn, barrier, fn, *args):
    """fn(*args) in a worker process; if it fails, break `barrier` and send the parent the
    error on `conn` (so neither the other workers nor the parent hang), then re-raise."""
    try:
        return fn(*args)
    except BaseException as e:
        barrier.abort()
        conn.send(dict(error=f"rank {rank}: {type(e).__name__}: {e}"))
        raise


def _spina_worker(rank, p, repeats, conn, barrier, profile_path, memory, netns, host):
    from bench.netns import enter
    from host_agent.agent import Agent
    from spina.net import bound_udp_socket

    enter(netns)
    sock = bound_udp_socket(host)
    conn.send(sock.getsockname())
    job, switch_addr = conn.recv()
    kw = {} if p.rto is None else {"rto": p.rto}
    agent = Agent(job, rank, switch_addr, sock=sock, timeout=30.0, **kw)
    x = make_tensor(p, rank)
    want = expected_sum(p) if rank == 0 else None

    def verify(res):
        err = check_result(res, want, p.workers, quantized=True) if rank == 0 else 0.0
        return err, zlib.crc32(res.view(np.uint8))

    barrier.wait()
    res = agent.allreduce(x)  # warm-up (not timed), verified like every timed call
    errs, crcs = [verify(res)[0]], [verify(res)[1]]
    del res
    times, cpus, stats = [], [], []
    # CPU time of this thread (the agent's work), not wall time: 6 processes share 2 cores
    # here, so wall-clock attribution would charge preemption to whatever line was running.
    prof = cProfile.Profile(time.thread_time) if profile_path else None
    for _ in range(repeats):
        barrier.wait()
        c0, t0 = _cpu(), time.perf_counter()
        if prof:
            res = prof.runcall(agent.allreduce, x)
        else:
            res = agent.allreduce(x)
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
        stats.append(agent.last_stats)
        err, crc = verify(res)
        errs.append(err)
        crcs.append(crc)
        del res
    if prof:
        prof.dump_stats(profile_path)
    mem = measure_memory(agent, x) if memory else None
    barrier.wait()
    s = stats[-1]
    conn.send(dict(times=times, cpu=cpus, max_err=max(errs), crcs=crcs,
                   bytes_sent=s.bytes_sent, payload_bytes_sent=s.payload_bytes_sent,
                   packets_sent=s.packets_sent, bytes_received=s.bytes_received,
                   packets_received=s.packets_received, resends=sum(t.resends for t in stats),
                   resends_per_call=[t.resends for t in stats],
                   spurious_per_call=[t.spurious_resends for t in stats],
                   timeouts_per_call=[t.timeout_resends for t in stats],
                   nonzero_blocks=s.nonzero_blocks, rounds=s.rounds, memory=mem))
    agent.close()


def measure_memory(agent, x) -> dict:
    """Extra memory of one call: peak tracemalloc'ed bytes above the start, and RSS growth.

    numpy reports its buffers to tracemalloc, so the peak covers every temporary array
    (and the returned result). Other workers keep calling meanwhile (the switch needs all).
    """
    import tracemalloc
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rss0 = _rss()
    res = agent.allreduce(x)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    out = dict(peak_traced=peak, rss_growth=_rss() - rss0, result_bytes=res.nbytes)
    del res
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ----------------------------------------------------------------------------- gloo worker
def gloo_worker(rank: int, p: Point, repeats: int, port: int, conn, methods) -> None:
    """One torch.distributed gloo worker: dense all_reduce, then sparse all_gather + sum."""
    try:
        conn.send(_gloo_worker(rank, p, repeats, port, methods))
    except BaseException as e:
        conn.send(dict(error=f"rank {rank}: {type(e).__name__}: {e}"))
        raise


def _gloo_worker(rank, p, repeats, port, methods):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    init_loopback_gloo(rank, p.workers, port)  # rendezvous and transport on 127.0.0.1 only
    x = torch.from_numpy(make_tensor(p, rank))
    want = expected_sum(p) if rank == 0 else None
    out = {}
    for method in methods:
        fn = _gloo_dense if method == "gloo_allreduce" else _gloo_sparse
        times, cpus, sent = [], [], 0
        for i in range(repeats + 1):  # the first call is a warm-up
            dist.barrier()
            c0, t0 = _cpu(), time.perf_counter()
            res, sent = fn(x, p.workers)
            dt, dc = time.perf_counter() - t0, _cpu() - c0
            if i == 0 and rank == 0:
                err = check_result(res.numpy(), want, p.workers, quantized=False)
            if i:
                times.append(dt)
                cpus.append(dc)
            del res
        out[method] = dict(times=times, cpu=cpus, bytes_sent=sent,
                           max_err=err if rank == 0 else 0.0)
    dist.barrier()
    dist.destroy_process_group()
    return out


def _gloo_dense(x, n):
    """Dense all-reduce of a copy (all_reduce is in place); bytes: the ring's 2(n-1)/n."""
    import torch.distributed as dist
    y = x.clone()
    dist.all_reduce(y)
    return y, int(2 * (n - 1) * x.numel() * 4 / n)


def _gloo_sparse(x, n):
    """What users write by hand: all_gather (index, value) of the non-zeros, then sum.

    all_gather needs equal sizes, so counts go first and everyone pads to the largest.
    Bytes: ring all-gather sends n-1 of the n padded chunks (int32 index + float32 value).
    """
    import torch
    import torch.distributed as dist
    idx = torch.nonzero(x, as_tuple=True)[0].to(torch.int32)
    vals = x[idx]
    count = torch.tensor([len(idx)], dtype=torch.int64)
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(counts, count)
    m = int(max(c.item() for c in counts))
    pad_i = torch.zeros(m, dtype=torch.int32)
    pad_v = torch.zeros(m, dtype=x.dtype)
    pad_i[:len(idx)] = idx
    pad_v[:len(idx)] = vals
    all_i = [torch.empty(m, dtype=torch.int32) for _ in range(n)]
    all_v = [torch.empty(m, dtype=x.dtype) for _ in range(n)]
    dist.all_gather(all_i, pad_i)
    dist.all_gather(all_v, pad_v)
    out = torch.zeros_like(x)
    for c, i, v in zip(counts, all_i, all_v):
        k = int(c.item())
        out.index_add_(0, i[:k], v[:k])
    return out, (n - 1) * (8 + 8 * m)
