"""The agent's compiled answer loop (_core.answer_batch) against its Python path.

    python -m pytest -q tests/test_agent_datapath.py

The same jobs run through both paths must give bit-identical outputs, datagrams, counters and
recovery state. The simulation drives whole calls of several workers through the switch's
reference pipeline (softswitch/pipeline.py) in this process, with a fake clock and a seeded
network that drops, duplicates and reorders datagrams both ways and delivers answers in
batches: every decision (resends, statuses, stale results) then depends only on the seed, so
any difference between the paths shows as different bytes. One test runs real loopback
calls through a lossy switch with each path.
"""
import dataclasses
import random

import numpy as np
import pytest

from host_agent import _core, agent as agent_mod, scatter
from host_agent.agent import Agent, _Buffers, _Call
from host_agent.local import LocalCluster
from host_agent.recovery import RttEstimator
from softswitch.egress import scatter_owners, scatter_strip
from softswitch.pipeline import Pipeline
from softswitch.udp import Faults, UdpSwitch
from spina.config import JobConfig, WorkerAddr
from spina.wire import MSG_RESULT

N, B, K, W = 3, 16, 4, 4
SRC = {r: (0, ("10.0.0.1", 100 + r)) for r in range(N)}
JOB = JobConfig(job=5, workers=tuple(WorkerAddr(r, "10.0.0.1", 100 + r) for r in range(N)),
                block_size=B, nlanes=K, nslots=W)


def tensors(seed: int, integer: bool, n: int = 4000) -> list:
    """Per worker a sparse tensor (shared and own blocks; a NaN block at one worker)."""
    rng = np.random.default_rng(seed)
    nb = -(-n // B)
    out = []
    for r in range(N):
        keep = rng.random(nb) < (0.3 if r else 0.6)
        if integer:
            x = rng.integers(-1000, 1000, n).astype(np.int32)
        else:
            x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
        x[np.repeat(~keep, B)[:n]] = 0
        out.append(x)
    if not integer:
        out[1][7 * B + 3] = np.nan
    return out


class Clock:
    """time.monotonic for the simulation: advanced by the network model only."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def simulate(datapath: str, seed: int, integer: bool, loss: float, monkeypatch,
             calls: int = 2, reduce_scatter: bool = False) -> dict:
    """`calls` consecutive all-reduces (reduce-scatters: the copies of a round's result for
    the ranks outside its owners stripped, as the switch's egress does) of N workers through
    a reference pipeline over a seeded lossy, duplicating, reordering network; everything
    observable, per worker."""
    clock = Clock()
    monkeypatch.setattr(agent_mod.time, "monotonic", clock)
    net = random.Random(seed)
    pipe = Pipeline(pool_slots=8, slot_capacity=64)
    pipe.add_job(JOB, SRC)
    rtts = [RttEstimator() for _ in range(N)]
    rounds = [np.zeros(W, np.int64) for _ in range(N)]
    buffers = [_Buffers() for _ in range(N)]
    python_answers = [0] * N
    original = _Call.on_answer

    def counted(self, view, a, st, now):
        python_answers[self.rank] += 1
        return original(self, view, a, st, now)
    monkeypatch.setattr(_Call, "on_answer", counted)
    seen = {"sent": [[] for _ in range(N)], "outs": [], "stats": [], "timers": [], "rtt": []}
    for call_id in range(1, calls + 1):
        xs = tensors(seed + call_id, integer)
        owners = scatter.Owners(len(xs[0]), N, B) if reduce_scatter else None
        cs = [_Call(JOB, r, call_id, rounds[r], xs[r], integer, False, None, buffers[r], rtts[r],
                    compiled=datapath == "compiled", owners=owners) for r in range(N)]
        assert all((c.compiled is not None) == (datapath == "compiled") for c in cs)
        to_switch, inbox = [], [[] for _ in range(N)]
        pending = [W] * N

        def flush(r, cs=cs, to_switch=to_switch):  # what the agent's _flush sends
            for p in cs[r].outbox:
                seen["sent"][r].append(bytes(p))
                to_switch.append((r, bytes(p)))
            cs[r].outbox.clear()
        for r in range(N):
            for st in cs[r].slots:
                cs[r].send_setup(st)
            flush(r)
        for _step in range(20000):
            if not any(pending):
                break
            clock.t += net.choice((0.0, 0.0001, 0.0005, 0.002))
            # the switch takes a few datagrams, any of those waiting (reordering)
            for _ in range(min(len(to_switch), net.randint(0, 4))):
                r, pkt = to_switch.pop(net.randrange(len(to_switch)))
                if net.random() < loss:
                    continue
                for _copy in range(2 if net.random() < 0.05 else 1):
                    for e in pipe.process(pkt, *SRC[r]):
                        own = scatter_owners(pkt) if e.data[1] == MSG_RESULT else 0
                        for dst in (range(N) if e.multicast else (r,)):
                            if net.random() >= loss:
                                inbox[dst].append(e.data if not own or own >> dst & 1
                                                  else scatter_strip(e.data))
            for r in range(N):
                if not pending[r]:
                    continue
                c = cs[r]
                if inbox[r] and net.random() < 0.7:  # a batch, arrival order shuffled a little
                    take = min(len(inbox[r]), net.randint(1, 6))
                    batch = [inbox[r].pop(net.randrange(min(2, len(inbox[r]))))
                             for _ in range(take)]
                    views, answers = [], []
                    for d in batch:
                        buf = bytearray(d)
                        verdict, a = _core.check_answer(buf, len(buf), JOB.job, JOB.epoch,
                                                        call_id, JOB.slot_base, W)
                        if verdict == 0:
                            answers.append((len(views),) + a[1:])
                            views.append(memoryview(buf))
                    pending[r] -= c.answers(views, answers, clock())
                    flush(r)
                if pending[r] and (net.random() < 0.3 or c.recovery.recheck):
                    c.resend_due(not inbox[r], 0.1, 60.0, ("10.0.0.1", 1))
                    flush(r)
        assert not any(pending), f"calls did not finish: {pending}"
        for r, c in enumerate(cs):
            seen["outs"].append(c.out.view(np.uint32).copy())
            seen["stats"].append(dataclasses.asdict(c.finish(0.0)))
            seen["timers"].append([dataclasses.asdict(tm) for tm in c.recovery.timers])
            rec = c.recovery
            seen["rtt"].append((rtts[r].srtt, rtts[r].rttvar, dict(rtts[r].group_srtt),
                                rec.seq, dict(rec.rack), list(rec.flying), rec.spurious,
                                rec.timer_from, rec.backoff, rec.recheck))
    seen["python_answers"] = python_answers
    seen["xs"] = xs
    return seen


@pytest.mark.parametrize("seed,integer,loss", [(1, False, 0.0), (2, False, 0.08),
                                               (3, True, 0.08), (4, False, 0.2)])
def test_both_paths_identical_through_a_lossy_reordering_network(seed, integer, loss,
                                                                   monkeypatch):
    """Outputs, every datagram sent, counters, timers and latency estimates are identical."""
    py = simulate("python", seed, integer, loss, monkeypatch)
    monkeypatch.undo()
    cc = simulate("compiled", seed, integer, loss, monkeypatch)
    for key in ("outs", "stats", "timers", "rtt"):
        for r, (a, b) in enumerate(zip(py[key], cc[key])):
            if key == "outs":
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b, f"{key} of worker {r % N} differ"
    assert py["sent"] == cc["sent"]
    received = sum(s["packets_received"] for s in py["stats"])
    assert sum(py["python_answers"]) == received  # the reference handled every answer itself
    # the compiled loop took the common case; Python the setups (and the unusual answers)
    print("answers", received, "on the Python path with the compiled loop",
          sum(cc["python_answers"]))
    assert sum(cc["python_answers"]) >= 2 * N * W
    assert sum(cc["python_answers"]) < received * (0.4 if loss == 0 else 0.75)
    if loss:
        assert sum(s["resends"] for s in py["stats"]) > 0
    # and the sum is right: every rank reads the same, the exact one for int32
    outs = py["outs"][-N:]
    assert all((o == outs[0]).all() for o in outs)
    if integer:
        np.testing.assert_array_equal(outs[0].view(np.int32), np.sum(py["xs"], 0, dtype=np.int32))


@pytest.mark.parametrize("seed,integer", [(5, True), (6, False)])
def test_reduce_scatter_identical_on_both_paths(seed, integer, monkeypatch):
    """Reduce-scatters through a lossy network (8%): the compiled loop writes each round's
    owners as the Python path does (every datagram sent identical), outputs, counters and
    timers identical; each rank's shard exact for int32 (the all-reduce's), for floats within
    the quantization bound of the float64 sum (its lanes by shard quantize with their own
    slots' exponents: scatter.Owners) and NaN where the all-reduce's is; fewer bytes received."""
    py = simulate("python", seed, integer, 0.08, monkeypatch, reduce_scatter=True)
    monkeypatch.undo()
    cc = simulate("compiled", seed, integer, 0.08, monkeypatch, reduce_scatter=True)
    assert py["sent"] == cc["sent"]
    for key in ("stats", "timers", "rtt"):
        assert py[key] == cc[key], key
    for a, b in zip(py["outs"], cc["outs"]):
        np.testing.assert_array_equal(a, b)
    assert sum(cc["python_answers"]) < sum(s["packets_received"] for s in cc["stats"])
    monkeypatch.undo()
    ar = simulate("python", seed, integer, 0.08, monkeypatch)  # the same tensors, all-reduced
    n = len(py["xs"][0])
    exact = np.sum(py["xs"], 0, dtype=np.float64)
    # int32 lanes: nworkers * 2**(-S-1) with S = 28 - the slot's exponent (3 ranks), so below
    # 2**-25 of twice the largest |x|; then float32's rounding of the sum
    tol = np.nanmax(np.abs(exact)) * 2.0 ** -23 + np.nanmax(np.abs(py["xs"])) * 2.0 ** -24
    for r, (out, full) in enumerate(zip(py["outs"][-N:], ar["outs"][-N:])):
        lo, hi = scatter.shard_bounds(n, N, r)
        if integer:
            np.testing.assert_array_equal(out[lo:hi], full[lo:hi])
            continue
        got, want = out[lo:hi].view(np.float32), full[lo:hi].view(np.float32)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        assert np.abs(got[~nan] - exact[lo:hi][~nan]).max() <= tol
    if integer:
        np.testing.assert_array_equal(ar["outs"][-1].view(np.int32),
                                      np.sum(py["xs"], 0, dtype=np.int32))
    assert sum(s["bytes_received"] for s in py["stats"]) < \
        sum(s["bytes_received"] for s in ar["stats"])


def test_bounded_loss_and_droppable_calls_stay_on_the_python_path():
    """The compiled loop's common case has no bounded loss: such calls never use it."""
    job = dataclasses.replace(JOB, bounded_loss=0.1, loss_deadline=0.01)
    c = _Call(job, 0, 1, np.zeros(W, np.int64), np.ones(100, np.float32), False, False, None,
              _Buffers(), RttEstimator(), compiled=True)
    assert c.compiled is None
    c = _Call(JOB, 0, 1, np.zeros(W, np.int64), np.ones(100, np.float32), False, False, None,
              _Buffers(), RttEstimator(), compiled=True)
    assert c.compiled is not None


def test_datapath_argument_is_checked():
    """An unknown datapath is a one-line error naming the field."""
    with pytest.raises(ValueError, match="datapath 'c': one of compiled, python"):
        Agent(JOB, 0, ("127.0.0.1", 1), sock=object(), datapath="c")


def test_loopback_calls_through_a_lossy_switch_equal_on_both_paths():
    """Real calls over loopback with loss, duplicates and reordering: both paths give the
    exact int32 sum and the same rounds."""
    rng = np.random.default_rng(9)
    xs = [rng.integers(-1000, 1000, 20000).astype(np.int32) for _ in range(N)]
    for x in xs[1:]:
        x[: 20000 // 2] = 0
    want = np.sum(xs, 0, dtype=np.int32)
    got = {}
    faults = Faults(drop_in=0.03, drop_out=0.03, duplicate=0.02, reorder=0.05, seed=4)
    with UdpSwitch(port=0, faults=faults) as sw:
        with LocalCluster(N, switch=sw, rto=0.02, timeout=30, block_size=64, nlanes=8,
                          nslots=4) as c:
            for datapath in ("python", "compiled", "python", "compiled"):
                for a in c.agents:
                    a.datapath = datapath
                res = c.allreduce(xs)
                assert all((r == want).all() for r in res), datapath
                got.setdefault(datapath, []).append([a.last_stats.rounds for a in c.agents])
    assert got["python"] == got["compiled"]
