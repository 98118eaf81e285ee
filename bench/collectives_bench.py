"""The planner against the clock: every collective algorithm measured on namespace topologies
with tbf-limited links, beside the cost model's prediction (docs/collectives.md).

Run from the repository root as root:

    python -m bench.collectives_bench                      # the three topologies of the doc
    python -m bench.collectives_bench --topologies bench/topologies/torus2x2.yaml \\
        --sizes 64KiB,4MiB --repeats 5 --out /tmp/c
    python -m bench.collectives_bench --topologies bench/topologies/package4.yaml \\
        --sizes 16KiB --repeats 1 --out /tmp/c             # a smoke run (tests/)

First the model's host constants are measured on loopback (no tbf, no link limits, the
same number of processes; calibrate()): alpha per step from all-reduces of 4 elements, the
cpu per byte from all-reduces of 4 MiB, and, when SpINA is measured, its fixed cost per call
through the software switch; the predictions use them (the CSV also has the prediction
with the file defaults). Then for each
topology bench.net_topo.Graph builds it (a namespace per host and switch, a veth per link
with tbf both ways, the topology's own routes) and one process per rank joins its host's
namespace and a gloo group on its host's address. Per size every algorithm (and gloo's own
dist.all_reduce, for reference) runs once as a warm-up, checked (each rank's result within
float32 rounding of numpy's float64 sum, crc32 the same on every rank), then --repeats
times, the order rotating repeat by repeat; each call between two multiprocessing barriers
(no traffic on the links) with the links idle long enough before it to refill their tbf
buckets (the planner starts from full buckets), only the collective timed; a repeat's time
is the slowest rank's. Where a topology is a star around one aggregating switch, SpINA
("ina") is measured as well, by bench.net_bench on its own star of the same shape, rate and
MTU (software switch in UDP mode, dense float32; its links keep net_bench's 20 ms queues,
which SpINA's window needs, and are not left idle between calls).
Outputs in --out: collectives.csv, summary.md (measured vs predicted, the planner's pick
against the best measured), collectives.png.
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import platform
import statistics
import sys
import textwrap
import time
import zlib
from datetime import timedelta

import numpy as np

from bench.net_topo import Graph
from bench.paired import BenchError, guarded, recv, slowest, stop_all
from collectives import plan as planner, topology
from collectives.schedule import ALGORITHMS, schedule
from spina.net import free_port
from spina.netns import why_no_namespaces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGIES = tuple(os.path.join("bench", "topologies", f"{n}.yaml")
                   for n in ("package4", "two_groups", "torus2x2", "star4"))
GLOO = "gloo"  # dist.all_reduce, measured for reference (not a planner candidate)
GLOO_PORT = 29500
CAL_BYTES = 32 << 20  # loopback calibration of the cpu term: large, so bytes dominate
PICK_WITHIN = 0.10  # the pick counts as good within 10% of the best measured
COLUMNS = ("topology", "collective", "bytes", "algorithm", "steps", "predicted_s",
           "predicted_default_s", "bottleneck", "measured_median_s", "measured_min_s",
           "measured_max_s", "error", "times_s", "load_start", "load_end")


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

        for m in methods:  # warm-up, checked
            call(m)
            want = sum(_data(r, n).astype(np.float64) for r in range(world))
            err = np.abs(buf.numpy() - want).max() / max(1.0, np.abs(want).max())
            if not err < 1e-5:
                raise BenchError(f"{m} at {nbytes} B: relative error {err:.3g}")
            out[(nbytes, m, "crc")] = zlib.crc32(buf.numpy().tobytes())
        for k in range(job["repeats"]):
            for m in methods[k % len(methods):] + methods[:k % len(methods)]:
                out.setdefault((nbytes, m), []).append(call(m))
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
            crcs = {w[(nbytes, m, "crc")] for w in recs}
            if len(crcs) != 1 and m != GLOO:
                raise BenchError(f"{m} at {nbytes} B: ranks disagree (crc32 {sorted(crcs)})")
    return recs


def times(recs, nbytes, method) -> list[float]:
    return slowest([{method: {"times": w[(nbytes, method)]}} for w in recs], method)


# ----------------------------------------------------------------------------- the run
def calibrate(world: int, repeats: int, ina: bool = False, log=print) -> dict:
    """alpha and cpu_per_byte on loopback, where no link limits: per algorithm the median
    all-reduce time of 4 elements over its steps (alpha), and the median time of CAL_BYTES
    less that of 4 elements over the bytes the busiest rank sends plus receives in all steps
    (cpu); the median of each over the 1-D algorithms. ina: also SpINA's fixed cost per call,
    the median time of all-reducing 4 elements through the software switch on loopback
    (ina_call_s)."""
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
    out = dict(alpha=alpha, cpu_per_byte=statistics.median(cpus))
    if ina:
        from bench.paired import Cluster, Request
        from bench.procs import Point
        with Cluster(world, nslots=16, block_size=256, nlanes=56) as cl:
            res = cl.measure(Request(Point("cal", world, 4, 1.0, 256, 56, 256), repeats,
                                     ("spina",)))
        out["ina_call_s"] = statistics.median(slowest(res, "spina"))
        log(f"calibration: ina {out['ina_call_s'] * 1e3:.3f} ms per call")
    return out


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


def measure_topology(path: str, sizes, repeats: int, tag: str, params, log=print):
    topo = topology.load(path)
    name = os.path.splitext(os.path.basename(path))[0]
    algs = [a for a in planner.algorithms(topo, "all_reduce") if a != planner.INA]
    rows = []
    load_start = load1()
    with Graph(topo, tag) as g:
        places = [(g.ns(h), g.host_ip(h), g.host_if(h)) for h in topo.ranks]
        recs = run_ranks(places, dict(algorithms=algs, sizes=list(sizes), repeats=repeats,
                                      groups=[list(x) for x in topo.groups] if topo.groups
                                      else None, idle_s=idle_seconds(topo)))
    ina = {}
    if planner.INA in planner.algorithms(topo, "all_reduce"):
        why = _not_a_star(topo)
        if why:
            log(f"{name}: ina not measured: {why}")
        else:
            ina = measure_ina(topo, sizes, repeats, f"{tag}i", log)
    load_end = load1()
    for nbytes in sizes:
        for a in algs + [GLOO] + ([planner.INA] if ina else []):
            ts = ina[nbytes] if a == planner.INA else times(recs, nbytes, a)
            med = statistics.median(ts)
            pred = pred0 = None
            steps, neck = "", ""
            if a != GLOO:
                p = planner.predict(topo, "all_reduce", nbytes, a, params)
                pred = p.seconds
                pred0 = planner.predict(topo, "all_reduce", nbytes, a).seconds
                steps, neck = len(p.steps), p.bottleneck
            rows.append(dict(topology=name, collective="all_reduce", bytes=nbytes, algorithm=a,
                             steps=steps, predicted_s=pred, predicted_default_s=pred0,
                             bottleneck=neck, measured_median_s=med, measured_min_s=min(ts),
                             measured_max_s=max(ts),
                             error=(med - pred) / pred if pred else None,
                             times_s=" ".join(f"{t:.5f}" for t in ts),
                             load_start=round(load_start, 2), load_end=round(load_end, 2)))
            log(f"{name} {nbytes} B {a}: measured {med * 1e3:.1f} ms" +
                (f", predicted {pred * 1e3:.1f} ms" if pred else ""))
    return rows


def _not_a_star(topo) -> str | None:
    """Why bench.net_bench's star (every host on one link to one aggregating switch, one
    rate) cannot stand for `topo`, or None."""
    if len(topo.switches) != 1 or topo.aggregating != topo.switches:
        return "SpINA is measured on a star around one aggregating switch only"
    sw = topo.switches[0]
    if sorted(tuple(sorted((ln.a, ln.b))) for ln in topo.links) != sorted(
            tuple(sorted((h, sw))) for h in topo.hosts):
        return "SpINA is measured on a star around one aggregating switch only"
    if len({ln.rate_text for ln in topo.links}) != 1:
        return "the star's links need one rate"
    return None


def measure_ina(topo, sizes, repeats: int, tag: str, log=print) -> dict:
    """SpINA's all-reduce through the software switch on bench.net_bench's star (the same
    shape, rate and MTU; its own tbf queue of 20 ms: SpINA's window): per size, the slowest
    worker's time per repeat (dense float32, paired with gloo there)."""
    from bench.net_bench import run_workers
    from bench.net_topo import tbf_params
    link = topo.links[0]
    tbf = tbf_params(link.rate_text, topo.mtu)
    queue = link.rate / 8 * tbf["latency_ms"] / 1e3 + tbf["burst"]
    datagram = planner.udp_wire_bytes(planner.CostParams().ina_elements * 4
                                      + planner.CostParams().ina_overhead, topo.mtu)
    # a window of slots that fits the worker's tbf queue: a larger one loses its tail there
    # (16 slots at 200 Mbit/s: 8 MiB took 31 s instead of 0.3 s, recovering)
    nslots = max(1, min(16, int(queue // datagram)))
    log(f"ina: {nslots} slots (tbf queue {queue / 1e3:.0f} KB)")
    out = {}
    for nbytes in sizes:
        rows = run_workers(topo.world, [link.rate_text], [1.0], nbytes // 4, repeats,
                           f"{tag}{nbytes}", topo.mtu, nslots=nslots, nlanes=56,
                           log=lambda *a, **k: None)
        out[nbytes] = [float(t) for t in rows[0]["spina_times_s"].split()]
        log(f"ina {nbytes} B: {statistics.median(out[nbytes]) * 1e3:.1f} ms")
    return out


def picks(rows) -> list[dict]:
    """Per (topology, size): the planner's pick (least predicted), the best measured, and
    whether the pick's measured time is within PICK_WITHIN of the best."""
    out = []
    keys = sorted({(r["topology"], int(r["bytes"])) for r in rows}, key=lambda k: (k[0], k[1]))
    for topo, nbytes in keys:
        cand = [r for r in rows if r["topology"] == topo and int(r["bytes"]) == nbytes
                and r["algorithm"] != GLOO]
        pick = min(cand, key=lambda r: float(r["predicted_s"]))
        best = min(cand, key=lambda r: float(r["measured_median_s"]))
        slow = float(pick["measured_median_s"]) / float(best["measured_median_s"]) - 1
        out.append(dict(topology=topo, bytes=nbytes, pick=pick["algorithm"],
                        best=best["algorithm"], pick_over_best=slow,
                        ok=slow <= PICK_WITHIN))
    return out


def _ms(x) -> str:
    return "" if x in (None, "") else f"{float(x) * 1e3:.1f}"


def summary(rows, meta: dict) -> str:
    d = planner.CostParams()
    ina = f", SpINA {meta['ina_call_s'] * 1e3:.3f} ms per call" if "ina_call_s" in meta else ""
    head = (f"Run {meta['date']} on {meta['host']}, command `{meta['command']}`; measured "
            f"on loopback: alpha {meta['alpha'] * 1e3:.3f} ms per step, cpu "
            f"{meta['cpu_per_byte'] * 1e9:.3f} ns per byte{ina} (defaults "
            f"{d.alpha * 1e3:.3f} ms, {d.cpu_per_byte * 1e9:.3f} ns, {d.ina_call_s * 1e3:.3f} "
            f"ms); load {meta['load_start']:.2f} at the start, {meta['load_end']:.2f} at the "
            "end.")
    lines = textwrap.wrap(head, 92, break_on_hyphens=False) + [
        "", "| topology | size | algorithm | steps | predicted ms | measured ms [min-max] | "
        "error | bottleneck | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = "" if r["error"] in (None, "") else f"{float(r['error']) * 100:+.0f}%"
        lines.append(f"| {r['topology']} | {_size(int(r['bytes']))} | {r['algorithm']} | "
                     f"{r['steps']} | {_ms(r['predicted_s'])} | "
                     f"{_ms(r['measured_median_s'])} [{_ms(r['measured_min_s'])}-"
                     f"{_ms(r['measured_max_s'])}] | {err} | {r['bottleneck']} | "
                     f"{r['load_start']}-{r['load_end']} |")
    lines += ["", "| topology | size | planner's pick | best measured | pick's time over the "
              "best | within 10% |", "|---|---|---|---|---|---|"]
    for p in picks(rows):
        lines.append(f"| {p['topology']} | {_size(p['bytes'])} | {p['pick']} | {p['best']} | "
                     f"{p['pick_over_best'] * 100:+.1f}% | {'yes' if p['ok'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _size(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["algorithm"] != GLOO]
    topos = sorted({r["topology"] for r in rows})
    fig, ax = plt.subplots(figsize=(6.5, 5.2))
    marks = dict(zip(ALGORITHMS + (planner.INA,), "os^Dv*"))
    for i, t in enumerate(topos):
        for a in marks:
            pts = [r for r in rows if r["topology"] == t and r["algorithm"] == a]
            if not pts:
                continue
            x = [float(r["predicted_s"]) for r in pts]
            y = [float(r["measured_median_s"]) for r in pts]
            lo = [m - float(r["measured_min_s"]) for m, r in zip(y, pts)]
            hi = [float(r["measured_max_s"]) - m for m, r in zip(y, pts)]
            ax.errorbar(x, y, yerr=[lo, hi], marker=marks[a], color=f"C{i}", ls="none",
                        capsize=2, label=f"{t}: {a}")
    lim = [min(float(r["predicted_s"]) for r in rows) / 2,
           max(float(r["measured_max_s"]) for r in rows) * 2]
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


def write_csv(rows, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in COLUMNS})


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.collectives_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES),
                    help="comma-separated topology files (default: %(default)s)")
    ap.add_argument("--sizes", default="64KiB,1MiB,8MiB",
                    help="all-reduce sizes in bytes of float32 (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calibration-repeats", type=int, default=20)
    ap.add_argument("--tag", default=f"cb{os.getpid() % 100000}",
                    help="namespace name prefix (unique per run)")
    ap.add_argument("--out", default=os.path.join("bench", "out", "collectives"))
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    try:
        a.sizes = [topology.parse_size(s) for s in a.sizes.split(",")]
    except ValueError as e:
        ap.error(f"argument --sizes: {e}")
    for s in a.sizes:
        if s < 4 or s % 4:
            ap.error(f"argument --sizes: {s} B is not a whole number of float32")
    a.topologies = a.topologies.split(",")
    if a.repeats < 1:
        ap.error("argument --repeats: must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    why = why_no_namespaces()
    if why:
        print(f"collectives_bench: error: {why}", file=sys.stderr)
        return 2
    try:
        topos = [topology.load(p) for p in a.topologies]
    except topology.TopologyError as e:
        print(f"collectives_bench: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                host=f"{platform.node()} ({os.cpu_count()} cores)",
                command="python -m bench.collectives_bench " + " ".join(
                    sys.argv[1:] if argv is None else argv), load_start=load1())
    worlds = {t.world for t in topos}
    if len(worlds) != 1:
        print("collectives_bench: error: --topologies: every topology needs the same number "
              "of ranks (one calibration)", file=sys.stderr)
        return 2
    ina = any(planner.INA in planner.algorithms(t, "all_reduce") and not _not_a_star(t)
              for t in topos)
    meta.update(calibrate(worlds.pop(), a.calibration_repeats, ina))
    params = planner.with_params(planner.CostParams(), **{k: meta[k] for k in (
        "alpha", "cpu_per_byte", "ina_call_s") if k in meta})
    rows = []
    for i, path in enumerate(a.topologies):
        rows += measure_topology(path, a.sizes, a.repeats, f"{a.tag}{i}", params)
    meta["load_end"] = load1()
    write_csv(rows, os.path.join(a.out, "collectives.csv"))
    text = summary(rows, meta)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    if not a.no_plots:
        plot(rows, os.path.join(a.out, "collectives.png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
