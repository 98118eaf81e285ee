"""The benchmarks' data, result check and switch process.

Each worker builds its own tensor from a seed (the same for every method, so SpINA and gloo
sum the same tensors); rank 0 checks results against numpy's float64 sum. The software
switch runs in a process of its own (switch_main). The workers: bench/paired.py.
"""
from __future__ import annotations

import cProfile
import os
import resource
import threading
import time
from dataclasses import dataclass

import numpy as np

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


def check_result(got: np.ndarray, want: Expected, nworkers: int, quantized: bool,
                 lane_bits: int = 32) -> float:
    """Max abs error of `got`; raises AssertionError if it exceeds the documented bound.

    SpINA quantizes with a shift agreed per slot from the largest exponent, so each
    element's error is at most nworkers * 2**(E + headroom - 31) (docs/aggregation.md),
    plus float32 rounding of the result; elements that are zero at every worker must be
    exactly zero. Narrow lanes (lane_bits 16, 8) round stochastically: below
    nworkers * 2**(E + headroom + 2 - lane_bits) (docs/bits.md). The gloo baselines sum in
    float32 (rounding only: n * 2**-24 * sum |x|).
    """
    exact = want.total
    if got.shape != exact.shape:
        raise AssertionError(f"result shape {got.shape} != expected {exact.shape}")
    step = 0.0
    if quantized and want.maxabs > 0:
        e = int(np.frexp(want.maxabs)[1])
        headroom = int(np.ceil(np.log2(nworkers))) if nworkers > 1 else 0
        step = nworkers * 2.0 ** (e + headroom - (31 if lane_bits == 32 else lane_bits - 2))
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


def requests(conn):
    """A worker's side of the pipe: say "ready", then yield each request until "stop"."""
    conn.send("ready")
    while (req := conn.recv()) != "stop":
        yield req


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process so far, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ----------------------------------------------------------------------------- switch
def switch_main(conn, profile_path: str | None, netns: str | None = None,
                host: str = "127.0.0.1", datapath: str = "compiled", threads: int = 1,
                slot_capacity: int | None = None) -> None:
    """The software switch in its own process, listening on `host` (any free port), in
    network namespace `netns` if given, running `datapath` on `threads` data-path threads
    (UdpSwitch's datapath, datapath_threads), with slot_capacity values a slot (None: the
    default).

    Protocol on `conn`: send our address; receive a JobConfig or a list of them (admit them,
    start serving);
    receive "stop" -> reply with packet/byte counters and the CPU time spent serving.
    """
    from softswitch.udp import UdpSwitch
    from spina.netns import enter

    enter(netns)
    kw = {} if slot_capacity is None else {"slot_capacity": slot_capacity}
    sw = UdpSwitch(host, port=0, datapath=datapath, datapath_threads=threads, **kw)
    conn.send(sw.address)
    jobs = conn.recv()
    for job in jobs if isinstance(jobs, list) else [jobs]:
        sw.add_job(job)
    conn.send("admitted")
    cpu0, wall0 = cpu_seconds(), time.perf_counter()

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
    sw.shutdown()
    t.join()
    cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    conn.send(dict(packets_in=sw.packets_in, packets_out=sw.packets_out, bytes_in=sw.bytes_in,
                   bytes_out=sw.bytes_out, send_errors=sw.send_errors, cpu_s=cpu, wall_s=wall))
    sw.stop()  # every data-path thread has returned: this closes the sockets


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
