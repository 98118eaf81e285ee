"""Soak: many all-reduces of 1M elements in a row under 5% loss in both directions; every
result exact, and the switch's and agents' memory flat.

Run just this file: python -m pytest tests/test_soak.py -s
SPINA_SOAK_CALLS sets the number of calls (default 1000, `make test`'s; `make soak` runs 5000).
"""
from __future__ import annotations

import os
import time

import numpy as np

from host_agent.local import LocalCluster
from softswitch.udp import Faults, UdpSwitch

N = 1_000_000
CALLS = int(os.environ.get("SPINA_SOAK_CALLS", "1000"))


def _rss_bytes() -> int:
    """Current resident set size of this process (switch and agents run in it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_soak_exact_and_memory_flat():
    """CALLS all-reduces of 1M float32/int32 elements at 5% loss: all exact, memory flat."""
    rng = np.random.default_rng(0)
    nw, block = 4, 256
    nblocks = -(-N // block)
    faults = Faults(drop_in=0.05, drop_out=0.05, seed=1)
    t0 = time.monotonic()
    with UdpSwitch(port=0, faults=faults) as sw, \
            LocalCluster(nw, switch=sw, rto=0.005, timeout=60, nslots=32) as c:
        samples = []
        for call in range(CALLS):
            # a fresh sparsity pattern every call: 5% of the blocks at each worker
            padded = np.zeros((nw, nblocks, block), np.int32)
            for r in range(nw):
                nz = rng.choice(nblocks, nblocks // 20, replace=False)
                padded[r, nz] = rng.integers(-2**20, 2**20, (len(nz), block))
            xs = padded.reshape(nw, -1)[:, :N]
            res = c.allreduce([np.ascontiguousarray(x) for x in xs])
            exact = xs.sum(axis=0, dtype=np.int32)
            for r in res:
                assert (r == exact).all(), f"call {call}: wrong sum"
            if call in (CALLS // 10, CALLS - 1):
                samples.append((call, _rss_bytes()))
        counters = sw.pipeline.job_counters(c.job.job)
    (c1, rss1), (c2, rss2) = samples
    print(f"\nsoak: {CALLS} calls of {N} elements x {nw} workers at 5% loss each way in "
          f"{time.monotonic() - t0:.0f} s: all exact; dropped {faults.dropped_in} in / "
          f"{faults.dropped_out} out, {counters['job_duplicates']} duplicates recognised; "
          f"RSS (switch + agents) {rss1 / 1e6:.1f} MB at call {c1} -> {rss2 / 1e6:.1f} MB at "
          f"call {c2}")
    assert faults.dropped_in > 0 and faults.dropped_out > 0
    assert rss2 - rss1 < 32e6, "resident memory grows across calls"
