"""SpINA all-reduce against what CPU PyTorch users run today, side by side in one run.

Run from the repository root (the Makefile's `make bench` does):

    python -m bench.allreduce_bench                      # the full sweep (12 min here)
    python -m bench.allreduce_bench --sweeps density --repeats 3
    python -m bench.allreduce_bench --sweeps base --base-workers 2 --base-elements 65536 \\
        --repeats 1 --out /tmp/b                         # a smoke run (tests/test_bench_smoke.py)

One factor at a time is varied around a base point (4 workers, 25M float32 elements, 1% of
the blocks non-zero, block 256, 56 blocks per packet): density, size (at 1%), fixed_nnz (size
with the base point's number of non-zero blocks: does time follow the non-zero bytes or the
length?), workers, block_size, nlanes. At each point, in this order:

  spina           SpINA all-reduce through the software switch (softswitch.udp.UdpSwitch):
                  switch and every worker in their own process, all on 127.0.0.1, the job
                  config built from the workers' bound ports;
  gloo_allreduce  torch.distributed gloo all_reduce of the dense tensor;
  gloo_allgather  gloo all_gather of (int32 index, float32 value) of the non-zero elements,
                  then a local index_add_ (the sparse all-reduce users write by hand).

Each method does one warm-up call and `--repeats` timed calls; a repeat's time is that of
the slowest worker (every worker starts at a barrier). Every SpINA result is checked
against numpy (rank 0 against the float64 sum within the documented quantization bound,
every other rank bit-identical to rank 0); a wrong result stops the run. Outputs in --out:
results.csv, summary.md and PNG plots (bench/report.py).
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import asdict, replace

from bench.procs import Point, gloo_worker, spina_worker, switch_main
from spina import wire
from spina.config import JobConfig, WorkerAddr

SWEEPS = ("density", "size", "fixed_nnz", "workers", "block_size", "nlanes", "loss")
METHODS = ("spina", "gloo_allreduce", "gloo_allgather")
SLOT_CAPACITY = 64 * 256  # softswitch.pipeline.DEFAULT_SLOT_CAPACITY: nlanes*block_size bound
CHILD_TIMEOUT = 900.0     # seconds a child may take before the run is declared hung

COLUMNS = ("sweep", "workers", "elements", "density", "block_size", "nlanes", "data_block",
           "nslots", "method", "repeats", "median_s", "min_s", "max_s", "times_s",
           "cpu_s_per_worker", "bytes_per_worker", "bytes_source", "payload_bytes_per_worker",
           "packets_per_worker", "nonzero_blocks_per_worker", "resends", "verified", "max_abs_err",
           "switch_packets_in", "switch_bytes_in", "switch_cpu_s", "switch_pkts_per_cpu_s",
           "switch_payload_gbit_per_cpu_s", "loss", "dropped", "resends_per_rank",
           "timeout_resends_per_rank",
           "spurious_resends", "load")


class BenchError(RuntimeError):
    """A benchmark child failed or produced a wrong result."""


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
    """Rough peak bytes of a point: per worker input + agent temporaries (< 4x) + result;
    rank 0 also holds the float64 reference (3 arrays of 8 bytes)."""
    return p.workers * 6 * 4 * p.elements + 3 * 8 * p.elements


# ----------------------------------------------------------------------------- runners
def _recv(conn, proc_list, what: str):
    if not conn.poll(CHILD_TIMEOUT):
        raise BenchError(f"{what}: no answer within {CHILD_TIMEOUT:g} s")
    msg = conn.recv()
    if isinstance(msg, dict) and "error" in msg:
        raise BenchError(f"{what}: {msg['error']}")
    return msg


def _stop(procs) -> None:
    for pr in procs:
        pr.join(timeout=10)
    for pr in procs:
        if pr.is_alive():
            pr.terminate()
            pr.join()


def run_spina(p: Point, repeats: int, profile_dir: str | None = None,
              memory: bool = False) -> dict:
    """Switch + p.workers agents, each in its own process; returns the merged measurements.
    With p.loss set, every process runs in its own network namespace and iptables drops a
    fraction p.loss of the datagrams each way at every worker (bench/netns.py)."""
    if p.loss is None:
        return _run_spina(p, repeats, profile_dir, memory, None)
    from bench import netns
    with netns.Star(p.workers) as star:
        star.loss(p.loss)
        m = _run_spina(p, repeats, profile_dir, memory, star)
        m["dropped"] = star.dropped()
    return m


def _run_spina(p, repeats, profile_dir, memory, star) -> dict:
    from bench import netns
    ctx = mp.get_context("spawn")
    procs = []
    try:
        sw_conn, child = ctx.Pipe()
        prof = os.path.join(profile_dir, "switch.prof") if profile_dir else None
        where = (None, "127.0.0.1") if star is None else (star.switch_ns, netns.SWITCH_IP)
        procs.append(ctx.Process(target=switch_main, args=(child, prof, *where),
                                 name="spina-switch"))
        procs[-1].start()
        switch_addr = _recv(sw_conn, procs, "switch")
        barrier = ctx.Barrier(p.workers)
        conns = []
        for r in range(p.workers):
            parent, child = ctx.Pipe()
            prof = os.path.join(profile_dir, f"agent{r}.prof") if profile_dir and r == 0 else None
            where = ((None, "127.0.0.1") if star is None else
                     (star.worker_ns[r], netns.worker_ip(r)))
            procs.append(ctx.Process(target=spina_worker, name=f"spina-worker{r}",
                                     args=(r, p, repeats, child, barrier, prof, memory, *where)))
            procs[-1].start()
            conns.append(parent)
        addrs = [_recv(c, procs, f"spina rank {r}") for r, c in enumerate(conns)]
        job = JobConfig(job=1, workers=tuple(WorkerAddr(r, h, port) for r, (h, port) in
                                             enumerate(addrs)),
                        nslots=p.nslots, block_size=p.block_size, nlanes=p.nlanes).validate()
        sw_conn.send(job)
        _recv(sw_conn, procs, "switch admission")
        for c in conns:
            c.send((job, switch_addr))
        res = [_recv(c, procs, f"spina rank {r}") for r, c in enumerate(conns)]
        sw_conn.send("stop")
        sw = _recv(sw_conn, procs, "switch stop")
    finally:
        _stop(procs)
    for r, w in enumerate(res[1:], 1):
        if w["crcs"] != res[0]["crcs"]:
            raise BenchError(f"{p}: rank {r}'s result differs from rank 0's "
                             f"(crc32 {w['crcs']} vs {res[0]['crcs']})")
    times = [max(w["times"][i] for w in res) for i in range(repeats)]
    mean = lambda k: statistics.fmean(w[k] for w in res)  # noqa: E731
    payload_in = sum(w["payload_bytes_sent"] for w in res) * (repeats + 1)
    return dict(times=times, cpu=statistics.fmean(statistics.median(w["cpu"]) for w in res),
                bytes=mean("bytes_sent"), bytes_source="measured",
                payload=mean("payload_bytes_sent"), packets=mean("packets_sent"),
                nonzero_blocks=mean("nonzero_blocks"), resends=sum(w["resends"] for w in res),
                resends_per_rank=statistics.fmean(x for w in res for x in w["resends_per_call"]),
                timeouts_per_rank=statistics.fmean(x for w in res for x in w["timeouts_per_call"]),
                # Without loss every resend is spurious; with loss, those the agents detected.
                spurious=sum(x for w in res for x in (w["resends_per_call"] if p.loss == 0
                                                      else w["spurious_per_call"])),
                load=os.getloadavg()[0],
                verified=True, max_err=res[0]["max_err"], switch=sw,
                switch_pkt_rate=sw["packets_in"] / sw["cpu_s"] if sw["cpu_s"] else float("nan"),
                switch_gbit=8e-9 * payload_in / sw["cpu_s"] if sw["cpu_s"] else float("nan"),
                memory=[w["memory"] for w in res])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(p: Point, repeats: int, methods) -> dict:
    """p.workers torch.distributed gloo processes; both gloo methods in one process group."""
    ctx = mp.get_context("spawn")
    port = _free_port()  # rank 0's rendezvous, on 127.0.0.1 (spina.net.init_loopback_gloo)
    procs, conns = [], []
    try:
        for r in range(p.workers):
            parent, child = ctx.Pipe()
            procs.append(ctx.Process(target=gloo_worker, name=f"gloo-worker{r}",
                                     args=(r, p, repeats, port, child, tuple(methods))))
            procs[-1].start()
            conns.append(parent)
        res = [_recv(c, procs, f"gloo rank {r}") for r, c in enumerate(conns)]
    finally:
        _stop(procs)
    out = {}
    for m in methods:
        ws = [w[m] for w in res]
        out[m] = dict(times=[max(w["times"][i] for w in ws) for i in range(repeats)],
                      cpu=statistics.fmean(statistics.median(w["cpu"]) for w in ws),
                      bytes=statistics.fmean(w["bytes_sent"] for w in ws), bytes_source="model",
                      verified=True, max_err=ws[0]["max_err"])
    return out


def row(p: Point, sweep: str, method: str, m: dict) -> dict:
    t = m["times"]
    sw = m.get("switch") or {}
    return dict(sweep=sweep, workers=p.workers, elements=p.elements, density=p.density,
                block_size=p.block_size, nlanes=p.nlanes, data_block=p.data_block,
                nslots=p.nslots, method=method, repeats=len(t), median_s=statistics.median(t),
                min_s=min(t), max_s=max(t), times_s=" ".join(f"{x:.6f}" for x in t),
                cpu_s_per_worker=m["cpu"], bytes_per_worker=m["bytes"],
                bytes_source=m["bytes_source"], payload_bytes_per_worker=m.get("payload", ""),
                packets_per_worker=m.get("packets", ""),
                nonzero_blocks_per_worker=m.get("nonzero_blocks", ""),
                resends=m.get("resends", ""), verified=m["verified"], max_abs_err=m["max_err"],
                switch_packets_in=sw.get("packets_in", ""), switch_bytes_in=sw.get("bytes_in", ""),
                switch_cpu_s=sw.get("cpu_s", ""), switch_pkts_per_cpu_s=m.get("switch_pkt_rate", ""),
                switch_payload_gbit_per_cpu_s=m.get("switch_gbit", ""),
                loss="" if p.loss is None else p.loss, dropped=m.get("dropped", ""),
                resends_per_rank=m.get("resends_per_rank", ""),
                timeout_resends_per_rank=m.get("timeouts_per_rank", ""),
                spurious_resends=m.get("spurious", ""), load=m.get("load", ""))


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(float(v)) for v in s.split(",")]  # noqa: E731  (accepts 25e6)
    floats = lambda s: [float(v) for v in s.split(",")]  # noqa: E731
    ap.add_argument("--sweeps", default=",".join(s for s in SWEEPS if s != "loss"),
                    help=f"comma list of {', '.join(SWEEPS)}, or 'base' for the base point only "
                    "(default: all but loss, which needs root for its network namespaces)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list of " + ", ".join(METHODS))
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per point and method")
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
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    a.sweeps = [] if a.sweeps == "base" else a.sweeps.split(",")
    a.methods = a.methods.split(",")
    for s in a.sweeps:
        if s not in SWEEPS:
            ap.error(f"--sweeps: unknown sweep {s!r}")
    for m in a.methods:
        if m not in METHODS:
            ap.error(f"--methods: unknown method {m!r}")
    return a


def main(argv=None) -> int:
    from tqdm import tqdm

    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    points = build_points(a)
    unique: dict[tuple, Point] = {}
    for _, p in points:
        unique.setdefault(p.key(), p)
    measured: dict[tuple, dict] = {}
    skipped = []
    started = time.time()
    bar = tqdm(total=len(unique) * len(a.methods), unit="run", desc="sweep", dynamic_ncols=True)
    for key, p in unique.items():
        if memory_estimate(p) > a.memory_limit_gib * 2 ** 30:
            skipped.append(f"{p} (estimated {memory_estimate(p) / 2 ** 30:.1f} GiB)")
            bar.update(len(a.methods))
            continue
        got = {}
        desc = (f"n={p.workers} len={p.elements:.3g} d={p.density:g} B={p.block_size} "
                f"k={p.nlanes}" + ("" if p.loss is None else f" loss={p.loss:g}"))
        if "spina" in a.methods:
            bar.set_postfix_str("spina " + desc)
            got["spina"] = run_spina(p, a.repeats)
            bar.update()
        gm = [m for m in a.methods if m != "spina" and p.loss is None]
        if gm:
            bar.set_postfix_str("gloo " + desc)
            got.update(run_gloo(p, a.repeats, gm))
            bar.update(len(gm))
        measured[key] = got
    bar.close()
    rows = [row(p, sweep, m, measured[p.key()][m]) for sweep, p in points
            if p.key() in measured for m in a.methods if m in measured[p.key()]]
    path = os.path.join(a.out, "results.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    meta = dict(command="python -m bench.allreduce_bench " + " ".join(sys.argv[1:] if argv is None
                                                                      else argv),
                date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), seconds=round(time.time() - started),
                host=f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}",
                load=" ".join(f"{x:.2f}" for x in os.getloadavg()), repeats=a.repeats,
                skipped=skipped, base=asdict(base_point(a)))
    from bench import report
    report.write_summary(rows, meta, os.path.join(a.out, "summary.md"))
    if not a.no_plots:
        report.plot(rows, a.out)
    print(f"wrote {path}, {os.path.join(a.out, 'summary.md')}"
          + ("" if a.no_plots else " and plots") + f" in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
