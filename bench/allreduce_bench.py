"""SpINA all-reduce against what CPU PyTorch users run today, in the same processes.

Run from the repository root (the Makefile's `make bench` does):

    python -m bench.allreduce_bench                      # the full sweep (8 min here)
    python -m bench.allreduce_bench --quick              # density sweep only (2 min)
    python -m bench.allreduce_bench --sweeps density --repeats 3
    python -m bench.allreduce_bench --sweeps base --base-workers 2 --base-elements 65536 \\
        --repeats 1 --out /tmp/b                         # a smoke run (tests/test_bench_smoke.py)

One factor at a time is varied around a base point (4 workers, 25M float32 elements, 1% of
the blocks non-zero, block 256, 56 blocks per packet): density, size (at 1%), fixed_nnz (size
with the base point's number of non-zero blocks: does time follow the non-zero bytes or the
length?), workers, block_size, nlanes. The methods:

  spina           SpINA all-reduce in place through the software switch
                  (softswitch.udp.UdpSwitch in a process of its own, all on 127.0.0.1);
  spina_blocks    the same, the caller passing its non-zero blocks (Agent.allreduce(blocks=),
                  computed before the timer: what a DDP hook that knows them does);
  floor           the machine's floor for a dense call (bench/floor.py): the simplest
                  compiled star all-reduce of the whole tensor through one relay process,
                  same datagrams and window as SpINA, no protocol;
  gloo_allreduce  torch.distributed gloo all_reduce of the dense tensor, in place;
  gloo_allgather  gloo all_gather of (int32 index, float32 value) of the non-zero elements,
                  then a local index_add_ (the sparse all-reduce users write by hand).

Fair by construction (bench/paired.py): every worker process holds a SpINA Agent and a gloo
process group at once; per repeat every method runs once on the same buffer, the order
rotating repeat by repeat, each call between barriers with only the collective timed (the
buffer is refilled outside the timer). A repeat's time is the slowest worker's; ratios are
taken per repeat (paired) and reported as median [min-max]. Every result is checked against
numpy (SpINA: rank 0 within the documented quantization bound, every rank bit-identical; gloo:
rank 0 within float32 rounding); a wrong result stops the run. The 1-minute load average is
recorded at the start and end of every point, SpINA's resends (all spurious on loopback) per
point. The scaling target's two points (fixed_nnz at the base length and the longest) are
measured once more alternating repeat by repeat (sweep fixed_nnz_paired), so that their ratio
is paired too. Outputs in --out: results.csv, meta.json, summary.md and PNG plots (bench/report.py,
which regenerates summary and plots from the CSV alone).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, replace

from bench.paired import (
    ALL_METHODS,
    GLOO_METHODS,
    METHODS,
    SPINA_METHODS,
    Cluster,
    Gloo,
    Place,
    Request,
    gloo_bytes,
    mean_over_workers,
    proc_cpu,
    slowest,
)
from bench.procs import Point
from softswitch.udp import MAX_DATAPATH_THREADS
from spina import cli, wire

SWEEPS = ("density", "size", "fixed_nnz", "workers", "block_size", "nlanes", "loss")
SLOT_CAPACITY = 64 * 256  # softswitch.pipeline.DEFAULT_SLOT_CAPACITY: nlanes*block_size bound
QUICK = dict(sweeps="density", methods="spina,floor,gloo_allreduce")  # --quick

COLUMNS = ("sweep", "workers", "elements", "density", "block_size", "nlanes", "data_block",
           "nslots", "method", "repeats", "median_s", "min_s", "max_s", "times_s",
           "cpu_s_per_worker", "bytes_per_worker", "bytes_source", "payload_bytes_per_worker",
           "packets_per_worker", "nonzero_blocks_per_worker", "resends", "spurious_resends",
           "timeout_resends", "verified", "max_abs_err",
           "switch_packets_in", "switch_cpu_s", "switch_pkts_per_cpu_s",
           "switch_payload_gbit_per_cpu_s", "loss", "dropped", "resends_per_rank",
           "timeout_resends_per_rank", "load_start", "load_end")


# ----------------------------------------------------------------------------- the sweep
def nlanes_for(block_size: int, wanted: int | None = None) -> int:
    """Blocks per packet: `wanted`, else as many as fit a datagram and a switch slot."""
    most = min(wire.max_lanes_for(block_size), SLOT_CAPACITY // block_size)
    return most if wanted is None else min(wanted, most)


def base_point(a) -> Point:
    return Point("base", a.base_workers, a.base_elements, a.base_density, a.base_block_size,
                 nlanes_for(a.base_block_size, a.base_nlanes), a.data_block, a.nslots, a.rto)


def build_points(a) -> list[tuple[str, Point]]:
    """(sweep, point) pairs: the base point first, then each sweep's points; the base point
    also belongs to every sweep (measured once: points are measured once per key). The loss
    sweep alone does not need the base point."""
    base = base_point(a)
    out = [] if a.sweeps == ["loss"] else [("base", base)]
    for sweep in a.sweeps:
        if sweep == "density":
            pts = [replace(base, density=d) for d in a.densities]
        elif sweep == "size":
            pts = [replace(base, elements=n) for n in a.sizes]
        elif sweep == "fixed_nnz":  # same non-zero bytes as the base point, longer tensors
            pts = [replace(base, elements=n, density=min(1.0, base.density * base.elements / n))
                   for n in a.sizes]
        elif sweep == "workers":
            pts = [replace(base, workers=w) for w in a.workers]
        elif sweep == "block_size":
            pts = [replace(base, block_size=b, nlanes=nlanes_for(b)) for b in a.block_sizes]
        elif sweep == "nlanes":
            pts = [replace(base, nlanes=nlanes_for(base.block_size, k)) for k in a.nlanes]
        else:  # loss: SpINA alone, in network namespaces, against its own lossless time
            out += [("loss", replace(base, sweep="loss", elements=a.loss_elements, density=d,
                                     loss=x)) for d in a.loss_densities for x in a.losses]
            continue
        if base.key() not in {p.key() for p in pts}:
            pts.append(base)
        seen = set()
        for p in pts:
            if p.key() not in seen:
                seen.add(p.key())
                out.append((sweep, replace(p, sweep=sweep)))
    return out


def memory_estimate(p: Point) -> int:
    """Rough peak bytes of a point: per worker the tensor, the buffer reduced in place and
    temporaries (< 3x); rank 0 also holds the float64 reference (3 arrays of 8 bytes)."""
    return p.workers * 5 * 4 * p.elements + 3 * 8 * p.elements


# ----------------------------------------------------------------------------- runners
def cluster_key(p: Point) -> tuple:
    """Points with the same key share one switch and one set of worker processes."""
    return (p.workers, p.block_size, p.nlanes, p.nslots, p.rto, p.loss is not None)


SWITCH_DATAPATH = ["compiled", 1]  # --switch-datapath, --switch-threads: every cluster's


def _cluster(p: Point, gloo: bool, star=None, switch_profile: str | None = None,
             floor: bool = False) -> Cluster:
    """The cluster for p's key: on 127.0.0.1, or in the namespaces of a bench.netns.Star;
    with the floor's relay if `floor`."""
    from bench import netns
    places = {}
    if star is not None:
        places = dict(switch_place=Place(star.switch_ns, netns.SWITCH_IP),
                      worker_places=[Place(star.worker_ns[r], netns.worker_ip(r))
                                     for r in range(p.workers)])
    return Cluster(p.workers, nslots=p.nslots, block_size=p.block_size, nlanes=p.nlanes,
                   agent_kw={} if p.rto is None else {"rto": p.rto},
                   gloo=Gloo() if gloo else None, switch_profile=switch_profile, floor=floor,
                   switch_datapath=SWITCH_DATAPATH[0], switch_threads=SWITCH_DATAPATH[1],
                   **places)


def measure(cl: Cluster, p: Point, repeats: int, methods, star=None,
            profile_path: str | None = None, memory: bool = False) -> dict:
    """One point in a running cluster: {method: measurements} (see summarize)."""
    load0 = os.getloadavg()
    sw0 = proc_cpu(cl.switch_pid)
    relay0 = proc_cpu(cl.relay_pid) if cl.relay_pid else 0.0
    if star is not None:
        star.loss(p.loss)  # new rules: their counters start at 0
    drops0 = star.dropped() if star is not None else 0
    recs = cl.measure(Request(p, repeats, tuple(methods), profile_path=profile_path,
                              memory=memory))
    out = summarize(p, recs, methods, proc_cpu(cl.switch_pid) - sw0,
                    proc_cpu(cl.relay_pid) - relay0 if cl.relay_pid else float("nan"))
    load = dict(load_start=_load(load0), load_end=_load(os.getloadavg()))
    for m in out.values():
        m.update(load)
        if star is not None:
            m["dropped"] = star.dropped() - drops0
    return out


def _load(v) -> str:
    return " ".join(f"{x:.2f}" for x in v)


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
        mean = lambda k: mean_over_workers(recs, m, k)  # noqa: E731
        # Every call, warm-up included: what the switch served while its CPU was measured
        # (with both SpINA methods in a point, it served both: the rates are of the total).
        total = lambda k: sum(w[n]["warmup"][k] + sum(w[n][k])  # noqa: E731
                              for w in recs for n in methods if n in SPINA_METHODS)
        own = lambda k: sum(w[m]["warmup"][k] + sum(w[m][k]) for w in recs)  # noqa: E731
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
    """SpINA alone at one point, in a cluster of its own (bench/profile.py's runner): its
    measurements (summarize) plus "switch", the switch's own counters. With p.loss set, every
    process runs in a network namespace of a bench.netns.Star, iptables dropping p.loss of the
    datagrams each way at every worker."""
    from contextlib import ExitStack

    from bench import netns
    with ExitStack() as stack:
        star = None if p.loss is None else stack.enter_context(netns.Star(p.workers))
        sw_prof = os.path.join(profile_dir, "switch.prof") if profile_dir else None
        ag_prof = os.path.join(profile_dir, "agent0.prof") if profile_dir else None
        cl = stack.enter_context(_cluster(p, gloo=False, star=star, switch_profile=sw_prof))
        m = measure(cl, p, repeats, ("spina",), star, ag_prof, memory)["spina"]
    m["switch"] = cl.switch_stats
    return m


def run_points(points: list[Point], repeats: int, methods):
    """Measure every point, one cluster per cluster_key (points grouped, first-seen order);
    yields (point, {method: measurements}) as each is done. Loss points run SpINA alone, in
    network namespaces."""
    from contextlib import ExitStack

    from bench import netns
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(cluster_key(p), []).append(p)
    for pts in groups.values():
        first = pts[0]
        lossy = first.loss is not None
        ms = ("spina",) if lossy else tuple(methods)
        with ExitStack() as stack:
            star = stack.enter_context(netns.Star(first.workers)) if lossy else None
            cl = stack.enter_context(_cluster(first, gloo=any(m in GLOO_METHODS for m in ms),
                                              star=star, floor="floor" in ms))
            for p in pts:
                yield p, measure(cl, p, repeats, ms, star)


PAIRED_SWEEP = "fixed_nnz_paired"


def scaling_pair(points: list[tuple[str, Point]], base: Point) -> tuple[Point, Point] | None:
    """The fixed_nnz sweep's point at the base point's length (25M at 1% by default) and its
    longest point (issue 12's scaling target), or None without that sweep."""
    pts = [p for sweep, p in points if sweep == "fixed_nnz"]
    small = next((p for p in pts if p.elements == base.elements), None)
    big = max(pts, key=lambda p: p.elements, default=None)
    return None if small is None or big.key() == small.key() else (small, big)


def run_interleaved(pair: tuple[Point, Point], repeats: int, methods) -> dict:
    """The two points of `pair` measured alternately, repeat by repeat, in one cluster (the
    order swapped every repeat), SpINA methods only: their time ratio is then paired like two
    methods' at one point, instead of two points measured minutes apart at other loads.
    {point key: {method: measurements}} (summarize's form; no switch CPU per point)."""
    ms = tuple(m for m in methods if m in SPINA_METHODS)
    recs: dict[tuple, list[list[dict]]] = {p.key(): [] for p in pair}
    load0 = os.getloadavg()
    with _cluster(pair[0], gloo=False) as cl:
        for r in range(repeats):
            for p in (pair if r % 2 == 0 else pair[::-1]):
                recs[p.key()].append(cl.measure(Request(p, 1, ms)))
    load = dict(load_start=_load(load0), load_end=_load(os.getloadavg()))
    out = {}
    for p in pair:
        runs = recs[p.key()]
        merged = [_merge_worker([run[w] for run in runs], ms) for w in range(p.workers)]
        got = summarize(p, merged, ms, float("nan"))
        for d in got.values():
            d.update(load)
        out[p.key()] = got
    return out


def _merge_worker(recs: list[dict], methods) -> dict:
    """One worker's records of several one-repeat requests as one record of them all."""
    out = {"nonzeros": recs[0]["nonzeros"]}
    for m in methods:
        d = {k: [x for r in recs for x in r[m][k]]
             for k, v in recs[0][m].items() if isinstance(v, list)}
        d["max_err"] = max(r[m]["max_err"] for r in recs)
        d["warmup"] = {k: sum(r[m]["warmup"][k] for r in recs) for k in recs[0][m]["warmup"]}
        out[m] = d
    return out


def _progress(p: Point, got: dict) -> str:
    s = (f"n={p.workers} len={p.elements:.3g} d={p.density:g} B={p.block_size} k={p.nlanes}"
         + ("" if p.loss is None else f" loss={p.loss:g}") + ":")
    for m, d in got.items():
        s += f" {m} {statistics.median(d['times']):.3f} s"
    any_d = next(iter(got.values()))
    return s + f" (load {any_d['load_start'].split()[0]}-{any_d['load_end'].split()[0]})"


def row(p: Point, sweep: str, method: str, m: dict) -> dict:
    t = m["times"]
    return dict(sweep=sweep, workers=p.workers, elements=p.elements, density=p.density,
                block_size=p.block_size, nlanes=p.nlanes, data_block=p.data_block,
                nslots=p.nslots, method=method, repeats=len(t), median_s=statistics.median(t),
                min_s=min(t), max_s=max(t), times_s=" ".join(f"{x:.6f}" for x in t),
                cpu_s_per_worker=m["cpu"], bytes_per_worker=m["bytes"],
                bytes_source=m["bytes_source"], payload_bytes_per_worker=m.get("payload", ""),
                packets_per_worker=m.get("packets", ""),
                nonzero_blocks_per_worker=m.get("nonzero_blocks", ""),
                resends=m.get("resends", ""), spurious_resends=m.get("spurious", ""),
                timeout_resends=m.get("timeout_resends", ""),
                verified=m["verified"], max_abs_err=m["max_err"],
                switch_packets_in=m.get("switch_packets", ""),
                switch_cpu_s=m.get("switch_cpu", ""),
                switch_pkts_per_cpu_s=m.get("switch_pkt_rate", ""),
                switch_payload_gbit_per_cpu_s=m.get("switch_gbit", ""),
                loss="" if p.loss is None else p.loss, dropped=m.get("dropped", ""),
                resends_per_rank=m.get("resends_per_rank", ""),
                timeout_resends_per_rank=m.get("timeouts_per_rank", ""),
                load_start=m["load_start"], load_end=m["load_end"])


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(float(v)) for v in s.split(",")]  # noqa: E731  (accepts 25e6)
    floats = lambda s: [float(v) for v in s.split(",")]  # noqa: E731
    ap.add_argument("--sweeps", default=",".join(s for s in SWEEPS if s != "loss"),
                    help=f"comma list of {', '.join(SWEEPS)}, or 'base' for the base point only "
                    "(default: all but loss, which needs root for its network namespaces)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"comma list of {', '.join(ALL_METHODS)} (default: "
                    f"{','.join(METHODS)}; the last two time as the benchmark before the paired "
                    "one did, for comparison)")
    ap.add_argument("--quick", action="store_true",
                    help="the density sweep at the base point, SpINA, the floor and gloo "
                    f"all_reduce only (sets --sweeps density --methods {QUICK['methods']})")
    ap.add_argument("--repeats", type=int, default=9,
                    help="paired repeats per point (each: one timed call of every method)")
    ap.add_argument("--base-workers", type=int, default=4)
    ap.add_argument("--base-elements", type=lambda s: int(float(s)), default=25_000_000)
    ap.add_argument("--base-density", type=float, default=0.01)
    ap.add_argument("--base-block-size", type=int, default=256)
    ap.add_argument("--base-nlanes", type=int, default=56, help="JobConfig's default")
    ap.add_argument("--data-block", type=int, default=256,
                    help="block size of the generated sparsity pattern (fixed while B varies)")
    ap.add_argument("--nslots", type=int, default=16, help="switch slots per job (the window)")
    ap.add_argument("--rto", type=float, default=None,
                    help="agent's first retransmission timeout in s (default: the Agent's own)")
    ap.add_argument("--densities", type=floats, default=[1.0, 0.1, 0.01, 0.001])
    ap.add_argument("--sizes", type=ints, default=[1_000_000, 5_000_000, 25_000_000, 100_000_000])
    ap.add_argument("--workers", type=ints, default=[2, 4, 8])
    ap.add_argument("--block-sizes", type=ints, default=[64, 256, 1024])
    ap.add_argument("--nlanes", type=ints, default=[8, 32, 56, 63])
    ap.add_argument("--losses", type=floats, default=[0.0, 0.01, 0.05, 0.10],
                    help="loss sweep: random loss each way (iptables in network namespaces)")
    ap.add_argument("--loss-densities", type=floats, default=[0.01, 1.0])
    ap.add_argument("--loss-elements", type=lambda s: int(float(s)), default=4_000_000)
    ap.add_argument("--memory-limit-gib", type=float, default=16.0,
                    help="skip points whose estimated footprint exceeds this (machine: 24 GiB)")
    ap.add_argument("--switch-datapath", choices=("compiled", "python"), default="compiled",
                    help="the software switch's data path (default %(default)s; python: the "
                         "reference pipeline, for comparison)")
    ap.add_argument("--switch-threads", type=cli.int_range(1, MAX_DATAPATH_THREADS), default=1,
                    metavar="N", help="the software switch's compiled data-path threads "
                                      "(UdpSwitch's datapath_threads; default %(default)s)")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.sweeps, a.methods = QUICK["sweeps"], QUICK["methods"]
    if a.repeats < 1:
        ap.error("--repeats: need at least 1")
    a.sweeps = [] if a.sweeps == "base" else a.sweeps.split(",")
    a.methods = a.methods.split(",")
    for s in a.sweeps:
        if s not in SWEEPS:
            ap.error(f"--sweeps: unknown sweep {s!r}")
    for m in a.methods:
        if m not in ALL_METHODS:
            ap.error(f"--methods: unknown method {m!r}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    SWITCH_DATAPATH[:] = a.switch_datapath, a.switch_threads
    os.makedirs(a.out, exist_ok=True)
    points = build_points(a)
    unique: dict[tuple, Point] = {}
    skipped = []
    for _, p in points:
        if memory_estimate(p) > a.memory_limit_gib * 2 ** 30:
            skipped.append(f"{p} (estimated {memory_estimate(p) / 2 ** 30:.1f} GiB)")
        else:
            unique.setdefault(p.key(), p)
    started = time.time()
    meta = dict(command="python -m bench.allreduce_bench " + " ".join(sys.argv[1:] if argv is None
                                                                      else argv),
                date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                host=f"{platform.node()}: {os.cpu_count()} cores, "
                     f"Python {platform.python_version()}",
                load_at_start=_load(os.getloadavg()), repeats=a.repeats, skipped=skipped,
                switch_datapath=a.switch_datapath, switch_threads=a.switch_threads,
                base=asdict(base_point(a)))
    measured: dict[tuple, dict] = {}
    path = os.path.join(a.out, "results.csv")
    print(f"{len(unique)} points, methods {', '.join(a.methods)}, {a.repeats} paired repeats "
          f"each; load {meta['load_at_start']}", flush=True)
    for i, (p, got) in enumerate(run_points(list(unique.values()), a.repeats, a.methods), 1):
        measured[p.key()] = got
        print(f"[{i}/{len(unique)} {time.time() - started:.0f} s] " + _progress(p, got),
              flush=True)
        write_csv([row(q, sweep, m, measured[q.key()][m]) for sweep, q in points
                   if q.key() in measured for m in measured[q.key()]], path)  # keep what is done
    pair = scaling_pair(points, base_point(a))
    if pair is not None and all(p.key() in unique for p in pair):
        print(f"interleaved pair for the scaling target: {pair[0].elements:.3g} and "
              f"{pair[1].elements:.3g} elements, {a.repeats} repeats each", flush=True)
        got = run_interleaved(pair, a.repeats, a.methods)
        rows = [row(q, sweep, m, measured[q.key()][m]) for sweep, q in points
                if q.key() in measured for m in measured[q.key()]]
        rows += [row(p, PAIRED_SWEEP, m, got[p.key()][m]) for p in pair for m in got[p.key()]]
        write_csv(rows, path)
    meta.update(seconds=round(time.time() - started), load_at_end=_load(os.getloadavg()))
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    from bench import report
    files = report.regenerate(path, plots=not a.no_plots)
    print(f"wrote {path} and " + ", ".join(files) + f" in {time.time() - started:.0f} s")
    return 0


def write_csv(rows, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
