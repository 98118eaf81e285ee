"""l2: how fast the software switch's L2 mode (where BMv2 or a Tofino would stand) aggregates
INA frames without loss.

    python -m bench l2 --offered 10000,30000,50000 --seconds 2         # root
    python -m bench l2 -m compiled,python                               # both data paths

Topology: -t, an L2 star file, by default bench/topologies/l2_star8.yaml (the namespace tests'
hosts too): -g workers are its first hosts, each a namespace whose veth ends in a port of its
L2 switch, left in the root namespace for the L2Switch this process runs there; the hosts
reach the switch's aggregator at the file's address. Each worker process sends, open loop at
offered/workers frames per second, the contributions of rounds 1, 2, ... of slots
0..nslots-1 (the P4 sizes: 4 lanes x 32 int32, 618-byte frames; the size column is a round's
data, 512 bytes), all workers the same sequence; a round completes only when the switch took
all its contributions, so results received / rounds sent is the fraction the switch
aggregated without loss (`lossless`, `lost_rounds`). Every result a worker receives is
checked: each lane the sum of the workers' ones (`wrong` counts those that are not). Methods:
the switch's data path, compiled or python, run back to back at each offered rate, their
order alternating from rate to rate (-n runs of each). time: the switch process's CPU per
round (what limits the rate on this machine; its frames per CPU-second beside it). Besides:
frames in, rounds, results received by the slowest worker, the rounds the switch completed
(`completed`: its job_results over the workers), the switch's own counters, the
load, and the senders' largest skew (`sender_skew_ms`) beside the slot window
(`slot_window_ms`: nslots frames of one sender): the senders never resend, so when one falls
further behind another than the window, its contributions arrive after the others' next
rounds on the same slots, the switch's hold drops those, and rounds are lost however fast the
switch is. Needs root (namespaces, raw sockets).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import method_rows
from spina import netns
from spina.netgraph import Graph
from spina.topology import Topology, first_hosts, load as load_topology

ROOT = Path(__file__).resolve().parents[1]
L2_STAR = "bench/topologies/l2_star8.yaml"  # the default -t: hosts on one L2 switch's ports
NSLOTS, NLANES, BLOCK = 64, 4, 32  # 64 slots: 128 frames of slack per sender (two copies)

SENDER = r'''
import json, socket, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from spina import wire
rank, n, rate, seconds, nslots, start_at = (int(sys.argv[2]), int(sys.argv[3]),
                                            float(sys.argv[4]), float(sys.argv[5]),
                                            int(sys.argv[6]), float(sys.argv[7]))
me, switch_ip = sys.argv[8], sys.argv[9]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((me, 50000 + rank))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
s.setblocking(False)
data = np.ones((4, 32), np.int32)
nframes = int(rate * seconds)
pkts = []
for i in range(nframes):
    rnd, slot = i // nslots + 1, i % nslots
    h = wire.Header(job=5, epoch=1, call=1, slot=slot, rank=rank, nlanes=4, round=rnd,
                    length=1 << 20, block_size=32, present=0xF)
    pkts.append(wire.pack(h, np.full(4, wire.END, np.uint32), data))
dst = (switch_ip, 47000)
got = []
late = []  # (first frame of a burst, how late it left against the schedule, s)
while time.time() < start_at:  # every worker starts its round sequence at the same moment
    time.sleep(0.0005)
t0 = time.perf_counter()
i = 0
while i < nframes:  # every millisecond, the frames due by then: no busy wait
    due = min(nframes, int((time.perf_counter() - t0) * rate) + 1)
    late.append((i, time.perf_counter() - t0 - i / rate))
    for p in pkts[i:due]:
        s.sendto(p, dst)
    i = max(i, due)
    while True:
        try:
            got.append(s.recv(2048))
        except BlockingIOError:
            break
    time.sleep(0.001)
end = time.perf_counter() + 1.0
while time.perf_counter() < end:
    try:
        got.append(s.recv(2048))
    except BlockingIOError:
        time.sleep(0.001)
send_seconds = time.perf_counter() - t0 - 1.0
wrong = sum(not (wire.unpack(r).data == n).all() for r in got)  # each lane: n workers' ones
print(json.dumps({"rank": rank, "sent": nframes, "results": len(got), "wrong": int(wrong),
                  "late": late, "send_seconds": send_seconds}))
'''


def sender_skew(lates: list[list[tuple[int, float]]], nframes: int) -> float:
    """The largest gap, in seconds, between the senders at the same point of their common
    frame sequence (each sender's lateness against its schedule when it reached frame i,
    sampled every 16 frames): a sender that far behind the others is nslots / its rate behind
    them when the gap exceeds the slot window, and its rounds' contributions come after the
    others' next rounds on the same slots, which the switch's hold drops."""
    import bisect
    firsts = [[i for i, _ in late] for late in lates]
    worst = 0.0
    for i in range(0, nframes, 16):
        at = [late[bisect.bisect_right(f, i) - 1][1] for late, f in zip(lates, firsts)
              if f and f[0] <= i]
        if len(at) == len(lates):
            worst = max(worst, max(at) - min(at))
    return worst


def l2_star(topo: Topology) -> str | None:
    """`topo`'s L2 switch when it is an L2 star (one aggregating l2 switch, its ports in the
    root namespace, its own address; every host on it and on nothing else), else None."""
    if len(topo.segments) != 1 or max(topo.devices) != 1:
        return None
    (sw, seg), = topo.segments.items()
    hosts = sorted(node for _, node in topo.ports(sw).values())
    ok = (seg.kind == "l2" and seg.root and seg.address is not None and sw in topo.aggregating
          and topo.switches == (sw,) and hosts == sorted(topo.hosts)
          and len(topo.links) == len(hosts) and topo.segment_mac(sw, 1) is not None)
    return sw if ok else None


def run_rate(rate: float, seconds: float, nworkers: int = 4, datapath: str = "compiled",
             batch: int | None = None, nslots: int = NSLOTS, topo: Topology | None = None,
             tag: str | None = None) -> dict:
    """One run at `rate` offered frames/s for `seconds` through an L2Switch of `datapath`
    (`batch`: the compiled path's frames per receive call, default its BATCH) over `nslots`
    slots, the workers the first `nworkers` hosts of L2 star `topo` (default L2_STAR's) in
    namespaces named `tag`-... (default a unique one)."""
    import resource

    from controller.controller import program_star
    from softswitch.compiled import CompiledFrames
    from softswitch.dataplane import Dataplane
    from softswitch.l2 import L2Switch
    from softswitch.p4runtime_server import SoftSwitchServicer
    from spina.config import JobConfig, WorkerAddr
    topo = first_hosts(topo or load_topology(str(ROOT / L2_STAR)), nworkers)
    sw_name = l2_star(topo)
    seg = topo.segments[sw_name]
    net = Graph(topo, tag or netns.unique_tag("l2r", 10000)).create()
    ports = net.ports(sw_name)
    ips = [topo.segment_address(sw_name, r + 1) for r in range(nworkers)]
    start_at = time.time() + 3.0 + 0.5 * nworkers  # after the senders' imports
    try:
        dp = Dataplane(datapath=datapath)
        if batch is not None and dp.compiled is not None:
            dp.compiled = CompiledFrames(dp, batch)
        load_before = os.getloadavg()[0]
        job = JobConfig(job=5, workers=tuple(WorkerAddr(r, ips[r], 50000 + r)
                                             for r in range(nworkers)),
                        nslots=nslots, block_size=BLOCK, nlanes=NLANES)
        program_star(SoftSwitchServicer(dp), job, seg.address,
                     [topo.segment_mac(sw_name, r + 1) for r in range(nworkers)],
                     pool_slots=dp.pipeline.pool_slots, slot_capacity=dp.pipeline.slot_capacity)
        with L2Switch(ports, dp) as sw:
            procs = [subprocess.Popen(netns.command(net.ns(h), sys.executable, "-c", SENDER,
                                                    ROOT, r, nworkers, rate / nworkers, seconds,
                                                    nslots, start_at, ips[r], seg.address),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for r, h in enumerate(topo.hosts)]
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=seconds * 10 + 60)
                if p.returncode:
                    raise RuntimeError(err[-2000:])
                outs.append(json.loads(out.strip().splitlines()[-1]))
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            frames_in = sw.frames_in
        user, system = cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime
        cpu = user + system
        c = dp.pipeline.counters
        rounds = min(o["sent"] for o in outs)
        skew = sender_skew([o["late"] for o in outs], rounds)
        return {"datapath": datapath, "batch": batch, "nslots": nslots, "offered_fps": rate,
                "frames_in": frames_in, "rounds": rounds,
                "results_min": min(o["results"] for o in outs),
                "wrong": sum(o["wrong"] for o in outs),
                "lossless": all(o["results"] == rounds for o in outs),
                "achieved_fps": round(sum(o["sent"] for o in outs)
                                      / max(o["send_seconds"] for o in outs)),
                "completed": int(c["job_results"][5]) // nworkers,
                "aggregated": int(c["job_aggregated"][5]), "stale": int(c["job_stale"][5]),
                "held": int(c["job_held"][5]),
                # a worker this far behind another loses rounds to the hold (open loop: no
                # resends), however fast the switch
                "sender_skew_ms": round(skew * 1e3, 1),
                "slot_window_ms": round(nslots / (rate / nworkers) * 1e3, 1),
                "switch_cpu_s": round(cpu, 3), "switch_user_s": round(user, 3),
                "switch_system_s": round(system, 3),
                "frames_per_cpu_s": round(frames_in / cpu) if cpu else None,
                "load": [load_before, os.getloadavg()[0]]}
    finally:
        net.close()


DESCRIPTION = "the L2-mode switch's lossless INA frame rate with namespaced workers (root)"
METHODS = ("compiled", "python")
DEFAULTS = dict(methods="compiled", densities="1", begin="512", end="512", repeats=1,
                topology=L2_STAR)
EXTRA_COLUMNS = ("offered_fps", "achieved_fps", "lossless", "lost_rounds", "frames_in",
                 "rounds", "results_min", "completed", "aggregated", "stale", "held",
                 "sender_skew_ms", "slot_window_ms", "switch_cpu_s", "frames_per_cpu_s", "batch",
                 "nslots")
POINT_COLUMNS = ("offered_fps",)
ROUND_BYTES = NLANES * BLOCK * 4  # a round's data: 4 lanes of 32 int32


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--offered", type=cli.comma_list(cli.positive_float, "frames per second"),
                    default="10000,20000,30000,40000,50000",
                    help="offered INA frames per second, all workers together (comma list)")
    ap.add_argument("--seconds", type=cli.positive_float, default=2.0,
                    help="sending time per rate (default %(default)s)")
    ap.add_argument("--batch", type=cli.int_range(1, 32), default=None,
                    help="frames per receive call of the compiled path (1..32; default 32)")


def check_options(a) -> str | None:
    if a.rates:
        return "argument --rates: l2 offers frame rates (--offered); its links are the file's"
    if l2_star(a.topo) is None:
        return (f"argument -t/--topology: {a.topology} is no L2 star (one aggregating l2 "
                "switch with its address, root: true and host_macs, every host on it alone)")
    if a.sizes != [ROUND_BYTES] or a.densities != [1.0] or a.lane_bits != [32]:
        return (f"argument -b/--begin: l2 sends the P4 program's frames: {ROUND_BYTES} bytes "
                "a round, dense, 32-bit (give no -b/-e/-d/-l)")
    if len(a.workers) != 1 or not 1 <= a.workers[0] <= len(a.topo.hosts):
        return f"argument -g/--workers: one count, 1..{len(a.topo.hosts)} (the hosts of " \
               f"{a.topology})"
    why = netns.why_no_namespaces()
    return f"l2: {why}" if why else None


def run(a, log):
    n = a.workers[0]
    for i, rate in enumerate(a.offered):
        got = {m: [] for m in a.methods}
        load0 = os.getloadavg()[0]
        for _ in range(a.repeats):
            for m in a.methods if i % 2 == 0 else a.methods[::-1]:
                got[m].append(run_rate(rate, a.seconds, n, datapath=m, batch=a.batch,
                                       topo=a.topo, tag=a.tag))
        times = {m: [r["switch_cpu_s"] / max(1, r["rounds"]) for r in rs] for m, rs in
                 got.items()}
        extras = {}
        for m, rs in got.items():
            last = rs[-1]
            extras[m] = {k: last[k] for k in ("achieved_fps", "frames_in", "rounds",
                                              "results_min", "completed", "aggregated",
                                              "stale", "held",
                                              "sender_skew_ms", "slot_window_ms",
                                              "switch_cpu_s", "frames_per_cpu_s", "nslots")}
            extras[m].update(offered_fps=rate, lossless=all(r["lossless"] for r in rs),
                             lost_rounds=sum(r["rounds"] - r["results_min"] for r in rs),
                             batch=a.batch or "")
        point = dict(size=ROUND_BYTES, elements=ROUND_BYTES // 4, dtype="int32", density=1.0,
                     workers=n, lane_bits=32, rate="")
        yield method_rows(a.what, point, times, bus="all_reduce",
                          wrong={m: sum(r["wrong"] for r in rs) for m, rs in got.items()},
                          load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)
