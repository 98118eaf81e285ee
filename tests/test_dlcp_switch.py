"""The switch side of DLCP's bounded loss: the loss budget's arithmetic, the controller's
per-job install, and bad bounds refused naming the field (docs/dlcp.md, "Switch").

Run just this file: python -m pytest tests/test_dlcp_switch.py
The packet-level conformance (queue order, which packets drop, exact counters and credit on
both switch targets) is bmv2_tests/test_priority.py.
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from controller.controller import program_in_process
from controller.softswitch_files import from_l2_config
from softswitch.dataplane import Dataplane
from softswitch.egress import CongestionDrop
from softswitch.p4runtime_server import SoftSwitchServicer
from softswitch.pipeline import Pipeline
from spina import spec, wire

ROOT = pathlib.Path(__file__).resolve().parents[1]
ONE, CAP = spec.LOSS_CREDIT_ONE, spec.LOSS_CREDIT_MAX


def contribution(job: int, loss_tolerant: bool, msg_type: int = wire.MSG_CONTRIB) -> bytes:
    """An INA header only: all the congestion drop reads."""
    h = bytearray(wire.HEADER_LEN)
    h[wire.FIELD_OFFSET["msg_type"]] = msg_type
    h[wire.FIELD_OFFSET["flags"]] = wire.FLAG_LOSS_TOLERANT if loss_tolerant else 0
    h[wire.FIELD_OFFSET["job"]:wire.FIELD_OFFSET["job"] + 2] = job.to_bytes(2, "big")
    return bytes(h)


def test_define_p4_constants_are_spec():
    """define.p4's loss-budget constants and bound width are spina/spec.py's."""
    text = (ROOT / "p4src" / "shared" / "define.p4").read_text()
    consts = {n: int(v, 0) for n, v in re.findall(r"const \w+\s+(LOSS_\w+) = (\w+);", text)}
    assert consts == {"LOSS_CREDIT_ONE": ONE, "LOSS_CREDIT_MAX": CAP}
    assert re.search(r"typedef bit<(\d+)> loss_bound_t;", text).group(1) == \
        str(spec.LOSS_BOUND_BITS)
    assert CAP == spec.LOSS_BURST * ONE and CAP + ONE < 1 << 32  # no 32-bit overflow


def test_loss_bound_rounds_down_and_refuses_out_of_range():
    """A fraction becomes bound/65536 rounded down (never more loss than asked); a fraction
    outside [0, 1) is refused naming bounded_loss."""
    assert [spec.loss_bound(f) for f in (0.0, 0.01, 0.1, 0.5, 0.9999999)] == \
        [0, 655, 6553, 32768, 65535]
    for bad in (1.0, -0.01, 2):
        with pytest.raises(ValueError, match="bounded_loss"):
            spec.loss_bound(bad)


@settings(max_examples=60, deadline=None)
@given(bound=st.integers(0, ONE - 1),
       packets=st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 1)),
                        min_size=1, max_size=400))
def test_drops_never_exceed_the_bound(bound, packets):
    """Any mix of loss-tolerant flags, queue depths and two jobs: a job's drops never exceed
    floor(seen x bound / ONE), nor, in any run of n of its packets, LOSS_BURST + floor(n x
    bound / ONE); results are never dropped nor seen."""
    p = Pipeline(pool_slots=1, slot_capacity=1)
    congestion = CongestionDrop(p.counters, p.job_registers)
    congestion.table = {1: (5, bound), 2: (5, ONE - 1 - bound)}
    dropped = {1: [], 2: []}
    for lt, deep, which in packets:
        job = which + 1
        if congestion.drop(contribution(job, lt, wire.MSG_RESULT), 100):
            pytest.fail("a result was dropped")
        dropped[job].append(congestion.drop(contribution(job, lt), 10 if deep else 5))
    for job, drops in dropped.items():
        b = congestion.table[job][1]
        c = p.counters
        assert c["job_congestion_seen"][job] == len(drops)
        assert c["job_congestion_drops"][job] == sum(drops) <= len(drops) * b // ONE
        assert 0 <= p.job_registers["job_loss_credit"][job] <= CAP
        for start in range(len(drops)):
            for end in range(start + 1, len(drops) + 1):
                assert sum(drops[start:end]) <= spec.LOSS_BURST + (end - start) * b // ONE


def test_controller_installs_each_jobs_bound():
    """`softswitch l2 --config`'s path: the controller writes one congestion entry per job
    with a bound (threshold: the switch's qdepth_threshold), none for a job without."""
    worker = {"host": "10.0.0.1", "port": 50000, "mac": "02:00:00:00:01:00", "switch_port": 1}
    job = {"nslots": 2, "block_size": 32, "nlanes": 4, "workers": [worker]}
    cfg = {"endpoints": ["10.0.0.100"], "qdepth_threshold": 7,
           "jobs": [dict(job, job=3, bounded_loss=0.1),
                    dict(job, job=4, slot_base=2, bounded_loss=0.0,
                         workers=[dict(worker, port=50001)])]}
    dp = Dataplane(pool_slots=8)
    state = from_l2_config(cfg, pool_slots=8, slot_capacity=dp.pipeline.slot_capacity)
    program_in_process(SoftSwitchServicer(dp), state)
    assert dp.congestion.table == {3: (7, 6553)}


@pytest.mark.parametrize("bound", [1.0, -0.1, 1.5])
def test_controller_refuses_a_bound_out_of_range(tmp_path, bound):
    """`python -m controller -c X.yaml status` with a job's bounded_loss outside [0, 1): exit
    2, one line naming jobs[0] and bounded_loss, before touching any switch."""
    doc = {"switches": [{"name": "s1", "target": "softswitch", "grpc": "127.0.0.1:1"}],
           "workers": [{"name": "w0", "ip": "10.0.0.1", "udp_port": 50000, "switch_port": 0}],
           "jobs": [{"id": 1, "members": ["w0"], "nslots": 2, "slot_base": 0,
                     "bounded_loss": bound}]}
    (tmp_path / "spina.yaml").write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "controller", "-c", "spina.yaml", "--timeout",
                          "1", "status"], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "jobs[0]" in lines[0] and "bounded_loss" in lines[0] and "Traceback" not in lines[0]


def test_contribution_dropped_at_a_leaf_becomes_a_partial_round():
    """A leaf forwards a job's contributions over a congested uplink to the aggregating
    switch: it drops rank 0's loss-tolerant contribution (the budget allowing), and rank 1's
    flush completes the round PARTIAL: both ranks get the same bits, bitmap naming rank 1 only.
    Frame by frame through two software switches (the flush is the one an agent would send)."""
    from bmv2_tests.helpers import (
        SWITCH_IP,
        SWITCH_MAC,
        InaEntries,
        contrib,
        rid,
        worker_mac,
        worker_port,
    )
    ina_at = 14 + 20 + 8
    uplink, leaf_port_at_agg = 9, 1
    leaf, agg = Dataplane(pool_slots=8), Dataplane(pool_slots=8)
    leaf.table_add("l2", {"dst_mac": SWITCH_MAC}, "bridge", {"port": uplink})
    for r in (0, 1):
        leaf.table_add("l2", {"dst_mac": worker_mac(r)}, "bridge", {"port": worker_port(r)})
    leaf.table_add("congestion", {"job": 7}, "set_congestion", {"qdepth": 0, "bound": ONE // 2})
    for port in (uplink, worker_port(0), worker_port(1)):
        leaf.qdepth[port] = 5  # every queue is deep: results pass all the same
    entries = InaEntries(agg)
    entries.add_ina_endpoint_entry(SWITCH_IP)
    for r in (0, 1):
        entries.add_admission_entry(r, 2, port=leaf_port_at_agg)
        entries.add_worker_rewrite_entry(r)
    agg.mcast_group_set(spec.mcast_grp(7), [(leaf_port_at_agg, rid(r)) for r in (0, 1)])

    def send(rank: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Worker -> leaf -> (uplink) -> aggregator -> leaf -> workers."""
        out = []
        for port, f in leaf.process(frame, worker_port(rank)):
            assert port == uplink
            for _, g in agg.process(f, leaf_port_at_agg):
                out += leaf.process(g, uplink)
        return out

    values = {r: [10 * r + i for i in range(32)] for r in (0, 1)}
    assert send(1, contrib(1, blocks={0: values[1]})) == []  # earns half a packet of credit
    assert send(0, contrib(0, blocks={0: values[0]}, flags=wire.FLAG_LOSS_TOLERANT)) == []
    assert leaf.counters["job_congestion_drops"][7] == 1  # rank 0's never reached the aggregator
    flush = contrib(1, blocks={0: values[1]}, flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL)
    got = send(1, flush)
    assert sorted(p for p, _ in got) == [worker_port(0), worker_port(1)]
    results = [wire.unpack(f[ina_at:]) for _, f in got]
    for p in results:
        assert p.header.msg_type == wire.MSG_RESULT and p.header.flags & wire.FLAG_PARTIAL
        assert p.header.bitmap == 0b10
        assert p.data.tolist() == [values[1]]
    assert got[0][1][ina_at:] == got[1][1][ina_at:]  # identical bits for every rank
    assert (leaf.counters["job_congestion_seen"][7], agg.counters["job_aggregated"][7]) == (3, 1)
