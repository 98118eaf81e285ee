"""Why the agent's `_deliver` is slow at low density: first touch of a fresh result buffer.

    python -m bench.first_touch

Writes 4% of the 256-element blocks of a 25M-element float32 result, 56 blocks at a time (as
the agent delivers one packet), into (a) a fresh np.zeros buffer, (b) a fresh buffer zero-filled
first, (c) a reused buffer zero-filled each time, (d) in place into an input that already holds
zeros where no block is written. Prints milliseconds and minor page faults of three repeats.
"""
from __future__ import annotations

import resource
import time

import numpy as np

N, B, LANES, FRACTION = 25_000_000, 256, 56, 0.04


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    nb = -(-N // B)
    rng = np.random.default_rng(0)
    blocks = np.sort(rng.choice(nb, int(FRACTION * nb), replace=False))
    data = rng.standard_normal((LANES, B)).astype(np.float32)

    def deliver(out2d):
        for i in range(0, len(blocks), LANES):
            w = blocks[i:i + LANES]
            out2d[w] = data[:len(w)]

    reused = np.zeros(nb * B, np.float32)
    reused[:] = 0
    x = np.zeros(nb * B, np.float32)
    x.reshape(nb, B)[blocks] = 1
    cases = {
        "fresh np.zeros, scattered writes": lambda: np.zeros(nb * B, np.float32),
        "fresh np.zeros, zero-filled first": lambda: _filled(np.zeros(nb * B, np.float32)),
        "reused buffer, zero-filled each call": lambda: _filled(reused),
        "in place into the input": lambda: x,
    }
    for name, make in cases.items():
        ms, flt = [], []
        for _ in range(3):
            f0, t0 = _faults(), time.perf_counter()
            deliver(make().reshape(nb, B))
            ms.append(round(1e3 * (time.perf_counter() - t0), 1))
            flt.append(_faults() - f0)
        print(f"{name:40s} {ms} ms, minor faults {flt}")


def _filled(a):
    a[:] = 0
    return a


if __name__ == "__main__":
    main()
