"""Hierarchical reduction through the daemon vs one rank per process, on loopback.

    python -m bench.hier_bench [--hosts 4] [--local 4] [--elements N] [--calls C]

H "hosts" are H daemon processes (`python -m host_agent daemon`, each its own socket), each
with L training processes (DaemonClients, one process each); one software switch (a thread
of this process). `flat`: every process is its own rank of an H*L-rank job (today's mode);
`hier`: the L processes of a host are local ranks of one rank of an H-rank job
(host_agent/daemon/hier.py). Both sum the same dense float32 tensors; printed per mode: the
switch's datagrams and bytes in+out per call (exact counts), the bytes each host's agents
put on and took off its link per call (exact), and the median call time of the calls after
the first (wall clock: the load average is printed too). docs/collectives.md shows a run.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina import cli
from spina.config import JobFile

ROOT = Path(__file__).resolve().parents[1]


def worker(job_file: str, rank: int, sock: str, local_rank: int, local_size: int, n: int,
           calls: int, seed: int) -> None:
    """One training process: `calls` all-reduces; prints its times and last stats as JSON."""
    from host_agent.daemon import DaemonClient
    x = (np.random.default_rng(seed).random(n) + 0.5).astype(np.float32)
    kw = dict(local_rank=local_rank, local_size=local_size) if local_size else {}
    times, nbytes, resends = [], [], 0
    with DaemonClient(job_file, rank, sock, **kw) as c:
        for _ in range(calls):
            t0 = time.perf_counter()
            c.allreduce(x)
            times.append(time.perf_counter() - t0)
            nbytes.append(c.last_stats.bytes_sent + c.last_stats.bytes_received)
            resends += c.last_stats.resends
    print(json.dumps({"times": times, "bytes": nbytes, "resends": resends}), flush=True)


def run_mode(sw, tmp: Path, mode: str, H: int, L: int, n: int, calls: int, job: int,
             rto: float) -> dict:
    ranks = H if mode == "hier" else H * L
    jobcfg = local_job(ranks, job=job, slot_base=16 * (job - 1))
    sw.add_job(jobcfg)
    job_file = tmp / f"{mode}.json"
    JobFile(jobcfg, sw.address).write(job_file)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")]))
    socks = [str(tmp / f"{mode}{h}.sock") for h in range(H)]
    daemons = []
    for h, s in enumerate(socks):
        cfg = tmp / f"{mode}{h}.json"  # rto: fewer timer resends on a loaded 2-core machine
        cfg.write_text(json.dumps({"socket": s, "log_level": "WARNING", "rto": rto}))
        daemons.append(subprocess.Popen([sys.executable, "-m", "host_agent", "daemon",
                                         "--config", str(cfg)], env=env, cwd=ROOT))
    try:
        while not all(os.path.exists(s) for s in socks):
            time.sleep(0.05)
        before = (sw.packets_in + sw.packets_out, sw.bytes_in + sw.bytes_out)
        procs = []
        for h in range(H):
            for lr in range(L):
                rank, local = (h, (lr, L)) if mode == "hier" else (h * L + lr, (0, 0))
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.hier_bench", "--worker", str(job_file),
                     str(rank), socks[h], str(local[0]), str(local[1]), str(n), str(calls),
                     str(h * L + lr)], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True))
        outs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
        after = (sw.packets_in + sw.packets_out, sw.bytes_in + sw.bytes_out)
    finally:
        for d in daemons:
            d.terminate()
            d.wait()
    # per call: hier: each local process reports its host agent's stats; flat: its own agent's
    per_host = [sum(outs[h * L]["bytes"]) / calls if mode == "hier" else
                sum(sum(o["bytes"]) for o in outs[h * L:(h + 1) * L]) / calls for h in range(H)]
    # hier: the L local processes of a host report the same resends (their one agent's)
    return {"mode": mode, "switch_packets": (after[0] - before[0]) / calls,
            "switch_bytes": (after[1] - before[1]) / calls, "host_bytes": per_host,
            "resends": sum(o["resends"] for o in outs[::L if mode == "hier" else 1]),
            "median_ms": 1e3 * statistics.median(t for o in outs for t in o["times"][1:])}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        a = argv[1:]
        worker(a[0], int(a[1]), a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]), int(a[7]))
        return 0
    ap = cli.ArgumentParser(prog="python -m bench.hier_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--local", type=int, default=4, help="training processes per host")
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--rto", type=float, default=0.05, help="the daemons' rto floor (s)")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, UdpSwitch(port=0) as sw:
        for job, mode in enumerate(("flat", "hier"), 1):
            rows.append(run_mode(sw, Path(tmp), mode, args.hosts, args.local, args.elements,
                                 args.calls, job, args.rto))
    load1 = os.getloadavg()
    print(f"{args.hosts} hosts x {args.local} processes, {args.elements} float32 elements "
          f"(dense), {args.calls} calls, rto {args.rto} s; load average {load0[0]:.2f} at start, "
          f"{load1[0]:.2f} at end, {os.cpu_count()} cores")
    print("| mode | switch datagrams/call | switch bytes/call | bytes on each host's link/call "
          "| resends (all calls) | median call (ms) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['switch_packets']:.0f} | {r['switch_bytes']:.0f} | "
              f"{', '.join(f'{b:.0f}' for b in r['host_bytes'])} | {r['resends']} | "
              f"{r['median_ms']:.1f} |")
    f, h = rows
    print(f"hier/flat: switch datagrams {h['switch_packets'] / f['switch_packets']:.4f}, "
          f"bytes {h['switch_bytes'] / f['switch_bytes']:.4f}, host link bytes "
          f"{sum(h['host_bytes']) / sum(f['host_bytes']):.4f}, call time "
          f"{h['median_ms'] / f['median_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
