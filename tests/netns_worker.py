"""One worker of an integration test, run inside a host's network namespace.

    python -m tests.netns_worker JOB_JSON RANK SWITCH_IP SWITCH_PORT SEED N [DENSITY [CALLS]]

Runs one int32 and one float32 all-reduce (CALLS "ints": the int32 one only) of the
deterministic tensors `tensors(seed, n, rank, density)` (DENSITY: the fraction of non-zero
blocks, default 0.3) and prints a JSON line with their results' checksums, so the test can
compare exactly, and each call's wire counts (packets, resends).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from host_agent.agent import Agent
from spina.config import JobConfig


def tensors(seed: int, n: int, rank: int, density: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """A sparse int32 and a sparse float32 tensor, different per rank, zero in whole blocks
    (each block non-zero with probability `density`)."""
    rng = np.random.default_rng(seed * 1000 + rank)
    mask = np.repeat(rng.random(-(-n // 32)) < density, 32)[:n]
    ints = np.where(mask, rng.integers(-1000, 1000, n), 0).astype(np.int32)
    floats = np.where(mask, rng.standard_normal(n), 0).astype(np.float32)
    return ints, floats


def digest(a: np.ndarray) -> str:
    import hashlib
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main(argv):
    job = JobConfig.from_dict(json.loads(argv[1]))
    rank, switch = int(argv[2]), (argv[3], int(argv[4]))
    seed, n = int(argv[5]), int(argv[6])
    density = float(argv[7]) if len(argv) > 7 else 0.3
    calls = argv[8] if len(argv) > 8 else "both"
    ints, floats = tensors(seed, n, rank, density)
    stats = []
    with Agent(job, rank, switch, timeout=20) as agent:
        isum = agent.allreduce(ints)
        stats.append(agent.last_stats)
        if calls != "ints":
            fsum = agent.allreduce(floats)
            stats.append(agent.last_stats)
    all_t = [tensors(seed, n, r, density) for r in range(job.nworkers)]
    want_i = np.sum([t[0] for t in all_t], axis=0, dtype=np.int64).astype(np.int32)
    report = {"rank": rank, "ints_exact": bool((isum == want_i).all()), "ints": digest(isum),
              "calls": [{"packets_sent": s.packets_sent, "resends": s.resends,
                         "fast_resends": s.fast_resends, "timeout_resends": s.timeout_resends,
                         "spurious_resends": s.spurious_resends,
                         "packets_received": s.packets_received} for s in stats]}
    if calls != "ints":
        want_f = np.sum([t[1].astype(np.float64) for t in all_t], axis=0)
        report.update(float_err=float(np.abs(fsum - want_f).max()), floats=digest(fsum))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv)
