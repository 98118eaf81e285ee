"""The main job: a software switch and 4 worker processes on loopback all-reduce a sparse
float32 tensor at several block densities, check every result, and compare with
`torch.distributed` gloo all-reduce of the same tensor in the same run.

The switch state comes only from the controller: the software switch starts empty with its
P4Runtime server (`python -m softswitch udp --grpc`), `python -m controller serve` pushes the
pipeline, admits the job from a desired-state file and starts the workers' run (its own epoch),
and each worker builds its agent from the assignment file the controller wrote
(host_agent.assignment).

    spina demo --help
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import queue
import select
import subprocess
import sys
import tempfile
import time

import numpy as np

from spina import cli, wire
from spina.config import JOB_DEFAULTS, ConfigError, JobConfig, WorkerAddr
from spina.net import free_port, free_ports, init_loopback_gloo
from spina.spec import DEFAULT_SLOT_CAPACITY

MAX_ELEMENTS = (1 << 32) - 1  # the INA header's `length` is 32 bits


def make_tensor(n: int, block_size: int, density: float, rank: int, seed: int) -> np.ndarray:
    """Worker `rank`'s block-sparse tensor: each block non-zero with probability `density`."""
    rng = np.random.default_rng([seed, rank, int(density * 1e6)])
    nblocks = -(-n // block_size)
    nz = np.flatnonzero(rng.random(nblocks) < density)
    out = np.zeros(nblocks * block_size, np.float32)
    out.reshape(nblocks, block_size)[nz] = rng.standard_normal((len(nz), block_size), np.float32)
    return out[:n]


def quant_bound(tensors: list[np.ndarray], nworkers: int) -> float:
    """Largest error the int32 quantization allows (docs/aggregation.md): N * 2**(-S-1)."""
    from host_agent.blocks import headroom_bits
    maxabs = max(float(np.abs(t).max()) for t in tensors)
    if maxabs == 0:
        return 0.0
    e = int(np.frexp(maxabs)[1])
    return nworkers * 2.0 ** (e + headroom_bits(nworkers) - 31)


def _worker(rank: int, args, assignment_file: str, gloo_port: int, out_q) -> None:
    import torch
    import torch.distributed as dist

    from host_agent import assignment

    torch.set_num_threads(1)
    init_loopback_gloo(rank, args.workers, gloo_port)
    agent = assignment.connect(assignment_file, timeout=args.timeout)
    try:
        for density in args.densities:
            x = make_tensor(args.elements, args.block_size, density, rank, args.seed)
            spina_t, gloo_t = [], []
            for _ in range(args.repeats):
                buf = x.copy()  # summed in place, as gloo's all_reduce below
                dist.barrier()
                t0 = time.perf_counter()
                res = agent.allreduce(buf, inplace=True)
                spina_t.append(time.perf_counter() - t0)
            stats = agent.last_stats
            for _ in range(args.repeats):
                t = torch.from_numpy(x.copy())
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                gloo_t.append(time.perf_counter() - t0)
            report = {"rank": rank, "density": density, "spina": spina_t, "gloo": gloo_t,
                      "bytes_sent": stats.bytes_sent, "payload": stats.payload_bytes_sent,
                      "packets": stats.packets_sent, "resends": stats.resends,
                      "nz_blocks": stats.nonzero_blocks,
                      "digest": hashlib.blake2b(res.tobytes()).hexdigest()}
            if rank == 0:  # check against numpy: regenerate every worker's tensor
                xs = [make_tensor(args.elements, args.block_size, density, r, args.seed)
                      for r in range(args.workers)]
                exact = np.sum(np.stack(xs), axis=0, dtype=np.float64)
                report["max_err"] = float(np.abs(res - exact).max()) if len(res) else 0.0
                report["bound"] = quant_bound(xs, args.workers) + float(
                    np.abs(exact).max() if len(exact) else 0) * 2.0 ** -24
                report["elem_density"] = float(np.mean(np.stack(xs) != 0))
                del xs, exact
            out_q.put(report)
    except Exception as e:  # report, never hang the parent
        out_q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})
    finally:
        agent.close()
        dist.destroy_process_group()


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1000 or unit == "GB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1000
    return str(b)


def parser(prog: str = "spina demo") -> argparse.ArgumentParser:
    from softswitch.pipeline import DEFAULT_POOL_SLOTS
    ap = cli.ArgumentParser(
        prog=prog,
        description="SpINA demo: software switch + N worker processes on loopback; sparse "
                    "all-reduce at several block densities, checked against numpy, compared with "
                    "torch.distributed gloo all-reduce of the same tensor.")
    ap.add_argument("--workers", type=cli.int_range(1, wire.MAX_WORKERS), default=4,
                    help=f"worker processes (1..{wire.MAX_WORKERS}, default %(default)s)")
    ap.add_argument("--elements", type=cli.int_range(1, MAX_ELEMENTS), default=25_000_000,
                    help="float32 elements per tensor (default %(default)s)")
    ap.add_argument("--densities", type=cli.unit_interval, nargs="+",
                    default=[1.0, 0.1, 0.01, 0.001],
                    help="fractions of non-zero blocks, each in [0, 1] (default %(default)s)")
    ap.add_argument("--block-size", type=cli.int_range(1, 65535),
                    default=JOB_DEFAULTS["block_size"],
                    help="elements per block (default %(default)s)")
    ap.add_argument("--nlanes", type=cli.int_range(0, wire.MAX_LANES, " (0: as many as fit)"),
                    default=0, help="blocks fused per packet (default: as many as fit a 64 KB "
                                    "datagram)")
    ap.add_argument("--nslots", type=cli.int_range(1, DEFAULT_POOL_SLOTS, " (the switch's pool)"),
                    default=JOB_DEFAULTS["nslots"],
                    help="window: slots in flight (default %(default)s)")
    ap.add_argument("--repeats", type=cli.int_range(1), default=3,
                    help="timed calls per density (default %(default)s)")
    ap.add_argument("--timeout", type=cli.positive_float, default=30.0,
                    help="per-call timeout in s (default %(default)s)")
    ap.add_argument("--seed", type=cli.int_range(0), default=1)
    ap.add_argument("--metrics", metavar="[HOST:]PORT", type=cli.metrics_address,
                    help="the software switch serves Prometheus metrics at "
                         "http://HOST:PORT/metrics while the demo runs (as `spina switch "
                         "--metrics`; port 0 picks one and prints it)")
    return ap


def main(argv=None, prog: str = "spina demo") -> int:
    ap = parser(prog)
    args = ap.parse_args(argv)
    nlanes = args.nlanes or wire.max_lanes_for(args.block_size)
    try:  # the job these options make, checked before anything starts
        JobConfig(job=1, workers=tuple(WorkerAddr(r, "127.0.0.1", 1 + r)
                                       for r in range(args.workers)),
                  nslots=args.nslots, block_size=args.block_size,
                  nlanes=nlanes).validate(slot_capacity=DEFAULT_SLOT_CAPACITY)
    except ConfigError as e:
        return cli.fail(ap.prog, f"--block-size/--nlanes: {e.detail or e}")

    print(f"SpINA demo: {args.workers} workers, {args.elements:,} float32 elements "
          f"({_fmt_bytes(4 * args.elements)}), blocks of {args.block_size}, "
          f"{nlanes} blocks/packet, window {args.nslots} slots", flush=True)
    switch_port, grpc_port, runs_port = free_ports(3)
    workers = tuple(WorkerAddr(r, "127.0.0.1", p) for r, p in enumerate(free_ports(args.workers)))
    job = JobConfig(job=1, workers=workers, nslots=args.nslots, block_size=args.block_size,
                    nlanes=nlanes).validate()
    tmp = tempfile.TemporaryDirectory(prefix="spina-demo-")
    desired = os.path.join(tmp.name, "spina.yaml")
    with open(desired, "w") as f:  # the desired state the controller deploys (YAML is JSON)
        json.dump({"switches": [{"name": "s1", "target": "softswitch",
                                 "grpc": f"127.0.0.1:{grpc_port}", "address": "127.0.0.1",
                                 "udp_port": switch_port}],
                   "workers": [{"name": f"w{w.rank}", "ip": w.host, "udp_port": w.port,
                                "switch_port": 0} for w in workers],
                   "jobs": [{"id": job.job, "members": [f"w{w.rank}" for w in workers],
                             "nslots": job.nslots, "slot_base": 0,
                             "block_size": job.block_size, "nlanes": job.nlanes}],
                   "agents_dir": "agents", "rendezvous": f"127.0.0.1:{runs_port}"}, f, indent=1)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    metrics = ["--metrics", args.metrics] if args.metrics else []
    switch = subprocess.Popen([sys.executable, "-m", "softswitch", "udp", "--port",
                               str(switch_port), "--grpc", f"127.0.0.1:{grpc_port}", *metrics],
                              stdout=subprocess.PIPE, text=True, env=env)
    ok = True
    procs, controller = [], None
    try:
        # "listening ...", "metrics URL" (with --metrics), "p4runtime ..." (softswitch main)
        started = [switch.stdout.readline().strip() for _ in range(2 + bool(metrics))]
        if not started[0].startswith("listening") or not started[-1].startswith("p4runtime"):
            print(f"FAIL: software switch did not start ({started[0]!r})")
            return 1
        print(f"software switch (pid {switch.pid}) {', '.join(started)}", flush=True)
        controller = subprocess.Popen([sys.executable, "-m", "controller", "-c", desired,
                                       "serve"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env)
        served = controller.stdout.readline().strip()  # "controller: run rendezvous on ..."
        # the first deploy's report; a deploy that keeps failing is retried by serve forever
        ready, _, _ = select.select([controller.stdout], [], [], 60)
        deployed = controller.stdout.readline().strip() if ready else ""
        if controller.poll() is not None or not deployed.startswith("switch s1:"):
            controller.kill()
            print(f"FAIL: controller serve did not deploy within 60 s: {served} {deployed} "
                  f"{controller.communicate()[1][-2000:]}")
            return 1
        print(f"{served.removesuffix('.')}; {deployed}", flush=True)
        files = [os.path.join(tmp.name, "agents", f"job{job.job}-rank{r}.json")
                 for r in range(args.workers)]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        gloo_port = free_port()
        procs = [ctx.Process(target=_worker, args=(r, args, files[r], gloo_port, q))
                 for r in range(args.workers)]
        for p in procs:
            p.start()
        rows = []
        for density in args.densities:
            reps = []
            while len(reps) < args.workers:
                try:
                    rep = q.get(timeout=args.timeout * (args.repeats + 2) + 120)
                except queue.Empty:
                    print("FAIL: a worker stopped answering")
                    return 1
                if "error" in rep:
                    print(f"FAIL: rank {rep['rank']}: {rep['error']}")
                    return 1
                reps.append(rep)
            reps.sort(key=lambda r: r["rank"])
            r0 = reps[0]
            identical = len({r["digest"] for r in reps}) == 1
            exact = r0["max_err"] <= r0["bound"]
            ok &= identical and exact
            spina = float(np.median([max(r["spina"][i] for r in reps)
                                     for i in range(args.repeats)]))
            gloo = float(np.median([max(r["gloo"][i] for r in reps) for i in range(args.repeats)]))
            sent = float(np.mean([r["bytes_sent"] for r in reps]))
            row = (density, r0["elem_density"], spina, gloo, sent, 4 * args.elements / spina,
                   identical and exact, r0["max_err"], sum(r["resends"] for r in reps))
            rows.append(row)
            print(f"  density {density:7.2%}: spina {spina * 1e3:8.1f} ms, "
                  f"gloo {gloo * 1e3:8.1f} ms, {_fmt_bytes(sent)} sent/worker, "
                  f"max error {r0['max_err']:.2e} (bound {r0['bound']:.2e}), "
                  f"ranks identical: {identical}", flush=True)
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=10)
        switch.terminate()
        switch.wait(timeout=10)
        tmp.cleanup()

    print()
    print("| block density | element density | SpINA time | gloo time | SpINA/gloo "
          "| bytes sent/worker | goodput | exact |")
    print("|---|---|---|---|---|---|---|---|")
    for d, ed, st, gt, sent, good, good_ok, _err, _resends in rows:
        print(f"| {d:.1%} | {ed:.3%} | {st * 1e3:.1f} ms | {gt * 1e3:.1f} ms | {st / gt:.2f} | "
              f"{_fmt_bytes(sent)} | {good * 8 / 1e9:.2f} Gbit/s | {'yes' if good_ok else 'NO'} |")
    print()
    print("goodput = tensor bytes / SpINA time; times are the median over repeats of the "
          "slowest rank")
    if ok:
        print(f"PASS: {len(rows)} densities, every result within the quantization bound and "
              f"bit-identical on all {args.workers} ranks")
        return 0
    print("FAIL: some result was wrong or differed between ranks")
    return 1


if __name__ == "__main__":
    sys.exit(main())
