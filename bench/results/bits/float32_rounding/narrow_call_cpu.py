"""One agent against an in-process software switch: the calling thread's CPU per dense call
(CallStats.phases["cpu"], from the scan on; with --whole, time.thread_time() around
Agent.allreduce, the residual's add before the scan included) of bench-train's gradient
(6,316,042 float32, in place), int32, 16-bit and 8-bit lanes (blocks of 256, 512, 1024; 56
rows a datagram), the narrow ones with error feedback (a residual kept across calls, as the
DDP hook keeps one per bucket); the widths alternating call by call, 1 warm-up and N timed
calls each.

    PYTHONPATH=<tree> python bench/results/bits/float32_rounding/narrow_call_cpu.py 8 [--whole]
"""
import statistics
import sys
import time

import numpy as np

from host_agent.local import LocalCluster
from softswitch.udp import UdpSwitch

N = 6316042
x0 = (np.random.default_rng(0).standard_normal(N) * 1e-3).astype(np.float32)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
whole = "--whole" in sys.argv
sw = UdpSwitch(port=0, slot_capacity=56 * 1024).start()
clusters = {bits: LocalCluster(1, job=j, switch=sw, lane_bits=bits, block_size=bs, nlanes=56,
                               slot_base=16 * (j - 1))
            for j, (bits, bs) in enumerate(((32, 256), (16, 512), (8, 1024)), 1)}
residuals = {bits: np.zeros(N, np.float32) for bits in (16, 8)}
cpu = {bits: [] for bits in clusters}
for i in range(reps + 1):
    for bits, c in clusters.items():
        a = c.agents[0]
        x = x0.copy()
        c0 = time.thread_time()
        a.allreduce(x, inplace=True, residual=residuals.get(bits))
        c1 = time.thread_time()
        if i:
            cpu[bits].append(1e3 * ((c1 - c0) if whole else a.last_stats.phases["cpu"]))
for bits, v in cpu.items():
    print(f"{bits}-bit: agent thread CPU per call {statistics.median(v):.2f} ms "
          f"(min {min(v):.2f})")
for c in clusters.values():
    c.close()
sw.stop()
