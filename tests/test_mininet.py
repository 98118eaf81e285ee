"""Integration: host agents on mininet hosts, software switch nodes (L2 mode) between them.

Run just this file: python -m pytest tests/test_mininet.py   (needs root and Debian's mininet)

Each test builds its topology, starts the switch processes, runs one worker process per host,
and stops everything it started (net.stop(), switch processes by their handles).
"""
from __future__ import annotations

import os
import shutil
import sys

import pytest

try:
    from testbed import topos
    from testbed.__main__ import (
        first_transmission_bytes,
        run_allreduce,
        spine_link_bytes,
        spray_traffic,
    )
    from testbed.mn import import_mininet
    import_mininet()
    WHY = None if os.geteuid() == 0 else "needs root"
except ImportError as e:
    WHY = str(e)

pytestmark = pytest.mark.skipif(WHY is not None, reason=f"mininet testbed unavailable: {WHY}")


def _udp_reaches(src, dst, port=40000) -> bool:
    """A datagram from host `src` arrives at host `dst` (not an INA packet)."""
    recv = dst.popen([sys.executable, "-c",
                      "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                      f"s.bind(('{dst.IP()}', {port})); s.settimeout(5); "
                      "print('bound', flush=True); print(s.recvfrom(100)[0].decode())"])
    try:
        assert recv.stdout.readline().strip() == b"bound"  # listening before anything is sent
        src.cmd(f"{sys.executable} -c \"import socket; socket.socket(socket.AF_INET, "
                f"socket.SOCK_DGRAM).sendto(b'hello', ('{dst.IP()}', {port}))\"")
        out, _ = recv.communicate(timeout=10)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return out.decode().strip() == "hello"


def _check(reports, nhosts):
    assert len(reports) == nhosts
    assert all(r["ints_exact"] for r in reports), reports
    assert len({r["ints"] for r in reports}) == 1
    assert len({r["floats"] for r in reports}) == 1
    assert max(r["float_err"] for r in reports) < 1e-3


def test_single_switch_allreduce():
    """Three hosts on one software switch get exact sums."""
    tb = topos.single(3)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        _check(run_allreduce(tb, jd, n=6000), 3)
    finally:
        tb.stop()


def test_leaf_spine_allreduce_and_forwarding():
    """Two leaves, two spines: spine1 aggregates; hosts on different leaves reach each other."""
    tb = topos.leafspine(2, 2, 2)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        assert _udp_reaches(tb.hosts[0], tb.hosts[3])  # ordinary forwarding across leaves
        assert _udp_reaches(tb.hosts[3], tb.hosts[1])
        _check(run_allreduce(tb, jd, n=6000), 4)
    finally:
        tb.stop()


@pytest.mark.parametrize("racks,per_rack,density", [
    (2, 4, 0.01), (2, 4, 1.0), (4, 4, 0.01), (4, 4, 1.0),
    (3, 12, 0.01),  # 36 workers: more than one switch's 32 (each sends its rank in its rack)
])
def test_two_level_allreduce_exact_under_loss(racks, per_rack, density):
    """Racks of `per_rack` hosts, 2 spines, the job's 8 slots sharded over both; every switch node
    programmed by the controller's deploy over P4Runtime gRPC; 1% of the frames dropped on
    every link in each direction: one int32 and one float32 all-reduce per host are exact
    and bit-identical on all ranks."""
    from controller.state import load
    tb = topos.leafspine(racks, 2, per_rack, two_level=True)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        state = load(tb.state_path)  # what the controller deployed: the testbed's YAML file
        assert len(state.fabric.members(state.fabric.jobs[1])) == racks * per_rack
        levels = state.fabric.levels
        assert sorted(levels.values()) == ["leaf"] * racks + ["spine"] * 2
        assert [s.nslots for s in state.fabric.jobs[1].shards] == [4, 4]
        assert all(r.changed for r in tb.reports)
        tb.drop_randomly(0.01)
        reports = run_allreduce(tb, jd, n=65536, density=density)
        hosts_dropped, switches_dropped = tb.dropped_frames()
        print(f"{racks} racks x {per_rack}, density {density}: frames dropped by hosts "
              f"{hosts_dropped}, by switches {switches_dropped}; resends "
              f"{sum(c['resends'] for r in reports for c in r['calls'])}")
        assert hosts_dropped > 0 and switches_dropped > 0
        _check(reports, racks * per_rack)
    finally:
        tb.stop()


@pytest.mark.parametrize("spines", [1, 2])
def test_spine_link_bytes_two_level_against_flat(spines):
    """One dense int32 all-reduce of 8 hosts in 2 racks, flat (the first spine aggregates)
    and two-level (slots sharded over the spines), no loss: the spines' interface counters
    hold every first transmission exactly once each way (N senders flat, one per rack
    two-level, so exactly 1/4 of flat) plus at most three full frames per worker resend;
    both runs give the same sums."""
    from spina import wire
    racks, per_rack, n = 2, 4, 32768
    flat, flat_reports = spine_link_bytes(racks, spines, per_rack, False, n=n)
    two, two_reports = spine_link_bytes(racks, spines, per_rack, True, n=n)
    jd = topos.JOB_SIZES
    full = 14 + 20 + 8 + wire.packet_len(jd["nlanes"], jd["block_size"], jd["nlanes"])
    rounds = n // (jd["nlanes"] * jd["block_size"]) + jd["nslots"]  # data + one setup per slot
    for r in flat_reports + two_reports:
        assert r["ints_exact"]
        (call,) = r["calls"]
        assert call["packets_sent"] - call["resends"] == rounds
    # the same sums, bit for bit, on every rank of both runs
    assert len({r["ints"] for r in flat_reports + two_reports}) == 1
    resends_flat = sum(r["calls"][0]["resends"] for r in flat_reports)
    resends_two = sum(r["calls"][0]["resends"] for r in two_reports)
    first_flat = first_transmission_bytes(racks * per_rack, n, jd)
    first_two = first_transmission_bytes(racks, n, jd)
    print(f"{spines} spine(s): spine-link bytes flat {flat} (first transmissions {first_flat}, "
          f"{resends_flat} resends), two-level {two} (first transmissions {first_two}, "
          f"{resends_two} resends); measured ratio {two / flat:.4f}, first transmissions "
          f"{first_two / first_flat:.4f}, target {1 / per_rack:.4f}")
    assert first_two * per_rack == first_flat
    # A worker's resend costs at most three frames, none larger than a full one: itself up
    # (or its leaf's partial), the answer down, and, when that answer (a duplicate) comes
    # after the worker closed its socket, the host's ICMP port unreachable (576 bytes of IP),
    # which a flat leaf forwards to the spine owning the switch address.
    assert first_flat <= flat <= first_flat + 3 * full * resends_flat
    assert first_two <= two <= first_two + 3 * full * resends_two


BMV2_PROGRAM = os.path.join(os.path.dirname(__file__), "..", "p4src", "build",
                            "spina_v1model.json")


@pytest.mark.skipif(not (shutil.which("simple_switch_grpc") and os.path.exists(BMV2_PROGRAM)),
                    reason="needs BMv2's simple_switch_grpc on PATH and `make p4` output "
                           "(p4src/README.md: upstream install instructions)")
@pytest.mark.parametrize("density", [0.01, 1.0])
def test_two_level_on_bmv2_nodes_exact_under_loss(density):
    """The P4 program on four BMv2 switches (2 leaves, 2 spines), every one programmed by the
    controller's deploy over P4Runtime from the testbed's desired state; 8 workers in 2 racks
    of 4, 1% of the frames dropped on every link: exact and bit-identical on all ranks."""
    tb = topos.leafspine(2, 2, 4, two_level=True, switch="bmv2")
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        assert all(r.changed for r in tb.reports)
        tb.drop_randomly(0.01)
        reports = run_allreduce(tb, jd, n=20000, density=density)
        hosts_dropped, switches_dropped = tb.dropped_frames()
        assert hosts_dropped > 0 and switches_dropped > 0
        _check(reports, 8)
    finally:
        tb.stop()


def test_two_level_state_for_bmv2_nodes():
    """The desired state the testbed deploys to BMv2 nodes, built but not started (so it runs
    without BMv2 too): it parses, gives each node its own gRPC and Thrift port and the
    compiled program, and the plan puts each leaf's rack and each spine's shard in P4 rows."""
    from controller import plan
    from controller.state import parse
    tb = topos.leafspine(2, 2, 4, two_level=True, switch="bmv2")
    tb.add_job(tb.job_config())
    try:
        for node in tb.switches:
            node.assign_addresses()
        state = parse(tb.desired_state())
        sws = list(state.switches.values())
        assert [s.target for s in sws] == ["bmv2"] * 4
        assert len({s.grpc for s in sws}) == len({s.thrift_port for s in sws}) == 4
        assert all(s.p4info.endswith("spina_v1model.p4info.txtpb") for s in sws)
        for leaf in tb.leaves:
            rows = plan.p4_rows(state.fabric, leaf.name)
            tables = [r[0] for r in rows.entries]
            assert (tables.count("admission"), tables.count("leaf_upstream")) == (4, 8)
            assert rows.jobs == {1: (0, 8, 1)}
        for j, spine in enumerate(tb.spines):
            rows = plan.p4_rows(state.fabric, spine.name)
            assert [r[0] for r in rows.entries].count("admission") == 2
            assert rows.jobs == {1: (4 * j, 4, 1)}
    finally:
        tb.stop()


def test_spray_splits_remote_traffic_over_spines_per_packet():
    """2000 paced UDP datagrams from rack 0 to rack 1 over 2 spines: without spraying every
    frame takes the one spine of the destination host (both its links carry all 2000); with
    --spray each spine's two links carry exactly 1000 frames (round robin), every datagram
    arrives either way."""
    frame = 14 + 20 + 8 + 1000
    fixed = spray_traffic(False, datagrams=2000)
    sprayed = spray_traffic(True, datagrams=2000)
    print(fixed, sprayed)
    assert fixed["received"] == sprayed["received"] == 2000
    assert fixed["reordered"] == 0
    # host 0 -> host 1 without spraying: spine (1 + 0) % 2 + 1 = 2 (remote_l2_entry)
    assert fixed["links"] == {"lf1-sp1": [0, 0], "lf2-sp1": [0, 0],
                              "lf1-sp2": [2000, 2000 * frame], "lf2-sp2": [2000, 2000 * frame]}
    assert sprayed["links"] == {k: [1000, 1000 * frame] for k in fixed["links"]}


def test_two_level_with_spray_stays_exact():
    """Two-level aggregation with the leaves spraying non-INA traffic over both spines: the
    desired state has the sprayed l2 entries, hosts in different racks reach each other, and
    the all-reduce is exact (INA traffic takes leaf_upstream, not l2)."""
    tb = topos.leafspine(2, 2, 2, two_level=True, spray=True)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        from controller.state import load
        state = load(tb.state_path)
        assert [state.switches[leaf.name].l2_spray for leaf in tb.leaves] == [
            tuple((topos.host_mac(k), (3, 4)) for k in (2, 3)),
            tuple((topos.host_mac(k), (3, 4)) for k in (0, 1))]
        assert _udp_reaches(tb.hosts[0], tb.hosts[3])
        assert _udp_reaches(tb.hosts[3], tb.hosts[0])
        _check(run_allreduce(tb, jd, n=6000), 4)
    finally:
        tb.stop()
