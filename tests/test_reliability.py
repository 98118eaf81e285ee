"""Reliability: exact results under loss, duplication and reordering; job isolation; fuzzing.

Faults are injected by the software switch (softswitch.udp.Faults) so these run anywhere;
tests/test_l2_netns.py and friends cover real interfaces.
Run just this file: .venv/bin/python -m pytest tests/test_reliability.py
"""
import concurrent.futures

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from host_agent.agent import SpinaTimeout
from host_agent.local import LocalCluster
from softswitch.pipeline import Pipeline
from softswitch.udp import Faults, UdpSwitch
from spina import spec, wire
from spina.config import JobConfig, WorkerAddr

B, K, W = 16, 4, 4


def sparse(rng, n, density):
    nblocks = -(-n // B)
    out = np.zeros(nblocks * B, np.int32)
    nz = np.flatnonzero(rng.random(nblocks) < density)
    out.reshape(nblocks, B)[nz] = rng.integers(-2**20, 2**20, (len(nz), B))
    return out[:n]


def run_with(faults, nworkers=3, calls=3, n=6_000, density=0.3, seed=0):
    """Several int32 all-reduces through a switch with `faults`; returns switch and agent stats."""
    rng = np.random.default_rng(seed)
    sw = UdpSwitch(port=0, faults=faults).start()
    try:
        with LocalCluster(nworkers, switch=sw, rto=0.01, timeout=30, block_size=B, nlanes=K,
                          nslots=W) as c:
            for _ in range(calls):
                xs = [sparse(rng, n, density) for _ in range(nworkers)]
                res = c.allreduce(xs)
                exact = np.sum(np.stack(xs), axis=0, dtype=np.int32)
                for r in res:
                    assert (r == exact).all()
            return sw, c
    finally:
        sw.stop()


@pytest.mark.parametrize("loss", [0.01, 0.05, 0.10, 0.25])
def test_exact_under_random_loss_both_directions(loss):
    """With random loss to and from the switch every all-reduce is exact (resends, stored results);
    at 25% each way too (a timeout resends every round not sent for a timeout, not only the
    oldest: one round per doubling timeout stalled such calls for the whole 30 s before)."""
    f = Faults(drop_in=loss, drop_out=loss, seed=int(loss * 100))
    sw, c = run_with(f, calls=1 if loss > 0.1 else 3)
    assert f.dropped_in > 0 and f.dropped_out > 0
    counters = sw.pipeline.job_counters(c.job.job)
    assert counters["job_duplicates"] > 0  # resends were recognised, not added twice


def test_loss_of_first_packet_of_call():
    """Losing the very first packet (rank 0's first setup packet) still gives exact results."""
    seen = set()

    def first(h):
        key = (h.rank, h.slot)
        if h.rank == 0 and not seen:
            seen.add(key)
            return True
        return False
    f = Faults(drop_in_match=first)
    run_with(f, calls=1)
    assert f.dropped_in == 1


def test_loss_of_last_packets_of_call():
    """Dropping each worker's final packet on every slot (flag LAST, first copy) is recovered."""
    seen = set()

    def last(h):
        key = (h.rank, h.slot, h.round)
        if h.flags & wire.FLAG_LAST and not h.flags & wire.FLAG_RESEND and key not in seen:
            seen.add(key)
            return True
        return False
    f = Faults(drop_in_match=last)
    run_with(f, calls=2)
    assert f.dropped_in >= 3


def test_lost_results_recovered_by_unicast():
    """Results lost on the way to workers are recovered from the switch's stored copy."""
    f = Faults(drop_out=0.2, seed=3)
    sw, c = run_with(f, calls=2)
    assert f.dropped_out > 0
    assert sw.pipeline.job_counters(c.job.job)["job_duplicates"] > 0


def test_duplicates_and_reordering_change_nothing():
    """Duplicated and reordered packets leave every result exact."""
    f = Faults(duplicate=0.2, reorder=0.2, seed=5)
    sw, c = run_with(f, calls=3)
    assert sw.pipeline.job_counters(c.job.job)["job_duplicates"] > 0


def test_two_jobs_concurrently_and_isolated():
    """Two jobs all-reduce at the same time on one switch with exact results; a cross-job packet
    is dropped and counted without touching the other job."""
    rng = np.random.default_rng(1)
    with UdpSwitch(port=0) as sw:
        a = LocalCluster(3, job=1, switch=sw, rto=0.05, block_size=B, nlanes=K, nslots=W,
                         slot_base=0)
        b = LocalCluster(2, job=2, switch=sw, rto=0.05, block_size=B, nlanes=K, nslots=W,
                         slot_base=W)
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as ex:
                for _ in range(3):
                    xa = [sparse(rng, 5000, 0.5) for _ in range(3)]
                    xb = [sparse(rng, 7000, 0.2) for _ in range(2)]
                    fa, fb = ex.submit(a.allreduce, xa), ex.submit(b.allreduce, xb)
                    assert all((r == np.sum(xa, 0, dtype=np.int32)).all() for r in fa.result(60))
                    assert all((r == np.sum(xb, 0, dtype=np.int32)).all() for r in fb.result(60))
            before = {n: r.copy() for n, r in sw.pipeline.registers.items()}
            # job 1's rank 0 names job 2, and job 1 with job 2's slots: both dropped
            sock = a.agents[0].sock
            for hdr in (dict(job=2, epoch=1, rank=0, slot=W),
                        dict(job=1, epoch=1, rank=0, slot=W + 1)):
                h = wire.Header(nlanes=K, block_size=B, round=10**6, length=5, **hdr)
                sock.sendto(wire.pack(h, [wire.END] * K), sw.address)
            import time
            deadline = time.time() + 5
            while sw.pipeline.port_counters(0)["port_unadmitted"] < 2 and time.time() < deadline:
                time.sleep(0.01)
            assert sw.pipeline.port_counters(0)["port_unadmitted"] == 2
            assert all((before[n] == r).all() for n, r in sw.pipeline.registers.items())
        finally:
            a.close()
            b.close()


# ---------------------------------------------------------------- fuzzing the pipeline
CFG = JobConfig(job=7, workers=tuple(WorkerAddr(r, "10.0.0.1", 100 + r) for r in range(3)),
                slot_base=2, nslots=2, nlanes=3, block_size=4)
SRC = {r: (0, ("10.0.0.1", 100 + r)) for r in range(3)}

field_values = st.fixed_dictionaries({
    "version": st.sampled_from([1, 1, 1, 0, 2, 255]),
    "msg_type": st.sampled_from([1, 1, 1, 2, 3, 0, 200]),
    "flags": st.integers(0, 255),
    "job": st.sampled_from([7, 7, 7, 8, 0]),
    "epoch": st.sampled_from([1, 1, 0]),
    "slot": st.sampled_from([2, 3, 0, 1, 4, 65535]),
    "rank": st.sampled_from([0, 1, 2, 3, 31, 200]),
    "nlanes": st.sampled_from([3, 3, 0, 1, 64, 255]),
    "round": st.integers(0, 2**32 - 1),
    "length": st.integers(0, 2**32 - 1),
    "block_size": st.sampled_from([4, 4, 0, 1, 65535]),
    "exponent": st.integers(-32768, 32767),
    "present": st.integers(0, 2**64 - 1) | st.integers(0, 7),
    "nonfinite": st.integers(0, 7),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packets=st.lists(st.tuples(field_values, st.integers(-40, 40), st.integers(0, 2)),
                        min_size=1, max_size=20))
def test_fuzzed_packets_never_crash_and_are_accounted(packets):
    """Malformed, truncated and mis-addressed packets never crash the pipeline, never touch
    registers outside the job's slots, and every packet is counted exactly once."""
    p = Pipeline(pool_slots=8, slot_capacity=64)
    p.add_job(CFG, SRC)
    # the job's slots 2..3: copies 4..7 of the per-copy registers, cells 2..3 of the head ones
    mine = {n: range(2, 4) if n in spec.HEAD_REGISTERS else range(4, 8) for n in p.registers}
    outside = {n: [i for i in range(len(r)) if i not in mine[n]] for n, r in p.registers.items()}
    before = {n: r[outside[n]].copy() for n, r in p.registers.items()}
    for fields, size_delta, rank_src in packets:
        h = wire.Header(**fields)
        npresent = bin(h.present).count("1")
        body = b"\x01" * max(0, 4 * min(h.nlanes, 64) + 4 * h.block_size * min(npresent, 64)
                             + size_delta)
        pkt = (wire.pack_header(h) + body)[:max(0, wire.HEADER_LEN + len(body))]
        if size_delta < -30:
            pkt = pkt[:wire.HEADER_LEN + size_delta]  # truncated inside the header
        p.process(pkt, *SRC[rank_src])
    after = {n: r[outside[n]] for n, r in p.registers.items()}
    assert all((before[n] == after[n]).all() for n in before)
    counted = (p.job_counters(7)["job_received"] + p.job_counters(8)["job_received"]
               + sum(p.port_counters(0).values()))
    assert counted == len(packets)


def test_worker_dies_mid_call_then_job_restarts():
    """A worker that stops mid-call makes the others fail naming it; after a restart with a new
    epoch (slots cleared) the job all-reduces exactly again."""
    import dataclasses
    rng = np.random.default_rng(2)
    cut = {"on": False}

    def dead_rank2(h):  # rank 2 "dies": nothing it sends after the cut arrives
        return cut["on"] and h.rank == 2
    sw = UdpSwitch(port=0, faults=Faults(drop_in_match=dead_rank2)).start()
    try:
        with LocalCluster(3, switch=sw, rto=0.01, timeout=1.0, block_size=B, nlanes=K,
                          nslots=W) as c:
            xs = [sparse(rng, 4000, 0.5) for _ in range(3)]
            assert (c.allreduce(xs)[0] == np.sum(xs, 0, dtype=np.int32)).all()
            cut["on"] = True
            futs = [a.allreduce_async(x) for a, x in zip(c.agents, xs)]
            for f in futs[:2]:
                with pytest.raises(SpinaTimeout, match=r"ranks \[2\] never contributed"):
                    f.result(timeout=30)
            with pytest.raises(SpinaTimeout):
                futs[2].result(timeout=30)
            cut["on"] = False
            new = dataclasses.replace(c.job, epoch=c.job.epoch + 1)
            sw.add_job(new)  # re-admission with a new epoch clears the job's slots
            for a in c.agents:
                a.reset(new)
            xs = [sparse(rng, 4000, 0.5) for _ in range(3)]
            assert all((r == np.sum(xs, 0, dtype=np.int32)).all() for r in c.allreduce(xs))
    finally:
        sw.stop()


def test_bounded_loss_worker_dies_the_others_fail_naming_it():
    """Bounded loss: a worker that stops is flushed out of a round, then the switch holds the
    slot's next round until it is heard (docs/reliability.md): the others' calls fail naming
    it (SpinaTimeout.missing), not blaming the switch."""
    rng = np.random.default_rng(3)
    cut = {"on": False, "passed": 0}

    def dead_rank2(h):  # after its setup round and one data round on every slot
        if not cut["on"] or h.rank != 2:
            return False
        cut["passed"] += 1
        return cut["passed"] > 2 * W
    sw = UdpSwitch(port=0, faults=Faults(drop_in_match=dead_rank2)).start()
    try:
        with LocalCluster(3, switch=sw, rto=0.01, timeout=1.0, block_size=B, nlanes=K, nslots=W,
                          bounded_loss=0.5, loss_deadline=0.02) as c:
            for _ in range(2):  # calls 1 and 2: the next one's flusher is rank 0 (3 mod 3)
                xs = [sparse(rng, 4000, 0.5) for _ in range(3)]
                assert (c.allreduce(xs)[0] == np.sum(xs, 0, dtype=np.int32)).all()
            cut["on"] = True
            futs = [a.allreduce_async(x) for a, x in zip(c.agents, xs)]
            for f in futs[:2]:
                with pytest.raises(SpinaTimeout, match=r"ranks \[2\]") as e:
                    f.result(timeout=30)
                assert e.value.missing == [2]
                assert "did not answer" not in str(e.value)
            with pytest.raises(SpinaTimeout):
                futs[2].result(timeout=30)
        assert sw.pipeline.job_counters(1)["job_held"] > 0
    finally:
        sw.stop()


def _drop_first_data_round_of(rank, slot, times=1):
    """Drop the first `times` transmissions of `rank`'s first data round on `slot`."""
    state = {"setup_seen": False, "round": None, "dropped": 0}

    def match(h):
        if h.rank != rank or h.slot != slot or state["dropped"] >= times:
            return False
        if not state["setup_seen"]:
            state["setup_seen"] = True  # the setup round goes through
            return False
        if state["round"] is None:
            state["round"] = h.round
        if h.round != state["round"]:
            return False
        state["dropped"] += 1
        return True
    return match


def test_bounded_loss_completes_partially_and_identically():
    """With bounded loss on, a round missing a worker completes after the deadline: every rank
    gets the same bits, marked partial, and at most the allowed fraction of blocks is affected."""
    rng = np.random.default_rng(4)
    n = 40 * B * K * W  # 40 rounds per slot: one partial round is 1/40 of the blocks
    xs = [sparse(rng, n, 1.0) for _ in range(3)]
    # rank 2 never gets that round through: every transmission of it (original, fast
    # retransmits, its own flush) is lost, so only the others' flush can complete the round
    f = Faults(drop_in_match=_drop_first_data_round_of(rank=2, slot=0, times=10**6))
    with UdpSwitch(port=0, faults=f) as sw:
        with LocalCluster(3, switch=sw, rto=0.2, block_size=B, nlanes=K, nslots=W,
                          bounded_loss=0.1, loss_deadline=0.02) as c:
            c.agents[2].rtt.min_rto = 1.0
            res = c.allreduce(xs)
            stats = [a.last_stats for a in c.agents]
    assert f.dropped_in >= 1
    assert res[0].tobytes() == res[1].tobytes() == res[2].tobytes()
    assert [s.partial_rounds for s in stats] == [1, 1, 1], (stats, sw.pipeline.job_counters(1))
    assert all(0 < s.partial_fraction <= 0.1 for s in stats)
    exact = np.sum(np.stack(xs), axis=0, dtype=np.int32)
    wrong_blocks = np.flatnonzero((res[0] != exact).reshape(-1, B).any(axis=1))
    assert 0 < len(wrong_blocks) <= K  # only the partial round's lanes miss rank 2's blocks
    assert (res[0].reshape(-1, B)[wrong_blocks] ==
            (xs[0] + xs[1]).reshape(-1, B)[wrong_blocks]).all()


def test_a_flush_never_strands_a_worker_whose_result_was_lost():
    """Bounded loss with a short deadline under 10% random loss each way: flushes let the others
    move on while a worker whose result was lost resends its old round. Without the switch's
    hold of a newer round they took that round's copy and the worker's call timed out (every
    call of this run, measured with the hold off); with it every call is exact and identical."""
    rng = np.random.default_rng(1)
    held = 0
    for seed in range(3):
        xs = [rng.standard_normal(20000).astype(np.float32) for _ in range(3)]
        with UdpSwitch(port=0, faults=Faults(drop_in=0.1, drop_out=0.1, seed=seed)) as sw:
            with LocalCluster(3, switch=sw, timeout=10.0, block_size=16, nlanes=4, nslots=4,
                              bounded_loss=0.1, loss_deadline=0.01) as c:
                res = c.allreduce(xs)
                stats = [a.last_stats for a in c.agents]
            held += sw.pipeline.job_counters(1)["job_held"]
        assert res[0].tobytes() == res[1].tobytes() == res[2].tobytes()
        assert all(s.partial_fraction <= 0.1 for s in stats)
    assert held > 0  # the hold acted (this loss and deadline flush many rounds)


def test_bounded_loss_budget_exhausted_falls_back_to_resending():
    """When a partial round would exceed the fraction, agents resend instead: the sum is exact."""
    rng = np.random.default_rng(5)
    xs = [sparse(rng, 2 * B * K * W, 1.0) for _ in range(3)]  # too few blocks for any budget
    f = Faults(drop_in_match=_drop_first_data_round_of(rank=2, slot=0))
    with UdpSwitch(port=0, faults=f) as sw:
        with LocalCluster(3, switch=sw, rto=0.05, block_size=B, nlanes=K, nslots=W,
                          bounded_loss=0.1, loss_deadline=0.01) as c:
            res = c.allreduce(xs)
            assert [a.last_stats.partial_rounds for a in c.agents] == [0, 0, 0]
    assert f.dropped_in == 1
    assert all((r == np.sum(xs, 0, dtype=np.int32)).all() for r in res)


def test_switch_restart_mid_call_recovers():
    """The switch loses all register state mid-call and the controller restores its tables: the
    call in flight completes exactly, because every resend carries the whole contribution."""
    from softswitch.pipeline import Pipeline
    rng = np.random.default_rng(8)
    xs = [sparse(rng, 30 * B * K * W, 0.8) for _ in range(3)]
    box = {}

    def restart_after_200(h):
        sw = box["sw"]
        if sw.packets_in == 200 and not box.get("done"):
            box["done"] = True
            sw.pipeline = Pipeline(sw.pipeline.pool_slots, sw.pipeline.slot_capacity)  # reboot
            sw.add_job(box["job"])  # the controller's redeploy
        return False
    with UdpSwitch(port=0, faults=Faults(drop_in_match=restart_after_200)) as sw:
        box["sw"] = sw
        with LocalCluster(3, switch=sw, rto=0.02, timeout=30, block_size=B, nlanes=K,
                          nslots=W) as c:
            box["job"] = c.job
            res = c.allreduce(xs)
            assert box.get("done"), "the restart never happened"
            assert all((r == np.sum(xs, 0, dtype=np.int32)).all() for r in res)
            res = c.allreduce(xs)  # and the next call too
            assert all((r == np.sum(xs, 0, dtype=np.int32)).all() for r in res)


def test_switch_process_killed_and_restarted_mid_call_completes_exactly(tmp_path):
    """A real switch process (`python -m softswitch udp --grpc`) is killed while ranks 0 and 1
    are in a call (rank 2 has not called yet, so the call cannot be over) and started again;
    `controller serve` restores its tables with the run's epoch. The agents ride through the
    refusals of the dead port: the call completes exactly at every rank, and so does the
    next. (test_switch_restart_mid_call_recovers restarts inside one process: the port never
    closes there.)"""
    import logging
    import threading

    from host_agent.assignment import connect
    from spina.net import free_ports
    from tests.deployment import Deployment
    from tests.waits import until

    udp, grpc, workers = free_ports(1), free_ports(2), free_ports(3)
    doc = {"switches": [{"name": "s0", "target": "softswitch", "grpc": f"127.0.0.1:{grpc[0]}",
                         "address": "127.0.0.1", "udp_port": udp[0]}],
           "workers": [{"name": f"w{r}", "ip": "127.0.0.1", "udp_port": workers[r],
                        "switch_port": 0, "switch": "s0"} for r in range(3)],
           "jobs": [{"id": 3, "members": ["w0", "w1", "w2"], "nslots": 4, "slot_base": 0,
                     "block_size": 256, "nlanes": 8}],
           "agents_dir": "agents", "rendezvous": f"127.0.0.1:{grpc[1]}"}
    rng = np.random.default_rng(9)
    refused = threading.Event()

    class Refusals(logging.Handler):
        def emit(self, record):
            if "refuses datagrams" in record.getMessage():
                refused.set()
    seen = Refusals()
    logging.getLogger("spina.agent").addHandler(seen)
    dep = Deployment("grpc", doc, tmp_path)
    agents = []
    try:
        dep.start()
        agents = [connect(dep.agent_file(3, r), timeout=30, rto=0.02) for r in range(3)]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            for call in range(3):  # the first joins the run; the switch dies in the second
                xs = [sparse(rng, 200_000, 0.5) for _ in range(3)]
                early = [pool.submit(agents[r].allreduce, xs[r]) for r in (0, 1)]
                if call == 1:  # the kill comes while ranks 0 and 1 resend into a dead port
                    def ended(early=early):  # a rank's call ended: its result says why
                        return any(f.done() for f in early)
                    until(lambda: all(a.call_id == 2 for a in agents[:2]) or ended(),
                          "ranks 0 and 1 in their call")
                    assert not ended(), [f.result() for f in early]
                    dep.procs.kill("s0")
                    until(lambda: refused.is_set() or ended(),
                          "an agent to see the dead switch's refusals")
                    dep.start_switch("s0")
                late = pool.submit(agents[2].allreduce, xs[2])
                res = [f.result(60) for f in early + [late]]
                exact = np.sum(np.stack(xs), axis=0, dtype=np.int32)
                for r in res:
                    assert (r == exact).all()
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dep.processes_tail()}") from None
    finally:
        logging.getLogger("spina.agent").removeHandler(seen)
        for a in agents:
            a.close()
        dep.stop()
