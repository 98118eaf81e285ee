"""hier_gather: the hierarchical all-gather (collectives "leader-switch", "leader-ring") against
the flat all-gather through the switch ("switch", Agent.allgather of every rank), the 2-D and
ring all-gathers and gloo's all_gather, on a topology file of groups joined by slower links
(docs/collectives.md, "Hierarchical all-gather").

    python -m bench hier_gather                       # two_groups_switch.yaml, 64K-4M (root)
    python -m bench hier_gather -b 64K -e 64K -n 1 --out /tmp/hg      # a smoke run

spina.netgraph.Graph builds the topology file (a namespace per host and switch, a veth per
link with tbf both ways, the planner's routes); the software switch (UDP mode) runs in the
aggregating switch's namespace and serves two jobs: every rank (the flat "switch") and the
groups' leaders (their first ranks: "leader-switch"'s middle phase). One process per rank
in its host's namespace holds its agents and a gloo group on its host's address. Per size
(nccl-tests' for all-gather: the gathered tensor's bytes, float32, a shard of size/p per
rank) every method runs once as a checked warm-up, then -n times, the order rotating; every
result must be the flat all-gather's bit for bit on every rank (`wrong` counts the calls
that were not, at any rank). Each call runs between barriers after the links were idle long
enough to refill their tbf buckets (part of the measurement, not a synchronisation); only
the call is timed; a repeat's time is the slowest rank's. Bytes per link and direction: the
interface counters (link layer: every header and resend) of the ranks' and the switch's
namespaces, read by rank 0 before and after each call (/proc/PID/net/dev), so every link
with a host or the aggregating switch at one end is counted; `bytes_per_link` is the busiest
direction's, and the columns add the slow and the fast links' sums, every direction's, the
predicted time and SpINA's loss requests.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta

import numpy as np

from bench.harness import method_rows
from bench.paired import guarded, recv, stop_all, stop_server
from bench.plan import GLOO, idle_seconds
from bench.procs import switch_main
from collectives import plan as planner
from spina import topology
from spina.netgraph import Graph, link_ifnames
from spina.netns import qdisc_drops

METHODS = ("switch", "leader-switch", "leader-ring", "2d-ring", "ring", GLOO)
GLOO_PORT = 29533
DESCRIPTION = "the hierarchical all-gather vs the flat switch one, 2-D, ring and gloo (root)"
DEFAULTS = dict(methods=",".join(METHODS), densities="1", begin="64K", end="4M", factor=8.0,
                repeats=3, topology="bench/topologies/two_groups_switch.yaml")
EXTRA_COLUMNS = ("topology", "predicted_us", "fast_link_bytes", "slow_link_bytes",
                 "link_bytes", "requests", "tbf_drops_run", "switch_send_errors_run")


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--nslots", type=cli.int_range(1, 256), default=4,
                    help="the jobs' window: chunks per rank in flight (default %(default)s)")
    ap.add_argument("--queue-ms", type=cli.positive_float, default=20.0,
                    help="tbf queue at line rate (default 20 ms, the all_reduce WHAT's: the "
                         "switch's window of 57 KB datagrams needs room)")
    ap.add_argument("--progress", action="store_true",
                    help="rank 0 prints every call's time to stderr as it goes")


def check_options(a) -> str | None:
    from spina.netns import why_no_namespaces
    if a.topo is None:
        return "argument -t/--topology: hier_gather runs on a topology file"
    if a.topo.groups is None or len(a.topo.aggregating) != 1 or max(a.topo.devices) != 1:
        return (f"argument -t/--topology: {a.topology}: needs groups, one aggregating switch "
                "and hosts of one device")
    if a.densities != [1.0] or a.rates:
        return "argument -d/--densities, --rates: an all-gather is dense, at the file's rates"
    if a.workers != [a.topo.world]:
        return (f"argument -g/--workers: {a.topology} has {a.topo.world} ranks (give -g "
                f"{a.topo.world})")
    a.sizes = [n // (4 * a.topo.world) * 4 * a.topo.world for n in a.sizes]  # whole shards
    why = why_no_namespaces()
    return f"argument -t/--topology: {why}" if why else None


def shard(rank: int, world: int, nbytes: int) -> np.ndarray:
    """Rank `rank`'s float32 shard of a gathered tensor of `nbytes` (different per rank)."""
    return np.random.default_rng([rank, nbytes]).standard_normal(
        nbytes // 4 // world).astype(np.float32)


def net_dev(pid: int) -> dict[str, tuple[int, int]]:
    """{interface: (tx_bytes, rx_bytes)} of the namespace process `pid` is in."""
    out = {}
    with open(f"/proc/{pid}/net/dev") as f:
        for line in list(f)[2:]:
            name, _, rest = line.partition(":")
            v = rest.split()
            out[name.strip()] = (int(v[8]), int(v[0]))
    return out


def link_bytes(topo, where: dict[str, int]) -> dict[str, int]:
    """{"a->b": bytes so far} for every link with an end in a namespace of `where` (node ->
    a pid there): a->b is the tx of a's interface, or the rx of b's."""
    dev = {node: net_dev(pid) for node, pid in where.items()}
    ifs = link_ifnames(topo)
    out = {}
    for i, ln in enumerate(topo.links):
        for a, b in ((ln.a, ln.b), (ln.b, ln.a)):
            if a in dev:
                out[f"{a}->{b}"] = dev[a][ifs[i, a]][0]
            elif b in dev:
                out[f"{a}->{b}"] = dev[b][ifs[i, b]][1]
    return out


# ----------------------------------------------------------------------------- rank side
def rank_main(rank, topo_path, place, store, conn, barrier) -> None:
    conn.send(guarded(rank, conn, barrier, _rank, rank, topo_path, place, store, conn,
                      barrier))


def _rank(rank, topo_path, place, store, conn, barrier):
    from spina.netns import enter
    ns, host, ifname, leader = place
    enter(ns)
    import torch
    import torch.distributed as dist

    import collectives
    from host_agent.agent import Agent
    from spina.net import bound_udp_socket
    torch.set_num_threads(1)
    topo = topology.load(topo_path)
    socks = [bound_udp_socket(host)] + ([bound_udp_socket(host)] if leader is not None else [])
    conn.send([s.getsockname() for s in socks])
    flat_job, lead_job, switch_addr, where, job = conn.recv()
    agent = Agent(flat_job, rank, switch_addr, sock=socks[0], timeout=60.0)
    lead = Agent(lead_job, leader, switch_addr, sock=socks[1], timeout=60.0) \
        if leader is not None else None
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    kv = dist.TCPStore(*store, topo.world, rank == 0, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=kv, rank=rank, world_size=topo.world,
                            timeout=timedelta(seconds=300))
    p, groups = topo.world, [list(g) for g in topo.groups]
    out = {}

    def call(m, x, total, outs):
        if m == GLOO:
            dist.all_gather(outs, x)
            return torch.cat(outs)
        return collectives.all_gather(x, total, m, None, groups,
                                      agent=agent if m == "switch" else lead)

    def timed(m, nbytes, x, want, outs, record):
        barrier.wait()  # the last call is over everywhere
        time.sleep(job["idle_s"])
        b0 = link_bytes(topo, where) if rank == 0 else None
        barrier.wait()
        t0 = time.perf_counter()
        got = call(m, x, want.size, outs)
        dt = time.perf_counter() - t0
        barrier.wait()  # every rank done: late resends belong to this call
        wrong = int(got.numpy().tobytes() != want.tobytes())  # not the flat one bit for bit
        out[(nbytes, m, "wrong")] = out.get((nbytes, m, "wrong"), 0) + wrong
        if rank == 0 and job["progress"]:
            print(f"  rank 0: {nbytes} B {m} {dt * 1e3:.1f} ms", file=sys.stderr, flush=True)
        if not record:
            return
        rec = out.setdefault((nbytes, m), dict(times=[], links=[], requests=[]))
        rec["times"].append(dt)
        by = {"switch": agent, "leader-switch": lead}.get(m)  # SpINA's loss requests
        rec["requests"].append(by.last_gather_stats.requests if by is not None else 0)
        if rank == 0:
            b1 = link_bytes(topo, where)
            rec["links"].append({k: b1[k] - b0[k] for k in b1})

    try:
        for nbytes in job["sizes"]:
            x = torch.from_numpy(shard(rank, p, nbytes))
            want = np.concatenate([shard(r, p, nbytes) for r in range(p)])
            outs = [torch.empty_like(x) for _ in range(p)]
            methods = job["methods"]
            for m in methods:
                timed(m, nbytes, x, want, outs, False)
            for k in range(job["repeats"]):
                for m in methods[k % len(methods):] + methods[:k % len(methods)]:
                    timed(m, nbytes, x, want, outs, True)
    finally:
        dist.destroy_process_group()
        agent.close()
        if lead is not None:
            lead.close()
    return out


# ----------------------------------------------------------------------------- parent side
def run(a, log):
    yield measure(a.topology, a.sizes, a.repeats, tuple(a.methods), a.tag, a.queue_ms,
                  a.nslots, a.progress, log, a.what)


def measure(topo_path: str, sizes, repeats: int, methods, tag: str, queue_ms: float,
            nslots: int, progress: bool = False, log=print, what="hier_gather") -> list[dict]:
    """Every method at every size on the file's network: the harness's rows."""
    import torch  # noqa: F401  (before the forks: once for all ranks)

    from spina.config import JobConfig, WorkerAddr
    topo = topology.load(topo_path)
    sw = topo.aggregating[0]
    groups = topo.groups
    leaders = [g[0] for g in groups]
    name = os.path.splitext(os.path.basename(topo_path))[0]
    ctx = mp.get_context("fork")
    load0 = os.getloadavg()[0]
    with Graph(topo, tag, queue_ms=queue_ms) as g:
        procs, conns, sconn = [], [], None
        try:
            sconn, child = ctx.Pipe()
            procs.append(ctx.Process(target=switch_main, name="hg-switch",
                                     args=(child, None, g.ns(sw), g.node_ip(sw))))
            procs[-1].start()
            switch_addr = recv(sconn, "switch")
            barrier = ctx.Barrier(topo.world)
            store = (g.host_ip(topo.ranks[0]), GLOO_PORT)
            for r, h in enumerate(topo.ranks):
                parent, child = ctx.Pipe()
                place = (g.ns(h), g.host_ip(h), g.host_if(h),
                         leaders.index(r) if r in leaders else None)
                procs.append(ctx.Process(target=rank_main, name=f"hg-rank{r}",
                                         args=(r, topo_path, place, store, child, barrier)))
                procs[-1].start()
                conns.append(parent)
            addrs = [recv(c, f"rank {r} start") for r, c in enumerate(conns)]
            flat = JobConfig(job=1, nslots=nslots, workers=tuple(
                WorkerAddr(r, *a[0]) for r, a in enumerate(addrs))).validate()
            lead = JobConfig(job=2, nslots=nslots, slot_base=nslots, workers=tuple(
                WorkerAddr(i, *addrs[r][1]) for i, r in enumerate(leaders))).validate()
            sconn.send([flat, lead])
            recv(sconn, "switch admission")
            where = {h: procs[1 + r].pid for r, h in enumerate(topo.ranks)}
            where[sw] = procs[0].pid
            job = dict(sizes=list(sizes), repeats=repeats, methods=list(methods),
                       idle_s=idle_seconds(topo), progress=progress)
            for c in conns:
                c.send((flat, lead, switch_addr, where, job))
            recs = [recv(c, f"rank {r}", timeout=600) for r, c in enumerate(conns)]
            drops = sum(qdisc_drops(g.ifname(i, n), g.ns(n)) for i, ln in enumerate(topo.links)
                        for n in (ln.a, ln.b))
        finally:
            stop_all(procs[1:])
            if procs:
                sw_stats = stop_server(procs[0], sconn) or {}
    load = f"{load0:.2f}-{os.getloadavg()[0]:.2f}"
    slow = min(ln.rate for ln in topo.links)
    is_slow = {f"{a}->{b}": rate == slow for ln in topo.links
               for a, b, rate in ((ln.a, ln.b, ln.rate), (ln.b, ln.a, ln.rate))}
    # the switch's sends that failed (its send buffer still full after 0.2 s: softswitch/udp.py)
    errors = sw_stats.get("send_errors", -1)
    log(f"over the whole run: tbf drops {drops}, the switch's failed sends {errors}")
    rates = {ln.rate_text for ln in topo.links}
    rate = next(iter(rates)) if len(rates) == 1 else "file"
    rows = []
    for nbytes in sizes:
        times, sent, wrong, extras = {}, {}, {}, {}
        for m in methods:
            times[m] = [max(w[(nbytes, m)]["times"][i] for w in recs) for i in range(repeats)]
            links = recs[0][(nbytes, m)]["links"]
            mean = {k: statistics.mean(d[k] for d in links) for k in links[0]}
            sent[m] = round(max(mean.values()))  # the busiest link direction's
            wrong[m] = sum(w.get((nbytes, m, "wrong"), 0) for w in recs)
            pred = "" if m == GLOO else round(
                planner.predict(topo, "all_gather", nbytes, m).seconds * 1e6, 1)
            extras[m] = dict(
                topology=name, predicted_us=pred,
                fast_link_bytes=round(sum(v for k, v in mean.items() if not is_slow[k])),
                slow_link_bytes=round(sum(v for k, v in mean.items() if is_slow[k])),
                link_bytes=" ".join(f"{k}={round(v)}" for k, v in sorted(mean.items())),
                requests=sum(sum(w[(nbytes, m)]["requests"]) for w in recs),
                tbf_drops_run=drops, switch_send_errors_run=errors)
        point = dict(size=nbytes, elements=nbytes // 4, dtype="float32", density=1.0,
                     workers=topo.world, lane_bits=32, rate=rate)
        rows += method_rows(what, point, times, bus="all_gather", sent=sent, wrong=wrong,
                            load=load, extras=extras)
    return rows
