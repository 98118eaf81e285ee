"""agent: the host agent's CPU per call against an echo switch, optionally beside older agent
code.

    python -m bench agent                                  # this checkout's agent, 100 MB
    python -m bench agent --baseline /tmp/old -d 0.01,1    # and an older checkout's, alternating

One worker (-g 1), so the switch's result is the worker's own contribution: a child process
turns every contribution around (msg_type RESULT, bitmap 1) and sends it back, and the agent's
CPU time (time.process_time) per call measures the agent alone, without the 4-agent
benchmark's contention for the cores: `time_us` is that CPU time (median over -n repeats), not
wall time. Methods: `new` (this checkout) and, with --baseline DIR, `old`: DIR/host_agent
loaded as a renamed package (host_agent_baseline) in the same process, the calls alternating
old/new repeat by repeat so both see the same machine load; `vs_old` is new's CPU over old's
in the same repeat (median). Every sum is checked against the tensor (one worker: within
max|x| 2^-30) and, with a baseline, old's and new's bit for bit: `wrong` counts the calls that
failed either.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import shutil
import socket
import sys
import tempfile
import time

import numpy as np

from bench.harness import method_rows
from bench.paired import paired_ratios
from spina import cli, wire
from spina.config import JobConfig, WorkerAddr

DESCRIPTION = "the agent's CPU per call against an echo switch (and an older checkout's)"
METHODS = ("new", "old")
DEFAULTS = dict(methods="new", workers="1", begin="100000000", end="100000000",
                densities="0.01,0.1,1", repeats=7)
EXTRA_COLUMNS = ("vs_old", "packets", "cpu_us_per_packet")


def add_options(ap) -> None:
    ap.add_argument("--baseline", metavar="DIR", type=cli.existing_path,
                    help="an older checkout whose agent runs beside this one (method old)")


def check_options(a) -> str | None:
    if a.topo is not None or a.rates:
        return "argument -t/--topology: the echo switch is on loopback"
    if a.workers != [1]:
        return "argument -g/--workers: one worker (the echo switch answers one)"
    if a.baseline and not os.path.isdir(os.path.join(a.baseline, "host_agent")):
        return f"argument --baseline: {a.baseline!r} has no host_agent/"
    if a.baseline and "old" not in a.methods:
        a.methods = list(a.methods) + ["old"]
    if "old" in a.methods and not a.baseline:
        return "argument -m/--methods: old needs --baseline DIR"
    return None


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


def run(a, log):
    from host_agent.agent import Agent
    classes = {"new": Agent}
    if a.baseline:
        classes["old"] = load_baseline(a.baseline)
    classes = {m: classes[m] for m in a.methods}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    sw = ctx.Process(target=echo_switch, args=(q,), daemon=True)
    sw.start()
    port = q.get(timeout=30)
    try:
        for size in a.sizes:
            for d in a.densities:
                yield measure(a, classes, port, size // 4, d)
    finally:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", port))
        sw.join(timeout=10)


def measure(a, classes: dict, port: int, elements: int, d: float) -> list[dict]:
    """Every agent's CPU per call at one size and density, the agents alternating."""
    B, k, W = 256, 56, 16  # the all-reduce benchmark's base point (block 256, 56 lanes, 16 slots)
    rng = np.random.default_rng([elements, int(d * 1e6)])
    nb = max(1, elements // B)
    x = np.zeros(nb * B, np.float32)
    chosen = rng.choice(nb, max(1, int(d * nb)), replace=False)
    x.reshape(nb, B)[chosen] = rng.standard_normal((len(chosen), B), np.float32)
    made = {}
    for name, cls in classes.items():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        job = JobConfig(job=1, workers=(WorkerAddr(0, *s.getsockname()),), block_size=B,
                        nlanes=k, nslots=W)
        made[name] = cls(job, 0, ("127.0.0.1", port), sock=s, rto=1.0)
    cpu = {name: [] for name in made}
    wrong = {name: 0 for name in made}
    # One worker: the sum is the tensor, quantized: within 2**(e-31) of it where |x| < 2**e
    # in the slot (docs/aggregation.md), so within max|x| * 2**-30.
    bound = float(np.abs(x).max()) * 2.0 ** -30
    load0 = os.getloadavg()[0]
    try:
        for r in range(a.repeats + 1):  # the first repeat warms up (checked)
            sums = {}
            for name in (list(made) if r % 2 else list(made)[::-1]):
                buf = x.copy()
                c0 = time.process_time()
                got = made[name].allreduce(buf, inplace=True)
                c1 = time.process_time()
                if r:
                    cpu[name].append(c1 - c0)
                wrong[name] += int(np.abs(got - x).max() > bound)
                sums[name] = got.tobytes()
            if len(sums) == 2 and sums["old"] != sums["new"]:
                wrong["new"] += 1  # the two agents' sums differ
        packets = made[next(iter(made))].last_stats.packets_sent
    finally:
        for ag in made.values():
            ag.close()
    extras = {name: dict(packets=packets, cpu_us_per_packet=round(
        1e6 * float(np.median(v)) / packets, 3)) for name, v in cpu.items()}
    if "old" in cpu and "new" in cpu:
        extras["new"]["vs_old"] = round(float(np.median(paired_ratios(cpu["new"], cpu["old"]))),
                                        4)
    point = dict(size=4 * len(x), elements=len(x), dtype="float32", density=d, workers=1,
                 lane_bits=32, rate="")
    return method_rows(a.what, point, cpu, bus="none", wrong=wrong,
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)
