"""switch: the software switch's per-packet cost without agents, pre-built datagrams, one or
several source trees alternating in the same run.

    python -m bench switch -b 1M -e 16M -f 4 -d 1,0.25         # this tree
    python -m bench switch --trees .,../main -n 7              # two trees, alternating
    python -m bench switch --profile                           # + cProfile of this tree

Methods (loads), each with -g workers of one job (56 lanes of 256, `JobConfig`'s defaults), 16
slots:
  pipeline    Pipeline.process_into over a list of datagrams (no sockets): the Python cost.
  compiled    the compiled data path (softswitch/_datapath.c) over the same list (no sockets).
  udp         UdpSwitch's serve loop over datagrams queued in its socket beforehand by the
              workers' sockets on 127.0.0.1 (the switch holds its pipeline lock until they are
              all queued, so it serves them back to back, as under a steady load): the tree's
              default data path plus socket calls, results sent as in a run (one unicast per
              worker and round).
  udp-python  the same with datapath="python" (trees that have the compiled path).
  udp-2t      the udp load on 2 compiled data-path threads (UdpSwitch(datapath_threads=2),
              trees that have them): the 16 slots 8 per thread, CPU time that of both.
size is the tensor an all-reduce of those datagrams sums: size / (16 x 56 x 256 x 4 bytes)
rounds of every slot from every worker; time is the switch's wall time to serve them all, so
algbw is the switch's ceiling for an all-reduce of that size (busbw = algbw: no bus). Density:
each worker's datagrams carry that fraction of the 56 lanes (random, at least one; 1: all).
Each repeat runs every tree once in a child process of its own (PYTHONPATH=tree), the trees'
order and the loads' order rotating repeat by repeat; every result datagram is counted (a
missing one is a `wrong`). Besides the harness's columns: the tree, the datagrams, wall and
process CPU per datagram (CPU includes the kernel's share of the socket calls, and is what a
loaded machine charges) and datagrams per CPU-second.
"""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

SLOTS, LANES, BLOCK = 16, 56, 256
ROUND_BYTES = SLOTS * LANES * BLOCK * 4  # the tensor bytes one round of every slot sums


def build_packets(workers: int, density: float, rounds: int,
                  seed: int = 0) -> list[tuple[int, bytes]]:
    """(rank, datagram) in arrival order: every slot's round r from every worker, r = 1..rounds,
    each datagram with `density` of the lanes (random; all at 1)."""
    from spina import wire
    rng = np.random.default_rng(seed)
    nlanes = max(1, round(density * LANES))
    out = []
    for rnd in range(1, rounds + 1):
        for slot in range(SLOTS):
            for rank in range(workers):
                if nlanes == LANES:
                    lanes = np.arange(LANES)
                else:
                    lanes = np.sort(rng.choice(LANES, nlanes, replace=False))
                present = sum(1 << int(i) for i in lanes)
                h = wire.Header(job=1, epoch=1, call=1, slot=slot, rank=rank, round=rnd,
                                nlanes=LANES, block_size=BLOCK, length=25_000_000,
                                present=present, exponent=10)
                data = rng.integers(-1000, 1000, (len(lanes), BLOCK), dtype=np.int32)
                nxt = rng.integers(0, 1 << 20, LANES, dtype=np.uint32)
                out.append((rank, wire.pack(h, nxt, data)))
    return out


def _job(addrs):
    from spina.config import JobConfig, WorkerAddr
    return JobConfig(job=1, workers=tuple(WorkerAddr(r, *a) for r, a in enumerate(addrs)),
                     nslots=SLOTS, nlanes=LANES, block_size=BLOCK)


def _workers(pkts) -> int:
    return max(rank for rank, _ in pkts) + 1


def _cpu() -> float:
    return time.process_time()


def measure_pipeline(pkts, repeats: int, prof: cProfile.Profile | None = None) -> list[dict]:
    from softswitch.pipeline import Pipeline
    addrs = [("127.0.0.1", 40000 + r) for r in range(_workers(pkts))]
    cfg = _job(addrs)
    p = Pipeline()
    srcs = {r: (0, a) for r, a in enumerate(addrs)}
    items = [(pkt, addrs[rank]) for rank, pkt in pkts]
    out = bytearray(p.max_packet_len)
    rows = []
    for _ in range(repeats):
        p.add_job(cfg, srcs)  # clears the job's slots: the same rounds are new again
        emitted = 0
        if prof:
            prof.enable()
        t0, c0 = time.perf_counter(), _cpu()
        for pkt, src in items:
            n, *_ = p.process_into(pkt, 0, src, out)
            emitted += n > 0
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        if prof:
            prof.disable()
        assert emitted == len(items) // len(addrs), emitted
        rows.append(dict(wall_us=1e6 * wall / len(items), cpu_us=1e6 * cpu / len(items)))
    return rows


def measure_compiled(pkts, repeats: int, prof: cProfile.Profile | None = None) -> list[dict]:
    from softswitch.udp import UdpSwitch
    addrs = [("127.0.0.1", 40000 + r) for r in range(_workers(pkts))]
    cfg = _job(addrs)
    sw = UdpSwitch(port=0, datapath="compiled")
    items = [(pkt, addrs[rank]) for rank, pkt in pkts]
    out = bytearray(sw.pipeline.max_packet_len)
    rows = []
    try:
        for _ in range(repeats):
            sw.add_job(cfg)
            with sw.pipeline.lock:
                sw._sync_compiled()
            process = sw._compiled.process
            emitted = 0
            t0, c0 = time.perf_counter(), _cpu()
            for pkt, src in items:
                emitted += process(pkt, src, out)[0] > 0
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            assert emitted == len(items) // len(addrs), emitted
            rows.append(dict(wall_us=1e6 * wall / len(items), cpu_us=1e6 * cpu / len(items)))
    finally:
        sw.stop()
    return rows


def measure_udp_python(pkts, repeats: int, prof: cProfile.Profile | None = None) -> list[dict]:
    return measure_udp(pkts, repeats, prof, datapath="python")


def measure_udp_2t(pkts, repeats: int, prof: cProfile.Profile | None = None) -> list[dict]:
    return measure_udp(pkts, repeats, prof, datapath_threads=2)


def measure_udp(pkts, repeats: int, prof: cProfile.Profile | None = None,
                **switch_kw) -> list[dict]:
    from softswitch.udp import UdpSwitch
    from spina.net import bound_udp_socket
    socks = [bound_udp_socket() for _ in range(_workers(pkts))]
    for s in socks:
        s.setblocking(False)
    cfg = _job([s.getsockname() for s in socks])
    sw = UdpSwitch(port=0, **switch_kw)
    sw.add_job(cfg)
    t = None
    if prof is not None:
        # The serve loop's thread runs under the profiler (its CPU time only).
        t = threading.Thread(target=prof.runcall, args=(sw.serve_forever,), daemon=True)
        t.start()
    else:
        sw.start()
    rows = []
    results = len(pkts)  # datagrams the switch sends: one per worker and round
    try:
        for _ in range(repeats):
            with sw.pipeline.lock:  # the switch waits here while the datagrams queue up
                sw.add_job(cfg)
                out0 = sw.packets_out
                for rank, pkt in pkts:
                    socks[rank].sendto(pkt, sw.address)
                t0, c0 = time.perf_counter(), _cpu()
            deadline = t0 + 30
            while sw.packets_out - out0 < results and time.perf_counter() < deadline:
                time.sleep(0.0005)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            got = sw.packets_out - out0
            assert got == results, f"{got} of {results} results sent"
            received = 0
            for s in socks:  # drain (and count) what reached the workers
                while True:
                    try:
                        s.recv(1 << 16)
                        received += 1
                    except BlockingIOError:
                        break
            assert received == len(pkts), f"{received} of {len(pkts)} results received"
            rows.append(dict(wall_us=1e6 * wall / len(pkts), cpu_us=1e6 * cpu / len(pkts)))
    finally:
        sw.stop()
        if t is not None:
            t.join()
        for s in socks:
            s.close()
    return rows


LOADS = {"pipeline": measure_pipeline, "compiled": measure_compiled, "udp": measure_udp,
         "udp-python": measure_udp_python, "udp-2t": measure_udp_2t}


# ----------------------------------------------------------------------------- child side
def child(argv) -> None:
    """Measure the tree on sys.path (argv: workers density rounds loads): one JSON line per
    load, its one measurement (after a warm-up: first touch of registers and buffers)."""
    workers, density, rounds, loads = int(argv[0]), float(argv[1]), int(argv[2]), argv[3]
    pkts = build_packets(workers, density, rounds)
    for load in loads.split(","):
        fn = LOADS[load]
        fn(pkts, 1)
        try:
            (row,) = fn(pkts, 1)
        except AssertionError as e:  # results missing: a wrong call
            row = dict(wall_us=float("nan"), cpu_us=float("nan"), wrong=str(e))
        print(json.dumps(dict(load=load, packets=len(pkts), **row)), flush=True)


def profile(a, out) -> None:
    """cProfile of every load on this tree, written to `out`."""
    for density in a.densities:
        pkts = build_packets(a.workers[0], density, rounds_for(a.sizes[0]))
        for load in a.methods:
            fn = LOADS[load]
            fn(pkts, 1)
            prof = cProfile.Profile(time.thread_time)
            fn(pkts, 1, prof)
            s = io.StringIO()
            pstats.Stats(prof, stream=s).strip_dirs().sort_stats("tottime").print_stats(a.top)
            out.write(f"==== {load}, density {density:g}: {len(pkts)} packets (cProfile, "
                      f"thread CPU time; own seconds per packet = tottime / {len(pkts)})\n")
            out.write(s.getvalue())


# ----------------------------------------------------------------------------- harness side
DESCRIPTION = "the software switch's per-datagram cost without agents (one or more trees)"
METHODS = tuple(LOADS)
DEFAULTS = dict(methods="pipeline,udp", begin="1M", end="1M", densities="1,0.25", repeats=5)
EXTRA_COLUMNS = ("tree", "packets", "wall_us_per_packet", "cpu_us_per_packet",
                 "packets_per_cpu_s")
POINT_COLUMNS = ("tree",)


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--trees", default=".", type=cli.comma_list(cli.existing_path, "trees"),
                    help="comma list of source trees to compare, alternating (default: this one)")
    ap.add_argument("--profile", action="store_true",
                    help="also cProfile every load on this tree into profile.txt")
    ap.add_argument("--top", type=cli.int_range(1, 1000), default=20,
                    help="functions listed per load by --profile (default %(default)s)")


def check_options(a) -> str | None:
    if a.topo is not None or a.rates:
        return "argument -t/--topology: the switch alone runs on loopback"
    if a.lane_bits != [32]:
        return "argument -l/--lane-bits: the switch's datagrams here are 32-bit"
    a.trees = [os.path.abspath(t) for t in a.trees]
    for tree in a.trees:
        if not os.path.isfile(os.path.join(tree, "softswitch", "pipeline.py")):
            return f"argument --trees: {tree!r} is not a SpINA source tree (no softswitch/)"
    return None


def rounds_for(size: int) -> int:
    return max(1, size // ROUND_BYTES)


def run(a, log):
    from bench.harness import method_rows
    if a.profile:
        with open(os.path.join(a.out, "profile.txt"), "w") as f:
            profile(a, f)
        log(f"cProfile of this tree: {a.out}/profile.txt")
    for n in a.workers:
        for density in a.densities:
            for size in a.sizes:
                rounds = rounds_for(size)
                got = {(m, t): [] for m in a.methods for t in a.trees}
                load0 = os.getloadavg()[0]
                for rep in range(a.repeats):
                    trees = a.trees if rep % 2 == 0 else a.trees[::-1]
                    k = rep % len(a.methods)
                    loads = a.methods[k:] + a.methods[:k]
                    for tree in trees:
                        for d in _child(tree, n, density, rounds, loads):
                            got[d["load"], tree].append(d)
                load = f"{load0:.2f}-{os.getloadavg()[0]:.2f}"
                for tree in a.trees:
                    times = {m: [d["packets"] * d["wall_us"] * 1e-6 for d in got[m, tree]]
                             for m in a.methods}
                    extras = {m: _extras(tree, got[m, tree]) for m in a.methods}
                    wrong = {m: sum("wrong" in d for d in got[m, tree]) for m in a.methods}
                    point = dict(size=rounds * ROUND_BYTES, elements=rounds * ROUND_BYTES // 4,
                                 dtype="float32", density=density, workers=n, lane_bits=32,
                                 rate="")
                    yield method_rows(a.what, point, times, bus="none", wrong=wrong,
                                      load=load, extras=extras)


def _extras(tree: str, ds: list[dict]) -> dict:
    wall = statistics.median(d["wall_us"] for d in ds)
    cpu = statistics.median(d["cpu_us"] for d in ds)
    return dict(tree=os.path.relpath(tree), packets=ds[0]["packets"],
                wall_us_per_packet=round(wall, 2), cpu_us_per_packet=round(cpu, 2),
                packets_per_cpu_s=round(1e6 / cpu) if cpu == cpu and cpu > 0 else "")


def _child(tree: str, n: int, density: float, rounds: int, loads) -> list[dict]:
    """One measurement of every load on `tree` in a child process of its own."""
    from bench.paired import BenchError
    # This file run by path with only `tree` on sys.path (not bench/, whose profile.py would
    # shadow the standard library's): `tree` supplies softswitch and spina.
    run = (f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, "
           "run_name='__main__')")
    cmd = [sys.executable, "-c", run, str(n), str(density), str(rounds), ",".join(loads)]
    r = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=tree), capture_output=True,
                       text=True, cwd=tree, timeout=600)
    if r.returncode:
        raise BenchError(f"{tree}: {' '.join(r.stderr.strip().splitlines()[-1:])}")
    return [json.loads(line) for line in r.stdout.splitlines()]


if __name__ == "__main__":
    child(sys.argv[1:])
