"""all_gather: the all-gather through the switch (Agent.allgather, docs/protocol.md
"All-gather") against gloo's all_gather, on a star topology file in namespaces.

    python -m bench all_gather -t bench/topologies/star4.yaml --rates 1gbit -b 256K -e 32M -f 8

One rank per host namespace (bench.paired.Cluster: each with an Agent and a gloo group on its
eth0), the software switch in the aggregating switch's namespace (it routes gloo's TCP too, so
both methods cross the same links). size is nccl-tests' for all-gather: the gathered result,
every rank's shard (size / workers bytes each). Per size the two methods alternate repeat by
repeat after a warm-up; every rank's result must be every shard bit for bit (the shards differ
per rank and size): `wrong` counts the calls that were not. bytes_per_link: the link-layer
bytes the rank's eth0 sent per call (rx_bytes_per_link what it received).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from bench.harness import method_rows
from bench.paired import Cluster, proc_cpu

DESCRIPTION = "all-gather through the switch vs gloo's all_gather (a star topology, root)"
METHODS = ("spina", "gloo")
DEFAULTS = dict(methods="spina,gloo", densities="1", begin="256K", end="4M",
                topology="bench/topologies/star4.yaml", rates="1gbit")
EXTRA_COLUMNS = ("shard_bytes", "rx_bytes_per_link", "requests", "resends", "tbf_drops",
                 "switch_cpu_s_per_call")
GLOO_PORT = 29531


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--nslots", type=cli.int_range(1, 256), default=8,
                    help="the job's window: chunks per rank in flight (default %(default)s)")


def check_options(a) -> str | None:
    from bench.net_topo import check_star
    if a.densities != [1.0]:
        return "argument -d/--densities: an all-gather is dense (give -d 1)"
    return check_star(a)


def shard(rank: int, nbytes: int) -> np.ndarray:
    """Rank `rank`'s float32 shard of `nbytes` bytes (different per rank and size)."""
    return np.random.default_rng([rank, nbytes]).standard_normal(nbytes // 4).astype(np.float32)


def serve(rank, req, agent, dist, torch, barrier, floor=None) -> dict:
    """A rank's side of one size: {method: {times, tx, rx, wrong[, requests, resends]}}."""
    from bench.net_topo import dev_bytes
    nbytes, repeats, methods = req["shard_bytes"], req["repeats"], req["methods"]
    n = agent.job.nworkers
    x = shard(rank, nbytes)
    want = np.stack([shard(r, nbytes) for r in range(n)])
    t = torch.from_numpy(x)
    outs = [torch.empty_like(t) for _ in range(n)]
    calls = {"spina": lambda: agent.allgather(x),
             "gloo": lambda: (dist.all_gather(outs, t), torch.stack(outs).numpy())[1]}
    rec = {m: dict(times=[], tx=[], rx=[], requests=[], resends=[], wrong=0) for m in methods}
    for i in range(repeats + 1):  # i == 0: warm-up, checked, not recorded
        for m in methods if i % 2 == 0 else methods[::-1]:
            barrier.wait()  # the last call is over everywhere: the links are quiet
            tx0, rx0 = dev_bytes()
            barrier.wait()
            t0 = time.perf_counter()
            got = calls[m]()
            dt = time.perf_counter() - t0
            barrier.wait()  # every rank done: late resends are counted with this call
            tx1, rx1 = dev_bytes()
            rec[m]["wrong"] += got.tobytes() != want.tobytes()
            if not i:
                continue
            r = rec[m]
            r["times"].append(dt)
            r["tx"].append(tx1 - tx0)
            r["rx"].append(rx1 - rx0)
            if m == "spina":
                r["requests"].append(agent.last_gather_stats.requests)
                r["resends"].append(agent.last_gather_stats.resends)
    return rec


def run(a, log):
    from bench.paired import star_places
    from spina.netgraph import Graph
    n = a.workers[0]
    with Graph(a.topo, a.tag, queue_ms=20) as graph:
        places, gloo = star_places(graph, GLOO_PORT)
        with Cluster(n, nslots=a.nslots, gloo=gloo, serve=serve, **places) as cl:
            for _ in graph.each_rate(a.rates):
                for size in a.sizes:
                    yield measure(cl, graph, a, size)


def measure(cl, graph, a, size: int) -> list[dict]:
    n, methods = a.workers[0], tuple(a.methods)
    nbytes = size // n // 4 * 4
    load0, drops0, cpu0 = os.getloadavg()[0], graph.tbf_drops(), proc_cpu(cl.switch_pid)
    recs = cl.ask(dict(shard_bytes=nbytes, repeats=a.repeats, methods=methods), f"{size} B")
    # the switch process works for SpINA alone (gloo's TCP is routed by the kernel)
    switch_cpu = (proc_cpu(cl.switch_pid) - cpu0) / (a.repeats + 1)
    drops = graph.tbf_drops() - drops0
    times, sent, wrong, extras = {}, {}, {}, {}
    for m in methods:
        times[m] = [max(r[m]["times"][i] for r in recs) for i in range(a.repeats)]
        sent[m] = round(statistics.mean(statistics.mean(r[m]["tx"]) for r in recs))
        wrong[m] = sum(r[m]["wrong"] for r in recs)
        extras[m] = dict(shard_bytes=nbytes,
                         rx_bytes_per_link=round(statistics.mean(
                             statistics.mean(r[m]["rx"]) for r in recs)),
                         requests=sum(sum(r[m]["requests"]) for r in recs),
                         resends=sum(sum(r[m]["resends"]) for r in recs), tbf_drops=drops,
                         switch_cpu_s_per_call=round(switch_cpu, 4) if m == "spina" else "")
    point = dict(size=nbytes * n, elements=nbytes * n // 4, dtype="float32", density=1.0,
                 workers=n, lane_bits=32, rate=graph.file_rate())
    return method_rows("all_gather", point, times, bus="all_gather", sent=sent, wrong=wrong,
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)
