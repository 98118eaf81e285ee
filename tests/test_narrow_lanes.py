"""16- and 8-bit lanes end to end (docs/bits.md): the wire's width flags, the software switch's
narrow parse, saturating answer and width-mismatch check, and 4 agents through a real
UdpSwitch whose sums are the quantized integers summed in numpy, bit-identical at every rank,
at half (quarter) the data bytes of an int32 call; the compiled agent core and switch data
path against their numpy and Python references, datagram for datagram.

Run just this file: python -m pytest tests/test_narrow_lanes.py
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from host_agent import agent as agent_mod
from host_agent.agent import Agent, LengthMismatch
from host_agent.blocks import (
    LanePlan,
    dequantize,
    exponent_of_bits,
    gather_blocks,
    quant_shift,
    rounding_noise,
    scatter_blocks,
    stochastic_quantize,
)
from host_agent.launch import local_job
from softswitch.pipeline import Pipeline
from softswitch.udp import UdpSwitch
from spina import wire
from spina.config import ConfigError, JobConfig

NRANKS, B, K, W = 4, 64, 8, 4
LENGTH = 5000  # 79 blocks, the last one partial (8 elements)
NBLOCKS = -(-LENGTH // B)
# Per rank and call: a setup round per slot, then as many rounds as its fullest lane has
# blocks (block b is lane b % (W * K)): 4 + 3 + 3 + 2 + 2.
PACKETS = W + int(np.bincount(np.arange(NBLOCKS) % (W * K)).reshape(W, K).max(axis=1).sum())
assert PACKETS == 14


def _tensors(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(LENGTH).astype(np.float32) for _ in range(NRANKS)]


def _run(job: JobConfig, xs: list[np.ndarray], calls: int = 1, datapath: str = "compiled",
         switch_datapath: str = "compiled", agent_job=None, residuals=None):
    """Every rank's results and stats of `calls` calls through one UdpSwitch (each rank's
    calls with its residuals[r] if given); the switch."""
    sw = UdpSwitch(port=0, datapath=switch_datapath)
    sw.add_job(job)
    sw.start()
    agents = [Agent(agent_job(r) if agent_job else job, r, sw.address, timeout=5.0,
                    datapath=datapath) for r in range(NRANKS)]
    out = [[None] * calls for _ in range(NRANKS)]
    stats = [[None] * calls for _ in range(NRANKS)]
    errors = [None] * NRANKS

    def rank(r):
        try:
            for c in range(calls):
                out[r][c] = agents[r].allreduce(
                    xs[r], residual=None if residuals is None else residuals[r])
                stats[r][c] = agents[r].last_stats
        except Exception as e:  # the test looks at it
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(NRANKS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for a in agents:
            a.close()
        sw.stop()
    return out, stats, errors, sw


def _expected(job: JobConfig, xs: list[np.ndarray], call_id: int = 1) -> np.ndarray:
    """What the agents must return: per rank, every block stochastically rounded with its
    slot's shift and the rank's draws for its plan row; the integers summed in numpy (int64),
    then dequantized."""
    plan, _ = LanePlan.build(np.arange(NBLOCKS), W, K)
    L = W * K
    slot_of = (np.arange(NBLOCKS) % L) // K
    exps = np.stack([exponent_of_bits(np.abs(gather_blocks(x, np.arange(NBLOCKS), B))
                                      .astype(np.float32).view(np.int32).max(axis=1))
                     for x in xs])  # (rank, block)
    slot_exp = np.array([exps[:, slot_of == s].max() for s in range(W)])
    shift_of_block = np.array([quant_shift(int(slot_exp[s]), NRANKS, job.lane_bits)
                               for s in slot_of])
    total = np.zeros((NBLOCKS, B), np.int64)
    for r, x in enumerate(xs):
        noise = rounding_noise(job.job, r, call_id, (NBLOCKS, B))
        rows = gather_blocks(x, plan.pos, B)
        for j, blk in enumerate(plan.pos):
            total[blk] += stochastic_quantize(rows[j:j + 1], int(shift_of_block[blk]),
                                              job.lane_bits, noise[j:j + 1])[0]
    lo, hi = -(1 << job.lane_bits - 1), (1 << job.lane_bits - 1) - 1
    assert lo <= total.min() and total.max() <= hi  # an honest job never saturates
    out = np.zeros(LENGTH, np.float32)
    for blk in range(NBLOCKS):
        scatter_blocks(out, np.array([blk]), dequantize(total[blk:blk + 1].astype(np.int32),
                                                        int(shift_of_block[blk])), B)
    return out


def _job(lane_bits: int) -> JobConfig:
    return local_job(NRANKS, job=5, nslots=W, block_size=B, nlanes=K, lane_bits=lane_bits)


@pytest.mark.parametrize("lane_bits", [16, 8])
@pytest.mark.parametrize("datapath", ["compiled", "python"])
def test_four_ranks_sum_the_quantized_integers_bit_identical(lane_bits, datapath):
    """4 ranks through a UdpSwitch, agents and switch both compiled or both Python: the numpy
    sum of the quantized integers, dequantized, at every rank bit for bit; nothing saturated
    or mismatched; the compiled switch served every packet itself (none punted)."""
    job = _job(lane_bits)
    xs = _tensors()
    out, stats, errors, sw = _run(job, xs, datapath=datapath, switch_datapath=datapath)
    assert errors == [None] * NRANKS
    want = _expected(job, xs)
    for r in range(NRANKS):
        assert out[r][0].tobytes() == want.tobytes(), r
    counters = sw.pipeline.job_counters(job.job)
    assert counters["job_lane_saturated"] == counters["job_lane_mismatch"] == 0
    # a round each rank's recovery sent again (a loaded machine's timeout) reaches the switch
    # too: it took every packet sent, first transmissions and resends
    sent = [agent_stats(s[0]) for s in stats]
    assert counters["job_received"] == sum(s["packets_sent"] for s in sent), sent
    if datapath == "compiled":
        assert sw.punted == 0 and sw._compiled.stats()["packets_in"] == counters["job_received"]


def agent_stats(st) -> dict:
    """The counters of a CallStats that the byte and packet accounting reads."""
    return {k: getattr(st, k) for k in ("packets_sent", "resends", "bytes_sent", "bytes_resent",
                                        "payload_bytes_sent", "packets_received",
                                        "bytes_received")}


def assert_sent_once_plus_resends(st, packets: int, first_bytes: int, payload: int,
                                  nlanes: int = K) -> None:
    """A call's counters: `packets` first transmissions of `first_bytes` in all (`payload` of
    block data), plus what recovery sent again (a loaded machine may time a round out), counted
    exactly: every resend one more packet of its round's bytes and no more data; every answer
    one result per round (a result is as long as the round's contribution) plus the switch's
    statuses to resends (a header and the lanes' next positions; a duplicate result to a round
    already answered is not counted)."""
    c = agent_stats(st)
    assert c["packets_sent"] == packets + c["resends"], c
    assert c["payload_bytes_sent"] == payload, c
    assert c["bytes_sent"] == first_bytes + c["bytes_resent"], c
    statuses = c["packets_received"] - packets
    assert 0 <= statuses <= c["resends"], c
    assert c["bytes_received"] == first_bytes + statuses * wire.data_offset(nlanes), c


def test_byte_counts_halve_and_quarter_with_the_width():
    """Per call and rank, the data bytes are 4, 2 and 1 per element of every block sent; the
    packets and their headers are the same at every width (resends accounted exactly)."""
    xs = _tensors(1)
    for bits, item in ((32, 4), (16, 2), (8, 1)):
        _, stats, errors, _ = _run(_job(bits), xs)
        assert errors == [None] * NRANKS
        data = NBLOCKS * B * item
        for r in range(NRANKS):
            assert_sent_once_plus_resends(stats[r][0], PACKETS,
                                          PACKETS * wire.data_offset(K) + data, data)


def _recorded_run(monkeypatch, datapath: str, lane_bits: int, xs, calls: int = 2):
    """_run with residuals, recording every datagram the agents send: ({(rank, call, slot,
    round): first transmission's bytes}, results, residuals after the calls, answers the
    compiled answer loop handled, stats, the switch)."""
    sent = {}
    batches = [0]
    send, answer_batch = agent_mod._core.send_batch, agent_mod._core.answer_batch

    def record(fd, datagrams, ip, port):
        for d in datagrams:
            h = wire.unpack_header(bytes(d))
            if not h.flags & wire.FLAG_RESEND:
                key = (h.rank, h.call, h.slot, h.round)
                assert key not in sent  # one first transmission per round
                sent[key] = bytes(d)
        return send(fd, datagrams, ip, port)

    def counted(ctx, answers, views, start, now):
        stop, finished = answer_batch(ctx, answers, views, start, now)
        batches[0] += stop - start
        return stop, finished
    monkeypatch.setattr(agent_mod._core, "send_batch", record)
    monkeypatch.setattr(agent_mod._core, "answer_batch", counted)
    job = _job(lane_bits)
    residuals = [np.zeros(LENGTH, np.float32) for _ in range(NRANKS)]
    out, stats, errors, sw = _run(job, xs, calls=calls, datapath=datapath,
                                  switch_datapath=datapath, residuals=residuals)
    monkeypatch.undo()
    assert errors == [None] * NRANKS
    return sent, out, residuals, batches[0], stats, sw


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_the_compiled_path_sends_and_gets_what_the_reference_does(monkeypatch, lane_bits):
    """Two calls with error feedback, 4 ranks: the compiled agent core and switch data path
    against numpy's rounding and the Python pipeline. Every datagram each rank sends (its
    stochastically rounded rows), every result and every residual, bit for bit; the
    compiled answer loop took the narrow answers, the compiled switch every packet."""
    xs = [x * np.float32(0.01) for x in _tensors(2)]
    xs[1][7 * B + 3] = np.nan  # a non-finite block: its residual dropped at rank 1
    got = _recorded_run(monkeypatch, "compiled", lane_bits, xs)
    ref = _recorded_run(monkeypatch, "python", lane_bits, xs)
    sent, out, residuals, batched, stats, sw = got
    sent_ref, out_ref, residuals_ref, batched_ref, stats_ref, sw_ref = ref
    assert len(sent) == 2 * NRANKS * PACKETS and sent.keys() == sent_ref.keys()
    assert [k for k in sent if sent[k] != sent_ref[k]] == []
    for r in range(NRANKS):
        for c in range(2):
            assert out[r][c].tobytes() == out_ref[r][c].tobytes() == out[0][c].tobytes()
            # first sends only: a resend on a loaded machine adds its bytes to one run,
            # not the other
            assert (stats[r][c].bytes_sent - stats[r][c].bytes_resent
                    == stats_ref[r][c].bytes_sent - stats_ref[r][c].bytes_resent)
        assert residuals[r].tobytes() == residuals_ref[r].tobytes()
    assert np.abs(residuals[0]).max() > 0 and not residuals[1][7 * B:8 * B].any()
    assert batched > NRANKS * (PACKETS - W) and batched_ref == 0
    assert sw.punted == 0 and sw._compiled.stats()["packets_in"] >= 2 * NRANKS * PACKETS
    assert_same_registers(sw, sw_ref)


def assert_same_registers(a: UdpSwitch, b: UdpSwitch) -> None:
    """Equal registers, and the counters a resend cannot change (the two switches summed the
    same contributions; a resend's answer depends on timing)."""
    for name, reg in a.pipeline.registers.items():
        np.testing.assert_array_equal(reg, b.pipeline.registers[name], err_msg=name)
    for name in ("job_aggregated", "job_lane_saturated", "job_lane_mismatch"):
        np.testing.assert_array_equal(a.pipeline.counters[name], b.pipeline.counters[name],
                                      err_msg=name)


def test_a_rerun_sends_the_same_values():
    """The draws are a function of (job, rank, call): the same calls give the same results."""
    job = _job(8)
    xs = _tensors(3)
    a, _, _, _ = _run(job, xs, calls=2)
    b, _, _, _ = _run(job, xs, calls=2)
    assert a[0][0].tobytes() == b[0][0].tobytes() and a[0][1].tobytes() == b[0][1].tobytes()
    assert a[0][0].tobytes() != a[0][1].tobytes()  # call 2 draws afresh


def test_ranks_that_disagree_on_the_width_all_fail_and_the_switch_counts_it():
    """Rank 3 sends 8-bit lanes into a 16-bit job's rounds: every rank raises LengthMismatch
    (no wrong sum), and job_lane_mismatch counts rank 3's contributions."""
    job = _job(16)
    other = JobConfig(**{**job.__dict__, "lane_bits": 8})
    _, _, errors, sw = _run(job, _tensors(4), agent_job=lambda r: other if r == 3 else job)
    assert all(isinstance(e, LengthMismatch) and "lane width" in str(e) for e in errors), errors
    # the setup round of each slot: rank 3's packet met a round another rank started (else
    # the other ranks' met rank 3's), and each is counted once
    assert 1 <= sw.pipeline.job_counters(job.job)["job_lane_mismatch"] <= W * (NRANKS - 1)


@pytest.mark.parametrize("switch_datapath", ["compiled", "python"])
def test_an_int32_rank_among_narrow_ones_fails_every_rank_on_both_switch_paths(switch_datapath):
    """Rank 3's job says 32-bit lanes: its packets carry no width flag; both switch paths
    compare each contribution's width with its round's first, mark the rounds MISMATCH and
    count them, and no rank takes a sum."""
    job = _job(16)
    wide = JobConfig(**{**job.__dict__, "lane_bits": 32})
    _, _, errors, sw = _run(job, _tensors(5), agent_job=lambda r: wide if r == 3 else job,
                            switch_datapath=switch_datapath)
    assert all(isinstance(e, LengthMismatch) for e in errors), errors
    assert 1 <= sw.pipeline.job_counters(job.job)["job_lane_mismatch"] <= W * (NRANKS - 1)


def test_error_feedback_keeps_what_the_lane_did_not_carry():
    """One rank, three 8-bit calls with a residual: the new residual is the tensor plus the old
    residual minus the result, and stays below one unit of its slot."""
    job = local_job(1, job=6, nslots=1, block_size=B, nlanes=4, lane_bits=8)
    sw = UdpSwitch(port=0)
    sw.add_job(job)
    sw.start()
    x = np.random.default_rng(5).standard_normal(4 * B).astype(np.float32) * 0.01
    residual = np.zeros_like(x)
    try:
        with Agent(job, 0, sw.address, timeout=5.0) as agent:
            for _ in range(3):
                target = x + residual
                got = agent.allreduce(x, residual=residual)
                e = int(exponent_of_bits(np.abs(target).view(np.int32).max(keepdims=True))[0])
                unit = 2.0 ** -quant_shift(e, 1, 8)
                assert np.abs(residual).max() < unit
                np.testing.assert_array_equal(residual, target - got)  # float32, as the agent
                assert np.array_equal(got / unit, np.round(got / unit))  # whole units
            with pytest.raises(ValueError, match="residual"):
                agent.allreduce(x, residual=np.zeros(3, np.float32))
    finally:
        sw.stop()


def test_error_feedback_in_place_matches_a_new_result():
    """allreduce(x, inplace=True, residual=r) forms x + r in x and sums there: x holds the
    result, bit for bit the new array the call returns without inplace, and r the same
    residual, call after call (each way on a fresh switch: the same call ids and draws)."""
    x0 = np.random.default_rng(6).standard_normal(4 * B).astype(np.float32) * 0.01
    runs = {}
    for inplace in (False, True):
        job = local_job(1, job=6, nslots=1, block_size=B, nlanes=4, lane_bits=8)
        sw = UdpSwitch(port=0)
        sw.add_job(job)
        sw.start()
        residual, outs = np.zeros_like(x0), []
        try:
            with Agent(job, 0, sw.address, timeout=5.0) as agent:
                for _ in range(3):
                    x = x0.copy()
                    got = agent.allreduce(x, inplace=inplace, residual=residual)
                    assert np.shares_memory(got, x) == inplace
                    assert np.array_equal(x, got if inplace else x0)
                    outs.append((got.tobytes(), residual.tobytes()))
                with pytest.raises(ValueError, match="inplace with residual"):
                    agent.allreduce(x0.astype(np.float64), inplace=True, residual=residual)
        finally:
            sw.stop()
        runs[inplace] = outs
    assert runs[True] == runs[False] and runs[True][0][1] != runs[True][1][1]


# ------------------------------------------------------------------ the pipeline, packet by packet
def _pipeline_job(nworkers: int = 2) -> tuple[Pipeline, JobConfig]:
    job = local_job(nworkers, job=9, nslots=1, block_size=4, nlanes=2)
    p = Pipeline(pool_slots=4, slot_capacity=64)
    p.add_job(job, {r: (0, (w.host, w.port)) for r, w in enumerate(job.workers)})
    return p, job


def _contribution(job: JobConfig, rank: int, flags: int, values) -> tuple[bytes, tuple]:
    h = wire.Header(flags=flags | wire.FLAG_LAST, job=job.job, epoch=job.epoch, rank=rank,
                    nlanes=2, round=1, length=8, block_size=4, present=0b11)
    w = job.workers[rank]
    return wire.pack(h, [wire.END, wire.END], np.asarray(values).reshape(2, 4)), (w.host, w.port)


def test_a_sum_beyond_the_lane_saturates_and_is_counted():
    """Two 16-bit contributions whose sums leave int16: the answer is clipped to
    -32768..32767 in 16-bit rows, counted once in job_lane_saturated."""
    p, job = _pipeline_job()
    a = [30000, -30000, 1, 2, 32767, -32768, 0, 7]
    b = [30000, -30000, 3, 4, 1, -1, 0, -7]
    for rank, vals in ((0, a), (1, b)):
        pkt, src = _contribution(job, rank, wire.FLAG_LANES16, vals)
        emits = p.process(pkt, 0, src)
    (emit,) = emits
    res = wire.unpack(emit.data)
    assert res.header.flags & wire.FLAGS_LANE_WIDTH == wire.FLAG_LANES16
    assert res.data.dtype == np.dtype(">i2")
    assert res.data.ravel().tolist() == [32767, -32768, 4, 6, 32767, -32768, 0, 0]
    assert len(emit.data) == wire.packet_len(2, 4, 2, wire.FLAG_LANES16) == 48 + 8 + 16
    assert p.job_counters(job.job)["job_lane_saturated"] == 1
    assert p.job_counters(job.job)["job_lane_mismatch"] == 0


def test_a_width_that_differs_from_the_rounds_first_is_marked_and_counted():
    """16-bit then 8-bit in one round: the result is MISMATCH (in the round's 16-bit rows)
    and job_lane_mismatch is 1; 8-bit rows sum exactly into the int32 registers."""
    p, job = _pipeline_job()
    pkt, src = _contribution(job, 0, wire.FLAG_LANES16, [1, 2, 3, 4, 5, 6, 7, 8])
    assert p.process(pkt, 0, src) == []
    pkt, src = _contribution(job, 1, wire.FLAG_LANES8, [-1, -2, -3, -4, 100, 0, 0, 0])
    (emit,) = p.process(pkt, 0, src)
    res = wire.unpack(emit.data)
    assert res.header.flags & wire.FLAG_MISMATCH
    assert res.header.flags & wire.FLAGS_LANE_WIDTH == wire.FLAG_LANES16
    assert res.data.ravel().tolist() == [0, 0, 0, 0, 105, 6, 7, 8]
    assert p.job_counters(job.job)["job_lane_mismatch"] == 1


def test_metrics_export_the_lane_counters():
    """The switch's exporter has spina_job_lane_saturated and _mismatch per job."""
    from softswitch.metrics import SwitchCollector
    p, job = _pipeline_job()
    p.counters["job_lane_saturated"][job.job] = 3
    p.counters["job_lane_mismatch"][job.job] = 2
    got = {(f.name, s.labels.get("job_id")): s.value for f in SwitchCollector(p).collect()
           for s in f.samples}
    assert got[("spina_job_lane_saturated", "9")] == 3
    assert got[("spina_job_lane_mismatch", "9")] == 2


@pytest.mark.parametrize("value", [12, 0, 64, "16", 16.0, True])
def test_bad_lane_bits_are_refused_naming_the_field(value):
    """lane_bits outside 32, 16, 8 (or not an int) is a ConfigError naming the field."""
    with pytest.raises(ConfigError, match="lane_bits"):
        JobConfig.from_dict({"job": 1, "lane_bits": value,
                             "workers": [{"host": "127.0.0.1", "port": 50000}]})


def test_narrow_lanes_need_a_flat_job():
    """A two-level job keeps int32 lanes (the leaf/spine roles do not parse narrow rows)."""
    with pytest.raises(ConfigError, match="lane_bits.*flat job"):
        local_job(2, racks=(1, 1), lane_bits=16)


def test_a_nonfinite_block_is_nan_at_every_rank_and_the_rest_exact():
    """Rank 1 has a NaN and rank 2 an Inf in block 3: that block is NaN at every rank; every
    other block is the numpy sum of the quantized integers, the bad values counted as 0."""
    job = _job(16)
    xs = _tensors(8)
    xs[1][3 * B + 5] = np.nan
    xs[2][3 * B + 9] = np.inf
    out, _, errors, _ = _run(job, xs)
    assert errors == [None] * NRANKS
    clean = [np.where(np.isfinite(x), x, np.float32(0)) for x in xs]
    want = _expected(job, clean)
    want[3 * B:4 * B] = np.nan
    for r in range(NRANKS):
        assert out[r][0].tobytes() == want.tobytes(), r


class _Bucket:
    """What the DDP hook uses of a GradBucket, with an index (the residual's key)."""

    def __init__(self, t, index=0):
        self._t, self._index = t, index

    def buffer(self):
        return self._t

    def index(self):
        return self._index

    def is_last(self):
        return True


def test_the_ddp_hook_keeps_a_residual_per_bucket_on_narrow_lanes():
    """Two ranks, three 8-bit steps of one bucket through the DDP hook: every step's average
    times 2 is both ranks' bucket plus old residual minus new residual (float32 rounding
    apart), and the residuals are non-zero; the states count the calls' rounds; an int32 job
    keeps none."""
    import torch

    from host_agent.hooks import SpinaHookState, spina_allreduce_hook
    from host_agent.local import LocalCluster
    gen = torch.Generator().manual_seed(3)
    with LocalCluster(2, lane_bits=8, nslots=2, nlanes=4, block_size=B) as c:
        states = [SpinaHookState(a) for a in c.agents]
        rounds = [0, 0]
        for _ in range(3):
            xs = [torch.randn(1000, generator=gen) * 0.01 for _ in range(2)]
            # summed in place (one piece): the residual has the bucket's length
            before = [s.residual_for(_Bucket(x), 1000).copy() for s, x in zip(states, xs)]
            sent = [x.clone() for x in xs]  # the hook sums each bucket where it lies
            outs = [f.wait() for f in [spina_allreduce_hook(s, _Bucket(x))
                                       for s, x in zip(states, xs)]]
            assert torch.equal(outs[0], outs[1])
            rounds = [r + a.last_stats.rounds for r, a in zip(rounds, c.agents)]
            after = [s.residuals[0] for s in states]
            carried = sum(x.numpy() + b - a for x, b, a in zip(sent, before, after))
            np.testing.assert_allclose(outs[0].numpy() * 2, carried, rtol=0, atol=1e-7)
            assert all(np.abs(a).max() > 0 for a in after)
        assert [s.rounds for s in states] == rounds and rounds[0] >= 3
    with LocalCluster(2, nslots=2, nlanes=4, block_size=B) as c:
        s = SpinaHookState(c.agents[0])
        assert s.residual_for(_Bucket(torch.ones(3)), 64) is None and s.residuals == {}


@pytest.mark.parametrize("datapath", ["compiled", "python"])
def test_narrow_rows_may_hold_more_values_than_an_int32_datagram(datapath):
    """An 8-bit job of 56 lanes x 1024 (a 57 KB datagram; int32 rows would need 229 KB) is
    valid, a 32-bit one is not; two ranks' integer-valued tensors (exact in the lanes: shift
    0) sum exactly through a switch whose slots hold them, in 57 KB datagrams; an int32
    tensor on the job is refused naming the lanes."""
    kw = dict(job=7, nslots=2, block_size=1024, nlanes=56)
    with pytest.raises(ConfigError, match="at most 15 fit"):
        local_job(2, lane_bits=32, **kw)
    job = local_job(2, lane_bits=8, **kw)
    rng = np.random.default_rng(9)
    xs = [rng.integers(-31, 32, 300_000).astype(np.float32) for _ in range(2)]
    sw = UdpSwitch(port=0, slot_capacity=56 * 1024, datapath=datapath)
    sw.add_job(job)
    sw.start()
    try:
        agents = [Agent(job, r, sw.address, timeout=5.0, datapath=datapath) for r in range(2)]
        outs = [None, None]
        threads = [threading.Thread(target=lambda r=r: outs.__setitem__(
            r, agents[r].allreduce(xs[r]))) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert outs[0].tobytes() == outs[1].tobytes() == (xs[0] + xs[1]).tobytes()
        # 293 blocks over 2 x 56 lanes: a setup and 3 data rounds a slot, 57 KB datagrams,
        # one byte a value
        data = -(-300_000 // 1024) * 1024
        for a in agents:
            assert_sent_once_plus_resends(a.last_stats, 2 * (1 + 3),
                                          8 * wire.data_offset(56) + data, data, 56)
        with pytest.raises(ValueError, match="int32 tensor travels in int32 lanes"):
            agents[0].allreduce(np.ones(10, np.int32))
    finally:
        for a in agents:
            a.close()
        sw.stop()


@pytest.mark.parametrize("datapath", ["compiled", "python"])
def test_lanes_bench_smoke(tmp_path, datapath):
    """`python -m bench lanes` runs (2 ranks, 8,192 elements, one call per width) on either
    path, every result within its width's bound (wrong 0), and reports each width's bytes: 4,
    2 and 1 per value of the 32 blocks, and the headers of the same 2 datagrams (the 32 blocks
    are lanes 0-31, slot 0's: its setup round and one data round; the other 15 slots hold no
    block of the tensor and send nothing)."""
    import csv

    from bench import harness
    assert harness.main(["lanes", "-b", "32K", "-e", "32K", "-g", "2", "-n", "1",
                         "--agent-datapath", datapath, "--switch-datapath", datapath,
                         "--no-plots", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "results.csv", newline="") as f:
        rows = {int(r["lane_bits"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == [8, 16, 32] and rows[32]["vs_32bit"] == "1.0"
    for bits, item in ((32, 4), (16, 2), (8, 1)):
        r = rows[bits]
        sent, data, packets = (int(r[k]) for k in ("bytes_per_link", "payload_bytes_per_link",
                                                   "packets_per_link"))
        assert data == 8192 * item and r["wrong"] == "0", bits
        if packets == 2:  # no resend (a loaded machine may time one out: then more)
            assert sent == 2 * wire.data_offset(56) + data, bits
        assert packets >= 2 and sent >= 2 * wire.data_offset(56) + data, bits
