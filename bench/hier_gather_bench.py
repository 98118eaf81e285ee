"""The hierarchical all-gather (collectives "leader-switch", "leader-ring") against the flat
all-gather through the switch ("switch", Agent.allgather of every rank) and gloo's
all_gather, on a namespace topology of groups joined by slower links (docs/collectives.md,
"Hierarchical all-gather").

Run from the repository root as root:

    python -m bench.hier_gather_bench                                # two_groups_switch, 3 sizes
    python -m bench.hier_gather_bench --sizes 8MiB --repeats 5 --out /tmp/hg
    python -m bench.hier_gather_bench --sizes 64KiB --repeats 1 --out /tmp/hg   # smoke

bench.net_topo.Graph builds the topology file (a namespace per host and switch, a veth per
link with tbf both ways, the planner's routes); the software switch (UDP mode) runs in the
aggregating switch's namespace and serves two jobs: every rank (the flat "switch") and the
groups' leaders (their first ranks: "leader-switch"'s middle phase). One process per rank
in its host's namespace holds its agents and a gloo group on its host's address. Per size
(the gathered tensor's bytes, float32, a shard of size/p per rank) every method runs once
as a checked warm-up, then --repeats times, the order rotating; every result must be the
flat all-gather's bit for bit on every rank. Each call runs between barriers after the
links were idle long enough to refill their tbf buckets; only the call is timed; a
repeat's time is the slowest rank's. Bytes per link and direction: the interface counters
(link layer: every header and resend) of the ranks' and the switch's namespaces, read by
rank 0 before and after each call (/proc/PID/net/dev), so every link with a host or the
aggregating switch at one end is counted. Outputs in --out: hier_gather.csv, summary.md.
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta

import numpy as np

from bench.net_topo import Graph, link_ifnames
from bench.paired import BenchError, guarded, recv, stop_all, stop_server
from bench.plan import GLOO, idle_seconds
from bench.procs import switch_main
from collectives import plan as planner, topology
from spina import cli
from spina.netns import qdisc_drops, unique_tag, why_no_namespaces

TOPOLOGY = os.path.join("bench", "topologies", "two_groups_switch.yaml")
METHODS = ("switch", "leader-switch", "leader-ring", "2d-ring", "ring", GLOO)
GLOO_PORT = 29533
COLUMNS = ("topology", "bytes", "method", "predicted_s", "median_s", "min_s", "max_s",
           "fast_link_bytes", "slow_link_bytes", "link_bytes", "requests", "times_s",
           "load_start", "load_end")


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
        if got.numpy().tobytes() != want.tobytes():
            raise BenchError(f"rank {rank}: {m} all-gather of {nbytes} B is not the flat "
                             "all-gather bit for bit")
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
def run(topo_path: str, sizes, repeats: int, methods, tag: str, queue_ms: float,
        nslots: int, progress: bool = False, log=print) -> list[dict]:
    import torch  # noqa: F401  (before the forks: once for all ranks)

    from spina.config import JobConfig, WorkerAddr
    topo = topology.load(topo_path)
    if topo.groups is None or len(topo.aggregating) != 1:
        raise BenchError(f"{topo_path}: needs groups and one aggregating switch")
    sw = topo.aggregating[0]
    groups = topo.groups
    leaders = [g[0] for g in groups]
    name = os.path.splitext(os.path.basename(topo_path))[0]
    ctx = mp.get_context("fork")
    rows = []
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
    load1 = os.getloadavg()[0]
    slow = min(ln.rate for ln in topo.links)
    for nbytes in sizes:
        for m in methods:
            ts = [max(w[(nbytes, m)]["times"][i] for w in recs) for i in range(repeats)]
            links = recs[0][(nbytes, m)]["links"]
            mean = {k: statistics.mean(d[k] for d in links) for k in links[0]}
            is_slow = {f"{a}->{b}": rate == slow for ln in topo.links
                       for a, b, rate in ((ln.a, ln.b, ln.rate), (ln.b, ln.a, ln.rate))}
            pred = None if m == GLOO else planner.predict(topo, "all_gather", nbytes, m).seconds
            rows.append(dict(
                topology=name, bytes=nbytes, method=m, predicted_s=pred,
                median_s=statistics.median(ts), min_s=min(ts), max_s=max(ts),
                fast_link_bytes=round(sum(v for k, v in mean.items() if not is_slow[k])),
                slow_link_bytes=round(sum(v for k, v in mean.items() if is_slow[k])),
                link_bytes=" ".join(f"{k}={round(v)}" for k, v in sorted(mean.items())),
                requests=sum(sum(w[(nbytes, m)]["requests"]) for w in recs),
                times_s=" ".join(f"{t:.4f}" for t in ts), load_start=round(load0, 2),
                load_end=round(load1, 2)))
            r = rows[-1]
            log(f"{name} {nbytes} B {m}: median {r['median_s'] * 1e3:.1f} ms "
                f"[{r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f}]"
                + (f", predicted {pred * 1e3:.1f} ms" if pred else "")
                + f"; fast links {r['fast_link_bytes'] / nbytes:.2f}x, slow links "
                f"{r['slow_link_bytes'] / nbytes:.2f}x the tensor; requests {r['requests']}",
                flush=True)
    # the switch's sends that failed (its send buffer still full after 0.2 s: softswitch/udp.py)
    errors = sw_stats.get("send_errors", -1)
    log(f"over the whole run: tbf drops {drops}, the switch's failed sends {errors}")
    for r in rows:
        r["tbf_drops_run"], r["switch_send_errors_run"] = drops, errors
    return rows


def write(rows, out: str, meta: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "hier_gather.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS + ("tbf_drops_run", "switch_send_errors_run"))
        w.writeheader()
        w.writerows(rows)
    lines = ["# Hierarchical all-gather vs the flat one through the switch and gloo's", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()] + [""]
    lines += ["| size | method | predicted ms | median ms [min-max] | time / gloo's | fast links"
              " (x size) | slow links (x size) | requests |", "|" + "---|" * 8]
    gloo = {r["bytes"]: r for r in rows if r["method"] == GLOO}
    for r in rows:
        g = gloo.get(r["bytes"])
        pred = f"{r['predicted_s'] * 1e3:.1f}" if r["predicted_s"] else ""
        lines.append(f"| {r['bytes']} | {r['method']} | {pred} | {r['median_s'] * 1e3:.1f} "
                     f"[{r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f}] | "
                     f"{r['median_s'] / g['median_s'] if g else float('nan'):.2f} | "
                     f"{r['fast_link_bytes'] / r['bytes']:.2f} | "
                     f"{r['slow_link_bytes'] / r['bytes']:.2f} | {r['requests']} |")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _methods(text: str) -> list[str]:
    out = text.split(",")
    for m in out:
        if m not in METHODS:
            raise argparse.ArgumentTypeError(f"method {m!r} is not one of {', '.join(METHODS)}")
    return out


def _sizes(text: str) -> list[int]:
    """--sizes: a comma list of sizes (collectives/topology.py's units), each checked here."""
    return [cli.parsed_by(topology.parse_size, "size")(v) for v in text.split(",")]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.hier_gather_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default=TOPOLOGY,
                    help="a topology file with groups and one aggregating switch")
    ap.add_argument("--sizes", type=_sizes, default=[64 << 10, 1 << 20, 8 << 20],
                    help="comma list of gathered sizes (default 64KiB,1MiB,8MiB)")
    ap.add_argument("--methods", type=_methods, default=list(METHODS),
                    help=f"comma list of {', '.join(METHODS)} (default all)")
    ap.add_argument("--repeats", type=cli.int_range(1, 1000), default=3)
    ap.add_argument("--nslots", type=cli.int_range(1, 256), default=4,
                    help="the jobs' window: chunks per worker in flight (default 4)")
    ap.add_argument("--queue-ms", type=float, default=20.0,
                    help="tbf queue at line rate (default 20 ms, the all_reduce WHAT's: the "
                         "switch's window of 57 KB datagrams needs room)")
    ap.add_argument("--progress", action="store_true",
                    help="rank 0 prints every call's time to stderr as it goes")
    ap.add_argument("--tag", default=unique_tag("hg"))
    ap.add_argument("--out", default=os.path.join("bench", "out", "hier_gather"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    why = why_no_namespaces()
    if why:
        print(f"hier_gather_bench: {why}", file=sys.stderr)
        return 2
    for n in args.sizes:
        if n % 16:
            print(f"hier_gather_bench: --sizes: {n} is not a multiple of 4 ranks x 4 bytes",
                  file=sys.stderr)
            return 2
    t0, load0 = time.time(), os.getloadavg()
    rows = run(args.topology, args.sizes, args.repeats, args.methods, args.tag, args.queue_ms,
               args.nslots, args.progress)
    meta = {"command": "python -m bench.hier_gather_bench " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            + f"; took {time.time() - t0:.0f} s",
            "load average": f"{load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
            "network": f"{args.topology}, tbf queue {args.queue_ms} ms, jobs' window "
                       f"{args.nslots} chunks"}
    write(rows, args.out, meta)
    print(f"wrote {args.out}/hier_gather.csv, summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
