"""The software switch's traffic manager (softswitch/egress.py): BMv2's priority queues and
rate limits, on a virtual clock, with exact departure order, times, depths and drops.

Run just this file: python -m pytest tests/test_egress.py
The same behaviour through the whole L2 dataplane is in bmv2_tests/test_priority.py (both
targets); the last test here runs a real L2Switch over veth pairs (root).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from softswitch.egress import QUEUE_CAPACITY, EgressQueues, PortRate, parse_port_rate
from spina import netns
from tests.netns import root_ports


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
    assert depths == [0, 1, 2, 0]  # enq_qdepth: the frame's own priority queue (BMv2)
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
    assert q.push(1, 1, "other class", now=0.0) == 0  # its own capacity and depth
    assert q.tail_drops == 1


def test_idle_queue_sends_at_once_after_the_gap():
    q = EgressQueues()
    q.set_rate(1, 2, now=0.0)
    q.push(1, 0, "a", now=10.0)  # long after the last departure: leaves on arrival
    assert q.pop_due(10.0) == [(1, "a")]
    q.push(1, 0, "b", now=10.1)
    assert q.next_due() == pytest.approx(10.5)


# ------------------------------------------------------------------ the port shaper
def send_all(port, item):
    """An egress that sends every frame: `item` is (name, length in bytes)."""
    return [(port, item)]


class Frame(bytes):
    """A frame of `n` bytes that knows its name (what the tests compare)."""
    def __new__(cls, name, n):
        f = super().__new__(cls, n)
        f.name = name
        return f


def shaped_drain(q: EgressQueues, until: float, run=send_all, step: float = 0.125):
    """(poll time, port, frame name) of every transmission, polling every `step` seconds."""
    out, t = [], 0.0
    while t <= until:
        out += [(t, port, f.name) for port, f in q.transmit(t, run)]
        t = round(t + step, 6)
    return out


def test_port_shaper_serves_a_late_high_priority_frame_before_queued_low_ones():
    q = EgressQueues()
    q.set_port_rate(2, PortRate(pps=4), now=0.0)  # the whole port: one frame every 0.25 s
    depths = [q.push(2, 0, Frame(f"low{i}", 100), now=0.0) for i in range(3)]
    depths.append(q.push(2, 6, Frame("high", 100), now=0.1))  # behind three low frames
    assert depths == [0, 1, 2, 0]  # enq_qdepth: its own priority queue
    assert q.pop_due(10.0) == []  # a shaped port's frames leave only by transmit()
    # low0 takes the link at 0 (the only frame then); at 0.25 high has arrived and goes first
    assert shaped_drain(q, 1.0) == [(0.0, 2, "low0"), (0.25, 2, "high"), (0.5, 2, "low1"),
                                    (0.75, 2, "low2")]
    assert q.depth(2) == 0 and q.next_due() is None


def test_port_shaper_departures_follow_the_port_rate_across_priorities():
    """Ten frames in four priorities: ten departures at one port rate (not four queues' worth),
    highest priority first, FIFO within a priority."""
    q = EgressQueues()
    q.set_port_rate(1, PortRate(pps=8), now=0.0)
    names = []
    for i in range(10):
        prio = (0, 3, 5, 7)[i % 4]
        names.append((prio, i))
        q.push(1, prio, Frame(f"p{prio}-{i}", 64), now=0.0)
    got = shaped_drain(q, 2.0)
    assert [t for t, _, _ in got] == [k / 8 for k in range(10)]  # 1/8 s apart, on the poll grid
    expect = [f"p{p}-{i}" for p, i in sorted(names, key=lambda pi: (-pi[0], pi[1]))]
    assert [n for _, _, n in got] == expect
    # the same frames with BMv2's per-queue rate: four queues drain at 8/s each
    b = EgressQueues()
    b.set_rate(1, 8, now=0.0)
    for p, i in names:
        b.push(1, p, i, now=0.0)
    assert len(b.pop_due(0.375)) == 10


def test_port_shaper_bits_per_second_counts_frame_bytes_on_the_wire():
    q = EgressQueues()
    # 1 Mbit/s: 1226 bytes + 24 of overhead = 10000 bits = 10 ms; a 40-byte frame pads to 60
    q.set_port_rate(1, PortRate(bps=1e6), now=0.0)
    q.push(1, 0, Frame("big", 1226), now=0.0)
    q.push(1, 0, Frame("small", 40), now=0.0)
    q.push(1, 0, Frame("next", 40), now=0.0)
    assert [f.name for _, f in q.transmit(0.0, send_all)] == ["big"]
    assert q.next_due() == pytest.approx(0.010)
    assert [f.name for _, f in q.transmit(0.010, send_all)] == ["small"]
    assert q.next_due() == pytest.approx(0.010 + 84 * 8 / 1e6)
    # both limits: the longer of 1/pps and the frame's bits
    assert PortRate(pps=1000, bps=1e6).seconds(1226) == pytest.approx(0.010)
    assert PortRate(pps=50, bps=1e6).seconds(1226) == pytest.approx(0.020)


def test_port_shaper_a_frame_egress_drops_takes_no_link_time():
    """The congestion drop at transmission: the dropped frame's slot goes to the next one."""
    q = EgressQueues()
    q.set_port_rate(1, PortRate(pps=4), now=0.0)
    for name in ("a", "drop1", "drop2", "b", "c"):
        q.push(1, 0, Frame(name, 100), now=0.0)
    seen = []

    def egress(port, f):
        seen.append(f.name)
        return [] if f.name.startswith("drop") else [(port, f)]
    # a at 0; drop1 and drop2 at 0.25 run egress and are dropped; b goes in the same slot
    assert shaped_drain(q, 1.0, egress) == [(0.0, 1, "a"), (0.25, 1, "b"), (0.5, 1, "c")]
    assert seen == ["a", "drop1", "drop2", "b", "c"]
    assert q.depth(1) == 0 and q.next_due() is None


def test_port_shaper_idle_link_sends_on_arrival_and_tail_drop_and_depth_as_bmv2():
    q = EgressQueues()
    q.set_port_rate(1, PortRate(pps=2), now=0.0)
    assert q.limited(1) and not q.idle
    q.push(1, 0, Frame("a", 60), now=10.0)  # long after the last transmission
    assert q.next_due() == 10.0
    assert [f.name for _, f in q.transmit(10.0, send_all)] == ["a"]
    q.push(1, 0, Frame("b", 60), now=10.1)
    assert q.next_due() == pytest.approx(10.5)
    assert [q.push(1, 0, Frame(str(i), 60), now=10.1) for i in range(QUEUE_CAPACITY - 1)] == \
        list(range(1, QUEUE_CAPACITY))
    assert q.push(1, 0, Frame("late", 60), now=10.1) is None and q.tail_drops == 1
    assert q.push(1, 7, Frame("other class", 60), now=10.1) == 0
    q.set_port_rate(1, None, now=11.0)  # shaper removed: what is queued leaves at once
    assert len(q.pop_due(11.0)) == QUEUE_CAPACITY + 1 and not q.limited(1)


def test_port_rate_and_queue_rate_exclude_each_other_and_rates_parse():
    q = EgressQueues()
    q.set_rate(1, 10, now=0.0)
    with pytest.raises(ValueError, match="port 1: has a queue rate"):
        q.set_port_rate(1, PortRate(pps=10), now=0.0)
    q.set_port_rate(2, PortRate(bps=1e9), now=0.0)
    with pytest.raises(ValueError, match="port 2: has a port rate"):
        q.set_rate(2, 10, now=0.0)
    assert parse_port_rate("1gbit") == PortRate(bps=1e9)
    assert parse_port_rate("400Mbit") == PortRate(bps=4e8)
    assert parse_port_rate("8000pps,1gbit") == PortRate(pps=8000, bps=1e9)
    for bad in ("", "100", "0pps", "1gbit,2gbit", "1xbit", "-5pps", "0.5pps"):
        with pytest.raises(ValueError, match="expected a rate|at least"):
            parse_port_rate(bad)


def test_dataplane_port_shaper_runs_egress_at_transmission():
    """Through the L2 Dataplane on a virtual clock: a forwarded loss-tolerant contribution
    that the congestion drop takes uses no link time; high priority overtakes queued low."""
    from softswitch.dataplane import Dataplane
    from spina import spec, wire
    dp = Dataplane(pool_slots=1)
    dst = "02:00:00:00:00:99"
    dp.table_add("l2", {"dst_mac": dst}, "bridge", {"port": 2})
    dp.set_port_rate(2, PortRate(pps=8), now=0.0)

    def ina(k, prio, tolerant):
        """A contribution frame to `dst` (forwarded, not aggregated here), `round` = k."""
        hdr = wire.Header(msg_type=wire.MSG_CONTRIB, job=1, round=k, nlanes=1, block_size=1,
                          priority=prio, flags=wire.FLAG_LOSS_TOLERANT if tolerant else 0)
        payload = wire.pack(hdr, [0], [[k]])
        ip = bytes.fromhex("4500") + (28 + len(payload)).to_bytes(2, "big") + bytes(4) + \
            bytes([64, 17]) + bytes(2) + bytes([10, 0, 0, 1, 10, 0, 0, 2])
        udp = (5000).to_bytes(2, "big") + spec.INA_UDP_PORT.to_bytes(2, "big") + \
            (8 + len(payload)).to_bytes(2, "big") + bytes(2)
        return bytes.fromhex(dst.replace(":", "")) + bytes(6) + b"\x08\x00" + ip + udp + payload
    # bound 65535/65536 and threshold 0: a flagged contribution that found another frame
    # queued is dropped while the credit lasts (every contribution earns 65535)
    dp.table_add("congestion", {"job": 1}, "set_congestion", {"qdepth": 0, "bound": 65535})
    frames = [ina(0, 0, False), ina(1, 0, True), ina(2, 0, True), ina(3, 0, True),
              ina(4, 0, False), ina(5, 5, False)]
    out = []
    for k, f in enumerate(frames):  # all within the first slot; rates and times binary-exact
        t = k / 64
        out += [(t, p, fr) for p, fr in dp.process(f, 1, now=t)]
    t = 0.125
    while t < 1.0:
        out += [(t, p, fr) for p, fr in dp.departures(now=t)]
        t += 1 / 32
    rounds = [(t, wire.unpack_header(fr[42:]).round) for t, _, fr in out]
    # round 0 leaves on arrival (so round 1 found the queue empty: kept); the link is free at
    # 1/8: round 5 (priority 5) goes first; round 1 at 2/8; rounds 2 and 3 (enq_qdepth 1, 2)
    # are dropped at egress and round 4 takes the 3/8 slot they did not use
    assert rounds == [(0.0, 0), (0.125, 5), (0.25, 1), (0.375, 4)]
    assert dp.counter("job_congestion_drops", 1) == 2


# ------------------------------------------------------------------ a real L2Switch
@pytest.fixture
def veth_pair_ports():
    """ports4.yaml's first two ports in this namespace: ({port: switch side}, {port: host
    side}), named by this process's tag (two runs on one machine do not share interfaces)."""
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(why)
    with root_ports(2, netns.unique_tag("sqe")) as ports:
        yield ports


def _paced_arrivals(host_ifs, dst: bytes, n: int = 3) -> list[float]:
    """Send n frames to `dst` on host port 1; when each arrived on host port 2."""
    tx, rx = netns.packet_socket(host_ifs[1]), netns.packet_socket(host_ifs[2])
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
    from softswitch.dataplane import Dataplane
    from softswitch.l2 import L2Switch
    sw_ifs, host_ifs = veth_pair_ports
    dp = Dataplane()
    dst = bytes.fromhex("020000000099")
    dp.table_add("l2", {"dst_mac": "02:00:00:00:00:99"}, "bridge", {"port": 2})
    dp.set_queue_rate(2, 2)
    with L2Switch(sw_ifs, dp) as sw:  # its sockets are bound: nothing sent now is missed
        times = _paced_arrivals(host_ifs, dst)
        assert times[-1] - times[0] >= 0.6  # 1.0 s apart at the switch; receive jitter allowed
        assert sw.frames_out == 3


@pytest.mark.parametrize("args, says", [
    (["--port-rate", "2:100"], "argument --port-rate: '100': expected a rate > 0 in pps"),
    (["--port-rate", "2"], "argument --port-rate: '2': expected PORT:RATE"),
    (["--port-rate", "3:1gbit"], "argument --port-rate: port 3 is not a switch port"),
    (["--port-rate", "2:1gbit", "--queue-rate", "2:100"],
     "argument --port-rate: port 2 also has a --queue-rate"),
])
def test_port_rate_option_bad_values_are_one_line(args, says):
    """Checked before any interface is opened: one line naming the option, exit 2."""
    out = subprocess.run([sys.executable, "-m", "softswitch", "l2", "-i", "1@nosuch0",
                          "-i", "2@nosuch1", *args], capture_output=True, text=True, timeout=60)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr
