"""The software switch's per-packet cost, without agents: pre-built packets, two source trees
measured alternately in the same run.

    python -m bench.switch_profile                           # this tree, 5 repeats
    python -m bench.switch_profile --trees .,../main --repeats 7
    python -m bench.switch_profile --profile                 # cProfile of this tree only

Loads (--loads), each with 4 workers of one job (56 lanes of 256, `JobConfig`'s defaults), 16 slots:
  pipeline  Pipeline.process_into over a list of datagrams (no sockets): the Python cost.
  compiled  the compiled data path (softswitch/_datapath.c) over the same list (no sockets).
  udp       UdpSwitch's serve loop over datagrams queued in its socket beforehand by 4 worker
            sockets on 127.0.0.1 (the switch holds its pipeline lock until they are all queued,
            so it serves them back to back, as under a steady load): the tree's default data
            path plus socket calls, results sent as in a run (one unicast per worker and round).
  udp-python  the same with datapath="python" (trees that have the compiled path).
  udp-2t    the udp load on 2 compiled data-path threads (UdpSwitch(datapath_threads=2), trees
            that have them): the 16 slots 8 per thread, CPU time that of both.
Packets are `full` (every lane present) or `sparse` (each worker a random quarter of the
lanes: the lane-gather paths). Each tree runs in its own child process (PYTHONPATH=tree), the
trees alternating repeat by repeat; per packet we report wall and process CPU time (CPU
includes the kernel's share of the socket calls, and is what a loaded machine charges).
"""
from __future__ import annotations

import argparse
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

WORKERS, SLOTS, LANES, BLOCK = 4, 16, 56, 256


def build_packets(shape: str, rounds: int, seed: int = 0) -> list[tuple[int, bytes]]:
    """(rank, datagram) in arrival order: every slot's round r from every worker, r = 1..rounds."""
    from spina import wire
    rng = np.random.default_rng(seed)
    out = []
    for rnd in range(1, rounds + 1):
        for slot in range(SLOTS):
            for rank in range(WORKERS):
                if shape == "full":
                    lanes = np.arange(LANES)
                else:
                    lanes = np.sort(rng.choice(LANES, LANES // 4, replace=False))
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


def _cpu() -> float:
    return time.process_time()


def measure_pipeline(pkts, repeats: int, prof: cProfile.Profile | None = None) -> list[dict]:
    from softswitch.pipeline import Pipeline
    addrs = [("127.0.0.1", 40000 + r) for r in range(WORKERS)]
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
        assert emitted == len(items) // WORKERS, emitted
        rows.append(dict(wall_us=1e6 * wall / len(items), cpu_us=1e6 * cpu / len(items)))
    return rows


def measure_compiled(pkts, repeats: int, prof: cProfile.Profile | None = None) -> list[dict]:
    from softswitch.udp import UdpSwitch
    addrs = [("127.0.0.1", 40000 + r) for r in range(WORKERS)]
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
            assert emitted == len(items) // WORKERS, emitted
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
    socks = [bound_udp_socket() for _ in range(WORKERS)]
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
SHAPES = ("full", "sparse")


def child(a) -> None:
    """Measure the tree on sys.path; one JSON line per (load, shape)."""
    for shape in a.shapes.split(","):
        pkts = build_packets(shape, a.rounds)
        for load in a.loads.split(","):
            fn = LOADS[load]
            fn(pkts, 1)  # warm-up: first touch of registers and socket buffers
            rows = fn(pkts, a.inner)
            print(json.dumps(dict(load=load, shape=shape, packets=len(pkts), rows=rows)),
                  flush=True)


def profile(a) -> None:
    for shape in a.shapes.split(","):
        pkts = build_packets(shape, a.rounds)
        for load in a.loads.split(","):
            fn = LOADS[load]
            fn(pkts, 1)
            prof = cProfile.Profile(time.thread_time)
            fn(pkts, a.inner, prof)
            s = io.StringIO()
            pstats.Stats(prof, stream=s).strip_dirs().sort_stats("tottime").print_stats(a.top)
            n = a.inner * len(pkts)
            print(f"==== {load} / {shape}: {n} packets (cProfile, thread CPU time; "
                  f"own seconds per packet = tottime / {n})")
            print(s.getvalue())


def main(argv=None) -> int:
    from spina import cli
    ap = cli.ArgumentParser(prog="python -m bench.switch_profile",
                            description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default=".",
                    help="comma-separated source trees to compare, the first the reference "
                         "(default: this one alone)")
    ap.add_argument("--loads", default="pipeline,udp", help=f"comma list of {', '.join(LOADS)}")
    ap.add_argument("--shapes", default="full,sparse", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--rounds", type=cli.int_range(1, 1000), default=12,
                    help="rounds per slot (4 x 16 x rounds datagrams queued at once)")
    ap.add_argument("--repeats", type=cli.int_range(1, 1000), default=5,
                    help="alternations of the trees")
    ap.add_argument("--inner", type=cli.int_range(1, 1000), default=5,
                    help="measurements per child process")
    ap.add_argument("--profile", action="store_true", help="cProfile this tree instead")
    ap.add_argument("--top", type=cli.int_range(1, 1000), default=20,
                    help="functions listed by --profile")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for opt, given, known in (("--loads", a.loads, LOADS), ("--shapes", a.shapes, SHAPES)):
        bad = [x for x in given.split(",") if x not in known]
        if bad:
            ap.error(f"argument {opt}: unknown {bad[0]!r} (one of {', '.join(known)})")
    for tree in a.trees.split(","):
        if not os.path.isfile(os.path.join(tree, "softswitch", "pipeline.py")):
            ap.error(f"argument --trees: {tree!r} is not a SpINA source tree (no softswitch/)")
    if a.child:
        child(a)
        return 0
    if a.profile:
        profile(a)
        return 0
    trees = [os.path.abspath(t) for t in a.trees.split(",")]
    got: dict[tuple, list] = {}
    for rep in range(a.repeats):
        for tree in (trees if rep % 2 == 0 else trees[::-1]):
            # This file run by path with only `tree` on sys.path (not bench/, whose profile.py
            # would shadow the standard library's): `tree` supplies softswitch and spina.
            run = (f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, "
                   "run_name='__main__')")
            loads = a.loads.split(",")
            loads = ",".join(loads if rep % 2 == 0 else loads[::-1])
            cmd = [sys.executable, "-c", run, "--child", "--loads", loads,
                   "--shapes", a.shapes, "--rounds", str(a.rounds), "--inner", str(a.inner)]
            env = dict(os.environ, PYTHONPATH=tree)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
            if r.returncode:
                sys.exit(f"switch_profile: error: {tree}: {r.stderr.strip().splitlines()[-1:]}")
            for line in r.stdout.splitlines():
                d = json.loads(line)
                got.setdefault((d["load"], d["shape"], tree), []).extend(d["rows"])
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"per packet, median [min-max] over {a.repeats} x {a.inner}; load {load}; "
          "packets per wall and per CPU second of the medians")
    med = {}
    for load_name in a.loads.split(","):
        for shape in a.shapes.split(","):
            for tree in trees:
                rows = got[(load_name, shape, tree)]
                w = [r["wall_us"] for r in rows]
                c = [r["cpu_us"] for r in rows]
                med[load_name, shape, tree] = statistics.median(c)
                base = med[load_name, shape, trees[0]]
                ratio = ("" if tree == trees[0] else
                         f"cpu {med[load_name, shape, tree] / base:.2f}x the first tree's")
                print(f"  {load_name:9s} {shape:6s} {tree}: wall {statistics.median(w):6.1f} us "
                      f"[{min(w):.1f}-{max(w):.1f}]  cpu {med[load_name, shape, tree]:6.1f} us "
                      f"[{min(c):.1f}-{max(c):.1f}]  {1e6 / statistics.median(w):7.0f}/s "
                      f"{1e6 / med[load_name, shape, tree]:7.0f}/cpu-s  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
