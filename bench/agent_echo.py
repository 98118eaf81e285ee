"""The host agent's CPU per call against an echo switch, optionally beside older agent code.

    python -m bench.agent_echo                          # this checkout's agent
    python -m bench.agent_echo --baseline /tmp/old      # and an older checkout's, alternating

One worker, so the switch's result is the worker's own contribution: a child process turns
every contribution around (msg_type RESULT, bitmap 1) and sends it back, and the agent's
CPU time (time.process_time) per call measures the agent alone, without the 4-agent
benchmark's contention for the cores. --baseline DIR loads DIR/host_agent as a renamed
package (host_agent_baseline) in the same process and alternates calls old/new repeat by
repeat, so both see the same machine load; the ratio of medians is the comparison.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import sys
import tempfile
import time

import numpy as np

from spina import wire
from spina.cli import ArgumentParser, fail, int_range, positive_float
from spina.config import JobConfig, WorkerAddr


def echo_switch(port_q) -> None:
    """Answer every contribution with itself as the result (a one-worker switch)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
    port_q.put(s.getsockname()[1])
    buf = bytearray(wire.MAX_UDP_PAYLOAD + 1)
    view = memoryview(buf)
    mt, bitmap = wire.FIELD_OFFSET["msg_type"], wire.FIELD_OFFSET["bitmap"]
    while True:
        n, addr = s.recvfrom_into(buf)
        if n == 1:  # the stop datagram
            return
        if buf[mt] == wire.MSG_CONTRIB:
            buf[mt], buf[bitmap + 3] = wire.MSG_RESULT, 1
            s.sendto(view[:n], addr)


def load_baseline(path: str):
    """The Agent class of the checkout at `path`, imported as host_agent_baseline."""
    tmp = tempfile.mkdtemp(prefix="spina-baseline-")
    dst = os.path.join(tmp, "host_agent_baseline")
    shutil.copytree(os.path.join(path, "host_agent"), dst)
    for name in os.listdir(dst):
        if name.endswith(".py"):
            p = os.path.join(dst, name)
            with open(p) as f:
                # both `host_agent.x` and `from host_agent import _core` (its own compiled core)
                src = re.sub(r"\bhost_agent(?=\.|\s+import\b)", "host_agent_baseline", f.read())
            with open(p, "w") as f:
                f.write(src)
    sys.path.insert(0, tmp)
    from host_agent_baseline.agent import Agent
    return Agent


def main(argv=None) -> int:
    ap = ArgumentParser(prog="bench.agent_echo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=positive_float, default=25e6)
    ap.add_argument("--densities", default="0.01,0.1,1.0", help="comma-separated, each in (0, 1]")
    ap.add_argument("--repeats", type=int_range(1, 1000), default=7)
    ap.add_argument("--baseline", metavar="DIR", help="an older checkout to compare with")
    a = ap.parse_args(argv)
    try:
        densities = [float(v) for v in a.densities.split(",")]
    except ValueError:
        return fail(ap.prog, f"argument --densities: {a.densities!r} is not a list of numbers")
    if not all(0 < d <= 1 for d in densities):
        return fail(ap.prog, f"argument --densities: {a.densities!r}: each must be in (0, 1]")
    if a.baseline and not os.path.isdir(os.path.join(a.baseline, "host_agent")):
        return fail(ap.prog, f"argument --baseline: {a.baseline!r} has no host_agent/")
    a.elements = int(a.elements)
    from host_agent.agent import Agent
    agents = {"new": Agent}
    if a.baseline:
        agents = {"old": load_baseline(a.baseline), "new": Agent}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    sw = ctx.Process(target=echo_switch, args=(q,), daemon=True)
    sw.start()
    port = q.get(timeout=30)
    B, k, W = 256, 56, 16  # the all-reduce benchmark's base point (block 256, 56 lanes, 16 slots)
    rng = np.random.default_rng(0)
    report = {"load_before": open("/proc/loadavg").read().split()[:3]}
    for d in densities:
        nb = a.elements // B
        x = np.zeros(nb * B, np.float32)
        chosen = rng.choice(nb, max(1, int(d * nb)), replace=False)
        x.reshape(nb, B)[chosen] = rng.standard_normal((len(chosen), B), np.float32)
        made = {}
        for name, cls in agents.items():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            job = JobConfig(job=1, workers=(WorkerAddr(0, *s.getsockname()),), block_size=B,
                            nlanes=k, nslots=W)
            made[name] = cls(job, 0, ("127.0.0.1", port), sock=s, rto=1.0)
        cpu = {name: [] for name in made}
        sums = {}
        # One worker: the sum is the tensor, quantized: within 2**(e-31) of it where
        # |x| < 2**e in the slot (docs/aggregation.md), so within max|x| * 2**-30.
        bound = float(np.abs(x).max()) * 2.0 ** -30
        for r in range(a.repeats + 1):  # the first repeat warms up
            for name in (list(made) if r % 2 else list(made)[::-1]):
                buf = x.copy()
                c0 = time.process_time()
                got = made[name].allreduce(buf, inplace=True)
                c1 = time.process_time()
                if r:
                    cpu[name].append(c1 - c0)
                else:
                    sums[name] = got
                    if np.abs(got - x).max() > bound:
                        raise SystemExit(f"{name}: sum off by more than {bound:g} at density {d:g}")
        if len(sums) == 2 and sums["old"].tobytes() != sums["new"].tobytes():
            raise SystemExit(f"old and new agents differ at density {d:g}")
        packets = made["new"].last_stats.packets_sent
        row = {name: dict(cpu_s_median=float(np.median(v)), cpu_s=[round(c, 4) for c in v],
                          us_per_packet_median=1e6 * float(np.median(v)) / packets)
               for name, v in cpu.items()}
        row["packets"] = packets
        if "old" in cpu:
            row["new_over_old"] = float(np.median(cpu["new"]) / np.median(cpu["old"]))
        report[f"{d:g}"] = row
        ratio = f"; new/old {row['new_over_old']:.2f}" if "old" in cpu else ""
        print(f"density {d:g}: {packets} packets; " + ", ".join(
            f"{n} {1e3 * r['cpu_s_median']:.1f} ms CPU/call" for n, r in row.items()
            if isinstance(r, dict)) + ratio)
        for ag in made.values():
            ag.close()
    report["load_after"] = open("/proc/loadavg").read().split()[:3]
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", port))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
