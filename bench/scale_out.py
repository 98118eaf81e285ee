"""Bytes and packets on the spine's links: two-level aggregation vs one flat switch.

    python -m bench.scale_out [--elements N] [--out DIR]
    python -m bench.scale_out --loss-timing [--racks R] [--per-rack H] [--seeds S,S,..]

For each density and sparsity pattern (every rank its own non-zero blocks, or one pattern for
all), the same 8 tensors are summed (a) through 2 leaves and a spine (software switches in UDP
mode, this process, programmed by the controller in process) and (b) through one flat software
switch.
The spine's datagrams in and out are its links' traffic; the flat switch's are what its links
would carry if it stood at the spine. Writes scale_out.csv and scale_out_bytes.png to DIR
(default bench/out). Counts are exact (no timing): the run needs no quiet machine.
docs/scale_out.md shows the committed run.

--loss-timing: time under loss instead, 1 spine against 2 (the slots sharded): R racks of H
workers, 1% of datagrams dropped into and out of every switch, 1% duplicated, 1% reordered
(seeded per switch from each seed), `--calls` dense int32 calls of `--elements` per seed; prints
per call the seconds and the agents' resends by trigger (fast, timeout, spurious) and writes
scale_out_loss.csv. Wall-clock times: run it on a quiet machine. docs/reliability.md shows a run.
"""
from __future__ import annotations

import concurrent.futures
import csv
import itertools
import os
import sys
import time

import numpy as np

from controller import plan
from controller.controller import Controller, program_in_process
from controller.p4rt import Connection
from host_agent.agent import Agent
from host_agent.local import LocalCluster
from host_agent.recovery import MIN_RTO
from softswitch.udp import Faults, UdpSwitch
from spina import cli, wire
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


def flat(ts, timeout: float = 30, rto: float = MIN_RTO) -> tuple[list, tuple[int, int], int]:
    """The same all-reduce through one flat software switch: results, (datagrams, bytes) in
    and out of it, the agents' resends."""
    with LocalCluster(len(ts), nslots=4, nlanes=8, block_size=256, timeout=timeout,
                      rto=rto) as c:
        res = c.allreduce(ts)
    sw = c.switch  # counted once its thread has stopped: its last sends are in
    return (res, (sw.packets_in + sw.packets_out, sw.bytes_in + sw.bytes_out),
            sum(a.last_stats.resends for a in c.agents))


DENSITIES = (0.001, 0.01, 0.1, 0.3, 1.0)


def measure(elements: int) -> list[dict]:
    rows = []
    for shared in (False, True):
        for density in DENSITIES:
            ts = tensors(density, 1, elements, shared=shared)
            with FabricCluster(rto=5.0) as fc:  # no loss here: a long timeout, no resends
                got = fc.allreduce(ts)
            packets, nbytes = fc.spine_traffic()  # once the switches' threads have stopped
            resends = sum(a.last_stats.resends for a in fc.agents)
            want, (fpackets, fbytes), fresends = flat(ts, rto=5.0)
            if any(g.tobytes() != w.tobytes() for g, w in zip(got, want)):
                raise RuntimeError(f"density {density}: two-level result differs from flat")
            rows.append({"pattern": "shared" if shared else "own", "density": density,
                         "spine_packets": packets, "spine_bytes": nbytes,
                         "flat_packets": fpackets, "flat_bytes": fbytes,
                         "packet_ratio": round(packets / fpackets, 4),
                         "byte_ratio": round(nbytes / fbytes, 4),
                         "resends": resends + fresends})
            print(rows[-1], flush=True)
    return rows


def lossy(seed: int):
    """Faults of switch i (leaves first): 1% dropped in and out, 1% duplicated, 1% reordered."""
    return lambda i: Faults(drop_in=0.01, drop_out=0.01, duplicate=0.01, reorder=0.01,
                            seed=seed + i)


def loss_timing(racks: int, per_rack: int, seeds, calls: int, elements: int) -> list[dict]:
    """Seconds and resends per dense call under loss (`lossy`), 1 spine and 2 spines: only
    the all-reduce is timed; the two spine counts run one after the other (unpaired)."""
    rows = []
    n = racks * per_rack
    for spines in (1, 2):
        for seed in seeds:
            with FabricCluster(racks=racks, per_rack=per_rack, spines=spines,
                               faults=lossy(seed), nlanes=4) as fc:
                for call in range(calls):
                    ints = tensors(1.0, seed + call, elements, nranks=n, integer=True)
                    want = np.sum(ints, axis=0, dtype=np.int32)
                    t = time.monotonic()
                    got = fc.allreduce(ints)
                    seconds = time.monotonic() - t
                    if any(not np.array_equal(g, want) for g in got):
                        raise RuntimeError(f"seed {seed} call {call}: a result is not exact")
                    st = [a.last_stats for a in fc.agents]
                    rows.append({"workers": n, "racks": racks, "spines": spines, "seed": seed,
                                 "call": call, "seconds": round(seconds, 3),
                                 "rounds_per_worker": st[0].rounds,
                                 "fast": sum(s.fast_resends for s in st),
                                 "timeout": sum(s.timeout_resends for s in st),
                                 "spurious": sum(s.spurious_resends for s in st),
                                 "srtt_ms": round(1000 * max(a.rtt.srtt or 0
                                                             for a in fc.agents), 1)})
                    print(rows[-1], flush=True)
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for pattern, label in (("own", "each rank its own blocks"), ("shared", "one pattern")):
        r = [x for x in rows if x["pattern"] == pattern]
        ax.plot([x["density"] for x in r], [x["byte_ratio"] for x in r], "o-",
                label=f"bytes, {label}")
    r = [x for x in rows if x["pattern"] == "own"]
    ax.plot([x["density"] for x in r], [x["packet_ratio"] for x in r], "k--", label="packets")
    ax.axhline(0.25, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylim(0, 0.5)
    ax.set_xlabel("density (fraction of non-zero 256-element blocks)")
    ax.set_ylabel("spine links / flat switch links")
    ax.set_title("8 workers, 2 racks of 4: two-level vs flat aggregation")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="python -m bench.scale_out", description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=cli.int_range(256, 1 << 24), default=None,
                    help="elements per tensor (default 262144; --loss-timing: 65536)")
    ap.add_argument("--out", default="bench/out", help="output directory (default %(default)s)")
    ap.add_argument("--loss-timing", action="store_true",
                    help="time dense calls under 1%% loss, 1 spine vs 2 (see above)")
    ap.add_argument("--racks", type=cli.int_range(1, 32), default=2,
                    help="--loss-timing: racks (default %(default)s)")
    ap.add_argument("--per-rack", type=cli.int_range(1, 32), default=20,
                    help="--loss-timing: workers per rack (default %(default)s)")
    ap.add_argument("--seeds", default="70,80,90",
                    help="--loss-timing: fault seeds, comma-separated (default %(default)s)")
    ap.add_argument("--calls", type=cli.int_range(1, 100), default=3,
                    help="--loss-timing: calls per seed (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    try:
        os.makedirs(args.out, exist_ok=True)
        if args.loss_timing:
            rows = loss_timing(args.racks, args.per_rack, seeds, args.calls,
                               args.elements or 1 << 16)
            with open(os.path.join(args.out, "scale_out_loss.csv"), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            return 0
        rows = measure(args.elements or 1 << 18)
        with open(os.path.join(args.out, "scale_out.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        plot(rows, os.path.join(args.out, "scale_out_bytes.png"))
    except OSError as e:
        return cli.fail(ap.prog, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
