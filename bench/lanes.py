"""lanes: narrow lanes on loopback (docs/bits.md): bytes per call and call time of a dense
float32 all-reduce with 32-, 16- and 8-bit lanes, the widths alternating call by call.

    python -m bench lanes                                  # 4 ranks, 4 MiB, -l 32,16,8
    python -m bench lanes -b 32K -e 32K -g 2 -n 1 --agent-datapath python --switch-datapath python

Every agent and the software switch run as threads of this one process (they share its GIL
and the machine's cores), so the times compare the widths with each other, not with gloo:
the method is SpINA alone, a job per lane width on one switch, and `vs_32bit` is a width's
call time over the 32-bit call's in the same repeat (median). A repeat's time is the slowest
rank's. bytes_per_link: what rank 0's agent sent (UDP payload, headers included); every
result is checked against numpy's float64 sum within the width's quantization bound
(bench.procs.check_result), `wrong` counting the calls outside it. The reference paths:
--agent-datapath python (numpy rounding and decoding of narrow lanes), --switch-datapath
python.
"""
from __future__ import annotations

import os
import statistics
import threading
import time

import numpy as np

from bench.harness import method_rows
from bench.paired import paired_ratios
from bench.procs import Expected, check_result

DESCRIPTION = "narrow lanes: a dense all-reduce at 32-, 16- and 8-bit lanes, alternating"
METHODS = ("spina",)
DEFAULTS = dict(methods="spina", densities="1", lane_bits="32,16,8", begin="4M", end="4M",
                repeats=7)
EXTRA_COLUMNS = ("vs_32bit", "payload_bytes_per_link", "packets_per_link", "max_abs_err",
                 "agent_datapath", "switch_datapath")


def add_options(ap) -> None:
    from host_agent.agent import DATAPATHS
    ap.add_argument("--switch-datapath", choices=("compiled", "python"), default="compiled",
                    help="the switch's UDP data path (default %(default)s)")
    ap.add_argument("--agent-datapath", choices=DATAPATHS, default="compiled",
                    help="the agents' (Agent(datapath=)): python rounds and decodes narrow "
                         "lanes in numpy, the reference (default %(default)s)")


def check_options(a) -> str | None:
    if a.topo is not None or a.rates:
        return "argument -t/--topology: lanes runs on loopback, in one process"
    if a.densities != [1.0]:
        return "argument -d/--densities: lanes measures the dense call (give -d 1)"
    return None


def run(a, log):
    for n in a.workers:
        for size in a.sizes:
            yield measure(a, n, size // 4)


def measure(a, n: int, elements: int) -> list[dict]:
    """One switch, a job per width, n agents each as threads; the widths alternate."""
    from host_agent.agent import Agent
    from host_agent.launch import local_job
    from softswitch.udp import UdpSwitch
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(elements).astype(np.float32) for _ in range(n)]
    want = Expected(np.sum(xs, axis=0, dtype=np.float64),
                    np.sum(np.abs(xs), axis=0, dtype=np.float64),
                    float(max(np.abs(x).max() for x in xs)))
    widths = list(a.lane_bits)
    jobs = {bits: local_job(n, job=j, slot_base=16 * (j - 1), lane_bits=bits)
            for j, bits in enumerate(widths, start=1)}
    sw = UdpSwitch(port=0, pool_slots=16 * len(jobs), datapath=a.switch_datapath)
    for job in jobs.values():
        sw.add_job(job)
    sw.start()
    agents = {bits: [Agent(job, r, sw.address, datapath=a.agent_datapath) for r in range(n)]
              for bits, job in jobs.items()}
    times = {bits: [] for bits in jobs}
    wrong = {bits: 0 for bits in jobs}
    err = {bits: 0.0 for bits in jobs}
    sent = {}
    load0 = os.getloadavg()[0]
    try:
        for i in range(a.repeats + 1):  # i == 0: a warm-up, checked, not timed
            for bits in widths[i % len(widths):] + widths[:i % len(widths)]:
                group, done, res = agents[bits], [0.0] * n, [None] * n

                def rank(r, group=group, done=done, res=res):
                    t0 = time.perf_counter()
                    res[r] = group[r].allreduce(xs[r])
                    done[r] = time.perf_counter() - t0
                threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for r in range(n):
                    try:
                        err[bits] = max(err[bits], check_result(res[r], want, n, True, bits))
                    except AssertionError:
                        wrong[bits] += 1
                if i:
                    times[bits].append(max(done))
                s = group[0].last_stats
                sent[bits] = (s.bytes_sent, s.payload_bytes_sent, s.packets_sent)
    finally:
        for group in agents.values():
            for ag in group:
                ag.close()
        sw.stop()
    load = f"{load0:.2f}-{os.getloadavg()[0]:.2f}"
    rows = []
    for bits in widths:
        point = dict(size=4 * elements, elements=elements, dtype="float32", density=1.0,
                     workers=n, lane_bits=bits, rate="")
        vs = (round(statistics.median(paired_ratios(times[bits], times[32])), 4)
              if 32 in times else "")
        extras = {"spina": dict(vs_32bit=vs, payload_bytes_per_link=sent[bits][1],
                                packets_per_link=sent[bits][2], max_abs_err=err[bits],
                                agent_datapath=a.agent_datapath,
                                switch_datapath=a.switch_datapath)}
        rows += method_rows(a.what, point, {"spina": times[bits]}, bus="all_reduce",
                            sent={"spina": sent[bits][0]}, wrong={"spina": wrong[bits]},
                            load=load, extras=extras)
    return rows
