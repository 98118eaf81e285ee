"""first_touch: why the agent's delivery is slow at low density: the first touch of a fresh
result buffer (docs/profile.md).

    python -m bench first_touch                          # 100 MB, 4% of the blocks
    python -m bench first_touch -b 1M -e 1M -d 0.04 -n 1

Writes a fraction (-d) of the 256-element blocks of a float32 result of the size, 56 blocks
at a time (as the agent delivers one packet), into, per method: `fresh` a fresh np.zeros
buffer, `fresh_filled` a fresh buffer zero-filled first, `reused` a reused buffer zero-filled
each call, `in_place` the input, which already holds zeros where no block is written. The
methods alternate repeat by repeat in this one process (time: the whole delivery, allocation
and zero-fill included); besides the harness's columns, the minor page faults per call. Every
result is checked: the written blocks hold the data, every other element is zero (`wrong`).
"""
from __future__ import annotations

import os
import resource
import statistics
import time

import numpy as np

from bench.harness import method_rows

B, LANES = 256, 56
DESCRIPTION = "writing a call's result into a fresh, a reused or the input buffer (faults)"
METHODS = ("fresh", "fresh_filled", "reused", "in_place")
DEFAULTS = dict(methods=",".join(METHODS), workers="1", densities="0.04", begin="100000000",
                end="100000000", repeats=3)
EXTRA_COLUMNS = ("minor_faults",)


def check_options(a) -> str | None:
    if a.topo is not None or a.rates or a.workers != [1]:
        return "argument -t/--topology, -g/--workers: first_touch runs in this one process"
    return None


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _filled(a):
    a[:] = 0
    return a


def run(a, log):
    for size in a.sizes:
        for d in a.densities:
            yield measure(a, size, d)


def measure(a, size: int, density: float) -> list[dict]:
    nb = max(1, size // 4 // B)
    rng = np.random.default_rng(0)
    blocks = np.sort(rng.choice(nb, max(1, int(density * nb)), replace=False))
    data = rng.standard_normal((LANES, B)).astype(np.float32)
    reused = _filled(np.zeros(nb * B, np.float32))
    x = np.zeros(nb * B, np.float32)
    x.reshape(nb, B)[blocks] = 1
    make = {"fresh": lambda: np.zeros(nb * B, np.float32),
            "fresh_filled": lambda: _filled(np.zeros(nb * B, np.float32)),
            "reused": lambda: _filled(reused),
            "in_place": lambda: x}
    want = np.zeros((nb, B), np.float32)
    for i in range(0, len(blocks), LANES):
        want[blocks[i:i + LANES]] = data[:len(blocks[i:i + LANES])]
    times = {m: [] for m in a.methods}
    faults = {m: [] for m in a.methods}
    wrong = {m: 0 for m in a.methods}
    load0 = os.getloadavg()[0]
    for r in range(a.repeats + 1):  # r == 0: a warm-up, checked
        k = r % len(a.methods)
        for m in a.methods[k:] + a.methods[:k]:
            f0, t0 = _faults(), time.perf_counter()
            out = make[m]().reshape(nb, B)
            for i in range(0, len(blocks), LANES):  # one packet's blocks at a time
                w = blocks[i:i + LANES]
                out[w] = data[:len(w)]
            dt, df = time.perf_counter() - t0, _faults() - f0
            wrong[m] += int(not np.array_equal(out, want))
            if r:
                times[m].append(dt)
                faults[m].append(df)
    point = dict(size=nb * B * 4, elements=nb * B, dtype="float32", density=density,
                 workers=1, lane_bits=32, rate="")
    extras = {m: dict(minor_faults=round(statistics.median(faults[m]))) for m in a.methods}
    return method_rows(a.what, point, times, bus="none", wrong=wrong,
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)
