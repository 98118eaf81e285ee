"""plan: the collectives' planner against the clock: every all-reduce algorithm measured on a
topology file in namespaces with tbf-limited links, beside the cost model's prediction
(docs/collectives.md).

    python -m bench plan -t bench/topologies/two_groups.yaml -b 64K -e 4M -f 8    # root
    python -m bench plan -t bench/topologies/star4.yaml -m ring,direct,ina,gloo

First the model's host constants are measured on loopback (no tbf, no link limits, the
same number of processes; calibrate()): alpha per step from all-reduces of 4 elements, the
cpu per byte from all-reduces of 32 MiB; the predictions use them (the CSV also has the
prediction with the file defaults). SpINA ("ina") is priced with its own model's constants
(collectives/ina_model.py, fitted by collectives/ina_calibration.py: its one calibration),
not re-measured here. Then spina.netgraph.Graph builds the topology (a namespace per host
and switch, a veth per link with tbf both ways, the topology's own routes) and one process
per rank joins its host's namespace and a gloo group on its host's address. Per size every
algorithm (methods: the planner's candidates for the file, and gloo's own dist.all_reduce
for reference) runs once as a warm-up, then -n times, the order rotating repeat by repeat;
each call between two multiprocessing barriers with the links idle long enough before it to
refill their tbf buckets (the planner starts from full buckets; the idle time is part of the
measurement design, not a synchronisation), only the collective timed; a repeat's time is
the slowest rank's. Every call is checked (each rank's result within float32 rounding of
numpy's float64 sum, its crc32 the same on every rank): `wrong` counts those that were not.
Where the topology is a star around one aggregating switch with one rate, SpINA ("ina") is
measured as well, by the all_reduce WHAT's cluster on the same file (software switch in UDP
mode, dense float32, 20 ms tbf queues, which SpINA's window needs, links not left idle).
Besides the harness's columns: the topology, the algorithm's steps, its predicted time (and
with the file's default constants), the bottleneck, the error, and per size the planner's
pick, the best measured and the pick's time over the best; predicted_vs_measured.png.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
import zlib
from datetime import timedelta

import numpy as np

from bench.harness import method_rows
from bench.net_topo import star_of
from bench.paired import guarded, recv, slowest, stop_all
from collectives import plan as planner
from collectives.schedule import ALGORITHMS, schedule
from spina import topology
from spina.net import free_port
from spina.netgraph import Graph

GLOO = "gloo"  # dist.all_reduce, measured for reference (not a planner candidate)
GLOO_PORT = 29500
CAL_BYTES = 32 << 20  # loopback calibration of the cpu term: large, so bytes dominate

DESCRIPTION = "the collectives' planner: every all-reduce algorithm measured vs predicted (root)"
METHODS = tuple(ALGORITHMS) + (planner.INA, GLOO)
DEFAULTS = dict(methods=",".join(METHODS), densities="1", begin="64K", end="4M", factor=8.0,
                topology="bench/topologies/two_groups.yaml")
EXTRA_COLUMNS = ("topology", "steps", "predicted_us", "predicted_default_us", "bottleneck",
                 "error", "planner_pick", "best_measured", "pick_over_best", "alpha_s",
                 "cpu_s_per_byte", "ina_call_s")


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--calibration-repeats", type=cli.int_range(1, 1000), default=20,
                    help="repeats of the loopback calibration (default %(default)s)")


def check_options(a) -> str | None:
    from spina.netns import why_no_namespaces
    if a.topo is None:
        return "argument -t/--topology: the planner is checked on a topology file"
    if a.densities != [1.0]:
        return "argument -d/--densities: the collectives are dense (give -d 1)"
    if a.rates:
        return "argument --rates: the planner prices the file's own rates"
    if a.workers != [a.topo.world]:
        return (f"argument -g/--workers: {a.topology} has {a.topo.world} ranks (give -g "
                f"{a.topo.world})")
    if max(a.topo.devices) != 1:
        return f"argument -t/--topology: {a.topology}: namespaces stand for hosts of one device"
    allowed = set(planner.algorithms(a.topo, "all_reduce")) | {GLOO}
    if planner.INA in allowed and _not_a_star(a.topo):
        allowed.discard(planner.INA)
    given = a.methods
    a.methods = [m for m in given if m in allowed]
    if not a.methods:
        return f"argument -m/--methods: none of {','.join(given)} runs on {a.topology}"
    why = why_no_namespaces()
    return f"argument -t/--topology: {why}" if why else None


def _not_a_star(topo) -> str | None:
    """Why ina cannot be measured on `topo` (a star around one aggregating switch, one
    rate), or None."""
    star = star_of(topo)
    if isinstance(star, str):
        return star
    return "the star's links need one rate" if len({ln.rate_text for ln in topo.links}) != 1 \
        else None


def run(a, log):
    cal = calibrate(a.topo.world, a.calibration_repeats, log)
    params = planner.with_params(planner.CostParams(), **cal)
    yield from measure_topology(a, params, log)


def finish(rows, a) -> list[str]:
    """predicted_vs_measured.png beside the harness's outputs."""
    if a.no_plots or not rows:
        return []
    path = os.path.join(a.out, "predicted_vs_measured.png")
    plot(rows, path)
    return [path]


def load1() -> float:
    return os.getloadavg()[0]


# ----------------------------------------------------------------------------- rank side
def rank_main(rank, world, ns, ifname, store, job, conn, barrier) -> None:
    """One rank: join namespace `ns` and a gloo group on interface `ifname` (rendezvous at
    rank 0's (address, port) `store`), measure `job`, report."""
    conn.send(guarded(rank, conn, barrier, _rank, rank, world, ns, ifname, store, job,
                      barrier))


def _rank(rank, world, ns, ifname, store, job, barrier):
    from spina.netns import enter
    enter(ns)
    import torch
    import torch.distributed as dist

    import collectives
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    kv = dist.TCPStore(*store, world, rank == 0, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=kv, rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    out = {}
    methods = list(job["algorithms"]) + [GLOO]
    for nbytes in job["sizes"]:
        n = nbytes // 4
        x = _data(rank, n)
        buf = torch.empty(n, dtype=torch.float32)

        def call(method):
            buf.copy_(torch.from_numpy(x))
            barrier.wait()  # everyone done with the last call: the links fall idle
            time.sleep(job["idle_s"])
            barrier.wait()
            t0 = time.perf_counter()
            if method == GLOO:
                dist.all_reduce(buf)
            else:
                collectives.all_reduce(buf, method, None, job["groups"])
            dt = time.perf_counter() - t0
            barrier.wait()
            return dt

        want = sum(_data(r, n).astype(np.float64) for r in range(world))

        def check(m):
            err = np.abs(buf.numpy() - want).max() / max(1.0, np.abs(want).max())
            out[(nbytes, m, "wrong")] = out.get((nbytes, m, "wrong"), 0) + (not err < 1e-5)
            out.setdefault((nbytes, m, "crc"), []).append(zlib.crc32(buf.numpy().tobytes()))

        for m in methods:  # warm-up, checked
            call(m)
            check(m)
        for k in range(job["repeats"]):
            for m in methods[k % len(methods):] + methods[:k % len(methods)]:
                out.setdefault((nbytes, m), []).append(call(m))
                check(m)
    dist.destroy_process_group()
    return out


def _data(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng([rank, n]).standard_normal(n).astype(np.float32)


def run_ranks(places, job: dict) -> list[dict]:
    """Fork one process per rank (torch imported once, here), each into its place
    (namespace, host address, interface); every rank's results, rank order."""
    import torch  # noqa: F401  (before the fork: once for all ranks)
    ctx = mp.get_context("fork")
    world = len(places)
    store = (places[0][1], GLOO_PORT if places[0][0] else free_port())
    barrier = ctx.Barrier(world)
    procs, conns = [], []
    try:
        for r, (ns, _, ifname) in enumerate(places):
            parent, child = ctx.Pipe()
            procs.append(ctx.Process(target=rank_main, name=f"coll-rank{r}",
                                     args=(r, world, ns, ifname, store, job, child, barrier)))
            procs[-1].start()
            conns.append(parent)
        recs = [recv(c, f"rank {r}") for r, c in enumerate(conns)]
    finally:
        stop_all(procs)
    for m in list(job["algorithms"]) + [GLOO]:
        for nbytes in job["sizes"]:
            if m == GLOO:
                continue
            for w in recs[1:]:  # every call whose result differs from rank 0's
                w[(nbytes, m, "wrong")] += sum(a != b for a, b in zip(
                    w[(nbytes, m, "crc")], recs[0][(nbytes, m, "crc")]))
    return recs


def wrong(recs, nbytes, method) -> int:
    return sum(w[(nbytes, method, "wrong")] for w in recs)


def times(recs, nbytes, method) -> list[float]:
    return slowest([{method: {"times": w[(nbytes, method)]}} for w in recs], method)


# ----------------------------------------------------------------------------- the run
def calibrate(world: int, repeats: int, log=print) -> dict:
    """alpha and cpu_per_byte on loopback, where no link limits: per algorithm the median
    all-reduce time of 4 elements over its steps (alpha), and the median time of CAL_BYTES
    less that of 4 elements over the bytes the busiest rank sends plus receives in all steps
    (cpu); the median of each over the 1-D algorithms. SpINA's constants are its model's
    (collectives.ina_model.Assumptions), not measured here."""
    algs = ("ring", "halving-doubling", "direct")
    recs = run_ranks([(None, "127.0.0.1", "lo")] * world,
                     dict(algorithms=algs, sizes=[16, CAL_BYTES], repeats=repeats,
                          groups=None, idle_s=0))
    alphas, cpus = [], []
    zero = planner.with_params(planner.CostParams(), alpha=0.0, cpu_per_byte=1.0)
    for a in algs:
        small = statistics.median(times(recs, 16, a))
        alphas.append(small / len(schedule("all_reduce", a, world).steps))
        # alpha 0 and 1 s per byte on links that never limit: the model counts the bytes
        moved = planner.predict(_ideal(world), "all_reduce", CAL_BYTES, a, zero).seconds
        cpus.append(max(0.0, statistics.median(times(recs, CAL_BYTES, a)) - small) / moved)
        log(f"calibration: {a}: {alphas[-1] * 1e3:.3f} ms per step, "
            f"{cpus[-1] * 1e9:.3f} ns per byte moved")
    alpha = statistics.median(alphas)
    return dict(alpha=alpha, cpu_per_byte=statistics.median(cpus))


def _ideal(world: int):
    """A topology whose links never limit: every rank on one switch at 1 Pbit/s."""
    return topology.from_dict(dict(
        hosts=[f"h{r}" for r in range(world)], switches=["s"],
        links=[dict(ends=[f"h{r}", "s"], rate="1000tbit", latency="0s")
               for r in range(world)]), "ideal")


def idle_seconds(topo) -> float:
    """Idle time before each call that refills every link's token bucket (the planner
    assumes full buckets at the start), with half again as margin."""
    return 1.5 * max(ln.burst * 8 / ln.rate for ln in topo.links) + 0.005


def measure_topology(a, params, log) -> list[dict]:
    """Every algorithm of a.methods on a.topo (and ina on its star): harness rows."""
    topo = a.topo
    algs = [m for m in a.methods if m not in (GLOO, planner.INA)]
    load_start = load1()
    with Graph(topo, a.tag) as g:
        places = [(g.ns(h), g.host_ip(h), g.host_if(h)) for h in topo.ranks]
        recs = run_ranks(places, dict(algorithms=algs, sizes=list(a.sizes), repeats=a.repeats,
                                      groups=[list(x) for x in topo.groups] if topo.groups
                                      else None, idle_s=idle_seconds(topo)))
    ina = (measure_ina(topo, a.sizes, a.repeats, f"{a.tag}i", log)
           if planner.INA in a.methods else {})
    load = f"{load_start:.2f}-{load1():.2f}"
    name = os.path.splitext(os.path.basename(a.topology))[0]
    rate = next(iter({ln.rate_text for ln in topo.links})) if len(
        {ln.rate_text for ln in topo.links}) == 1 else "file"
    rows = []
    for nbytes in a.sizes:
        times_, wrong_, extras = {}, {}, {}
        for m in algs + [GLOO] + ([planner.INA] if ina else []):
            if m not in a.methods:
                continue
            ts, bad = ina[nbytes] if m == planner.INA else (times(recs, nbytes, m),
                                                            wrong(recs, nbytes, m))
            times_[m], wrong_[m] = ts, bad
            e = dict(topology=name, steps="", predicted_us="", predicted_default_us="",
                     bottleneck="", error="")
            if m != GLOO:
                p = planner.predict(topo, "all_reduce", nbytes, m, params)
                e.update(steps=len(p.steps), predicted_us=round(p.seconds * 1e6, 1),
                         predicted_default_us=round(planner.predict(
                             topo, "all_reduce", nbytes, m).seconds * 1e6, 1),
                         bottleneck=p.bottleneck,
                         error=round((statistics.median(ts) - p.seconds) / p.seconds, 4))
            e.update({k: params_dict(params)[k] for k in ("alpha_s", "cpu_s_per_byte",
                                                         "ina_call_s")})
            extras[m] = e
        _picks(times_, extras)
        point = dict(size=nbytes, elements=nbytes // 4, dtype="float32", density=1.0,
                     workers=topo.world, lane_bits=32, rate=rate)
        rows.append(method_rows(a.what, point, times_, bus="all_reduce", wrong=wrong_,
                                load=load, extras=extras))
        for r in rows[-1]:
            log(f"{name} {nbytes} B {r['method']}: measured {r['time_us'] / 1e3:.1f} ms"
                + (f", predicted {r['predicted_us'] / 1e3:.1f} ms" if r["predicted_us"] else ""))
    return rows


def params_dict(params) -> dict:
    return dict(alpha_s=params.alpha, cpu_s_per_byte=params.cpu_per_byte,
                ina_call_s=params.ina_call_s)


def _picks(times_: dict, extras: dict) -> None:
    """Mark the planner's pick (least predicted) and the best measured among the candidates
    (not gloo), and the pick's median time over the best's."""
    cand = [m for m in times_ if m != GLOO]
    if not cand:
        return
    pick = min(cand, key=lambda m: extras[m]["predicted_us"])
    best = min(cand, key=lambda m: statistics.median(times_[m]))
    over = statistics.median(times_[pick]) / statistics.median(times_[best]) - 1
    for m in times_:
        extras[m].update(planner_pick="yes" if m == pick else "",
                         best_measured="yes" if m == best else "",
                         pick_over_best=round(over, 4) if m == pick else "")


def measure_ina(topo, sizes, repeats: int, tag: str, log) -> dict:
    """SpINA's all-reduce through the software switch on the star `topo` in namespaces of its
    own (20 ms tbf queues: SpINA's window): per size (the slowest rank's time per repeat,
    wrong calls), dense float32."""
    from bench.paired import Cluster, Request, star_places
    from bench.procs import Point
    from spina.netgraph import tbf_params
    link = topo.links[0]
    tbf = tbf_params(link.rate_text, topo.mtu)
    queue = link.rate / 8 * tbf["latency_ms"] / 1e3 + tbf["burst"]
    datagram = planner.udp_wire_bytes(planner.CostParams().ina_elements * 4
                                      + planner.CostParams().ina_overhead, topo.mtu)
    # a window of slots that fits the rank's tbf queue: a larger one loses its tail there
    # (16 slots at 200 Mbit/s: 8 MiB took 31 s instead of 0.3 s, recovering)
    nslots = max(1, min(16, int(queue // datagram)))
    log(f"ina: {nslots} slots (tbf queue {queue / 1e3:.0f} KB)")
    out = {}
    with Graph(topo, tag, queue_ms=tbf["latency_ms"]) as g:
        places, _ = star_places(g, 0)
        with Cluster(topo.world, nslots=nslots, block_size=256, nlanes=56, **places) as cl:
            for nbytes in sizes:
                p = Point("ina", topo.world, nbytes // 4, 1.0, 256, 56, 256, nslots)
                recs = cl.measure(Request(p, repeats, ("spina",), count_wrong=True))
                out[nbytes] = (slowest(recs, "spina"), sum(w["spina"]["wrong"] for w in recs))
    return out


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["method"] != GLOO]
    topos = sorted({r["topology"] for r in rows})
    fig, ax = plt.subplots(figsize=(6.5, 5.2))
    marks = dict(zip(ALGORITHMS + (planner.INA,), "os^Dv*"))
    for i, t in enumerate(topos):
        for a in marks:
            pts = [r for r in rows if r["topology"] == t and r["method"] == a]
            if not pts:
                continue
            x = [r["predicted_us"] / 1e6 for r in pts]
            y = [r["time_us"] / 1e6 for r in pts]
            lo = [m - r["time_min_us"] / 1e6 for m, r in zip(y, pts)]
            hi = [r["time_max_us"] / 1e6 - m for m, r in zip(y, pts)]
            ax.errorbar(x, y, yerr=[lo, hi], marker=marks[a], color=f"C{i}", ls="none",
                        capsize=2, label=f"{t}: {a}")
    lim = [min(r["predicted_us"] for r in rows) / 2e6, max(r["time_max_us"] for r in rows) * 2e-6]
    ax.plot(lim, lim, color="k", lw=1)
    for f in (0.8, 1.2):
        ax.plot(lim, [v * f for v in lim], color="k", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted all-reduce time (s)")
    ax.set_ylabel("measured (s): median, bars min-max")
    ax.set_title("collectives: measured vs predicted (dashed: +-20%)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
