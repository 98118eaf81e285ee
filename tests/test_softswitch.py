"""The software switch: bad input is dropped and counted, slots are isolated, failures are loud.

Run just this file: .venv/bin/python -m pytest tests/test_softswitch.py
"""
import dataclasses
import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from host_agent.agent import LengthMismatch, SpinaTimeout
from host_agent.local import LocalCluster
from softswitch.pipeline import Pipeline
from spina import wire
from spina.config import ConfigError, JobConfig, WorkerAddr

SRC = [(0, ("10.0.0.1", 5000 + r)) for r in range(4)]  # (ingress port, source) per rank


def job(j=1, base=0, nslots=2, k=2, bs=4, n=3, epoch=1):
    workers = tuple(WorkerAddr(r, *SRC[r][1]) for r in range(n))
    return JobConfig(job=j, workers=workers, slot_base=base, nslots=nslots, nlanes=k,
                     block_size=bs, epoch=epoch)


def contrib(cfg, rank, slot, rnd, data=None, nxt=None, **kw):
    k, bs = cfg.nlanes, cfg.block_size
    present = 0 if data is None else (1 << len(data)) - 1
    h = wire.Header(job=cfg.job, epoch=cfg.epoch, rank=rank, slot=slot, round=rnd, nlanes=k,
                    block_size=bs, length=100, present=present, **kw)
    return wire.pack(h, nxt if nxt is not None else [wire.END] * k, data)


def snapshot(p):
    return {n: r.copy() for n, r in p.registers.items()}


def same(a, b):
    return all((a[n] == b[n]).all() for n in a)


@pytest.fixture
def pipe():
    p = Pipeline(pool_slots=8, slot_capacity=64)
    a, b = job(1, base=0), job(2, base=2)
    p.add_job(a, {r: SRC[r] for r in range(3)})
    p.add_job(b, {r: SRC[r] for r in range(3)})
    return p, a, b


def test_round_completes_and_multicasts(pipe):
    """Three contributions complete a round: one multicast result with sums, min next, bitmap."""
    p, a, _ = pipe
    d = [np.full((2, 4), r + 1, np.int32) for r in range(3)]
    outs = [p.process(contrib(a, r, 0, 1, d[r], nxt=[10 + r, wire.END]), *SRC[r]) for r in range(3)]
    assert outs[0] == [] and outs[1] == []
    (e,) = outs[2]
    assert e.multicast and e.job == 1
    res = wire.unpack(e.data)
    assert res.header.msg_type == wire.MSG_RESULT and res.header.bitmap == 0b111
    assert (res.data == 6).all() and list(res.next) == [10, wire.END]
    assert p.job_counters(1)["job_results"] == 3


def test_duplicate_gets_stored_result_by_unicast(pipe):
    """A resend to a completed round is not added twice; the sender gets the stored result back."""
    p, a, _ = pipe
    d = np.ones((2, 4), np.int32)
    for r in range(3):
        p.process(contrib(a, r, 1, 1, d), *SRC[r])
    before = snapshot(p)
    (e,) = p.process(contrib(a, 1, 1, 1, d, flags=wire.FLAG_RESEND), *SRC[1])
    assert not e.multicast
    res = wire.unpack(e.data)
    assert res.header.flags & wire.FLAG_RESEND and (res.data == 3).all()
    assert same(before, snapshot(p))
    assert p.job_counters(1)["job_duplicates"] == 1


def test_duplicate_to_incomplete_round_gets_status(pipe):
    """A resend while others are missing returns a status naming who contributed; no addition."""
    p, a, _ = pipe
    p.process(contrib(a, 0, 0, 1, np.ones((2, 4), np.int32)), *SRC[0])
    before = snapshot(p)
    (e,) = p.process(contrib(a, 0, 0, 1, np.ones((2, 4), np.int32)), *SRC[0])
    h = wire.unpack(e.data).header
    assert h.msg_type == wire.MSG_STATUS and h.bitmap == 0b001 and not e.multicast
    assert same(before, snapshot(p))


def test_new_round_on_shadow_copy_resets_it_and_old_round_is_stale(pipe):
    """Round r+2 reuses copy r's registers from scratch; a late packet of round r is stale."""
    p, a, _ = pipe
    for rnd, val in ((1, 5), (2, 7), (3, 11)):
        for r in range(3):
            out = p.process(contrib(a, r, 0, rnd, np.full((2, 4), val, np.int32)), *SRC[r])
        assert (wire.unpack(out[0].data).data == 3 * val).all()
    assert p.process(contrib(a, 2, 0, 1, np.ones((2, 4), np.int32)), *SRC[2]) == []
    assert p.job_counters(1)["job_stale"] == 1


@pytest.mark.parametrize("make, counter", [
    (lambda a: contrib(a, 0, 0, 1)[:30], "port_malformed"),
    (lambda a: contrib(a, 0, 0, 1)[:-1], "port_malformed"),
    (lambda a: bytes([7]) + contrib(a, 0, 0, 1)[1:], "port_malformed"),
    (lambda a: contrib(a, 0, 0, 1, msg_type=wire.MSG_RESULT), "port_malformed"),
    (lambda a: contrib(job(j=99), 0, 0, 1), "port_unadmitted"),          # unknown job
    (lambda a: contrib(a, 0, 2, 1), "port_unadmitted"),                  # job 2's slot
    (lambda a: contrib(a, 0, 200, 1), "port_unadmitted"),                # outside the pool
    (lambda a: contrib(job(k=3), 0, 0, 1), "port_unadmitted"),           # wrong lane count
])
def test_bad_packets_dropped_counted_and_change_nothing(pipe, make, counter):
    """Truncated, malformed, unknown-job and out-of-range packets are dropped and counted only."""
    p, a, _ = pipe
    before = snapshot(p)
    assert p.process(make(a), *SRC[0]) == []
    assert p.port_counters(0)[counter] == 1
    assert same(before, snapshot(p))


def test_wrong_source_cannot_speak_for_a_rank(pipe):
    """A packet naming rank 1 from rank 0's address is unadmitted."""
    p, a, _ = pipe
    assert p.process(contrib(a, 1, 0, 1), *SRC[0]) == []
    assert p.port_counters(0)["port_unadmitted"] == 1


def test_stale_epoch_dropped(pipe):
    """A packet of an earlier incarnation (epoch) of the job is dropped and counted as stale."""
    p, a, _ = pipe
    before = snapshot(p)
    assert p.process(contrib(job(epoch=0), 0, 0, 1), *SRC[0]) == []
    assert p.job_counters(1)["job_stale"] == 1 and same(before, snapshot(p))


def test_overlapping_slot_ranges_rejected(pipe):
    """Admitting a job whose slots overlap another job's fails with a message naming the field."""
    p, *_ = pipe
    with pytest.raises(ConfigError, match="slot_base.*overlap job 1"):
        p.add_job(job(3, base=1), {r: SRC[r] for r in range(3)})


def test_udp_switch_survives_garbage():
    """Random datagrams at the UDP switch are counted as malformed; all-reduce still works after."""
    rng = np.random.default_rng(0)
    with LocalCluster(2, rto=5.0, block_size=8, nlanes=2, nslots=2) as c:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(50):
            s.sendto(rng.bytes(int(rng.integers(0, 200))), c.switch.address)
        s.close()
        x = [np.arange(100, dtype=np.int32)] * 2
        res = c.allreduce(x)
        assert (res[0] == 2 * x[0]).all()
        counts = c.switch.pipeline.port_counters(0)
        assert counts["port_malformed"] + counts["port_unadmitted"] == 50


def test_length_mismatch_is_an_error_on_every_rank():
    """Workers that disagree on the tensor length all get LengthMismatch, not a hang."""
    with LocalCluster(3, rto=5.0, timeout=10, block_size=8, nlanes=2, nslots=2) as c:
        futs = [a.allreduce_async(np.ones(n, np.float32))
                for a, n in zip(c.agents, (100, 100, 120))]
        for f in futs:
            with pytest.raises(LengthMismatch, match="disagree on the tensor length"):
                f.result(timeout=20)
        # the job still works afterwards
        res = c.allreduce([np.ones(50, np.float32)] * 3)
        assert (res[0] == 3).all()


def test_length_mismatch_over_different_slots_leaves_the_job_working():
    """Rank 2's tensor spans both slots, the others' only slot 0 (the slots a call uses follow
    its length): every rank gets LengthMismatch, and later calls over both slots still sum."""
    with LocalCluster(3, rto=0.05, timeout=10, block_size=8, nlanes=2, nslots=2) as c:
        futs = [a.allreduce_async(np.ones(n, np.float32)) for a, n in zip(c.agents, (10, 10, 100))]
        for f in futs:
            with pytest.raises(LengthMismatch, match="disagree on the tensor length"):
                f.result(timeout=20)
        assert [a.last_stats.packets_sent - a.last_stats.resends for a in c.agents] == [1, 1, 2]
        for _ in range(3):
            x = np.arange(100, dtype=np.float32)
            res = c.allreduce([x] * 3)
            assert all(np.abs(r - 3 * x).max() <= 1e-3 for r in res)


def test_missing_worker_times_out_naming_it():
    """If rank 2 never calls, the others fail after the timeout with an error naming rank 2."""
    with LocalCluster(3, rto=0.05, timeout=1.0, block_size=8, nlanes=2, nslots=2) as c:
        futs = [c.agents[r].allreduce_async(np.ones(100, np.float32)) for r in (0, 1)]
        for f in futs:
            with pytest.raises(SpinaTimeout, match=r"ranks \[2\] never contributed") as ei:
                f.result(timeout=20)  # a bound on a hang: the agents' timeout is 1 s
            assert ei.value.missing == [2]


def test_no_switch_times_out_clearly():
    """With no switch listening the call fails within the timeout saying the switch never
    answered."""
    from host_agent.agent import Agent
    from spina.net import bound_udp_socket
    sock = bound_udp_socket()
    cfg = JobConfig(job=1, workers=(WorkerAddr(0, *sock.getsockname()),))
    dead = bound_udp_socket()  # a port nobody serves
    with Agent(cfg, 0, dead.getsockname(), sock=sock, timeout=0.5, rto=0.05) as a:
        with pytest.raises(SpinaTimeout, match="never answered"):
            a.allreduce(np.ones(10, np.float32))
    dead.close()


def test_softswitch_cli_rejects_bad_job_file(tmp_path):
    """`python -m softswitch udp --jobs` with a bad field exits 2 naming the field."""
    f = tmp_path / "jobs.json"
    f.write_text(json.dumps({"jobs": [{"job": 1, "nlanes": 500,
                                       "workers": [{"host": "127.0.0.1", "port": 1}]}]}))
    r = subprocess.run([sys.executable, "-m", "softswitch", "udp", "--port", "0", "--jobs", str(f)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "jobs[0]" in r.stderr and "'nlanes'" in r.stderr


def test_softswitch_cli_serves_and_stops(tmp_path):
    """`python -m softswitch udp` prints its address, aggregates, and exits cleanly on SIGTERM."""
    from host_agent.agent import Agent
    from spina.net import bound_udp_socket
    socks = [bound_udp_socket() for _ in range(2)]
    cfg = {"job": 4, "nslots": 2, "nlanes": 2, "block_size": 8,
           "workers": [dict(zip(("host", "port"), s.getsockname())) for s in socks]}
    f = tmp_path / "jobs.yaml"
    import yaml
    f.write_text(yaml.safe_dump({"jobs": [cfg]}))
    proc = subprocess.Popen([sys.executable, "-m", "softswitch", "udp", "--port", "0",
                             "--jobs", str(f)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        host, port = line[1].rsplit(":", 1)
        jc = JobConfig.from_dict(cfg)
        agents = [Agent(jc, r, (host, int(port)), sock=s) for r, s in enumerate(socks)]
        futs = [a.allreduce_async(np.arange(40, dtype=np.int32)) for a in agents]
        assert all((f.result(timeout=20) == 2 * np.arange(40)).all() for f in futs)
        for a in agents:
            a.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_udp_switch_serves_a_queued_burst_like_the_pipeline():
    """Datagrams of two jobs queued while the switch is busy, with a malformed one among them,
    are served back to back: each worker gets exactly the bare pipeline's packets, in order,
    and the counters match."""
    from softswitch.dataplane import UDP_MODE_PORT
    from softswitch.udp import UdpSwitch
    from spina.net import bound_udp_socket
    socks = [bound_udp_socket() for _ in range(4)]
    addrs = [s.getsockname() for s in socks]
    jobs = [JobConfig(job=j, workers=tuple(WorkerAddr(r, *addrs[2 * i + r]) for r in range(2)),
                      slot_base=2 * i, nslots=2, nlanes=2, block_size=4)
            for i, j in enumerate((1, 2))]
    burst = []  # (sender index, datagram)
    for rnd in (1, 2):
        for i, cfg in enumerate(jobs):
            for r in range(2):
                burst.append((2 * i + r, contrib(cfg, r, cfg.slot_base + 1, rnd,
                                                 np.full((2, 4), 10 * rnd + r, np.int32))))
    burst.insert(3, (1, burst[1][1][:-1]))  # truncated body: malformed
    burst.append((0, burst[0][1]))  # a late duplicate of round 1: its stored result, unicast
    burst.append((0, contrib(dataclasses.replace(jobs[0], epoch=0), 0, 1, 3)))  # stale epoch
    burst.append((2, contrib(jobs[1], 0, 3, 2, np.full((2, 4), 20, np.int32),
                             flags=wire.FLAG_RESEND)))  # a resend to the completed round 2
    ref = Pipeline(pool_slots=8, slot_capacity=64)
    for cfg in jobs:
        ref.add_job(cfg, {w.rank: (UDP_MODE_PORT, (w.host, w.port)) for w in cfg.workers})
    expected = {a: [] for a in addrs}
    for who, pkt in burst:
        for e in ref.process(pkt, UDP_MODE_PORT, addrs[who]):
            cfg = jobs[e.job - 1]
            for dst in ([(w.host, w.port) for w in cfg.workers] if e.multicast else [addrs[who]]):
                expected[dst].append(e.data)
    assert sum(map(len, expected.values())) == 10  # 2 rounds x 2 jobs x 2 workers + 2 replies
    try:
        with UdpSwitch(port=0, pool_slots=8, slot_capacity=64) as sw:
            for cfg in jobs:
                sw.add_job(cfg)
            with sw.pipeline.lock:  # the serve loop waits here until the whole burst is queued
                for who, pkt in burst:
                    socks[who].sendto(pkt, sw.address)
            for s, a in zip(socks, addrs):
                s.settimeout(5)
                assert [s.recvfrom(1 << 16) for _ in expected[a]] == [(d, sw.address)
                                                                      for d in expected[a]]
        assert (sw.packets_in, sw.packets_out) == (len(burst), 10)
        for j in (1, 2):
            assert sw.pipeline.job_counters(j) == ref.job_counters(j)
        assert sw.pipeline.port_counters(0) == ref.port_counters(0)
        assert ref.port_counters(0)["port_malformed"] == 1
        assert ref.job_counters(1)["job_stale"] == ref.job_counters(1)["job_duplicates"] == 1
        assert ref.job_counters(2)["job_duplicates"] == 1
        for s in socks:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1 << 16)
    finally:
        for s in socks:
            s.close()


def test_a_second_switch_on_a_port_names_the_switch_that_holds_it():
    """`python -m softswitch udp --port P` while another switch process holds P: one line,
    exit 2, naming that process as another SpINA software switch with its pid and command."""
    from spina.net import free_port
    from spina.procs import stop_process
    port = free_port()
    first = subprocess.Popen([sys.executable, "-m", "softswitch", "udp", "--port", str(port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout.readline().startswith("listening")
        out = subprocess.run([sys.executable, "-m", "softswitch", "udp", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    finally:
        stop_process(first, 10)
    assert out.returncode == 2, out
    assert out.stderr == (
        f"python -m softswitch udp: error: argument --host/--port: cannot listen on "
        f"127.0.0.1:{port}: 127.0.0.1:{port} (the switch's UDP port) is held by another SpINA "
        f"process: the software switch (pid {first.pid}: python -m softswitch udp --port "
        f"{port})\n")
