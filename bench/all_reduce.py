"""all_reduce: SpINA's all-reduce against gloo and the floor, paired, in the same processes.

    python -m bench all_reduce -b 64K -e 16M -f 4 -d 1,0.01 -g 4        # loopback
    python -m bench all_reduce -t bench/topologies/star4.yaml --rates 1gbit,10gbit   # root

Every rank is a process holding a SpINA Agent, a gloo group and a socket of the floor
(bench/paired.py); the software switch and the floor's relay run in processes of their own.
On loopback everything talks over 127.0.0.1; with -t the file's star (one aggregating switch,
a link per host) is built in namespaces (bench/net_topo.py `Graph`: tbf at both ends of every
link), the switch and the relay in the switch's namespace, each rank in its host's. Per
repeat every method runs once on the same buffer, the order rotating, between barriers, only
the collective timed:

  spina           Agent.allreduce(buf, inplace=True)
  spina_blocks    the same, the caller passing its non-zero blocks (found before the timer)
  floor           the simplest compiled star all-reduce of the dense tensor (bench/floor.py)
  gloo_allreduce  dist.all_reduce(t) in place, t sharing buf's memory
  gloo_allgather  all_gather of (index, value) of the non-zeros, then index_add_
  spina_alloc, gloo_allreduce_clone   the timing before the paired design (docs/benchmark.md)

Data: each rank's float32 tensor has a fraction `density` of its 256-element blocks non-zero
(bench/procs.py). Every result is checked: rank 0 against numpy's float64 sum (SpINA and the
floor within the quantization bound, gloo within float32 rounding), SpINA's and the floor's
on every other rank bit-identical to rank 0's; `wrong` counts the calls that failed either,
warm-up included. bytes_per_link: on a topology the link-layer bytes the rank's interface
sent per call (its counters around every call), on loopback SpINA's and the floor's UDP
payload as the agent counted it and gloo's from its algorithm (ring: 2(n-1)/n of the
tensor); `bytes_source` says which.
"""
from __future__ import annotations

import os
from contextlib import ExitStack

from bench.allreduce_bench import summarize
from bench.harness import method_rows
from bench.paired import (
    ALL_METHODS,
    Cluster,
    Gloo,
    Place,
    Request,
    mean_over_workers,
    proc_cpu,
)
from bench.procs import Point

DESCRIPTION = "SpINA's all-reduce vs gloo and the floor, paired (loopback or a topology)"
METHODS = ALL_METHODS
DEFAULTS = dict(methods="spina,floor,gloo_allreduce")
EXTRA_COLUMNS = ("block_size", "nlanes", "nslots", "bytes_source", "payload_bytes_per_link",
                 "packets_per_link", "resends", "spurious_resends", "timeout_resends",
                 "max_abs_err", "cpu_s_per_rank", "switch_cpu_s", "switch_pkts_per_cpu_s",
                 "tbf_drops")
GLOO_PORT = 29400


def add_options(ap) -> None:
    from softswitch.udp import MAX_DATAPATH_THREADS
    from spina import cli
    ap.add_argument("--block-size", type=cli.int_range(1, 4096), default=256,
                    help="SpINA block size (default %(default)s)")
    ap.add_argument("--nlanes", type=cli.int_range(1, 1024), default=None,
                    help="blocks per packet (default: as many as fit a datagram and a slot, "
                    "at most JobConfig's 56)")
    ap.add_argument("--nslots", type=cli.int_range(1, 4096), default=16,
                    help="switch slots per job: the window (default %(default)s)")
    ap.add_argument("--rto", type=cli.positive_float, default=None,
                    help="the agent's first retransmission timeout in s (default its own)")
    ap.add_argument("--switch-datapath", choices=("compiled", "python"), default="compiled",
                    help="the software switch's data path (default %(default)s)")
    ap.add_argument("--switch-threads", type=cli.int_range(1, MAX_DATAPATH_THREADS),
                    default=1, help="the switch's data-path threads (default %(default)s)")


def nlanes_for(block_size: int, wanted: int | None = None) -> int:
    """Blocks per packet: `wanted` (default JobConfig's 56), at most what fits a datagram
    and a switch slot."""
    from spina import spec, wire
    most = min(wire.max_lanes_for(block_size), spec.DEFAULT_SLOT_CAPACITY // block_size)
    return min(56 if wanted is None else wanted, most)


def star_of(topo) -> tuple[str, list[str]] | str:
    """(the aggregating switch, the hosts) of a star topology, or why it is not one."""
    if len(topo.aggregating) != 1 or max(topo.devices) != 1:
        return "needs one aggregating switch and hosts of one device"
    sw = topo.aggregating[0]
    if sorted(tuple(sorted((ln.a, ln.b))) for ln in topo.links) != sorted(
            tuple(sorted((h, sw))) for h in topo.hosts):
        return f"needs one link from every host to {sw} and no other"
    return sw, list(topo.hosts)


def check_options(a) -> str | None:
    if a.topo is None:
        return "argument --rates: needs -t/--topology (loopback has no links)" if a.rates \
            else None
    star = star_of(a.topo)
    if isinstance(star, str):
        return f"argument -t/--topology: {a.topology}: {star}"
    if a.workers != [len(star[1])]:
        return (f"argument -g/--workers: {a.topology} has {len(star[1])} hosts (give -g "
                f"{len(star[1])} or another file)")
    from spina.netns import why_no_namespaces
    why = why_no_namespaces()
    return f"argument -t/--topology: {why}" if why else None


def file_rate(topo) -> str:
    rates = {ln.rate_text for ln in topo.links}
    return rates.pop() if len(rates) == 1 else "file"


def run(a, log):
    """Rows per point: per (workers, lane bits) one cluster; per rate, density and size a
    point measured in it."""
    with ExitStack() as stack:
        graph = None
        if a.topo is not None:
            from bench.net_topo import Graph
            graph = stack.enter_context(Graph(a.topo, a.tag, queue_ms=20))
            log(f"{a.topology}: namespaces {graph.tag}-*")
        for n in a.workers:
            for bits in a.lane_bits:
                yield from _cluster_points(a, n, bits, graph, log)


def _cluster_points(a, n: int, bits: int, graph, log):
    nlanes = nlanes_for(a.block_size, a.nlanes)
    places = {}
    if graph is not None:
        sw, hosts = star_of(graph.topo)
        places = dict(switch_place=Place(graph.ns(sw), graph.node_ip(sw)),
                      worker_places=[Place(graph.ns(h), graph.host_ip(h)) for h in hosts])
        gloo = Gloo(graph.host_ip(hosts[0]), GLOO_PORT, graph.host_if(hosts[0]))
    else:
        gloo = Gloo()
    use_gloo = any(m.startswith("gloo") for m in a.methods)
    with Cluster(n, nslots=a.nslots, block_size=a.block_size, nlanes=nlanes, lane_bits=bits,
                 agent_kw={} if a.rto is None else {"rto": a.rto},
                 gloo=gloo if use_gloo else None, floor="floor" in a.methods,
                 switch_datapath=a.switch_datapath, switch_threads=a.switch_threads,
                 **places) as cl:
        for rate in (a.rates or [None]) if graph is not None else [None]:
            if rate is not None:
                graph.set_rate(rate)
            rate_text = "" if graph is None else rate or file_rate(graph.topo)
            for d in a.densities:
                for size in a.sizes:
                    p = Point("all_reduce", n, size // 4, d, a.block_size, nlanes, 256,
                              a.nslots, a.rto)
                    yield measure(cl, p, a, bits, rate_text, graph)


def measure(cl: Cluster, p: Point, a, bits: int, rate: str, graph) -> list[dict]:
    """One point: its rows (harness columns and this module's)."""
    load0 = os.getloadavg()
    sw0 = proc_cpu(cl.switch_pid)
    relay0 = proc_cpu(cl.relay_pid) if cl.relay_pid else 0.0
    drops0 = graph.tbf_drops() if graph is not None else 0
    recs = cl.measure(Request(p, a.repeats, tuple(a.methods), count_dev=graph is not None,
                              count_wrong=True))
    sw_cpu = proc_cpu(cl.switch_pid) - sw0
    relay_cpu = proc_cpu(cl.relay_pid) - relay0 if cl.relay_pid else float("nan")
    drops = graph.tbf_drops() - drops0 if graph is not None else ""
    load = f"{load0[0]:.2f}-{os.getloadavg()[0]:.2f}"
    stats = summarize(p, recs, a.methods, sw_cpu, relay_cpu)
    times, sent, wrong, extras = {}, {}, {}, {}
    for m, s in stats.items():
        times[m] = s["times"]
        wrong[m] = sum(w[m]["wrong"] for w in recs)
        if graph is not None:
            sent[m], source = round(mean_over_workers(recs, m, "tx")), "link counters"
        else:
            sent[m], source = round(s["bytes"]), s["bytes_source"]
        extras[m] = dict(block_size=p.block_size, nlanes=p.nlanes, nslots=p.nslots,
                         bytes_source=source,
                         payload_bytes_per_link=_round(s.get("payload")),
                         packets_per_link=_round(s.get("packets")),
                         resends=s.get("resends", ""), spurious_resends=s.get("spurious", ""),
                         timeout_resends=s.get("timeout_resends", ""),
                         max_abs_err=s["max_err"], cpu_s_per_rank=round(s["cpu"], 6),
                         switch_cpu_s=_round(s.get("switch_cpu"), 4),
                         switch_pkts_per_cpu_s=_round(s.get("switch_pkt_rate")),
                         tbf_drops=drops)
    point = dict(size=4 * p.elements, elements=p.elements, dtype="float32", density=p.density,
                 workers=p.workers, lane_bits=bits, rate=rate)
    return method_rows("all_reduce", point, times, bus="all_reduce", sent=sent, wrong=wrong,
                       load=load, extras=extras)


def _round(x, nd: int = 0):
    if x is None or x == "" or x != x:
        return ""
    return round(x, nd) if nd else round(x)
