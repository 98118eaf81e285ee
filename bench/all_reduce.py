"""all_reduce: SpINA's all-reduce against gloo and the floor, paired, in the same processes.

    python -m bench all_reduce -b 64K -e 16M -f 4 -d 1,0.01 -g 4        # loopback
    python -m bench all_reduce -t bench/topologies/star4.yaml --rates 1gbit,10gbit   # root

Every rank is a process holding a SpINA Agent, a gloo group and a socket of the floor
(bench/paired.py); the software switch and the floor's relay run in processes of their own.
On loopback everything talks over 127.0.0.1; with -t the file's star (one aggregating switch,
a link per host) is built in namespaces (spina/netgraph.py `Graph`: tbf at both ends of every
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
import statistics

from bench.harness import method_rows
from bench.paired import (
    ALL_METHODS,
    SPINA_METHODS,
    Cluster,
    Request,
    gloo_bytes,
    mean_over_workers,
    proc_cpu,
    slowest,
    star_clusters,
)
from bench.procs import Point

DESCRIPTION = "SpINA's all-reduce vs gloo and the floor, paired (loopback or a topology)"
METHODS = ALL_METHODS
DEFAULTS = dict(methods="spina,floor,gloo_allreduce")
# A SpINA call's timeline (host_agent.agent.PHASES): milliseconds per phase, medians over every
# rank's timed calls; rounds per slot, the call's thread CPU and its sleep in select.
PHASE_COLUMNS = ("scan_ms", "plan_ms", "setup_ms", "data_ms", "tail_ms", "waited_ms",
                 "call_cpu_ms", "rounds_per_slot")
EXTRA_COLUMNS = ("block_size", "nlanes", "nslots", "bytes_source", "rx_bytes_per_link",
                 "payload_bytes_per_link",
                 "packets_per_link", "resends", "spurious_resends", "timeout_resends",
                 "max_abs_err", "cpu_s_per_rank", "switch_cpu_s", "switch_pkts_per_cpu_s",
                 "tbf_drops", "loss", "dropped", "resends_per_rank",
                 "timeout_resends_per_rank") + PHASE_COLUMNS
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


def check_options(a) -> str | None:
    from bench.net_topo import check_star
    if a.topo is None:
        return "argument --rates: needs -t/--topology (loopback has no links)" if a.rates \
            else None
    return check_star(a)


def run(a, log):
    """Rows per point: per (workers, lane bits) one cluster; per rate, density and size a
    point measured in it."""
    nlanes = nlanes_for(a.block_size, a.nlanes)
    clusters = star_clusters(
        a, GLOO_PORT, log, gloo=any(m.startswith("gloo") for m in a.methods),
        nslots=a.nslots, block_size=a.block_size, nlanes=nlanes,
        agent_kw={} if a.rto is None else {"rto": a.rto}, floor="floor" in a.methods,
        switch_datapath=a.switch_datapath, switch_threads=a.switch_threads)
    for cl, n, bits, graph, rate in clusters:
        for d in a.densities:
            for size in a.sizes:
                for loss in getattr(a, "losses", [None]):  # bench/loss.py's
                    p = Point(a.what, n, size // 4, d, a.block_size, nlanes, 256,
                              a.nslots, a.rto, loss)
                    yield measure(cl, p, a, bits, rate, graph)


def measure(cl: Cluster, p: Point, a, bits: int, rate: str, graph) -> list[dict]:
    """One point: its rows (harness columns and this module's)."""
    load0 = os.getloadavg()
    sw0 = proc_cpu(cl.switch_pid)
    relay0 = proc_cpu(cl.relay_pid) if cl.relay_pid else 0.0
    drops0 = graph.tbf_drops() if graph is not None else 0
    if p.loss is not None:
        graph.set_loss(p.loss)  # new rules: their counters start at 0
    recs = cl.measure(Request(p, a.repeats, tuple(a.methods), count_dev=graph is not None,
                              count_wrong=True))
    sw_cpu = proc_cpu(cl.switch_pid) - sw0
    relay_cpu = proc_cpu(cl.relay_pid) - relay0 if cl.relay_pid else float("nan")
    drops = graph.tbf_drops() - drops0 if graph is not None else ""
    dropped = graph.dropped() if p.loss is not None else ""
    load = f"{load0[0]:.2f}-{os.getloadavg()[0]:.2f}"
    stats = summarize(p, recs, a.methods, sw_cpu, relay_cpu)
    times, sent, wrong, extras = {}, {}, {}, {}
    for m, s in stats.items():
        times[m] = s["times"]
        wrong[m] = sum(w[m]["wrong"] for w in recs)
        received = ""  # on a topology: what the rank's link delivered (the link time's other way)
        if graph is not None:
            sent[m], source = round(mean_over_workers(recs, m, "tx")), "link counters"
            received = round(mean_over_workers(recs, m, "rx"))
        else:
            sent[m], source = round(s["bytes"]), s["bytes_source"]
        extras[m] = dict(block_size=p.block_size, nlanes=p.nlanes, nslots=p.nslots,
                         bytes_source=source, rx_bytes_per_link=received,
                         payload_bytes_per_link=round_or_blank(s.get("payload")),
                         packets_per_link=round_or_blank(s.get("packets")),
                         resends=s.get("resends", ""), spurious_resends=s.get("spurious", ""),
                         timeout_resends=s.get("timeout_resends", ""),
                         max_abs_err=s["max_err"], cpu_s_per_rank=round(s["cpu"], 6),
                         switch_cpu_s=round_or_blank(s.get("switch_cpu"), 4),
                         switch_pkts_per_cpu_s=round_or_blank(s.get("switch_pkt_rate")),
                         tbf_drops=drops, loss="" if p.loss is None else p.loss,
                         dropped=dropped,
                         resends_per_rank=round_or_blank(s.get("resends_per_rank"), 3),
                         timeout_resends_per_rank=round_or_blank(s.get("timeouts_per_rank"), 3))
        if m in SPINA_METHODS:
            extras[m].update(phase_medians(recs, m, p.nslots))
    point = dict(size=4 * p.elements, elements=p.elements, dtype="float32", density=p.density,
                 workers=p.workers, lane_bits=bits, rate=rate)
    return method_rows(a.what, point, times, bus="all_reduce", sent=sent, wrong=wrong,
                       load=load, extras=extras)


def phase_medians(recs: list[dict], method: str, nslots: int) -> dict:
    """PHASE_COLUMNS of `method`: each the median over every rank's timed calls."""
    def med(f):
        return round(statistics.median(f(ph, r) for w in recs
                                       for ph, r in zip(w[method]["phases"],
                                                        w[method]["rounds"])), 3)
    ms = lambda a, b=None: (lambda ph, r: 1e3 * (ph[a] - (ph[b] if b else 0.0)))  # noqa: E731
    return dict(scan_ms=med(ms("scan")), plan_ms=med(ms("plan", "scan")),
                setup_ms=med(ms("setup_done", "plan")), data_ms=med(ms("answers", "setup_done")),
                tail_ms=med(ms("end", "answers")), waited_ms=med(ms("waited")),
                call_cpu_ms=med(ms("cpu")), rounds_per_slot=med(lambda ph, r: r / nslots))


def round_or_blank(x, nd: int = 0):
    """x rounded (to nd digits), or "" when there is none (None, "" or NaN: nothing measured)."""
    if x is None or x == "" or x != x:
        return ""
    return round(x, nd) if nd else round(x)


def summarize(p: Point, recs: list[dict], methods, switch_cpu: float,
              relay_cpu: float = float("nan")) -> dict:
    """Per method: the repeat times (slowest worker), CPU, bytes, resends, checks; the
    floor's relay in the switch's columns."""
    out = {}
    nonzeros = max(w["nonzeros"] for w in recs)
    for m in methods:
        cpu = statistics.fmean(statistics.median(w[m]["cpu"]) for w in recs)
        d = dict(times=slowest(recs, m), cpu=cpu, verified=True, max_err=recs[0][m]["max_err"])
        if m == "floor":
            out[m] = d | floor_counts(recs, relay_cpu)
            continue
        if m not in SPINA_METHODS:
            d.update(bytes=gloo_bytes(m, p, nonzeros), bytes_source="model")
            out[m] = d
            continue
        mean = lambda k, m=m: mean_over_workers(recs, m, k)  # noqa: E731
        # Every call, warm-up included: what the switch served while its CPU was measured
        # (with both SpINA methods in a point, it served both: the rates are of the total).
        total = lambda k: sum(w[n]["warmup"][k] + sum(w[n][k])  # noqa: E731
                              for w in recs for n in methods if n in SPINA_METHODS)
        own = lambda k, m=m: sum(w[m]["warmup"][k] + sum(w[m][k]) for w in recs)  # noqa: E731
        timed_calls = p.workers * len(d["times"])
        resends = own("resends")
        d.update(bytes=mean("bytes_sent"), bytes_source="measured",
                 payload=mean("payload_bytes_sent"), packets=mean("packets_sent"),
                 nonzero_blocks=mean("nonzero_blocks"), resends=resends,
                 timeout_resends=own("timeout_resends"),
                 # Without loss every resend is spurious; with loss, those the agents found so.
                 spurious=resends if not p.loss else own("spurious_resends"),
                 resends_per_rank=sum(sum(w[m]["resends"]) for w in recs) / timed_calls,
                 timeouts_per_rank=sum(sum(w[m]["timeout_resends"])
                                       for w in recs) / timed_calls,
                 switch_packets=total("packets_sent"), switch_cpu=switch_cpu,
                 switch_pkt_rate=(total("packets_sent") / switch_cpu if switch_cpu
                                  else float("nan")),
                 switch_gbit=(8e-9 * total("payload_bytes_sent") / switch_cpu if switch_cpu
                              else float("nan")),
                 memory=[w.get("memory") for w in recs])
        out[m] = d
    return out


def floor_counts(recs: list[dict], relay_cpu: float) -> dict:
    """The floor's bytes and datagrams per worker and call (measured), and its relay's
    datagrams and payload (every call, warm-up included) per CPU-second of the relay."""
    packets, sent = (sum(w["floor"]["warmup"][k] + sum(w["floor"][k]) for w in recs)
                     for k in ("packets_sent", "bytes_sent"))
    mean = lambda k: mean_over_workers(recs, "floor", k)  # noqa: E731
    per_cpu = lambda x: x / relay_cpu if relay_cpu else float("nan")  # noqa: E731
    # payload: the datagrams less their 4-byte chunk index
    return dict(bytes=mean("bytes_sent"), bytes_source="measured",
                payload=mean("bytes_sent") - 4 * mean("packets_sent"),
                packets=mean("packets_sent"), switch_packets=packets, switch_cpu=relay_cpu,
                switch_pkt_rate=per_cpu(packets),
                switch_gbit=per_cpu(8e-9 * (sent - 4 * packets)))


def run_spina(p: Point, repeats: int, profile_dir: str | None = None,
              memory: bool = False) -> dict:
    """SpINA alone at one point on loopback, in a cluster of its own (bench/profile.py's
    runner): summarize's measurements plus "switch", the switch's own counters, and "wrong",
    the calls whose results failed their check; with
    profile_dir, the switch's and rank 0's cProfile there (switch.prof, agent0.prof)."""
    sw_prof = os.path.join(profile_dir, "switch.prof") if profile_dir else None
    ag_prof = os.path.join(profile_dir, "agent0.prof") if profile_dir else None
    with Cluster(p.workers, nslots=p.nslots, block_size=p.block_size, nlanes=p.nlanes,
                 agent_kw={} if p.rto is None else {"rto": p.rto},
                 switch_profile=sw_prof) as cl:
        sw0 = proc_cpu(cl.switch_pid)
        recs = cl.measure(Request(p, repeats, ("spina",), profile_path=ag_prof, memory=memory,
                                  count_wrong=True))
        m = summarize(p, recs, ("spina",), proc_cpu(cl.switch_pid) - sw0)["spina"]
    m["switch"], m["wrong"] = cl.switch_stats, sum(w["spina"]["wrong"] for w in recs)
    return m
