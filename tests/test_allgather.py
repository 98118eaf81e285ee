"""All-gather through the software switch (Agent.allgather, host_agent/allgather.py) over
loopback UDP: exact against numpy, bit for bit on every rank, the packets and bytes each rank
and the switch move, loss recovered by requests to the owners, bad calls refused.

Run just this file: .venv/bin/python -m pytest tests/test_allgather.py
"""
from __future__ import annotations

import numpy as np
import pytest

from host_agent import allgather as gather_mod
from host_agent.agent import LengthMismatch, SpinaError, SpinaTimeout
from host_agent.local import LocalCluster
from softswitch.udp import Faults, UdpSwitch
from spina import wire

B, K, W = 16, 4, 3  # small blocks, lanes and window: many chunks, the window's clock turns


def shards_of(rng, n, shape, dtype=np.float32):
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is None:
        return [rng.random(shape) < 0.5 for _ in range(n)]
    return [rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
            for _ in range(n)]


def assert_gathered(results, shards):
    """Every rank's result is the shards stacked by rank, byte for byte."""
    want = np.stack(shards)
    for got in results:
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


def chunks_of(nbytes: int) -> int:
    return -(-(-(-nbytes // 4) // B) // K)


@pytest.mark.parametrize("datapath", ["compiled", "python"])
def test_allgather_exact_on_every_rank(datapath):
    """4 ranks, float32 shards of a length no block or chunk divides: every rank holds every
    shard bit for bit, NaN payloads and signed zeros included, on either switch data path."""
    rng = np.random.default_rng(0)
    shards = shards_of(rng, 4, 1001)
    shards[2][5] = -0.0
    shards[3][7:9] = np.array([0x7FC00123, 0xFF800001], np.uint32).view(np.float32)  # NaNs
    with UdpSwitch(port=0, datapath=datapath) as sw, \
            LocalCluster(4, switch=sw, block_size=B, nlanes=K, nslots=W) as c:
        assert_gathered(c.allgather(shards), shards)
        if datapath == "compiled":  # the compiled path serves every gather packet itself
            assert sw.punted == 0 and sw.packets_in > 0


@pytest.mark.parametrize("dtype,shape", [(np.float64, (3, 50)), (np.int8, (7,)),
                                         (np.uint16, (2, 3, 5)), (np.bool_, (33,)),
                                         (np.int32, (0,)), (np.float32, ())])
def test_allgather_any_dtype_and_shape(dtype, shape):
    """Shards of any dtype and shape (odd byte counts, empty, 0-d): (nworkers, *shape) back."""
    rng = np.random.default_rng(1)
    shards = shards_of(rng, 3, shape, dtype)
    with LocalCluster(3, block_size=B, nlanes=K, nslots=W) as c:
        assert_gathered(c.allgather(shards), shards)


def test_allgather_of_one_worker_or_empty_shards_sends_nothing():
    """One worker, or shards of 0 bytes: the result at once, not a datagram sent."""
    with LocalCluster(1, block_size=B, nlanes=K, nslots=W) as c:
        x = np.arange(10, dtype=np.float32)
        assert_gathered(c.allgather([x]), [x])
        assert c.agents[0].last_gather_stats.packets_sent == 0
    with LocalCluster(2, block_size=B, nlanes=K, nslots=W) as c:
        e = np.zeros(0, np.float32)
        assert_gathered(c.allgather([e, e]), [e, e])
        assert [a.last_gather_stats.packets_sent for a in c.agents] == [0, 0]


def test_allgather_packets_and_bytes_are_one_send_per_chunk():
    """Without loss each rank sends each chunk once and receives the others' once; the switch
    takes N*chunks datagrams and sends N*(N-1)*chunks: the sender's own copy never comes
    back, no slot register is touched."""
    n, length = 4, 1000
    shards = shards_of(np.random.default_rng(2), n, length)
    chunks = chunks_of(4 * length)
    head = wire.data_offset(K)
    sent = sum(head + 4 * B * min(K, -(-length // B) - i * K) for i in range(chunks))
    with UdpSwitch(port=0) as sw, LocalCluster(n, switch=sw, block_size=B, nlanes=K,
                                               nslots=W) as c:
        assert_gathered(c.allgather(shards), shards)
        for a in c.agents:
            st = a.last_gather_stats
            assert (st.packets_sent, st.bytes_sent) == (chunks, sent)
            assert (st.packets_received, st.bytes_received) == ((n - 1) * chunks, (n - 1) * sent)
            assert st.resends == st.requests == st.duplicates == st.malformed_packets == 0
        assert (sw.packets_in, sw.bytes_in) == (n * chunks, n * sent)
        assert (sw.packets_out, sw.bytes_out) == (n * (n - 1) * chunks, n * (n - 1) * sent)
        assert sw.pipeline.job_counters(c.job.job)["job_received"] == n * chunks
        assert not sw.pipeline.registers["slot_round"].any()
        assert not sw.pipeline.registers["head_round"].any()


def test_allgather_recovers_lost_packets():
    """10% of the datagrams into and out of the switch lost: the receivers ask the owners
    again, and every rank still holds every shard bit for bit, several calls in a row."""
    rng = np.random.default_rng(3)
    faults = Faults(drop_in=0.1, drop_out=0.1, seed=4)
    asked = 0
    with UdpSwitch(port=0, faults=faults) as sw, \
            LocalCluster(3, switch=sw, block_size=B, nlanes=K, nslots=W) as c:
        for _ in range(3):
            shards = shards_of(rng, 3, 700)
            assert_gathered(c.allgather(shards), shards)
            asked += sum(a.last_gather_stats.requests for a in c.agents)
        assert faults.dropped_in and faults.dropped_out
        assert asked > 0


def test_allgather_between_allreduces():
    """All-gather and all-reduce calls interleaved on the same agents: both exact."""
    rng = np.random.default_rng(5)
    with LocalCluster(3, block_size=B, nlanes=K, nslots=W) as c:
        for _ in range(2):
            ints = [rng.integers(-1000, 1000, 300).astype(np.int32) for _ in range(3)]
            for got in c.allreduce(ints):
                assert np.array_equal(got, sum(ints))
            shards = shards_of(rng, 3, 200)
            assert_gathered(c.allgather(shards), shards)


def test_allgather_torch_tensors():
    """A torch bfloat16 tensor: a (nworkers, *shape) torch tensor of the same dtype, exact."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(6)
    shards = [torch.randn(5, 7, generator=g).to(torch.bfloat16) for _ in range(2)]
    with LocalCluster(2, block_size=B, nlanes=K, nslots=W) as c:
        for got in c.allgather(shards):
            assert got.dtype == torch.bfloat16 and got.shape == (2, 5, 7)
            assert torch.equal(got.view(torch.int16), torch.stack(shards).view(torch.int16))


def test_allgather_of_different_sizes_refused():
    """Ranks passing shards of different byte sizes: LengthMismatch naming the other rank."""
    with LocalCluster(2, timeout=2.0, block_size=B, nlanes=K, nslots=W) as c:
        with pytest.raises(LengthMismatch, match="rank 1's shard has 3 words"):
            c.allgather([np.zeros(10, np.float32), np.zeros(3, np.float32)], ranks=[0, 1])


def test_allgather_without_a_rank_times_out_naming_it():
    """A rank that never calls: the others fail after the timeout, naming it."""
    with LocalCluster(3, timeout=0.5, block_size=B, nlanes=K, nslots=W) as c:
        with pytest.raises(SpinaTimeout) as e:
            c.allgather([np.ones(40, np.float32)] * 3, ranks=[0, 1])
        assert e.value.missing == [2]


def test_allgather_needs_a_flat_job():
    """A two-level job (racks) is refused before anything is sent."""
    with LocalCluster(2, racks=(1, 1), block_size=B, nlanes=K, nslots=W) as c:
        with pytest.raises(SpinaError, match="flat job"):
            c.agents[0].allgather(np.ones(3, np.float32))


def last_chunk_of(rank: int, chunks: int, chunk: int | None = None):
    """A drop_in_match that loses the first arrival of `rank`'s last chunk (or `chunk`) at
    the switch."""
    seen = []
    lost = chunks - 1 if chunk is None else chunk

    def match(h) -> bool:
        hit = h.msg_type == wire.MSG_GATHER and h.rank == rank and h.round == lost \
            and not h.bitmap and not seen
        if hit:
            seen.append(h)
        return hit
    return match


def test_allgather_asks_for_a_gap_at_once(monkeypatch):
    """Rank 1's chunk 1 is lost at the switch: ranks 0 and 2 ask for it as soon as its chunk
    2 arrives, one request each, with the silence before any other request set beyond the
    call's timeout (which would end the call without them); rank 1 sends it again once for
    both requests (to everyone; the second within ANSWER_AGAIN of the first, here set past
    the call) and every rank ends with every shard, no chunk twice."""
    monkeypatch.setattr(gather_mod, "FIRST_ASK", 60.0)
    monkeypatch.setattr(gather_mod, "ANSWER_AGAIN", 60.0)
    rng = np.random.default_rng(8)
    shards = shards_of(rng, 3, 300)
    faults = Faults(drop_in_match=last_chunk_of(1, chunks_of(4 * 300), chunk=1))
    with UdpSwitch(port=0, faults=faults) as sw, \
            LocalCluster(3, switch=sw, timeout=5.0, block_size=B, nlanes=K, nslots=W) as c:
        assert_gathered(c.allgather(shards), shards)
        st = [a.last_gather_stats for a in c.agents]
    assert faults.dropped_in == 1
    assert [s.requests for s in st] == [1, 0, 1]
    assert [s.resends for s in st] == [0, 1, 0]
    assert [s.duplicates for s in st] == [0, 0, 0]


@pytest.mark.parametrize("then", ["nothing", "allreduce"])
def test_allgather_owner_answers_after_it_returned(then):
    """Rank 1's last chunk never reaches anyone the first time, so rank 1 is done while ranks
    0 and 2 still ask for it: rank 1 answers between calls (its responder thread) or from
    inside the all-reduce it went on to, and every rank ends with every shard."""
    rng = np.random.default_rng(7)
    shards = shards_of(rng, 3, 300)
    ints = [rng.integers(-99, 99, 50).astype(np.int32) for _ in range(3)]
    chunks = chunks_of(4 * 300)
    faults = Faults(drop_in_match=last_chunk_of(1, chunks))
    with UdpSwitch(port=0, faults=faults) as sw, \
            LocalCluster(3, switch=sw, timeout=3.0, block_size=B, nlanes=K, nslots=W) as c:
        def step(r):
            got = c.agents[r].allgather(shards[r])
            return got, (c.agents[r].allreduce(ints[r]) if then == "allreduce" else None)
        done = [c._pool.submit(step, r) for r in range(3)]
        results = [f.result() for f in done]
        assert_gathered([g for g, _ in results], shards)
        if then == "allreduce":
            for _, s in results:
                assert np.array_equal(s, sum(ints))
        assert faults.dropped_in == 1
        assert c.agents[1].last_gather_stats.resends >= 1
