"""The collectives (collectives/schedule.py, p2p.py) and their DDP hook
(host_agent/hooks/collective.py): exact against numpy.

Run just this file: python -m pytest tests/test_collectives.py

The schedules are checked symbolically for every world size 1..9 and grouping (who holds
which contributions after each step). Then 4 and 8 gloo processes on loopback
(tests/collectives_worker.py: one process forks the ranks) run every algorithm on lengths
1, 3, 5, 37 and 1001 (shorter than and not divisible by the world size), also on sub-groups of
6 and 3 ranks; int32 must equal numpy's sum, float32 must equal numpy summing in the documented
order, bit for bit, on every rank; the DDP hook must give DDP's averaged gradients.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from collectives.schedule import ALGORITHMS, ScheduleError, check_groups, chunk_bounds, schedule
from softswitch.udp import UdpSwitch
from spina.net import free_port, free_ports
from tests.collectives_worker import (
    LENGTHS,
    SWITCH_CASES,
    case_input,
    cases,
    gather_cases,
    grads,
    model_and_input,
    switch_jobs,
)

ROOT = Path(__file__).resolve().parents[1]
WORKER = ("-m", "tests.collectives_worker")  # run from ROOT (cwd=ROOT)


# ----------------------------------------------------------------------------- schedules
def symbolic(collective, algorithm, p, groups=None):
    """Run a schedule on tuples: state[r][c] = the ranks whose values chunk c at rank r holds,
    in the order they were added (all-gather: the one rank it came from)."""
    s = schedule(collective, algorithm, p, groups)
    if collective == "all_gather":
        st = [[(r,) if c == r else None for c in range(p)] for r in range(p)]
    else:
        st = [[(r,)] * p for r in range(p)]
    for step in s.steps:
        assert len({(t.src, t.dst) for t in step}) == len(step), "one message per pair and step"
        before = [list(row) for row in st]
        adds = {}
        for t in step:
            for c in t.chunks:
                assert before[t.src][c] is not None, "sent a chunk it does not hold"
                if t.reduce:
                    adds.setdefault((t.dst, c), []).append(before[t.src][c])
                else:
                    st[t.dst][c] = before[t.src][c]
        for (d, c), parts in adds.items():
            st[d][c] = sum(parts, ()) + before[d][c]
    return s, st


def groupings(algorithm, p):
    if algorithm.startswith("2d"):
        return [g for g in range(1, p + 1) if p % g == 0]
    return [None]


def test_schedules_sum_every_rank_once_for_all_sizes():
    """Every schedule, p = 1..9, every grouping: each chunk sums each rank exactly once."""
    for p in range(1, 10):
        for alg in ALGORITHMS:
            for g in groupings(alg, p):
                _, ar = symbolic("all_reduce", alg, p, g)
                _, rs = symbolic("reduce_scatter", alg, p, g)
                _, ag = symbolic("all_gather", alg, p, g)
                for c in range(p):
                    assert sorted(rs[c][c]) == list(range(p)), (alg, p, g, c)
                    for r in range(p):
                        assert ar[r][c] == ar[c][c], "all ranks: the owner's sum, copied"
                        assert sorted(ar[r][c]) == list(range(p)), (alg, p, g, r, c)
                        assert ag[r][c] == (c,), (alg, p, g, r, c)


def test_schedules_step_counts():
    """Steps as the algorithms promise: ring 2(p-1), halving-doubling 2 log p (+2 folds),
    direct 2, 2d 2(g-1) + 2(G-1) with a ring inside and 2 + 2(G-1) with a full mesh."""
    assert len(schedule("all_reduce", "ring", 8).steps) == 14
    assert len(schedule("all_reduce", "halving-doubling", 8).steps) == 6
    assert len(schedule("all_reduce", "halving-doubling", 6).steps) == 8
    assert len(schedule("all_reduce", "direct", 8).steps) == 2
    assert len(schedule("all_reduce", "2d-ring", 8, 4).steps) == 6 + 2
    assert len(schedule("all_reduce", "2d-direct", 8, 4).steps) == 2 + 2
    assert len(schedule("reduce_scatter", "ring", 5).steps) == 4
    assert schedule("all_reduce", "ring", 1).steps == ()


def test_documented_orders():
    """The orders collectives/schedule.py documents, chunk 0 of 4 ranks (groups of 2)."""
    assert symbolic("all_reduce", "ring", 4)[1][0][0] == (1, 2, 3, 0)
    assert symbolic("all_reduce", "direct", 4)[1][0][0] == (1, 2, 3, 0)
    assert symbolic("all_reduce", "2d-ring", 4, 2)[1][0][0] == (3, 2, 1, 0)
    assert symbolic("all_reduce", "2d-direct", 4, 2)[1][0][0] == (3, 2, 1, 0)


def test_chunk_bounds_are_array_split():
    """Chunk c is numpy.array_split's c-th part, also with more ranks than elements."""
    for n in (0, 1, 3, 8, 37, 1001):
        for p in (1, 3, 4, 8):
            b = chunk_bounds(n, p)
            assert [b[c + 1] - b[c] for c in range(p)] == [len(a) for a in
                                                          np.array_split(np.arange(n), p)]


def test_bad_input_names_the_field():
    """Unknown names and bad groupings are one-line errors naming the field."""
    for args, msg in ((("all_sum", "ring", 4), "collective: 'all_sum' is not one of"),
                      (("all_reduce", "tree", 4), "algorithm: 'tree' is not one of"),
                      (("all_reduce", "ring", 0), "world size: need at least 1 rank"),
                      (("all_reduce", "2d-ring", 4), "groups: algorithm 2d-ring needs"),
                      (("all_reduce", "2d-ring", 6, 4), "groups: a group size of 4 does not"),
                      (("all_reduce", "2d-ring", 4, [[0, 1], [1, 2]]), "groups: must hold"),
                      (("all_reduce", "2d-ring", 4, [[0, 1, 2], [3]]), "groups: every group")):
        with pytest.raises(ScheduleError, match=msg.replace("(", r"\(")):
            schedule(*args)
    assert check_groups([[0, 2], [1, 3]], 4) == ((0, 2), (1, 3))


# ----------------------------------------------------------------------------- references
def ordered_sum(xs, order):
    """xs[order[0]] + xs[order[1]] + ... left to right in float32 (int32: wrapping)."""
    acc = xs[order[0]].copy()
    for r in order[1:]:
        acc += xs[r]
    return acc


def reference(xs, alg, groups):
    """The documented order of collectives/schedule.py, per chunk, in numpy."""
    p = len(xs)
    b = chunk_bounds(len(xs[0]), p)
    out = np.empty_like(xs[0])
    for c in range(p):
        part = [x[b[c]:b[c + 1]] for x in xs]
        if alg in ("ring", "direct"):
            v = ordered_sum(part, [(c + k) % p for k in range(1, p + 1)])
        elif alg == "halving-doubling":  # power-of-two worlds only
            vals, m = list(part), p // 2
            while m:
                vals = [vals[q] + vals[q ^ m] for q in range(p)]
                m //= 2
            v = vals[c]
        else:
            grp = check_groups(groups, p)
            gi, li = next((i, g.index(c)) for i, g in enumerate(grp) if c in g)
            gs = len(grp[0])
            inner = [ordered_sum([part[r] for r in g], [(li + k) % gs for k in range(1, gs + 1)])
                     for g in grp]
            v = ordered_sum(inner, [(gi + k) % len(grp) for k in range(1, len(grp) + 1)])
        out[b[c]:b[c + 1]] = v
    return out


# ----------------------------------------------------------------------------- processes
def run_world(world: int, out: Path, switch: UdpSwitch | None = None) -> list[dict]:
    """Run `world` ranks on loopback gloo (one process that forks the others); return their
    results. The process is stopped, also when it fails; its ranks die with it. With
    `switch` (4 ranks), the ranks' agents' jobs are admitted to it first."""
    port = free_port()
    extra = []
    if switch is not None:
        ports = free_ports(6)
        for job in switch_jobs(ports):
            switch.add_job(job)
        extra = [",".join(map(str, [switch.address[1], *ports]))]
    proc = subprocess.Popen([sys.executable, *WORKER, str(world), str(port), str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        err = proc.communicate(timeout=300)[1]
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(world)]


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    """4 ranks, with the software switch for the all-gathers through it (its counters kept
    in the results' first dict under "switch/...")."""
    sw = UdpSwitch(port=0).start()
    try:
        res = run_world(4, tmp_path_factory.mktemp("w4"), sw)
        res[0]["switch/packets_in"] = sw.packets_in
    finally:
        sw.stop()
    return res


@pytest.fixture(scope="module")
def world8(tmp_path_factory):
    return run_world(8, tmp_path_factory.mktemp("w8"))


def check_world(res: list[dict], world: int) -> int:
    """Compare every case of a run with numpy; returns the number of arrays checked."""
    checked = 0
    for key, ranks, alg, groups in cases(world):
        ranks = list(range(world)) if ranks is None else ranks
        p = len(ranks)
        pow2 = p & (p - 1) == 0
        for n in LENGTHS:
            b = chunk_bounds(n, p)
            for dtype in ("int32", "float32"):
                xs = [case_input(i, n, dtype, 1) for i in ranks]
                got = [res[r][f"{key}/ar/{dtype}/{n}"] for r in ranks]
                if dtype == "int32":
                    want = np.sum(xs, axis=0, dtype=np.int32)
                elif alg == "halving-doubling" and not pow2:
                    want = got[0]  # its fold's order is not re-derived here: same bits on all ranks
                    assert np.allclose(want, np.sum(xs, axis=0, dtype=np.float64), rtol=1e-4,
                                       atol=1e-3 * np.abs(xs).sum(axis=0).max())
                else:
                    want = reference(xs, alg, groups)
                for g in got:
                    assert g.dtype == want.dtype and g.tobytes() == want.tobytes(), (key, dtype, n)
                checked += len(got)
            ar = res[ranks[0]][f"{key}/ar/float32/{n}"]  # same input: same RS phase, bits
            for i, r in enumerate(ranks):
                mine = res[r][f"{key}/rs/float32/{n}"]
                assert mine.tobytes() == ar[b[i]:b[i + 1]].tobytes(), (key, n, i)
                ag = res[r][f"{key}/ag/float32/{n}"]
                want = np.concatenate([case_input(j, n, "float32", 3)[:b[k + 1] - b[k]]
                                       for k, j in enumerate(ranks)])
                assert ag.tobytes() == want.tobytes(), (key, n, i)
                checked += 2
    return checked


def gathered(ranks, n, dtype="float32", seed=3) -> np.ndarray:
    """The flat all-gather's result: each rank's shard (chunk i of n), concatenated."""
    b = chunk_bounds(n, len(ranks))
    return np.concatenate([case_input(j, n, dtype, seed)[:b[k + 1] - b[k]]
                           for k, j in enumerate(ranks)])


def check_gathers(res: list[dict], world: int) -> int:
    """The all-gather-only cases (leader-ring): every rank the flat result, bit for bit."""
    checked = 0
    for key, ranks, _, _ in gather_cases(world):
        ranks = list(range(world)) if ranks is None else ranks
        for n in LENGTHS:
            want = gathered(ranks, n)
            for r in ranks:
                assert res[r][f"{key}/ag/float32/{n}"].tobytes() == want.tobytes(), (key, n, r)
                checked += 1
    return checked


def test_four_ranks_exact(world4):
    """4 ranks (2d: 2 x 2): int32 exact, float32 bit-identical to the documented order."""
    assert check_world(world4, 4) == len(cases(4)) * len(LENGTHS) * 4 * 4
    assert check_gathers(world4, 4) == len(gather_cases(4)) * len(LENGTHS) * 4


def test_eight_ranks_and_subgroups_exact(world8):
    """8 ranks (2d: 2 x 4 and 4 x 2), sub-groups of 6 (2 x 3, 3 x 2) and 3 ranks."""
    ranks = sum(8 if r is None else len(r) for _, r, _, _ in cases(8))
    assert check_world(world8, 8) == ranks * len(LENGTHS) * 4
    ranks = sum(8 if r is None else len(r) for _, r, _, _ in gather_cases(8))
    assert check_gathers(world8, 8) == ranks * len(LENGTHS)


def test_all_gathers_through_the_switch(world4):
    """"switch" (Agent.allgather of every rank) and "leader-switch" (inside the groups
    {0, 2} and {1, 3} over gloo, between the leaders 0 and 1 through the switch): every rank
    holds the flat all-gather's result bit for bit, float32 on every length (shards of
    unequal sizes, padded on the wire) and int32; the switch saw their packets."""
    for alg, _ in SWITCH_CASES:
        for r in range(4):
            for n in LENGTHS:
                got = world4[r][f"{alg}/ag/float32/{n}"]
                assert got.tobytes() == gathered(range(4), n).tobytes(), (alg, r, n)
            got = world4[r][f"{alg}/ag/int32/37"]
            assert got.dtype == np.int32
            assert got.tobytes() == gathered(range(4), 37, "int32").tobytes(), (alg, r)
    # one packet per rank (flat: 4) or leader (2) and call, every shard under one chunk
    calls = len(LENGTHS) + 1
    assert world4[0]["switch/packets_in"] >= calls * (4 + 2)


def test_order_matters_so_the_check_can_fail():
    """The float32 data are such that another order gives other bits (the check is real)."""
    xs = [case_input(i, 1001, "float32", 1) for i in range(4)]
    ring = reference(xs, "ring", None)
    assert ring.tobytes() != ordered_sum(xs, [0, 1, 2, 3]).tobytes()
    assert ring.tobytes() != reference(xs, "halving-doubling", None).tobytes()


def test_ddp_hook_gives_the_average_gradient(world4):
    """DDP with the hook: every algorithm gives the mean of the ranks' own gradients."""
    local = [grads(*model_and_input(r)) for r in range(4)]  # each rank alone, no DDP
    for alg in ("ring", "halving-doubling", "direct", "2d-ring", "2d-direct"):
        assert int(world4[0][f"ddp/{alg}/calls"]) >= 2, "the model spans several buckets"
        for i in range(3):
            want = np.mean([g[i] for g in local], axis=0).astype(np.float32)
            for w in world4:
                assert w[f"ddp/{alg}/{i}"].tobytes() == want.tobytes(), (alg, i)
