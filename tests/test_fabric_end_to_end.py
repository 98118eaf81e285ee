"""Two-level aggregation end to end on UDP-mode software switches: 8 workers in 2 racks and
larger fabrics, loss on every switch, a silent worker, sharding, new epochs, spine restarts,
bounded loss across both levels (bench.scale_out.FabricCluster).

Run just this file: python -m pytest tests/test_fabric_end_to_end.py
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from bench.scale_out import FabricCluster, flat, tensors
from controller import plan
from controller.controller import program_in_process
from host_agent.agent import Agent, SpinaTimeout
from softswitch.udp import Faults, UdpSwitch
from spina import wire
from tests.waits import until


# ---------------------------------------------------------------- end to end: 8 workers, 2 racks
@pytest.fixture
def fabric():
    with FabricCluster() as f:
        yield f


@pytest.mark.parametrize("density", [0.01, 1.0])
def test_two_levels_are_exact_and_bit_identical(fabric, density):
    """8 workers in 2 racks through 2 leaves and a spine: int32 sums exact, float32 results
    bit-identical on every rank and to flat aggregation on one switch."""
    ints = tensors(density, 1, integer=True)
    for r in fabric.allreduce(ints):
        assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
    floats = tensors(density, 2)
    got = fabric.allreduce(floats)
    want, _, _ = flat(floats)
    for r in got:
        assert r.tobytes() == got[0].tobytes() == want[0].tobytes()
    assert np.abs(got[0] - np.sum(floats, axis=0, dtype=np.float64)).max() < 1e-5
    # Per level: each rack's 4 contributions per round at its leaf, 2 partials at the spine.
    st = plan.status(fabric.plan, dict(zip(("leaf0", "leaf1", "spine0"), fabric.switches)))
    spine_rounds = st["spine"]["spine0"][7]["job_aggregated"] // 2
    assert spine_rounds >= 2 * 4  # two calls, at least their setup rounds on 4 slots
    for leaf in ("leaf0", "leaf1"):
        assert st["leaf"][leaf][7]["job_aggregated"] == 4 * spine_rounds
    # one result per leaf and round, plus answers to resends (a loaded machine times out)
    assert st["spine"]["spine0"][7]["job_results"] >= 2 * spine_rounds


def test_sixteen_workers_in_four_racks():
    """16 workers in 4 racks of 4, slots sharded over 2 spines, 1% loss and reordering on every
    switch: int32 sums exact on every rank at 1% and 100% density."""
    faults = lambda i: Faults(drop_in=0.01, drop_out=0.01, reorder=0.01, seed=40 + i)  # noqa: E731
    with FabricCluster(racks=4, spines=2, faults=faults) as f:
        for density in (0.01, 1.0):
            ints = tensors(density, 6, nranks=16, integer=True)
            want = np.sum(ints, axis=0, dtype=np.int32)
            for r in f.allreduce(ints):
                assert np.array_equal(r, want)


def lossy(racks: int, spines: int):
    """Switch i's faults: 1% lost, duplicated and reordered; a spine, which sees only its share
    (1/spines) of the leaves' partials, a few hundred datagrams here, loses spines x 1% so
    that each one surely loses some (at 1% one of 2 spines lost none in a CI run)."""
    def faults(i: int) -> Faults:
        drop = 0.01 if i < racks else 0.01 * spines
        return Faults(drop_in=drop, drop_out=drop, duplicate=0.01, reorder=0.01, seed=70 + i)
    return faults


@pytest.mark.parametrize("racks,per_rack,spines", [
    (2, 20, 1),          # 40 workers: more than one switch's 32
    (3, [3, 32, 6], 1),  # 41 workers in unequal racks, one of them full (32)
    (2, 20, 2),          # 40 workers, the slots sharded over 2 spines (2 slot groups of 2)
])
def test_more_than_32_workers_with_loss_on_every_switch(racks, per_rack, spines):
    """A job of more than 32 workers (each sends its rank within its rack; the job's total N
    in the quantization), 1% of datagrams (a spine's: spines x 1%) lost into and out of each switch,
    1% duplicated, 1% reordered: int32 sums exact on every rank and float32 results
    bit-identical on every rank, within the quantization's bound of the float64 sum, at 1% and
    100% density."""
    n = racks * per_rack if isinstance(per_rack, int) else sum(per_rack)
    with FabricCluster(racks=racks, per_rack=per_rack, spines=spines, faults=lossy(racks, spines),
                       nlanes=4) as f:
        assert f.job.nworkers == n > 32
        for density in (0.01, 1.0):
            ints = tensors(density, 30, n=1 << 16, nranks=n, integer=True)
            want = np.sum(ints, axis=0, dtype=np.int32)
            for r in f.allreduce(ints):
                assert np.array_equal(r, want)
            floats = tensors(density, 31, n=1 << 16, nranks=n)
            got = f.allreduce(floats)
            for r in got:
                assert r.tobytes() == got[0].tobytes()
            exact = np.sum(floats, axis=0, dtype=np.float64)
            # S = 30 - ceil(log2 N) - E: each of N values is off by at most 2**(E-30+6)/2.
            bound = n * 2.0 ** (np.ceil(np.log2(np.abs(np.concatenate(floats)).max())) - 25)
            assert np.abs(got[0] - exact).max() <= bound + 1e-6 * np.abs(exact).max()
        lost = [s.faults.dropped_in + s.faults.dropped_out for s in f.switches]
        assert min(lost) > 0, f"a switch lost nothing ({lost}): the test proved less"
        st = plan.status(f.plan, {f"leaf{i}": s for i, s in enumerate(f.leaves)}
                         | {f"spine{j}": s for j, s in enumerate(f.spines)})
        assert sorted(st["leaf"]) == [f"leaf{i}" for i in range(racks)]


def test_a_silent_worker_is_named_by_its_job_rank():
    """40 workers in 2 racks of 20; job rank 25 (rank 5 within rack 1) never calls. Its rack's
    agents time out naming rank 25 (their leaf's status names local ranks); rack 0's agents,
    whose leaf's status says the whole rack is in, name the other rack's ranks as "some of"."""
    with FabricCluster(racks=2, per_rack=20, timeout=2.0) as f:
        ints = tensors(1.0, 32, n=1 << 12, nranks=40, integer=True)
        futs = {r: f.pool.submit(f.agents[r].allreduce, ints[r]) for r in range(40) if r != 25}
        errors = {}
        for r, fut in futs.items():
            with pytest.raises(SpinaTimeout) as e:
                fut.result()
            errors[r] = e.value
    for r in range(20, 40):
        if r != 25:
            assert errors[r].missing == [25] and "ranks [25] never contributed" in str(
                errors[r]), str(errors[r])
    for r in range(20):
        assert errors[r].missing == list(range(20, 40)), str(errors[r])
        assert "every rank of this rack (0..19) contributed" in str(errors[r])


def test_slots_sharded_over_two_spines():
    """The job's slots split over two spines: each aggregates its own slots only, results
    exact."""
    with FabricCluster(spines=2) as f:
        ints = tensors(0.2, 3, integer=True)
        for r in f.allreduce(ints):
            assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
        slots = [{int(s) for s in np.flatnonzero(sp.pipeline.registers["slot_round"]) // 2}
                 for sp in f.spines]
        assert slots == [{0, 1}, {2, 3}]


def test_two_levels_with_loss_on_every_switch():
    """1% of datagrams lost into and out of every switch (leaves and spine), 1% duplicated, 1%
    reordered: results still exact and bit-identical on every rank, over several calls."""
    faults = lambda i: Faults(drop_in=0.01, drop_out=0.01, duplicate=0.01,  # noqa: E731
                              reorder=0.01, seed=i)
    with FabricCluster(faults=faults) as f:
        for call, density in enumerate((0.01, 1.0, 0.3)):
            ints = tensors(density, 10 + call, integer=True)
            for r in f.allreduce(ints):
                assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
            floats = tensors(density, 20 + call)
            got = f.allreduce(floats)
            for r in got:
                assert r.tobytes() == got[0].tobytes()
        lost = [s.faults.dropped_in + s.faults.dropped_out for s in f.switches]
        assert min(lost) > 0, f"a switch lost nothing ({lost}): the test proved less"


@pytest.mark.parametrize("density,shared", [(1.0, False), (0.01, True), (0.01, False)])
def test_spine_link_bytes_against_flat(density, shared):
    """Datagrams on the spine's links are exactly 1/(workers per rack) of a flat switch's;
    bytes too when the racks' non-zero blocks coincide (dense, or one sparsity pattern); with
    each rank its own sparse blocks, partials carry the union of a rack's blocks: more than a
    quarter, still less than flat. No loss here, and a 5 s timeout: nothing is resent."""
    ts = tensors(density, 4, shared=shared)
    with FabricCluster(rto=5.0) as f:
        f.allreduce(ts)
    two_level = f.spine_traffic()
    resends = sum(a.last_stats.resends for a in f.agents)
    _, one, flat_resends = flat(ts, rto=5.0)
    print(f"density {density} shared {shared}: spine links {two_level[0]} datagrams "
          f"{two_level[1]} bytes; flat {one[0]} datagrams {one[1]} bytes; ratio "
          f"{two_level[0] / one[0]:.4f} datagrams {two_level[1] / one[1]:.4f} bytes")
    assert resends == flat_resends == 0, "a loaded machine made agents resend: counts inexact"
    assert two_level[0] * 4 == one[0]
    if density == 1.0 or shared:
        assert two_level[1] * 4 == one[1]
    else:
        assert two_level[1] * 4 > one[1] and two_level[1] < one[1]


def test_a_new_epoch_on_every_level():
    """A new run (the controller's start_run, as `serve` calls it): every switch of both
    levels is re-admitted with the new epoch, slots cleared; agents reset to the new epoch sum
    exactly; an agent still on the old epoch is stale at its leaf and gets nothing."""
    with FabricCluster() as f:
        ints = tensors(0.3, 5, integer=True)
        f.allreduce(ints)
        new = f.start_run(2)
        assert all(s.pipeline.registers["slot_round"].sum() == 0 for s in f.switches)
        for a in f.agents:
            a.reset(new)
        for r in f.allreduce(ints):
            assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
        stale = f.switches[0].pipeline.job_counters(7)["job_stale"]
        f.agents[0].close()  # rank 0's address, now with the old epoch
        old = Agent(dataclasses.replace(new, epoch=1), 0, f.plan.agent_switch("w0"),
                    timeout=0.3)
        with pytest.raises(SpinaTimeout):
            old.allreduce(np.ones(256, np.int32))
        old.close()
        assert f.switches[0].pipeline.job_counters(7)["job_stale"] > stale


def _restart_spine(f: FabricCluster, new: UdpSwitch) -> UdpSwitch:
    """`new`, on the stopped spine's port, takes its place: the controller installs the plan
    on it alone, as after a restart."""
    f.switches[2] = new
    f.spines = [new]
    program_in_process({"spine0": new.servicer()}, f.plan.state, ["spine0"])
    new.start()
    return new


def test_spine_restarted_mid_call():
    """The spine stops mid-call (its registers lost) and a new one starts on its port; the
    controller installs the plan on it alone; the call completes exactly on every rank."""
    with FabricCluster() as f:
        ints = tensors(1.0, 7, n=1 << 19, integer=True)  # 64 rounds per slot
        futs = [f.pool.submit(a.allreduce, t) for a, t in zip(f.agents, ints)]
        old = f.spines[0]
        until(lambda: old.pipeline.registers["slot_round"].max() >= 8, "round 8 at the spine",
              30, every=0.001)
        old.stop()
        stopped_at = int(old.pipeline.registers["slot_round"].max())
        new = _restart_spine(f, UdpSwitch(*old.address))
        want = np.sum(ints, axis=0, dtype=np.int32)
        for fut in futs:
            assert np.array_equal(fut.result(), want)
        assert 8 <= stopped_at < 64, stopped_at  # the restart was mid-call
        assert new.pipeline.job_counters(7)["job_aggregated"] > 0


def test_spine_restarted_after_a_result_reached_one_leaf_only():
    """Leaf 1 loses the spine's results from round 8 on, and the spine stops right after the
    first such loss: that round's result is at leaf 0, whose workers never send it again, and
    missing at leaf 1. The restarted spine gets it back from leaf 0 (REPLAY) and the call
    completes exactly on every rank."""
    cut, stopped = threading.Event(), threading.Event()

    def lose_results(h: wire.Header) -> bool:
        if h.msg_type != wire.MSG_RESULT or h.round < 8 or stopped.is_set():
            return False
        cut.set()
        return True

    replays = []
    with FabricCluster(faults=lambda i: Faults(drop_in_match=lose_results) if i == 1 else None,
                       timeout=60) as f:
        ints = tensors(1.0, 7, n=1 << 19, integer=True)  # 64 rounds per slot
        futs = [f.pool.submit(a.allreduce, t) for a, t in zip(f.agents, ints)]
        assert cut.wait(30)
        old = f.spines[0]
        old.stop()
        stopped.set()
        count_replays = Faults(drop_in_match=lambda h: bool(
            h.flags & wire.FLAG_REPLAY and replays.append(h.slot)))  # counts, drops nothing
        _restart_spine(f, UdpSwitch(*old.address, faults=count_replays))
        want = np.sum(ints, axis=0, dtype=np.int32)
        for fut in futs:
            assert np.array_equal(fut.result(), want)
        assert replays, "no leaf replayed a result: the case was not reached"
