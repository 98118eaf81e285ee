"""Narrow lanes on loopback: bytes per call and call time of a dense float32 all-reduce with
32-, 16- and 8-bit lanes (docs/bits.md), the widths alternating call by call.

Every agent and the software switch run as threads of this one process (they share its GIL
and the machine's cores), so the times compare the widths with each other, not with gloo;
the load average before and after is printed with them.

    python -m bench.lanes_bench [--elements 1048576] [--workers 4] [--repeats 7]
                                [--switch-datapath compiled|python]
                                [--agent-datapath compiled|python]
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

from host_agent.agent import DATAPATHS, Agent
from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina import wire


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lanes_bench", description=__doc__)
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--switch-datapath", choices=("compiled", "python"), default="compiled",
                    help="the switch's UDP data path")
    ap.add_argument("--agent-datapath", choices=DATAPATHS, default="compiled",
                    help="the agents' (Agent(datapath=)): python rounds and decodes narrow "
                         "lanes in numpy, the reference")
    args = ap.parse_args(argv)
    n = args.workers
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(args.elements).astype(np.float32) for _ in range(n)]
    setups = {}
    for job_id, bits in enumerate(wire.LANE_BITS, start=1):
        job = local_job(n, job=job_id, slot_base=16 * (job_id - 1), lane_bits=bits)
        setups[bits] = job
    sw = UdpSwitch(port=0, pool_slots=64, datapath=args.switch_datapath)
    for job in setups.values():
        sw.add_job(job)
    sw.start()
    agents = {bits: [Agent(job, r, sw.address, datapath=args.agent_datapath) for r in range(n)]
              for bits, job in setups.items()}
    times = {bits: [] for bits in setups}
    sent = {}
    load0 = os.getloadavg()
    try:
        for _ in range(args.repeats):
            for bits, group in agents.items():
                done = [0.0] * n

                def rank(r, group=group, done=done):
                    t0 = time.perf_counter()
                    group[r].allreduce(xs[r])
                    done[r] = time.perf_counter() - t0
                threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                times[bits].append(max(done))
                s = group[0].last_stats
                sent[bits] = (s.bytes_sent, s.payload_bytes_sent, s.packets_sent)
    finally:
        for group in agents.values():
            for a in group:
                a.close()
        sw.stop()
    load1 = os.getloadavg()
    print(f"{n} workers, {args.elements} float32 elements, {args.repeats} calls per width, "
          f"switch data path {args.switch_datapath}, agents' {args.agent_datapath}; "
          f"load average {load0[0]:.2f} before, {load1[0]:.2f} after ({os.cpu_count()} cores)")
    print("| lanes | bytes sent per rank | data bytes | packets | median call (s) | min (s) |")
    print("|---|---|---|---|---|---|")
    for bits in setups:
        b, p, k = sent[bits]
        print(f"| {bits}-bit | {b} | {p} | {k} | {statistics.median(times[bits]):.3f} | "
              f"{min(times[bits]):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
