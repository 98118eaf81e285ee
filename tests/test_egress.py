"""The software switch's traffic manager (softswitch/egress.py): BMv2's priority queues and
rate limits, on a virtual clock, with exact departure order, times, depths and drops.

Run just this file: python -m pytest tests/test_egress.py
The same behaviour through the whole L2 dataplane is in bmv2_tests/test_priority.py (both
targets); the last test here runs a real L2Switch over veth pairs (root).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from softswitch.egress import QUEUE_CAPACITY, EgressQueues


def drain(q: EgressQueues, until: float, step: float = 0.25):
    """(time, port, item) of every departure, polling every `step` seconds of virtual time."""
    out, t = [], 0.0
    while t <= until:
        out += [(t, port, item) for port, item in q.pop_due(t)]
        t = round(t + step, 6)
    return out


def test_rate_spaces_departures_per_priority_queue():
    q = EgressQueues()
    q.set_rate(2, 4, now=0.0)  # one frame every 0.25 s per priority queue
    depths = [q.push(2, 0, f"a{i}", now=0.0) for i in range(3)]
    depths.append(q.push(2, 5, "b0", now=0.0))
    assert depths == [0, 1, 2, 3]  # enq_qdepth counts every priority of the port
    assert drain(q, 1.0) == [(0.25, 2, "b0"), (0.25, 2, "a0"), (0.5, 2, "a1"), (0.75, 2, "a2")]
    assert q.depth(2) == 0 and q.next_due() is None


def test_tie_goes_to_the_higher_priority_then_fifo():
    q = EgressQueues()
    q.set_rate(1, 1, now=0.0)
    for prio, name in ((0, "low"), (7, "high"), (3, "mid"), (7, "high2")):
        q.push(1, prio, name, now=0.0)
    assert [item for _, item in q.pop_due(1.0)] == ["high", "mid", "low"]
    assert q.pop_due(1.999) == []
    assert q.pop_due(2.0) == [(1, "high2")]


def test_unlimited_port_is_not_queued_and_rate_zero_lifts_the_limit():
    q = EgressQueues()
    assert not q.limited(3)
    q.set_rate(3, 10, now=0.0)
    assert q.limited(3)
    q.push(3, 0, "x", now=0.0)
    q.set_rate(3, 0, now=0.0)
    assert q.limited(3)  # still holds a frame: it leaves first
    assert q.pop_due(0.1) == [(3, "x")]
    assert not q.limited(3)
    with pytest.raises(ValueError, match="port 3: queue rate must be >= 0"):
        q.set_rate(3, -1, now=0.0)


def test_full_priority_queue_drops_the_tail():
    q = EgressQueues()
    q.set_rate(1, 1, now=0.0)
    assert [q.push(1, 0, i, now=0.0) for i in range(QUEUE_CAPACITY)] == list(range(QUEUE_CAPACITY))
    assert q.push(1, 0, "late", now=0.0) is None  # priority 0 is full
    assert q.push(1, 1, "other class", now=0.0) == QUEUE_CAPACITY  # its own capacity
    assert q.tail_drops == 1


def test_idle_queue_sends_at_once_after_the_gap():
    q = EgressQueues()
    q.set_rate(1, 2, now=0.0)
    q.push(1, 0, "a", now=10.0)  # long after the last departure: leaves on arrival
    assert q.pop_due(10.0) == [(1, "a")]
    q.push(1, 0, "b", now=10.1)
    assert q.next_due() == pytest.approx(10.5)


# ------------------------------------------------------------------ a real L2Switch
@pytest.fixture
def veth_pair_ports():
    """Two veth pairs in this namespace: switch side sqe1s/sqe2s, host side sqe1h/sqe2h."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create veth pairs")
    names = []
    try:
        for p in (1, 2):
            a, b = f"sqe{p}s", f"sqe{p}h"
            subprocess.run(["ip", "link", "del", a], capture_output=True)
            subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
            names.append(a)
            for i in (a, b):
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{i}.disable_ipv6=1"], check=False)
                subprocess.run(["ip", "link", "set", i, "up"], check=True)
        yield {1: "sqe1s", 2: "sqe2s"}, {1: "sqe1h", 2: "sqe2h"}
    finally:
        for a in names:
            subprocess.run(["ip", "link", "del", a], capture_output=True)


def _paced_arrivals(host_ifs, dst: bytes, n: int = 3) -> list[float]:
    """Send n frames to `dst` on host port 1; when each arrived on host port 2."""
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    tx.bind((host_ifs[1], 0))
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    rx.bind((host_ifs[2], 0))
    rx.settimeout(5.0)
    frames = [dst + bytes.fromhex("020000000001") + b"\x88\xb5" + bytes([i]) * 50 for i in range(n)]
    try:
        for f in frames:
            tx.send(f)
        got, times = [], []
        while len(got) < n:
            data = rx.recv(2048)
            if data[:6] == dst and data[12:14] == b"\x88\xb5":
                got.append(data[:len(frames[0])])
                times.append(time.monotonic())
        assert got == frames
        return times
    finally:
        tx.close()
        rx.close()


def test_switch_command_line_sets_a_queue_rate(veth_pair_ports, tmp_path):
    """`python -m softswitch l2 --queue-rate 2:2`: the switch process paces port 2."""
    sw_ifs, host_ifs = veth_pair_ports
    cfg = tmp_path / "l2.json"
    cfg.write_text(json.dumps({"endpoints": [], "l2": [{"mac": "02:00:00:00:00:99", "port": 2}]}))
    proc = subprocess.Popen([sys.executable, "-m", "softswitch", "l2", "-i", f"1@{sw_ifs[1]}",
                             "-i", f"2@{sw_ifs[2]}", "--queue-rate", "2:2", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("switching"), proc.stderr.read()
        times = _paced_arrivals(host_ifs, bytes.fromhex("020000000099"))
        assert times[-1] - times[0] >= 0.6  # 1.0 s apart at the switch; receive jitter allowed
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_l2switch_paces_a_rate_limited_port(veth_pair_ports):
    """Through real sockets: frames to a port limited to 2/s all arrive, in order, and the
    switch holds the queued ones until they are due (the last leaves 1 s after the
    first; no upper bound is asserted, the machine may be slow)."""
    from softswitch.l2 import Dataplane, L2Switch
    sw_ifs, host_ifs = veth_pair_ports
    dp = Dataplane()
    dst = bytes.fromhex("020000000099")
    dp.table_add("l2", {"dst_mac": "02:00:00:00:00:99"}, "bridge", {"port": 2})
    dp.set_queue_rate(2, 2)
    with L2Switch(sw_ifs, dp) as sw:
        time.sleep(0.1)
        times = _paced_arrivals(host_ifs, dst)
        assert times[-1] - times[0] >= 0.6  # 1.0 s apart at the switch; receive jitter allowed
        assert sw.frames_out == 3
