"""SpINA and gloo measured in the SAME worker processes, repeat by repeat: both benchmarks' core.

`Cluster` starts the software switch (bench.procs.switch_main) and n worker processes, each
in a `Place` (a network namespace or none, an address). Every worker holds one SpINA `Agent`
and, when a `Gloo` is given, one torch.distributed gloo process group, both alive for the
whole cluster; `Cluster.measure(point, ...)` then measures a point in those processes.

Per point every worker builds its tensor (bench.procs.make_tensor) and one buffer. Each
repeat runs every method once, the order rotating repeat by repeat (two methods simply
alternate which goes first), each call between two barriers, and only the collective
inside the timed region:

  spina           Agent.allreduce(buf, inplace=True)
  spina_blocks    the same with blocks= the worker's non-zero blocks, computed before the
                  timer: a caller that knows them (embedding rows, a compressor's selection)
                  skips the agent's scan of the whole tensor
  floor           bench/floor.py: the simplest compiled star all-reduce of the dense buf,
                  in place (scan, one hello, int32 chunks of SpINA's datagram size through
                  one relay process, nslots in flight; no protocol): the machine's floor
  gloo_allreduce  dist.all_reduce(t), t sharing buf's memory (in place, as DDP calls it)
  gloo_allgather  all_gather of (int32 index, float32 value) of buf's non-zeros, then a local
                  index_add_ into a new tensor: the sparse all-reduce users write by hand

and, only when asked for, the unfair timing of the benchmark before this one, to show what
it did to the numbers (docs/benchmark.md):

  spina_alloc           Agent.allreduce(buf): the result in a new array
  gloo_allreduce_clone  dist.all_reduce(t.clone()): a 100 MB copy inside the timed region

The buffer is refilled from the tensor before the first barrier, outside the timer. The
first repeat is a warm-up, checked but not recorded. Every result is checked: rank 0 against
numpy's float64 sum (SpINA and the floor within the quantization bound, gloo within float32
rounding) and their crc32 on every rank (the parent compares them: bit-identical on all ranks).
The floor's relay runs beside the switch (same namespace and host), started only when the
cluster is asked for it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from bench.net_topo import dev_bytes as link_bytes, star_of
from bench.procs import (
    Point,
    check_result,
    cpu_seconds,
    expected_sum,
    make_tensor,
    measure_memory,
    requests,
    switch_main,
)
from host_agent.blocks import nonzero_blocks
from spina.net import free_port
from spina.netgraph import Graph

METHODS = ("spina", "spina_blocks", "floor", "gloo_allreduce", "gloo_allgather")
OLD_TIMING = ("spina_alloc", "gloo_allreduce_clone")
ALL_METHODS = METHODS + OLD_TIMING
SPINA_METHODS = ("spina", "spina_blocks", "spina_alloc")
GLOO_METHODS = ("gloo_allreduce", "gloo_allgather", "gloo_allreduce_clone")
QUANTIZED = SPINA_METHODS + ("floor",)  # checked within the quantization bound, crc32 per rank
FLOOR_STATS = ("packets_sent", "bytes_sent")  # per floor call: FloorWorker.last_stats
CHILD_TIMEOUT = 900.0  # seconds a child may take before the run is declared hung


class BenchError(RuntimeError):
    """A benchmark child failed or produced a wrong result."""


@dataclass(frozen=True)
class Place:
    """Where a process runs: network namespace (None: this one) and the address it binds
    (port 0: any free port; the job config is built from the ports the workers got)."""
    netns: str | None = None
    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class Gloo:
    """How the workers form their gloo group: rank 0's store at host:port, gloo's pairs on
    interface `ifname`. On 127.0.0.1 spina.net.init_loopback_gloo keeps every socket there."""
    host: str = "127.0.0.1"
    port: int = 0
    ifname: str = "lo"


@dataclass(frozen=True)
class Request:
    """One point to measure, sent to every worker."""
    point: Point
    repeats: int
    methods: tuple[str, ...]
    count_dev: bool = False            # read eth0's tx/rx bytes around every call (namespaces)
    profile_path: str | None = None    # cProfile rank 0's timed SpINA calls into this file
    memory: bool = False               # afterwards one SpINA call under tracemalloc
    count_wrong: bool = False          # count wrong results ("wrong") instead of stopping


def rotation(methods: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """The order of the methods in repeat `repeat`: rotated by one each repeat."""
    k = repeat % len(methods)
    return tuple(methods[k:]) + tuple(methods[:k])


def paired_ratios(a: list[float], b: list[float]) -> list[float]:
    """Per repeat a/b of two methods' times measured in the same repeats."""
    if len(a) != len(b):
        raise ValueError(f"paired ratios need as many repeats of each ({len(a)} vs {len(b)})")
    return [x / y for x, y in zip(a, b)]


# ----------------------------------------------------------------------------- worker side
def guarded(rank: int, conn, barrier, body, *args):
    """A child process's body(*args); on any failure break the barrier and send the parent
    {"error": "rank R: ..."} (recv raises it), so neither the others nor the parent hang."""
    try:
        return body(*args)
    except BaseException as e:
        barrier.abort()
        conn.send(dict(error=f"rank {rank}: {type(e).__name__}: {e}"))
        raise


def worker_main(rank: int, place: Place, gloo: Gloo | None, conn, barrier, serve=None,
                lane_jobs: int = 0) -> None:
    """A worker process: bind, report the address, get the job, build the Agent (and the
    gloo group, and the floor's socket), then answer requests until "stop": each with
    `serve(rank, request, agent, dist, torch, barrier, floor)` (default measure_point), and
    `lanes={lane_bits: Agent}` after them when the cluster has `lane_jobs` narrow-lane jobs
    (Cluster's `lanes`: an agent and a socket of its own each)."""
    guarded(rank, conn, barrier, _worker, rank, place, gloo, conn, barrier,
            serve or measure_point, lane_jobs)


def _worker(rank, place, gloo, conn, barrier, serve, lane_jobs=0):
    from host_agent.agent import Agent
    from spina.net import bound_udp_socket
    from spina.netns import enter

    enter(place.netns)
    socks = [bound_udp_socket(place.host, place.port)]
    socks += [bound_udp_socket(place.host, 0) for _ in range(lane_jobs)]
    conn.send([s.getsockname() for s in socks])
    jobs, switch_addr, agent_kw, relay_addr = conn.recv()
    agent, *narrow = [Agent(j, rank, switch_addr, sock=s, timeout=60.0, **agent_kw)
                      for j, s in zip(jobs, socks)]
    lanes = {a.job.lane_bits: a for a in narrow}
    job = agent.job
    floor = None
    if relay_addr is not None:
        from bench.floor import FloorWorker, chunk_for
        floor = FloorWorker(rank, job.nworkers, relay_addr, job.nslots,
                            chunk_for(job.block_size, job.nlanes), host=place.host)
    dist = torch = None
    if gloo is not None:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if gloo.host == "127.0.0.1":
            from spina.net import init_loopback_gloo
            init_loopback_gloo(rank, job.nworkers, gloo.port)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = gloo.ifname
            dist.init_process_group("gloo", init_method=f"tcp://{gloo.host}:{gloo.port}",
                                    rank=rank, world_size=job.nworkers,
                                    timeout=timedelta(seconds=300))
    try:
        kw = {"lanes": lanes} if lanes else {}
        for req in requests(conn):
            conn.send(serve(rank, req, agent, dist, torch, barrier, floor, **kw))
    finally:
        if dist is not None:
            dist.destroy_process_group()
        if floor is not None:
            floor.close()
        for a in (agent, *narrow):
            a.close()


def measure_point(rank: int, req: Request, agent, dist, torch, barrier, floor=None) -> dict:
    """This worker's side of one point: {method: record} (+ "memory" if asked)."""
    p = req.point
    x = make_tensor(p, rank)
    buf = np.empty_like(x)
    t = torch.from_numpy(buf) if torch is not None else None  # same memory as buf
    want = expected_sum(p) if rank == 0 else None
    dev_bytes = link_bytes if req.count_dev else None
    known = nonzero_blocks(x, p.block_size)  # what a caller that knows its blocks passes
    calls = {"spina": lambda: agent.allreduce(buf, inplace=True),
             "spina_blocks": lambda: agent.allreduce(buf, inplace=True, blocks=known),
             "floor": lambda: floor.allreduce(buf),
             "gloo_allreduce": lambda: (dist.all_reduce(t), buf)[1],
             "gloo_allgather": lambda: gloo_allgather_sum(t, p.workers, dist, torch).numpy(),
             "spina_alloc": lambda: agent.allreduce(buf),
             "gloo_allreduce_clone": lambda: _reduced(t.clone(), dist)}
    prof = None
    if req.profile_path and rank == 0:
        import cProfile
        # CPU time of this thread (the agent's work): wall time would charge preemption by
        # the other processes on this machine's 2 cores to whatever line was running.
        prof = cProfile.Profile(time.thread_time)
    rec = {m: dict(times=[], cpu=[], tx=[], rx=[], crcs=[], max_err=0.0, wrong=0)
           for m in req.methods}
    for m in req.methods:
        keys = SPINA_STATS if m in SPINA_METHODS else FLOOR_STATS if m == "floor" else ()
        if keys:
            rec[m].update({k: [] for k in keys}, warmup={})
    rec["nonzeros"] = int(np.count_nonzero(x))
    for i in range(req.repeats + 1):  # i == 0: warm-up, checked but not recorded
        for m in rotation(req.methods, i):
            np.copyto(buf, x)
            barrier.wait()
            tx0, rx0 = dev_bytes() if dev_bytes else (0, 0)
            c0, t0 = cpu_seconds(), time.perf_counter()
            if prof is not None and m in SPINA_METHODS and i:
                res = prof.runcall(calls[m])
            else:
                res = calls[m]()
            dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
            barrier.wait()  # every worker done: late answers are counted with this call
            tx1, rx1 = dev_bytes() if dev_bytes else (0, 0)
            r = rec[m]
            if rank == 0:
                try:
                    err = check_result(res, want, p.workers, quantized=(m in QUANTIZED),
                                       lane_bits=(agent.job.lane_bits if m in SPINA_METHODS
                                                  else 32))
                    r["max_err"] = max(r["max_err"], err)
                except AssertionError as e:
                    if not req.count_wrong:
                        raise
                    r["wrong"] += 1
                    r.setdefault("first_wrong", f"{m}: {e}")
            if m in QUANTIZED:
                r["crcs"].append(zlib.crc32(res.view(np.uint8)))
            stats = _call_stats(m, agent, floor)
            if stats and not i:
                r["warmup"] = stats
            del res
            if not i:
                continue
            r["times"].append(dt)
            r["cpu"].append(dc)
            r["tx"].append(tx1 - tx0)
            r["rx"].append(rx1 - rx0)
            for k, v in stats.items():
                r[k].append(v)
    if prof is not None:
        prof.dump_stats(req.profile_path)
    if req.memory:
        rec["memory"] = measure_memory(agent, x)
        barrier.wait()
    return rec


def _call_stats(method: str, agent, floor) -> dict:
    """What the last call of `method` reported about itself ({} for gloo's)."""
    if method in SPINA_METHODS:
        return {k: getattr(agent.last_stats, k) for k in SPINA_STATS}
    if method == "floor":
        return dict(zip(FLOOR_STATS, floor.last_stats))
    return {}


def _reduced(y, dist) -> np.ndarray:
    dist.all_reduce(y)
    return y.numpy()


# What the agent reports per call (host_agent.agent.CallStats), recorded per timed call.
SPINA_STATS = ("bytes_sent", "payload_bytes_sent", "packets_sent", "nonzero_blocks",
               "resends", "spurious_resends", "timeout_resends", "rounds", "phases")


def gloo_allgather_sum(x, n: int, dist, torch):
    """What users write by hand: all_gather (index, value) of the non-zeros, then sum.

    all_gather needs equal sizes, so counts go first and everyone pads to the largest.
    """
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
    return out


def gloo_bytes(method: str, p: Point, nonzeros: int) -> int:
    """Bytes one worker sends, from the algorithm: ring all-reduce 2(n-1)/n of the tensor;
    ring all-gather n-1 chunks padded to the largest count (int32 index + float32 value)."""
    n = p.workers
    if method == "gloo_allgather":
        return (n - 1) * (8 + 8 * nonzeros)
    return int(2 * (n - 1) * p.elements * 4 / n)


# ----------------------------------------------------------------------------- parent side
def recv(conn, what: str, timeout: float = CHILD_TIMEOUT):
    """A child's next message; BenchError if it failed or does not answer in time."""
    if not conn.poll(timeout):
        raise BenchError(f"{what}: no answer within {timeout:g} s")
    msg = conn.recv()
    if isinstance(msg, dict) and "error" in msg:
        raise BenchError(f"{what}: {msg['error']}")
    return msg


def stop_all(procs) -> None:
    """Join child processes; terminate those that do not end within 10 s."""
    for pr in procs:
        pr.join(timeout=10)
    for pr in procs:
        if pr.is_alive():
            pr.terminate()
            pr.join()


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


class Cluster:
    """The switch and n workers (see the module docstring); a context manager.

    Args:
        n: workers.
        nslots, block_size, nlanes, lane_bits: the job's SpINA parameters (lane_bits 16, 8:
            narrow lanes, docs/bits.md; the floor stays int32).
        agent_kw: extra Agent keyword arguments (e.g. rto).
        gloo: form a gloo group in the workers (None: SpINA alone, torch not imported).
        switch_place, worker_places: where the processes run (default: 127.0.0.1, any port).
        switch_profile: cProfile the switch's serve loop into this file.
        switch_datapath: the software switch's data path, "compiled" or "python" (UdpSwitch).
        switch_threads: its data-path threads (UdpSwitch's datapath_threads); the job's slot
            groups are then the threads' (softswitch.udp.shard_slot_groups).
        lanes: narrow-lane jobs beside the main one, (lane_bits, block_size) each: jobs 2, 3,
            ... on the same switch, the main job's nslots and nlanes, the slots after its
            own; every worker holds an Agent of each on a socket of its own, which `serve`
            gets as `lanes={lane_bits: Agent}` (bench/training.py's spina16 and spina8).
        floor: also start the floor's relay (bench/floor.py) at switch_place, any free port,
            and a floor socket in every worker (method "floor").
        serve: what the workers do with a request (`ask`): a module-level function
            serve(rank, request, agent, dist, torch, barrier, floor) -> record; default
            measure_point (bench/training.py trains instead).
    After close(), `switch_stats` holds the switch's counters over its whole life, and
    `relay_stats` the relay's (with floor).
    """

    def __init__(self, n: int, *, nslots: int = 16, block_size: int = 256, nlanes: int = 56,
                 lane_bits: int = 32, agent_kw: dict | None = None, gloo: Gloo | None = None,
                 switch_place: Place = Place(), worker_places: list[Place] | None = None,
                 switch_profile: str | None = None, floor: bool = False,
                 switch_datapath: str = "compiled", switch_threads: int = 1, serve=None,
                 lanes: tuple[tuple[int, int], ...] = ()):
        self.n = n
        self.lanes = tuple(lanes)
        self.serve = serve
        self.switch_datapath = switch_datapath
        self.switch_threads = switch_threads
        self.job_args = dict(nslots=nslots, block_size=block_size, nlanes=nlanes,
                             lane_bits=lane_bits)
        self.agent_kw = agent_kw or {}
        self.gloo = gloo
        self.switch_place = switch_place
        self.worker_places = worker_places or [Place()] * n
        self.switch_profile = switch_profile
        self.procs: list = []
        self.conns: list = []
        self.switch_conn = None
        self.switch_stats: dict | None = None
        self.floor = floor
        self.relay = self.relay_conn = None
        self.relay_stats: dict | None = None
        self.job = None

    def __enter__(self) -> "Cluster":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        from softswitch.udp import shard_slot_groups
        from spina.config import JobConfig, WorkerAddr
        ctx = mp.get_context("spawn")  # no child inherits a big parent heap
        self.switch_conn, child = ctx.Pipe()
        sp = self.switch_place
        self.procs.append(ctx.Process(target=switch_main, name="spina-switch",
                                      args=(child, self.switch_profile, sp.netns, sp.host,
                                            self.switch_datapath, self.switch_threads,
                                            self._slot_capacity())))
        self.procs[-1].start()
        switch_addr = recv(self.switch_conn, "switch")
        relay_addr = self._start_relay(ctx) if self.floor else None
        gloo = self.gloo
        if gloo is not None and gloo.port == 0:
            gloo = Gloo(gloo.host, free_port(gloo.host), gloo.ifname)
        barrier = ctx.Barrier(self.n)
        for r in range(self.n):
            parent, child = ctx.Pipe()
            self.procs.append(ctx.Process(target=worker_main, name=f"bench-worker{r}",
                                          args=(r, self.worker_places[r], gloo, child, barrier,
                                                self.serve, len(self.lanes))))
            self.procs[-1].start()
            self.conns.append(parent)
        addrs = [recv(c, f"rank {r} start") for r, c in enumerate(self.conns)]
        nslots = self.job_args["nslots"]
        jobs = [JobConfig(job=1 + j, workers=tuple(WorkerAddr(r, *a[j])
                                                   for r, a in enumerate(addrs)),
                          slot_base=j * nslots,
                          slot_groups=shard_slot_groups(self.switch_threads, nslots,
                                                        j * nslots),
                          **args).validate()
                for j, args in enumerate(self._jobs_args())]
        self.job = jobs[0]
        self.switch_conn.send(jobs)
        recv(self.switch_conn, "switch admission")
        for c in self.conns:
            c.send((jobs, switch_addr, self.agent_kw, relay_addr))
        for r, c in enumerate(self.conns):
            recv(c, f"rank {r} ready")

    def _jobs_args(self) -> list[dict]:
        """JobConfig's arguments of the main job, then of each narrow-lane job."""
        return [self.job_args] + [dict(self.job_args, lane_bits=bits, block_size=block)
                                  for bits, block in self.lanes]

    def _slot_capacity(self) -> int | None:
        """The switch's slot capacity: its default, or the largest slot of the jobs' if
        larger."""
        from spina.spec import DEFAULT_SLOT_CAPACITY
        need = max(a["nlanes"] * a["block_size"] for a in self._jobs_args())
        return need if need > DEFAULT_SLOT_CAPACITY else None

    def _start_relay(self, ctx) -> tuple[str, int]:
        from bench.floor import chunk_for, relay_main
        sp = self.switch_place
        self.relay_conn, child = ctx.Pipe()
        self.relay = ctx.Process(target=relay_main, name="floor-relay",
                                 args=(child, sp.netns, sp.host, self.n, self.job_args["nslots"],
                                       chunk_for(self.job_args["block_size"],
                                                 self.job_args["nlanes"])))
        self.relay.start()
        return tuple(recv(self.relay_conn, "floor relay"))

    @property
    def switch_pid(self) -> int:
        return self.procs[0].pid

    @property
    def relay_pid(self) -> int | None:
        return None if self.relay is None else self.relay.pid

    @property
    def pids(self) -> list[int]:
        """Switch first, then the workers."""
        return [pr.pid for pr in self.procs]

    def ask(self, req, what: str) -> list:
        """Send `req` to every worker; their answers (the cluster's `serve`), rank order."""
        for c in self.conns:
            c.send(req)
        return [recv(c, f"rank {r} at {what}") for r, c in enumerate(self.conns)]

    def measure(self, req: Request) -> list[dict]:
        """Every worker's record of one point (bench.paired.measure_point), rank order."""
        recs = self.ask(req, str(req.point))
        for m in set(req.methods) & set(QUANTIZED):
            for r, w in enumerate(recs[1:], 1):
                if req.count_wrong:  # every call whose result differs from rank 0's
                    w[m]["wrong"] += sum(a != b for a, b in zip(w[m]["crcs"],
                                                               recs[0][m]["crcs"]))
                elif w[m]["crcs"] != recs[0][m]["crcs"]:
                    raise BenchError(f"{req.point}: rank {r}'s {m} result differs from rank "
                                     f"0's ({m}, crc32 {w[m]['crcs']} vs {recs[0][m]['crcs']})")
        return recs

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send("stop")
            except OSError:
                pass
        stop_all(self.procs[1:])
        if self.procs:
            self.switch_stats = stop_server(self.procs[0], self.switch_conn)
        self.conns.clear()
        if self.relay is not None:
            self.relay_stats = stop_server(self.relay, self.relay_conn)
            self.relay = None


def stop_server(proc, conn) -> dict | None:
    """Ask a serving child (the switch, the floor's relay) to stop: its counters, which it
    sends once stopped (profile written), or None if it failed (its error is on stderr)."""
    out = None
    if conn is not None and proc.is_alive():
        try:
            conn.send("stop")
            if conn.poll(30):
                msg = conn.recv()
                if isinstance(msg, dict) and "error" not in msg:
                    out = msg
        except (OSError, EOFError):
            pass
    stop_all([proc])
    return out


def slowest(recs: list[dict], method: str) -> list[float]:
    """Per repeat, the slowest worker's time of `method`: the repeat's time."""
    times = [w[method]["times"] for w in recs]
    return [max(ts) for ts in zip(*times)]


def mean_over_workers(recs: list[dict], method: str, key: str) -> float:
    """Mean over workers of each worker's mean over timed calls of `key`."""
    return statistics.fmean(statistics.fmean(w[method][key]) for w in recs)


def star_places(graph: "Graph | None", gloo_port: int):
    """bench.paired.Cluster's places (the switch and the floor's relay at the aggregating
    switch, a rank per host) and its Gloo (rank 0's store on its host, every rank on its
    eth0) for a star Graph; on loopback (None) the defaults."""
    if graph is None:
        return {}, Gloo()
    sw, hosts = star_of(graph.topo)
    places = dict(switch_place=Place(graph.ns(sw), graph.node_ip(sw)),
                  worker_places=[Place(graph.ns(h), graph.host_ip(h)) for h in hosts])
    return places, Gloo(graph.host_ip(hosts[0]), gloo_port, graph.host_if(hosts[0]))


def star_clusters(a, gloo_port: int, log, gloo: bool = True, **cluster_kw):
    """The collectives' loop (all_reduce, loss, reduce_scatter): -t's star in namespaces
    (tbf queues of 20 ms; no -t: loopback), per (-g workers, lane bits) one Cluster of n
    ranks at those bits (gloo's ranks on the star's hosts unless `gloo` is false;
    `cluster_kw` the rest), and in it per --rates rate (set on every link) one
    (cluster, n, bits, graph, rate): graph None on loopback, rate the links' ('' there)."""
    from contextlib import ExitStack
    with ExitStack() as stack:
        graph = None
        if a.topo is not None:
            graph = stack.enter_context(Graph(a.topo, a.tag, queue_ms=20))
            log(f"{a.topology}: namespaces {graph.tag}-*")
        places, gloo_at = star_places(graph, gloo_port)
        for n in a.workers:
            for bits in a.lane_bits:
                with Cluster(n, lane_bits=bits, gloo=gloo_at if gloo else None, **cluster_kw,
                             **places) as cl:
                    for rate in graph.each_rate(a.rates) if graph is not None else [""]:
                        yield cl, n, bits, graph, rate
