"""scale_out: bytes and packets on the spine's links, two-level aggregation vs one flat switch
(and time under loss, 1 spine vs 2); and the one-machine leaf/spine fabric the scale-out
tests use too (`FabricCluster`).

    python -m bench scale_out                           # 8 ranks in 2 racks, 1 MiB, 5 densities
    python -m bench scale_out --loss-timing -g 40 -b 256K -e 256K -d 1 -n 3     # under loss

Methods `two_level` and `flat`: for each density and sparsity pattern (--patterns: `own`,
every rank its own non-zero blocks; `shared`, one pattern for all), the same -g tensors are
summed (a) through --racks leaves and a spine (software switches in UDP mode, threads of this
process, programmed by the controller in process) and (b) through one flat software switch,
alternating repeat by repeat, a fabric of its own per call (its switches' counts are exact once
they stopped). The spine's datagrams and bytes in and out are its links' traffic
(`bytes_per_link`); the flat switch's are what its links would carry if it stood at the spine.
The counts are exact; time is the call's wall time (informative on a shared machine). Every
two-level result must be bit-identical to the flat one (`wrong` counts those that are not).

--loss-timing: time under loss instead, methods `spines1` and `spines2` (the slots sharded):
-g ranks in --racks racks, 1% of datagrams dropped into and out of every switch, 1%
duplicated, 1% reordered (seeded per switch from each repeat's seed), dense int32 calls;
the agents' resends by trigger (fast, timeout, spurious) as columns; every result exact or
`wrong`. Wall-clock times: run it on a quiet machine. docs/reliability.md and
docs/scale_out.md show runs.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import os
import statistics
import time

import numpy as np

from bench.harness import method_rows
from controller import plan
from controller.controller import Controller, program_in_process
from controller.p4rt import Connection
from host_agent.agent import Agent
from host_agent.local import LocalCluster
from host_agent.recovery import MIN_RTO
from softswitch.udp import Faults, UdpSwitch
from spina import wire
from spina.net import bound_udp_socket

_SPINE_NETS = itertools.count()


def spine_hosts(n: int) -> list[str]:
    """Loopback addresses for n spines: spines listen on the INA UDP port (47000), each on an
    address of its own (controller/plan.py). Every call gives addresses no earlier call of
    this process gave (a /24 of 127/8 named by the process and a counter), so a fabric never
    meets a spine of another run, or of an earlier fabric whose sockets are not closed yet."""
    net = next(_SPINE_NETS)
    pid = os.getpid()
    return [f"127.{(pid ^ net >> 8) & 255}.{(pid >> 8 ^ net) & 255}.{2 + j}" for j in range(n)]


def fabric_doc(racks=2, per_rack=4, spines=2, nslots=4, switch_ports=None, worker_ports=None,
               block_size=4, nlanes=2, host="127.0.0.1", grpc_ports=None,
               spine_addresses=None) -> dict:
    """A desired state with a fabric: racks r<i> on leaf<i> (`per_rack` workers each, or a
    list of the racks' sizes), spines spine<j>, job 7 sharded evenly over the spines. Leaves
    at `host`, ports `switch_ports` (default from 47001); spine j at spine_addresses[j]
    (default: new ones, spine_hosts), UDP port 47000; workers from 50000 (ranks rack by rack).
    P4Runtime at grpc_ports (leaves then spines) on loopback, or none (in process)."""
    sizes = list(per_rack) if not isinstance(per_rack, int) else [per_rack] * racks
    firsts = [sum(sizes[:i]) for i in range(racks)]
    switch_ports = switch_ports or [47001 + i for i in range(racks)]
    spine_addresses = spine_addresses or spine_hosts(spines)
    worker_ports = worker_ports or [50000 + i for i in range(sum(sizes))]
    grpc = [f"127.0.0.1:{p}" for p in grpc_ports] if grpc_ports else ["in-process"] * (
        racks + spines)
    switches = [{"name": f"leaf{i}", "target": "softswitch", "grpc": grpc[i],
                 "address": host, "udp_port": switch_ports[i]} for i in range(racks)]
    switches += [{"name": f"spine{j}", "target": "softswitch", "grpc": grpc[racks + j],
                  "address": spine_addresses[j], "udp_port": wire.DEFAULT_UDP_PORT}
                 for j in range(spines)]
    workers = [{"name": f"w{firsts[r] + k}", "ip": host,
                "udp_port": worker_ports[firsts[r] + k], "switch_port": 0,
                "switch": f"leaf{r}"} for r in range(racks) for k in range(sizes[r])]
    share = nslots // spines
    shards = [{"spine": f"spine{j}", "slot_base": j * share,
               "nslots": share if j < spines - 1 else nslots - j * share} for j in range(spines)]
    return {"switches": switches, "workers": workers, "fabric": {
        "racks": [{"name": f"r{i}", "leaf": f"leaf{i}",
                   "workers": [f"w{firsts[i] + k}" for k in range(sizes[i])]}
                  for i in range(racks)],
        "spines": [f"spine{j}" for j in range(spines)],
        "jobs": [{"id": 7, "racks": [f"r{i}" for i in range(racks)], "slot_base": 0,
                  "nslots": nslots, "block_size": block_size, "nlanes": nlanes,
                  "shards": shards}]}}


class FabricCluster:
    """`racks` leaves and `spines` spines (UDP-mode software switches, threads of this process)
    programmed with the plan by the controller through each switch's own P4Runtime servicer
    (controller.controller.program_in_process), and an agent per worker, `per_rack` per rack
    (or a list of the racks' sizes).

    faults: optional function of the switch's index (leaves first) -> softswitch.udp.Faults.
    """

    def __init__(self, racks: int = 2, per_rack=4, spines: int = 1, faults=None,
                 nslots: int = 4, nlanes: int = 8, block_size: int = 256, timeout: float = 30,
                 rto: float = MIN_RTO):
        faults = faults or (lambda i: None)
        self.switches, self.agents, self.pool = [], [], None
        try:
            self._build(racks, per_rack, spines, faults, nslots, nlanes, block_size, timeout,
                        rto)
        except BaseException:
            self.close()  # no switch of a half-built fabric may keep its address
            raise

    def _build(self, racks, per_rack, spines, faults, nslots, nlanes, block_size, timeout, rto):
        hosts = spine_hosts(spines)
        for i in range(racks):
            self.switches.append(UdpSwitch(port=0, faults=faults(i)))
        for j in range(spines):
            self.switches.append(UdpSwitch(hosts[j], wire.DEFAULT_UDP_PORT,
                                           faults=faults(racks + j)))
        n = per_rack * racks if isinstance(per_rack, int) else sum(per_rack)
        self.socks = [bound_udp_socket() for _ in range(n)]
        doc = fabric_doc(racks, per_rack, spines, nslots, block_size=block_size, nlanes=nlanes,
                         switch_ports=[s.address[1] for s in self.switches],
                         worker_ports=[s.getsockname()[1] for s in self.socks],
                         spine_addresses=hosts)
        self.plan = plan.parse(doc)
        self.servicers = {d["name"]: s.servicer() for d, s in zip(doc["switches"], self.switches)}
        program_in_process(self.servicers, self.plan.state)
        for s in self.switches:
            s.start()
        self.leaves, self.spines = self.switches[:racks], self.switches[racks:]
        self.job = self.plan.job_config(self.plan.jobs[7])
        self.agents = [Agent(self.job, r, self.plan.agent_switch(f"w{r}"), sock=self.socks[r],
                             timeout=timeout, rto=rto) for r in range(n)]
        self.pool = concurrent.futures.ThreadPoolExecutor(n)

    def start_run(self, epoch: int):
        """A new run of job 7 with `epoch`, as `controller serve` starts one: every switch of
        the job re-admits it with the epoch and clears its slots. Returns the job's config."""
        with Controller(self.plan.state, connect=lambda sw: Connection.in_process(
                self.servicers[sw.name], sw.device_id)) as ctl:
            ctl.start_run(7, epoch)
            self.plan = ctl.state.fabric
        return self.plan.job_config(self.plan.jobs[7])

    def allreduce(self, tensors):
        futs = [self.pool.submit(a.allreduce, t) for a, t in zip(self.agents, tensors)]
        return [f.result() for f in futs]

    def spine_traffic(self) -> tuple[int, int]:
        """(datagrams, bytes) in and out of the spines: their links' traffic. Exact after
        `close` (a switch counts a datagram after sending it, maybe after the agents return)."""
        return (sum(s.packets_in + s.packets_out for s in self.spines),
                sum(s.bytes_in + s.bytes_out for s in self.spines))

    def close(self):
        try:
            if self.pool is not None:
                self.pool.shutdown()
            for a in self.agents:
                a.close()
        finally:  # the switches' addresses are freed whatever failed before
            for s in self.switches:
                s.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tensors(density: float, seed: int, n: int = 1 << 17, nranks: int = 8, integer=False,
            shared=False, block: int = 256) -> list[np.ndarray]:
    """`nranks` tensors of n elements whose non-zero blocks are a `density` fraction: each
    rank its own random choice, or one choice for all with `shared`."""
    rng = np.random.default_rng(seed)
    nblocks = n // block
    pick = rng.random(nblocks) < density
    out = []
    for _ in range(nranks):
        if not shared:
            pick = rng.random(nblocks) < density
        if integer:
            x = rng.integers(-1 << 20, 1 << 20, n).astype(np.int32)
        else:
            x = rng.standard_normal(n).astype(np.float32)
        x.reshape(nblocks, block)[~pick] = 0
        out.append(x)
    return out


def flat(ts, timeout: float = 30, rto: float = MIN_RTO,
         seconds: list | None = None) -> tuple[list, tuple[int, int], int]:
    """The same all-reduce through one flat software switch: results, (datagrams, bytes) in
    and out of it, the agents' resends; the call's wall time appended to `seconds`."""
    with LocalCluster(len(ts), nslots=4, nlanes=8, block_size=256, timeout=timeout,
                      rto=rto) as c:
        t0 = time.perf_counter()
        res = c.allreduce(ts)
        if seconds is not None:
            seconds.append(time.perf_counter() - t0)
    sw = c.switch  # counted once its thread has stopped: its last sends are in
    return (res, (sw.packets_in + sw.packets_out, sw.bytes_in + sw.bytes_out),
            sum(a.last_stats.resends for a in c.agents))


DESCRIPTION = "two-level aggregation vs one flat switch: spine bytes (and time under loss)"
METHODS = ("two_level", "flat", "spines1", "spines2")
DEFAULTS = dict(methods="two_level,flat", workers="8", densities="0.001,0.01,0.1,0.3,1",
                begin="1M", end="1M", repeats=1)
EXTRA_COLUMNS = ("pattern", "racks", "packets_per_call", "packet_ratio", "byte_ratio",
                 "resends", "fast", "timeout", "spurious", "srtt_ms")
POINT_COLUMNS = ("pattern",)


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--racks", type=cli.int_range(1, 32), default=2,
                    help="racks (leaves); -g must be a multiple (default %(default)s)")
    ap.add_argument("--patterns", type=cli.names(("own", "shared")), default="own,shared",
                    help="own (every rank its own blocks), shared (one for all), or both")
    ap.add_argument("--loss-timing", action="store_true",
                    help="time dense int32 calls under 1%% loss, 1 spine vs 2 (see above)")


def check_options(a) -> str | None:
    if a.topo is not None or a.rates:
        return "argument -t/--topology: the fabric is threads of this process on loopback"
    if len(a.workers) != 1 or a.workers[0] % a.racks:
        return f"argument -g/--workers: one count, a multiple of --racks {a.racks}"
    if not a.patterns or set(a.patterns) - {"own", "shared"}:
        return f"argument --patterns: own, shared or both, got {','.join(a.patterns)}"
    pair = ("spines1", "spines2") if a.loss_timing else ("two_level", "flat")
    if a.methods == ["two_level", "flat"] and a.loss_timing:
        a.methods = list(pair)  # the default methods of --loss-timing
    if set(a.methods) - set(pair):
        return f"argument -m/--methods: {'--loss-timing takes' if a.loss_timing else 'takes'} " \
               f"{', '.join(pair)}"
    return None


def run(a, log):
    n, racks = a.workers[0], a.racks
    if a.loss_timing:
        for size in a.sizes:
            yield loss_rows(a, n, racks, size // 4)
        return
    for pattern in a.patterns:
        for density in a.densities:
            for size in a.sizes:
                yield count_rows(a, n, racks, size // 4, density, pattern)


def count_rows(a, n: int, racks: int, elements: int, density: float, pattern: str):
    """Spine and flat-switch traffic of one point, both methods alternating per repeat."""
    ts = tensors(density, 1, elements, nranks=n, shared=pattern == "shared")
    times = {m: [] for m in a.methods}
    counts = {m: [] for m in a.methods}
    resends = {m: 0 for m in a.methods}
    wrong = {m: 0 for m in a.methods}
    load0 = os.getloadavg()[0]
    for r in range(a.repeats):
        got = {}
        for m in a.methods if r % 2 == 0 else a.methods[::-1]:
            if m == "two_level":
                with FabricCluster(racks=racks, per_rack=n // racks, rto=5.0) as fc:
                    t0 = time.perf_counter()  # no loss here: a long timeout, no resends
                    got[m] = fc.allreduce(ts)
                    times[m].append(time.perf_counter() - t0)
                counts[m].append(fc.spine_traffic())  # once the switches' threads stopped
                resends[m] += sum(ag.last_stats.resends for ag in fc.agents)
            else:
                got[m], one, res = flat(ts, rto=5.0, seconds=times[m])
                counts[m].append(one)
                resends[m] += res
        if len(got) == 2:
            wrong["two_level"] += any(g.tobytes() != w.tobytes()
                                      for g, w in zip(got["two_level"], got["flat"]))
    mean = {m: (statistics.fmean(c[0] for c in counts[m]), statistics.fmean(c[1] for c in
                                                                            counts[m]))
            for m in a.methods}
    extras = {m: dict(pattern=pattern, racks=racks, packets_per_call=round(mean[m][0]),
                      resends=resends[m]) for m in a.methods}
    if len(mean) == 2:
        extras["two_level"].update(
            packet_ratio=round(mean["two_level"][0] / mean["flat"][0], 4),
            byte_ratio=round(mean["two_level"][1] / mean["flat"][1], 4))
    point = dict(size=4 * elements, elements=elements, dtype="float32", density=density,
                 workers=n, lane_bits=32, rate="")
    return method_rows(a.what, point, times, bus="all_reduce",
                       sent={m: round(mean[m][1]) for m in a.methods}, wrong=wrong,
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)


def lossy(seed: int):
    """Faults of switch i (leaves first): 1% dropped in and out, 1% duplicated, 1% reordered."""
    return lambda i: Faults(drop_in=0.01, drop_out=0.01, duplicate=0.01, reorder=0.01,
                            seed=seed + i)


def loss_rows(a, n: int, racks: int, elements: int):
    """Seconds and resends of dense int32 calls under loss (`lossy`), 1 spine and 2 spines:
    only the all-reduce is timed; repeat r uses seed 70 + 10 r, the spine counts one after
    the other within it."""
    times = {m: [] for m in a.methods}
    wrong = {m: 0 for m in a.methods}
    tally = {m: dict(fast=0, timeout=0, spurious=0, resends=0, srtt_ms=0.0) for m in a.methods}
    load0 = os.getloadavg()[0]
    for r in range(a.repeats):
        seed = 70 + 10 * r
        ints = tensors(1.0, seed, elements, nranks=n, integer=True)
        want = np.sum(ints, axis=0, dtype=np.int32)
        for m in a.methods:
            with FabricCluster(racks=racks, per_rack=n // racks, spines=int(m[-1]),
                               faults=lossy(seed), nlanes=4) as fc:
                t0 = time.monotonic()
                got = fc.allreduce(ints)
                times[m].append(time.monotonic() - t0)
                wrong[m] += any(not np.array_equal(g, want) for g in got)
                st = [ag.last_stats for ag in fc.agents]
                t = tally[m]
                t["fast"] += sum(s.fast_resends for s in st)
                t["timeout"] += sum(s.timeout_resends for s in st)
                t["spurious"] += sum(s.spurious_resends for s in st)
                t["resends"] += sum(s.resends for s in st)
                t["srtt_ms"] = max(t["srtt_ms"], round(1000 * max(ag.rtt.srtt or 0
                                                                   for ag in fc.agents), 1))
    point = dict(size=4 * elements, elements=elements, dtype="int32", density=1.0, workers=n,
                 lane_bits=32, rate="")
    extras = {m: dict(tally[m], pattern="own", racks=racks) for m in a.methods}
    return method_rows(a.what, point, times, bus="all_reduce", wrong=wrong,
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)


def finish(rows, a) -> list[str]:
    """scale_out_bytes.png: spine links over flat links against density, per pattern."""
    pts = [r for r in rows if r["method"] == "two_level" and r.get("byte_ratio") != ""]
    if a.no_plots or not pts:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for pattern, label in (("own", "each rank its own blocks"), ("shared", "one pattern")):
        r = [x for x in pts if x["pattern"] == pattern]
        if r:
            ax.plot([x["density"] for x in r], [x["byte_ratio"] for x in r], "o-",
                    label=f"bytes, {label}")
            ax.plot([x["density"] for x in r], [x["packet_ratio"] for x in r], "--",
                    label=f"packets, {label}")
    ax.axhline(0.25, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylim(0, 0.5)
    ax.set_xlabel("density (fraction of non-zero 256-element blocks)")
    ax.set_ylabel("spine links / flat switch links")
    ax.set_title(f"{pts[0]['workers']} workers, {a.racks} racks: two-level vs flat")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(a.out, "scale_out_bytes.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
