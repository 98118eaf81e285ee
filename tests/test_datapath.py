"""The compiled UDP data path (softswitch/_datapath.c) against the Python pipeline, its
reference: the same random packet sequences in give the same packets out, to the same
destinations, and the same registers and counters.

Run just these: .venv/bin/python -m pytest -q tests/test_datapath.py
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from host_agent.local import LocalCluster
from softswitch import _datapath
from softswitch.udp import UdpSwitch
from spina import wire
from spina.config import JobConfig, WorkerAddr
from spina.net import bound_udp_socket
from tests.waits import until

HOST = "127.0.0.1"
FLAGS = (wire.FLAG_RESEND, wire.FLAG_LOSS_TOLERANT, wire.FLAG_LAST, wire.FLAG_PARTIAL)


def job_config(job: int, nworkers: int, first_port: int, epoch: int = 1, **kw) -> JobConfig:
    return JobConfig(job=job, workers=tuple(WorkerAddr(r, HOST, first_port + r)
                                            for r in range(nworkers)), epoch=epoch, **kw)


JOBS = (job_config(3, 3, 41000, nslots=4, slot_base=0, block_size=8, nlanes=4),
        job_config(9, 2, 42000, nslots=3, slot_base=6, block_size=5, nlanes=7))


class Traffic:
    """Random datagrams for JOBS: mostly admitted contributions of rounds near each slot's
    current one (duplicates, resends, flush requests, old and far rounds, partial lanes,
    wrapping int32 sums, disagreeing lengths), and some a switch must refuse: wrong epoch,
    unknown sender, slot or shape, a result or status sent by a host, a wrong version or length,
    a truncated header; a third of the contributions are a reduce-scatter's (random owners in
    their bitmap); some are all-gather packets (chunks, and requests naming owners). `widths`
    {job: width flag}: narrow lanes (docs/bits.md), each job's contributions mostly in its width,
    some in another (a width mismatch) or both (malformed), their values either small or
    anywhere in the width's range (sums that saturate)."""

    def __init__(self, seed: int, jobs=JOBS, stranger: int = 43000, widths=None,
                 gathers: bool = True):
        self.rng = np.random.default_rng(seed)
        self.rounds = {}
        self.jobs, self.stranger = jobs, stranger  # stranger: a UDP port no job admits
        self.epochs = {cfg.job: cfg.epoch for cfg in jobs}
        self.widths = widths
        self.gathers = gathers  # False: no all-gather packet (counted in job_received alone)

    def packet(self) -> tuple[bytes, tuple[str, int]]:
        rng = self.rng
        cfg = self.jobs[int(rng.integers(len(self.jobs)))]
        rank = int(rng.integers(cfg.nworkers))
        src = (HOST, cfg.workers[rank].port)
        slot = cfg.slot_base + int(rng.integers(cfg.nslots))
        cur = self.rounds.setdefault((cfg.job, slot), 1)
        step = rng.choice([0, 0, 0, 1, 1, -1, 2, 3, 1 << 31])
        rnd = (cur + int(step)) % (1 << 32)
        if step in (1, 2):
            self.rounds[(cfg.job, slot)] = rnd
        k, bs = cfg.nlanes, cfg.block_size
        present = int(rng.integers(0, 1 << k)) if rng.random() < 0.5 else (1 << k) - 1
        flags = sum(f for f in FLAGS if rng.random() < 0.25)
        h = wire.Header(job=cfg.job, epoch=self.epochs[cfg.job], call=int(rng.integers(1 << 32)),
                        slot=slot, rank=rank, nlanes=k, round=rnd, block_size=bs,
                        length=int(rng.choice([1000, 1000, 1000, 999])), flags=flags,
                        priority=int(rng.integers(8)), present=present,
                        nonfinite=(present & int(rng.integers(0, 1 << k))
                                   if rng.random() < 0.2 else 0),
                        exponent=int(rng.integers(-32768, 32768)),
                        bitmap=(int(rng.integers(1, 1 << cfg.nworkers))
                                if rng.random() < 0.33 else 0))
        npresent = bin(present).count("1")
        width = both = 0
        if self.widths is not None:
            width = self.widths[cfg.job]
            pick = rng.random()
            if pick < 0.08:  # another width than the job's (maybe int32)
                width = int(rng.choice([0, wire.FLAG_LANES16, wire.FLAG_LANES8]))
            both = pick > 0.99  # both width flags: malformed
            h.flags |= width
        bits = 8 * wire.lane_item_bytes(width)
        top = 1 << bits - 1  # narrow: half the time small values, sums that fit
        if self.widths is not None and rng.random() < 0.5:
            top = 1 << min(bits, 16) - 5
        data = rng.integers(-top, top, (npresent, bs), dtype=np.int64)
        nxt = rng.choice([0, 5, 9, 100, wire.END], k).astype(np.uint32)
        odd = rng.random()
        if odd < 0.03:
            h.epoch = (h.epoch + 1) % (1 << 16)
        elif odd < 0.06:
            src = (HOST, self.stranger)  # nobody's
        elif odd < 0.08:
            h.slot = cfg.slot_base + cfg.nslots  # beyond the job's slots
        elif odd < 0.10:
            h.msg_type = int(rng.choice([wire.MSG_RESULT, wire.MSG_STATUS]))
        elif odd < 0.11:
            h.version = 2
        elif odd < 0.2 and self.gathers:
            h.msg_type = wire.MSG_GATHER  # a chunk, or (bitmap) a request to its owners
        pkt = wire.pack(h, nxt, data)
        if both:
            pkt = pkt[:2] + bytes([pkt[2] | wire.FLAGS_LANE_WIDTH]) + pkt[3:]
        if 0.11 <= odd < 0.12:
            pkt = pkt[:-4]  # a length that does not match the lanes
        elif 0.12 <= odd < 0.125:
            pkt = pkt[:20]
        return pkt, src


def switches() -> tuple[UdpSwitch, UdpSwitch]:
    pair = UdpSwitch(HOST, 0, pool_slots=16, slot_capacity=64, datapath="compiled"), \
        UdpSwitch(HOST, 0, pool_slots=16, slot_capacity=64, datapath="python")
    for sw in pair:
        for cfg in JOBS:
            sw.add_job(cfg)
    return pair


def assert_same_state(a: UdpSwitch, b: UdpSwitch) -> None:
    for name, reg in a.pipeline.registers.items():
        np.testing.assert_array_equal(reg, b.pipeline.registers[name], err_msg=name)
    for name, ctr in a.pipeline.counters.items():
        np.testing.assert_array_equal(ctr, b.pipeline.counters[name], err_msg=name)


def test_the_compiled_offsets_are_the_wire_format():
    """The header offsets _datapath.c hard-codes are spina/wire.py's."""
    assert _datapath.HEADER_LEN == wire.HEADER_LEN
    assert _datapath.MAX_LANES == wire.MAX_LANES
    assert _datapath.OFFSETS == {f: wire.FIELD_OFFSET[f] for f in _datapath.OFFSETS}
    assert len(_datapath.OFFSETS) == len(wire.FIELD_NAMES) - 2  # all but priority and call


NARROW = {3: wire.FLAG_LANES16, 9: wire.FLAG_LANES8}  # Traffic's widths: narrow lanes per job


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("widths", [None, NARROW], ids=["int32", "narrow"])
def test_random_sequences_give_the_same_packets_registers_and_counters(seed, widths):
    """6,000 random datagrams (with a re-admission at a new epoch and the hold switched off
    and on mid-way) through both paths: identical datagrams to identical destinations after
    every one, identical registers and counters after every 500; most served compiled. With
    narrow lanes (a 16-bit and an 8-bit job, another width now and then, both in a few, sums
    that saturate) widths mismatched and answers saturated on both jobs, alike."""
    fast, ref = switches()
    traffic = Traffic(seed, widths=widths)
    try:
        for i in range(6000):
            pkt, src = traffic.packet()
            assert fast.run_one(pkt, src) == ref.run_one(pkt, src), f"packet {i}"
            if i % 500 == 499:
                assert_same_state(fast, ref)
            if i == 2000:  # a new run of job 3: new epoch, its slots cleared
                traffic.epochs[3] = 2
                for sw in (fast, ref):
                    sw.add_job(job_config(3, 3, 41000, epoch=2, nslots=4, slot_base=0,
                                          block_size=8, nlanes=4))
            if i in (3000, 4500):
                for sw in (fast, ref):
                    sw.pipeline.hold_newer_rounds = i != 3000
        assert_same_state(fast, ref)
        assert 0 < fast.punted < 1000  # the refused ones only: the compiled path took the rest
        c = fast.pipeline.job_counters(3)
        assert c["job_aggregated"] > 500 and c["job_results"] > 100 and c["job_held"] > 0
        assert c["job_stale"] > 0 and c["job_duplicates"] > 0
        for job in NARROW if widths else ():
            c = fast.pipeline.job_counters(job)
            assert c["job_lane_mismatch"] > 0 and c["job_lane_saturated"] > 0, (job, c)
    finally:
        fast.stop()
        ref.stop()


def test_gather_packets_are_served_compiled():
    """An all-gather chunk and a request naming its owners: the compiled path sends each
    unchanged to the job's workers but its sender, as the Python pipeline does, and punts
    neither; a chunk of another epoch leaves nowhere on both."""
    fast, ref = switches()
    cfg = JOBS[0]
    k, bs = cfg.nlanes, cfg.block_size
    try:
        for bitmap, epoch in ((0, 1), (0b101, 1), (0, 2)):
            h = wire.Header(msg_type=wire.MSG_GATHER, job=cfg.job, epoch=epoch, slot=1, rank=1,
                            nlanes=k, round=3, block_size=bs, length=k * bs,
                            present=(1 << k) - 1 if not bitmap else 0, bitmap=bitmap)
            pkt = wire.pack(h, np.full(k, wire.END), np.arange(k * bs).reshape(k, bs)
                            if not bitmap else np.zeros((0, bs)))
            src = (HOST, cfg.workers[1].port)
            got = fast.run_one(pkt, src)
            assert got == ref.run_one(pkt, src)
            others = [(HOST, cfg.workers[r].port) for r in (0, 2)]
            assert got == ([(d, pkt) for d in others] if epoch == 1 else [])
        assert fast.punted == 0
        assert_same_state(fast, ref)
    finally:
        fast.stop()
        ref.stop()


def test_a_job_with_a_fabric_role_is_left_to_python():
    """A job the tables make a leaf never reaches the compiled path: each of its packets is
    punted (and Python's pipeline counts it) while a flat job beside it is served compiled."""
    fast, ref = switches()
    try:
        for sw in (fast, ref):
            sw.dataplane.table_add("job_level", {"job": 9}, "as_spine", {})
        traffic = Traffic(7)
        n9 = 0
        for _ in range(400):
            pkt, src = traffic.packet()
            n9 += pkt[4:6] == (9).to_bytes(2, "big")
            assert fast.run_one(pkt, src) == ref.run_one(pkt, src)
        assert_same_state(fast, ref)
        assert fast.punted >= n9 > 100
        assert fast.pipeline.job_counters(3)["job_aggregated"] > 50
    finally:
        fast.stop()
        ref.stop()


def test_agents_get_exact_sums_through_the_sockets():
    """Four agents over loopback, dense and sparse tensors of odd lengths, through a switch
    of each data path: exact sums, bit-identical on every rank and between the paths; every
    datagram counted once in and out, none punted by the compiled path."""
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(100_003).astype(np.float32) for _ in range(4)]
    for x in xs[:2]:
        x[rng.random(x.size) < 0.9] = 0
    results = {}
    for datapath in ("compiled", "python"):
        sw = UdpSwitch(HOST, 0, datapath=datapath).start()
        try:
            with LocalCluster(4, switch=sw, rto=5.0) as c:
                for _ in range(2):
                    outs = c.allreduce([x.copy() for x in xs])
                assert sum(a.last_stats.resends for a in c.agents) == 0
        finally:
            sw.stop()  # its thread joined: a result's copies are counted once all are sent
        assert all(np.array_equal(outs[0], o) for o in outs[1:])
        np.testing.assert_allclose(outs[0], np.sum(xs, axis=0), rtol=0, atol=1e-4)
        results[datapath] = outs[0]
        counters = sw.pipeline.job_counters(1)
        assert sw.packets_in == counters["job_received"] == counters["job_aggregated"]
        assert sw.packets_out == counters["job_results"]
        if datapath == "compiled":
            assert sw.punted == 0 and sw._compiled.stats()["packets_in"] == sw.packets_in
    assert np.array_equal(results["compiled"], results["python"])


# --------------------------------------------------------------- data-path threads (shards)
def _through_sockets(threads: int, seed: int) -> tuple[UdpSwitch, dict]:
    """Traffic(seed)'s datagrams for two jobs of 4 and 2 slots, each sent by its worker's (or
    the stranger's) real socket to a switch of `threads` data-path threads, one after another:
    each slot's datagrams reach the switch in one order whatever the threads. The stopped
    switch and what each socket received (sorted: slots on different threads interleave)."""
    socks = [bound_udp_socket() for _ in range(7)]
    ports = [s.getsockname()[1] for s in socks]
    jobs = (job_config(3, 3, 0, nslots=4, slot_base=0, block_size=8, nlanes=4),
            job_config(9, 2, 0, nslots=3, slot_base=6, block_size=5, nlanes=7))
    jobs = (replace(jobs[0], workers=tuple(WorkerAddr(r, HOST, ports[r]) for r in range(3))),
            replace(jobs[1], workers=tuple(WorkerAddr(r, HOST, ports[3 + r]) for r in range(2))))
    by_port = dict(zip(ports, socks))
    sw = UdpSwitch(HOST, 0, pool_slots=16, slot_capacity=64, datapath_threads=threads)
    got = {p: [] for p in ports}
    try:
        for cfg in jobs:
            sw.add_job(cfg)
        sw.start()
        traffic = Traffic(seed, jobs, stranger=ports[6])
        n = 3000
        for _ in range(n):
            pkt, src = traffic.packet()
            by_port[src[1]].sendto(pkt, sw.address)
        until(lambda: sw.packets_in >= n, f"the switch to take {n} packets", 30)
        assert sw.packets_in == n
    finally:
        sw.stop()  # every datagram received is served before its thread returns
        for s in socks:
            s.setblocking(False)
            while True:
                try:
                    got[s.getsockname()[1]].append(s.recv(1 << 16))
                except BlockingIOError:
                    break
            s.close()
    # results keyed by rank, not port: the two runs' sockets differ
    return sw, {i: sorted(got[p]) for i, p in enumerate(ports)}


def test_two_data_path_threads_give_what_one_gives():
    """The same multi-slot, two-job workload (with refused datagrams, punted to Python) through
    real sockets: a switch of 2 data-path threads sends every socket the same datagrams as one
    of 1, and ends with the same registers and counters; each thread served its slots."""
    one, got_one = _through_sockets(1, seed=11)
    two, got_two = _through_sockets(2, seed=11)
    assert got_one == got_two
    assert sum(map(len, got_one.values())) > 500
    assert_same_state(one, two)
    assert one.punted == two.punted > 0
    assert one.packets_out == two.packets_out
    shards = two.shard_stats()
    assert len(shards) == 2 and all(s["packets_in"] > 1000 for s in shards)
    assert not [t for t in threading.enumerate() if t.name.startswith("spina-softswitch")]


def test_the_control_plane_sees_a_still_switch_while_two_threads_serve():
    """pipeline.lock holds both data-path threads between packets: in every snapshot of the
    counters taken under it while the threads serve, each datagram is counted whole
    (received = stale + held + duplicates + aggregated; a packet half through breaks it), and
    nothing moves while it is held (two reads a moment apart agree)."""
    socks = [bound_udp_socket() for _ in range(4)]  # 3 workers and a stranger
    by_port = {s.getsockname()[1]: s for s in socks}
    cfg = replace(JOBS[0], workers=tuple(WorkerAddr(r, HOST, s.getsockname()[1])
                                         for r, s in enumerate(socks[:3])))
    traffic = Traffic(3, (cfg,), stranger=socks[3].getsockname()[1], gathers=False)
    sw = UdpSwitch(HOST, 0, pool_slots=16, slot_capacity=64, datapath_threads=2)
    sw.add_job(cfg)
    sw.start()
    busy = 0
    try:
        for i in range(4000):
            pkt, src = traffic.packet()
            by_port[src[1]].sendto(pkt, sw.address)
            if i % 20 == 19:
                with sw.pipeline.lock:
                    c = sw.pipeline.job_counters(cfg.job)
                    busy += sw.packets_in < i + 1  # some still queued: the threads were busy
                    time.sleep(0.001)
                    assert c == sw.pipeline.job_counters(cfg.job)
                assert c["job_received"] == (c["job_stale"] + c["job_held"]
                                             + c["job_duplicates"] + c["job_aggregated"]), c
    finally:
        sw.stop()
        for s in socks:
            s.close()
    assert busy > 0 and sw.pipeline.job_counters(cfg.job)["job_aggregated"] > 500


@pytest.mark.parametrize("threads", [2, 3])
def test_each_slot_lands_on_its_threads_socket(threads):
    """The kernel's reuseport steering (_datapath.steer_by_slot) hands every datagram of slot s
    to data-path thread s % threads: per thread, exactly the datagrams of its slots arrive, and
    a datagram too short to name a slot lands on thread 0."""
    sender = bound_udp_socket()
    sw = UdpSwitch(HOST, 0, pool_slots=16, datapath_threads=threads).start()
    sent = [0] * threads
    try:
        for slot in range(16):
            for _ in range(slot + 1):  # a different count per slot
                h = wire.Header(job=5, epoch=1, slot=slot, nlanes=1, block_size=1)
                sender.sendto(wire.pack(h, np.zeros(1, np.uint32), np.zeros((1, 1), np.int32)),
                              sw.address)
                sent[slot % threads] += 1
        sender.sendto(b"short", sw.address)
        sent[0] += 1
        until(lambda: sw.packets_in >= sum(sent), f"the switch to take {sum(sent)} packets", 10)
    finally:
        sw.stop()
        sender.close()
    assert [s["packets_in"] for s in sw.shard_stats()] == sent
    assert sw.punted == sum(sent)  # no job 5: every one refused by Python's pipeline
    assert all(not sh.thread.is_alive() for sh in sw._shards)


def test_agents_get_exact_sums_through_two_data_path_threads():
    """Four agents, 16 slots over 2 data-path threads (the job's slot groups the threads, so
    the agents expect no order across them): the same exact sums as one thread, no resend,
    every datagram counted once in and out, none punted, both threads busy."""
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(200_001).astype(np.float32) for _ in range(4)]
    outs = {}
    for threads in (1, 2):
        sw = UdpSwitch(HOST, 0, datapath_threads=threads).start()
        try:
            with LocalCluster(4, switch=sw, rto=5.0, slot_groups=sw.slot_groups(16)) as c:
                outs[threads] = c.allreduce([x.copy() for x in xs])
                resends = sum(a.last_stats.resends for a in c.agents)
        finally:
            sw.stop()
        counters = sw.pipeline.job_counters(1)
        assert resends == 0, (threads, resends, sw.shard_stats())
        assert sw.packets_in == counters["job_received"] == counters["job_aggregated"], (
            threads, counters, sw.shard_stats())
        assert sw.packets_out == counters["job_results"] and sw.punted == 0
    assert all(np.array_equal(outs[1][0], o) for o in outs[1] + outs[2])
    assert all(s["packets_in"] > 20 for s in sw.shard_stats())  # 120 datagrams, 16 slots


def test_more_than_one_thread_needs_the_compiled_path():
    """And a slot's group is its thread: slot s on thread s % N; one thread, one group."""
    with UdpSwitch(HOST, 0, datapath_threads=3) as sw:
        assert sw.slot_groups(5, slot_base=7) == (1, 2, 0, 1, 2)
    with UdpSwitch(HOST, 0) as sw:
        assert sw.slot_groups(5) == ()
    with pytest.raises(ValueError, match="compiled"):
        UdpSwitch(HOST, 0, datapath="python", datapath_threads=2)
    with pytest.raises(ValueError, match="datapath_threads 0"):
        UdpSwitch(HOST, 0, datapath_threads=0)
