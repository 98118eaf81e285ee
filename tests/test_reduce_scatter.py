"""Reduce-scatter through the software switch (Agent.reduce_scatter, host_agent/scatter.py,
docs/protocol.md "Reduce-scatter") over loopback UDP: each rank's shard of the sum, exact for
int32 and within the quantization bound for floats (bit for bit the all-reduce's on the
all-reduce's lanes), on torch.chunk's split; the switch's copies for ranks owning none of a
round's blocks carry no data, and sparse lanes laid out by shard give each round one owner
(the packets and bytes each rank receives); loss,
duplication and reordering recovered; a missing rank named; narrow lanes and block hints.

Run just this file: .venv/bin/python -m pytest tests/test_reduce_scatter.py
"""
from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from host_agent import scatter
from host_agent.agent import Agent, SpinaError, SpinaTimeout
from host_agent.local import LocalCluster
from softswitch.egress import scatter_strip
from softswitch.udp import Faults, UdpSwitch
from spina import wire
from spina.config import JobConfig, WorkerAddr
from spina.net import bound_udp_socket

B, K, W = 16, 4, 3  # small blocks, lanes and window: many rounds per call


def ints(rng, n, nworkers, lo=-1000, hi=1000):
    return [rng.integers(lo, hi, n).astype(np.int32) for _ in range(nworkers)]


def assert_shards(got, total, nworkers):
    """Rank r's result is torch.chunk(total, nworkers)[r] (empty past the chunks), exactly."""
    torch = pytest.importorskip("torch")
    chunks = torch.chunk(torch.from_numpy(np.ascontiguousarray(total)), nworkers)
    for r, g in enumerate(got):
        want = chunks[r].numpy() if r < len(chunks) else total[:0]
        assert g.dtype == total.dtype and g.shape == want.shape, (r, g.shape, want.shape)
        assert g.tobytes() == want.tobytes(), r


@pytest.mark.parametrize("nworkers,n", [(1, 17), (2, 64), (3, 1001), (4, 1000), (5, 7),
                                        (7, 333), (8, 4099)])
def test_reduce_scatter_int32_exact_on_torch_chunks_split(nworkers, n):
    """int32, 1-8 ranks, lengths no rank count or block divides (n=7 over 5 ranks: the last
    shards empty): each rank gets exactly its torch.chunk shard of the sum, wrapping as numpy."""
    rng = np.random.default_rng(nworkers)
    xs = ints(rng, n, nworkers, -(1 << 31) // 8, (1 << 31) // 8)
    with LocalCluster(nworkers, block_size=B, nlanes=K, nslots=W) as c:
        assert_shards(c.reduce_scatter(xs), np.sum(xs, axis=0, dtype=np.int32), nworkers)


@pytest.mark.parametrize("switch_path", ["compiled", "python"])
@pytest.mark.parametrize("agent_path", ["compiled", "python"])
def test_reduce_scatter_on_every_data_path(switch_path, agent_path):
    """Both switch data paths (the compiled one hands reduce-scatter rounds to Python) and
    both agent data paths give the same exact shards."""
    rng = np.random.default_rng(2)
    xs = ints(rng, 2000, 4)
    with UdpSwitch(port=0, datapath=switch_path) as sw, \
            LocalCluster(4, switch=sw, block_size=B, nlanes=K, nslots=W) as c:
        for a in c.agents:
            a.datapath = agent_path
        assert_shards(c.reduce_scatter(xs), np.sum(xs, axis=0, dtype=np.int32), 4)


@pytest.mark.parametrize("nslots", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_reduce_scatter_floats_within_the_bound(dtype, nslots):
    """float32/16/64: each shard within the documented bound of the exact sum, NaN where a
    rank had a NaN; with fewer slots than ranks (the all-reduce's lanes, the same slot
    exponents) bit for bit that part of the all-reduce's result of the same tensors."""
    rng = np.random.default_rng(3)
    n, N = 999, 3
    xs = [rng.standard_normal(n).astype(dtype) for _ in range(N)]
    xs[0][:100] *= 64  # by shard: a larger exponent in shard 0's slots only
    xs[1][500] = np.nan
    with LocalCluster(N, block_size=B, nlanes=K, nslots=nslots) as c:
        got = c.reduce_scatter(xs)
        full = c.allreduce(xs)
    c_ = scatter.shard_size(n, N)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for r, g in enumerate(got):
        assert g.dtype == dtype and len(g) == c_
        assert nslots >= N or g.tobytes() == full[r][r * c_:(r + 1) * c_].tobytes()
    nan_block = slice(500 // B * B, 500 // B * B + B)
    assert np.isnan(got[1][nan_block.start - c_:nan_block.stop - c_]).all()
    ok = np.ones(n, bool)
    ok[nan_block] = False
    # int32 lanes: within nworkers * 2**(-S-1) per block, S from the block's slot exponent;
    # 2**-20 of the largest |x| bounds it for 3 ranks (docs/aggregation.md), plus dtype rounding
    tol = np.nanmax(np.abs(np.stack(xs).astype(np.float64))) * 2.0 ** -20 + \
        np.abs(exact[ok]).max() * np.finfo(dtype).eps
    flat = np.concatenate(got)
    assert np.abs(flat[ok] - exact[ok]).max() <= tol


def test_reduce_scatter_torch_bfloat16():
    """A torch bfloat16 tensor: a bfloat16 shard, the all-reduce's part of it."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(300, generator=g).to(torch.bfloat16) for _ in range(3)]
    with LocalCluster(3, block_size=B, nlanes=K, nslots=W) as c:
        got = c.reduce_scatter(xs)
        full = c.allreduce(xs)
    for r, s in enumerate(got):
        assert s.dtype == torch.bfloat16 and torch.equal(s, full[r][r * 100:(r + 1) * 100])


def test_reduce_scatter_sends_each_round_only_to_its_owners():
    """Dense, shards on block boundaries: every data round has one owner. Each rank receives
    the setup results, its own rounds whole and every other round as a header with its next
    positions (48 + 4*nlanes bytes), byte for byte; it sends what an all-reduce sends."""
    N, rounds = 4, 8  # data rounds per slot; each shard: 2 rounds of every slot
    n = rounds * W * K * B
    rng = np.random.default_rng(5)
    xs = ints(rng, n, N)
    head = wire.data_offset(K)
    with LocalCluster(N, block_size=B, nlanes=K, nslots=W) as c:
        assert_shards(c.reduce_scatter(xs), np.sum(xs, axis=0, dtype=np.int32), N)
        rs = [(a.last_stats.bytes_sent, a.last_stats.bytes_received) for a in c.agents]
        c.allreduce(xs)
        ar = [(a.last_stats.bytes_sent, a.last_stats.bytes_received) for a in c.agents]
    own = rounds * W // N  # data rounds whose blocks a rank owns
    full = head + K * B * 4
    want = W * head + own * full + (rounds * W - own) * head
    assert [r[1] for r in rs] == [want] * N
    assert [r[0] for r in rs] == [a[0] for a in ar]  # sent: as much as an all-reduce
    assert [a[1] for a in ar] == [W * head + rounds * W * full] * N


@pytest.mark.parametrize("switch_path", ["compiled", "python"])
@pytest.mark.parametrize("agent_path", ["compiled", "python"])
def test_sparse_rounds_each_go_to_one_owner(switch_path, agent_path):
    """Sparse, as many slots as ranks: slot g's lanes hold shard g's blocks only
    (scatter.Owners.lanes; lane j of them blocks 32 g + j + 4 m), so every data round has one
    owner however the lanes drift. Each rank receives one result per round of every slot
    (1 + the most union blocks in one of its lanes) and as data exactly the union's blocks
    in its own shard, byte for byte (a status, the answer to a resend while a round waits for
    a slow rank, is one header more); exact sums."""
    N, per_shard = 4, 32
    n = N * per_shard * B
    rng = np.random.default_rng(11)
    xs, union = [], set()
    for _ in range(N):
        blocks = rng.choice(n // B, 6, replace=False)  # about 5% of the blocks each
        union.update(blocks.tolist())
        x = np.zeros(n, np.int32)
        x[(blocks[:, None] * B + np.arange(B)).ravel()] = rng.integers(1, 100, 6 * B)
        xs.append(x)
    u = np.array(sorted(union))
    own = np.bincount(u // per_shard, minlength=N)  # union blocks per shard
    rounds = sum(1 + np.bincount(u[u // per_shard == g] % K, minlength=K).max()
                 for g in range(N))
    with UdpSwitch(port=0, datapath=switch_path) as sw, \
            LocalCluster(N, switch=sw, rto=0.5, block_size=B, nlanes=K, nslots=N) as c:
        for a in c.agents:
            a.datapath = agent_path
        assert_shards(c.reduce_scatter(xs), np.sum(xs, axis=0, dtype=np.int32), N)
        got = [a.last_stats for a in c.agents]
    head = wire.data_offset(K)
    for r, st in enumerate(got):
        assert st.bytes_received - st.packets_received * head == own[r] * B * 4
        assert st.packets_received == rounds or st.resends


def test_reduce_scatter_recovers_loss_duplication_and_reordering():
    """10% of the datagrams into and out of the switch lost, some duplicated and reordered:
    several calls in a row, each shard exact."""
    rng = np.random.default_rng(6)
    faults = Faults(drop_in=0.1, drop_out=0.1, duplicate=0.05, reorder=0.05, seed=7)
    with UdpSwitch(port=0, datapath="python", faults=faults) as sw, \
            LocalCluster(4, switch=sw, block_size=B, nlanes=K, nslots=W) as c:
        for n in (1500, 777, 64):
            xs = ints(rng, n, 4)
            assert_shards(c.reduce_scatter(xs), np.sum(xs, axis=0, dtype=np.int32), 4)
        assert faults.dropped_in and faults.dropped_out


def test_reduce_scatter_missing_rank_is_named():
    """Rank 2 never calls: the others fail naming it (SpinaTimeout.missing == [2])."""
    rng = np.random.default_rng(8)
    xs = ints(rng, 500, 3)
    with LocalCluster(3, timeout=0.5, block_size=B, nlanes=K, nslots=W) as c:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(c.agents[r].reduce_scatter, xs[r]) for r in (0, 1)]
            for f in futs:
                with pytest.raises(SpinaTimeout, match=r"ranks \[2\] never contributed") as e:
                    f.result(timeout=30)
                assert e.value.missing == [2]


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_reduce_scatter_narrow_lanes_are_the_allreduce_shards(lane_bits):
    """16- and 8-bit lanes (fewer slots than ranks: the all-reduce's lanes): each shard bit for
    bit the all-reduce's of the same job at the same call number (the same stochastic
    rounding draws: seed job id, rank, call), within the narrow lanes' bound of the exact sum
    (docs/bits.md: below nworkers * 2**-S), and the rows sent 2 or 4 times narrower than
    int32's."""
    rng = np.random.default_rng(9)
    xs = [rng.uniform(-1, 1, 640).astype(np.float32) for _ in range(4)]
    lanes = dict(block_size=B, nlanes=K, nslots=W, lane_bits=lane_bits)
    with LocalCluster(4, **lanes) as a, LocalCluster(4, **lanes) as b:  # two switches, job 1
        got = a.reduce_scatter(xs)
        sent = [ag.last_stats.payload_bytes_sent for ag in a.agents]
        full = b.allreduce(xs)
    exact = np.sum(xs, axis=0, dtype=np.float64)
    bound = 4 * 2.0 ** -(lane_bits - 2 - 2)  # S = lane_bits - 2 - log2(4) - exponent (0)
    for r, g in enumerate(got):
        assert len(g) == 160 and g.tobytes() == full[r][r * 160:(r + 1) * 160].tobytes()
        assert np.abs(g - exact[r * 160:(r + 1) * 160]).max() < bound
    assert sent == [640 * lane_bits // 8] * 4


def test_reduce_scatter_with_block_hints():
    """Sparse tensors with `blocks=` hints (each rank's own non-zero blocks): exact shards,
    and only the hinted blocks' rows sent."""
    rng = np.random.default_rng(10)
    n, N = 4096, 4
    xs, hints = [], []
    for _ in range(N):
        x = np.zeros(n, np.int32)
        blocks = np.sort(rng.choice(n // B, 10, replace=False))
        for b_ in blocks:
            x[b_ * B:(b_ + 1) * B] = rng.integers(-100, 100, B)
        xs.append(x)
        hints.append(blocks)
    with LocalCluster(N, block_size=B, nlanes=K, nslots=W) as c:
        assert_shards(c.reduce_scatter(xs, blocks=hints), np.sum(xs, axis=0, dtype=np.int32), N)
        assert [a.last_stats.nonzero_blocks for a in c.agents] == [10] * N


def test_reduce_scatter_refuses_a_two_level_job():
    """A job with racks: SpinaError saying reduce-scatter needs a flat job, nothing sent."""
    job = JobConfig(job=3, workers=tuple(WorkerAddr(r, "127.0.0.1", 41000 + r)
                                         for r in range(4)), racks=(2, 2))
    with Agent(job, 0, ("127.0.0.1", 9), sock=bound_udp_socket()) as a:
        with pytest.raises(SpinaError, match="reduce-scatter needs a flat job"):
            a.reduce_scatter(np.ones(8, np.float32))
        assert a.last_stats.packets_sent == 0


def test_shard_bounds_are_torch_chunk():
    """scatter.shard_bounds matches torch.chunk's pieces (and empty ones past them)."""
    torch = pytest.importorskip("torch")
    for n in (0, 1, 5, 7, 16, 1001):
        for N in range(1, 9):
            chunks = torch.chunk(torch.arange(n), N) if n else ()
            for r in range(N):
                lo, hi = scatter.shard_bounds(n, N, r)
                want = chunks[r].tolist() if r < len(chunks) else []
                assert list(range(lo, hi)) == want, (n, N, r)


def test_owners_of_a_round():
    """Owners.of: the ranks whose shards a round's blocks touch; END and -1 lanes none."""
    o = scatter.Owners(100, 4, 16)  # shards of 25: [0,25) [25,50) [50,75) [75,100)
    assert o.of(np.array([0, -1, wire.END], np.int64)) == 0b0001  # elements 0..15
    assert o.of(np.array([1], np.int64)) == 0b0011                # 16..31 spans ranks 0, 1
    assert o.of(np.array([6], np.int64)) == 0b1000                # 96..99 (cut at n)
    assert o.of(np.array([3, 4], np.int64)) == 0b1110             # 48..79
    assert o.of(np.array([-1, -1], np.int64)) == 0


def _contribs(job, owners: int, rnd: int = 1, flags: int = 0) -> list[bytes]:
    """Each rank's contribution to round `rnd` of `job`'s first slot, every lane present
    (rank r's values r+1), naming `owners` in its bitmap."""
    k, bs = job.nlanes, job.block_size
    return [wire.pack(wire.Header(job=job.job, epoch=job.epoch, slot=job.slot_base, rank=r,
                                  nlanes=k, round=rnd, length=k * bs, block_size=bs,
                                  present=(1 << k) - 1, bitmap=owners, flags=flags,
                                  exponent=wire.EXPONENT_NONE),
                      np.full(k, wire.END), np.full((k, bs), r + 1))
            for r in range(job.nworkers)]


@pytest.mark.parametrize("datapath", ["compiled", "python"])
def test_udp_switch_strips_the_copies_of_non_owners(datapath):
    """UDP mode, a round owned by rank 1 of 3: rank 1's copy is the whole result, ranks 0 and
    2 get its header and next positions (present 0); a resend from a non-owner to the
    complete round gets the header only too, from the owner the whole result; the compiled
    path serves it all itself."""
    from tests.test_datapath import JOBS
    job = JOBS[0]
    with UdpSwitch(port=0, datapath=datapath) as sw:
        sw.add_job(job)
        addr = [(w.host, w.port) for w in job.workers]
        pkts = _contribs(job, 0b010)
        assert sw.run_one(pkts[0], addr[0]) == [] and sw.run_one(pkts[1], addr[1]) == []
        out = dict(sw.run_one(pkts[2], addr[2]))
        assert sorted(out) == sorted(addr)
        whole = wire.unpack(out[addr[1]])
        assert whole.header.msg_type == wire.MSG_RESULT and whole.header.bitmap == 0b111
        assert (whole.data == 6).all() and whole.header.present == 0b1111
        head = wire.data_offset(job.nlanes)
        for r in (0, 2):
            assert out[addr[r]] == scatter_strip(out[addr[1]])
            stripped = wire.unpack(out[addr[r]])
            assert len(out[addr[r]]) == head and stripped.header.present == 0
            assert stripped.header.bitmap == 0b111 and (stripped.next == wire.END).all()
        resend = bytearray(pkts[0])
        resend[wire.FIELD_OFFSET["flags"]] |= wire.FLAG_RESEND
        [(to, again)] = sw.run_one(bytes(resend), addr[0])
        h = wire.unpack(again).header
        assert to == addr[0] and len(again) == head and h.present == 0
        assert h.msg_type == wire.MSG_RESULT and h.flags & wire.FLAG_RESEND
        resend = bytearray(pkts[1])
        resend[wire.FIELD_OFFSET["flags"]] |= wire.FLAG_RESEND
        [(to, again)] = sw.run_one(bytes(resend), addr[1])
        assert to == addr[1] and wire.unpack(again).data.tobytes() == whole.data.tobytes()
        if datapath == "compiled":
            assert sw.punted == 0  # the compiled path strips the copies itself



@pytest.mark.parametrize("datapath", ["compiled", "python"])
def test_udp_switch_status_and_flush_carry_no_other_owners_data(datapath):
    """UDP mode, a round owned by rank 1 of 3 whose slot holds rank 1's and rank 0's blocks:
    rank 0's resend gets the status (header and next positions, present 0: a status never
    carries data); its flush (FLAG_PARTIAL) sends rank 1 the partial sum whole and ranks 0
    and 2 its header; the compiled path serves both itself."""
    from tests.test_datapath import JOBS
    job = JOBS[0]
    head = wire.data_offset(job.nlanes)
    with UdpSwitch(port=0, datapath=datapath) as sw:
        sw.add_job(job)
        addr = [(w.host, w.port) for w in job.workers]
        pkts = _contribs(job, 0b010)
        assert sw.run_one(pkts[1], addr[1]) == [] and sw.run_one(pkts[0], addr[0]) == []
        again = bytearray(pkts[0])
        again[wire.FIELD_OFFSET["flags"]] |= wire.FLAG_RESEND
        [(to, status)] = sw.run_one(bytes(again), addr[0])
        h = wire.unpack(status).header
        assert to == addr[0] and len(status) == head
        assert h.msg_type == wire.MSG_STATUS and h.present == 0 and h.bitmap == 0b011
        again[wire.FIELD_OFFSET["flags"]] |= wire.FLAG_PARTIAL
        out = dict(sw.run_one(bytes(again), addr[0]))
        assert sorted(out) == sorted(addr)
        whole = wire.unpack(out[addr[1]])
        assert whole.header.flags & wire.FLAG_PARTIAL and whole.header.present == 0b1111
        assert (whole.data == 3).all()  # ranks 0 and 1: 1 + 2
        for r in (0, 2):
            assert out[addr[r]] == scatter_strip(out[addr[1]]) and len(out[addr[r]]) == head
        if datapath == "compiled":
            assert sw.punted == 0

def test_l2_dataplane_strips_the_copies_of_non_owners_on_both_paths():
    """L2 mode (Dataplane, frames): a round owned by ranks 0 and 2 leaves whole on their
    ports and as a header-only frame (IPv4 and UDP lengths to match) on rank 1's, the same
    frames on the compiled path (which hands reduce-scatter rounds to Python in this mode)
    and the Python one."""
    from tests.test_datapath import JOBS
    from tests.test_datapath_l2 import PORTS, frame, pair
    job = JOBS[0]
    fast, ref = pair()
    pkts = _contribs(job, 0b101)
    outs = []
    for dp in (fast, ref):
        got = []
        for r, p in enumerate(pkts):
            got += dp.process(frame(p, job.workers[r].port, src_mac=bytes(6)), PORTS[3][r])
        outs.append(got)
    assert outs[0] == outs[1]
    by_port = dict(outs[0])
    assert sorted(by_port) == [1, 2, 3]
    ina = 14 + 20 + 8
    for port, f in by_port.items():
        pkt = wire.unpack(f[ina:])
        assert int.from_bytes(f[16:18], "big") == len(f) - 14  # IPv4 total length
        assert int.from_bytes(f[38:40], "big") == len(f) - 14 - 20  # UDP length
        if port == 2:  # rank 1
            assert pkt.header.present == 0 and len(pkt.data) == 0
        else:
            assert pkt.header.present == 0b1111 and (pkt.data == 6).all()


def test_owners_are_a_flat_jobs_only():
    """FabricRoles.owners: a result of a reduce-scatter contribution names its owners; of an
    all-reduce contribution (bitmap 0) none; at a spine none (a leaf's partial carries its
    rack's contributors in bitmap, not owners); a status none."""
    from softswitch.dataplane import Dataplane
    from tests.test_datapath import JOBS
    roles = Dataplane(pool_slots=16, slot_capacity=64, datapath="python").roles
    rs, ar = _contribs(JOBS[0], 0b100)[0], _contribs(JOBS[0], 0)[0]
    result = bytearray(rs)
    result[1] = wire.MSG_RESULT
    assert roles.owners(rs, result) == 0b100 and roles.owners(ar, result) == 0
    result[1] = wire.MSG_STATUS
    assert roles.owners(rs, result) == 0
    result[1] = wire.MSG_RESULT
    roles.spines.add(JOBS[0].job)
    assert roles.owners(rs, result) == 0
