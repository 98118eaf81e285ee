"""SpINA's cost model at cluster scale and on this machine (collectives/ina_model.py), its
calibration from bench/results/ (collectives/ina_calibration.py) and `spina plan --scale`
and `--calibration`.

Run just this file: python -m pytest tests/test_ina_model.py

The arithmetic is checked against values worked out by hand on small cases; the
calibration is recomputed from the committed CSVs, and its error table must be the one
docs/collectives.md shows.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from collectives import ina_calibration as cal, ina_model as m

ROOT = Path(__file__).resolve().parents[1]
A = m.Assumptions()
# the scale model's switch terms alone: no agent, no fixed cost
BARE = A.with_(agent_s_per_call=0.0, agent_s_per_element=0.0, tofino_agent_s_per_packet=0.0,
               agent_s_per_datagram=0.0, agent_s_per_fragment=0.0, agent_s_per_byte=0.0,
               call_s=0.0)


# ----------------------------------------------------------------------------- arithmetic
def test_link_arithmetic_per_collective():
    """Issue 45's table: 4 ranks, 1024 bytes, density 0.5 (union 1 - 0.5^4 = 0.9375),
    16-bit lanes (half the bytes)."""
    assert m.union(0.1, 2) == pytest.approx(0.19)
    assert m.rank_bytes("all_reduce", 4, 1024, 0.5, 16) == (256.0, 480.0)
    assert m.rank_bytes("reduce_scatter", 4, 1024, 0.5, 16) == (256.0, 120.0)
    assert m.rank_bytes("all_gather", 4, 1024) == (256.0, 768.0)
    assert m.rank_bytes("reduce_scatter", 4, 1024) == (1024.0, 256.0)  # S up, S/N down
    with pytest.raises(ValueError, match="collective: one of"):
        m.rank_bytes("broadcast", 4, 1024)


def test_tree_levels():
    """Children per switch, leaves first: SpINA's fabric is 32 x 32 = 1024 in two levels;
    16 ports per Tofino pipe need three."""
    assert m._levels(1024, 32) == [32, 32]
    assert m._levels(1024, 16) == [16, 16, 4]
    assert m._levels(8, 32) == [8]
    assert m._levels(100, 32) == [32, 4]


def test_ring_by_hand():
    """4 ranks, S = 4 x 8948 bytes: 6 steps of S/4, 6 MSS segments of 8948 bytes each
    carrying 66 bytes of headers and 24 of framing; 10 us per step."""
    c = m.ring(A, 4, 4 * 8948, 1e9)
    wire = 6 * 8948 + 6 * (66 + 24)
    assert c.terms["link"] == pytest.approx(wire * 8 / 1e9)
    assert c.seconds == pytest.approx(wire * 8 / 1e9 + 6 * 10e-6)
    assert m.ring(A, 4, 4 * 8948, 1e9, "all_gather").terms["steps"] == pytest.approx(3e-5)


def test_rounds_by_hand():
    """E[max of k Binomial(m, p)]: one lane holds m p blocks; two lanes of one position at
    p = 1/2 take a round unless both are empty (3/4); every position when p = 1. A slot in
    use: its setup round and the largest lane's positions; a slot whose lanes hold no block
    of the tensor sends nothing (host_agent/agent.py)."""
    assert m.expected_max(1, 40, 0.25) == pytest.approx(10.0)
    assert m.expected_max(2, 1, 0.5) == pytest.approx(0.75)
    assert m.expected_max(56, 7, 1.0) == 7.0 and m.expected_max(56, 7, 0.0) == 0.0
    # 64 KiB of int32: 64 blocks of 256 in the first 2 of 16 slots (56 lanes each)
    assert m.active_slots(16384, 56, 256, 16) == 2
    assert m.rounds(4, 16384, 1.0, 56, 256, 16) == 2 + 2
    # 4 values: one block, slot 0 alone: its setup round and one data round
    assert m.rounds(4, 4, 1.0, 56, 256, 16) == 2
    # 10 datagrams' values (560 blocks): 10 slots, each a setup round and one data round
    assert m.rounds(4, 14336 * 10, 1.0, 56, 256, 16) == 20
    # dense 25 M values: 109 positions per lane, every slot: 16 x 110 (the sweep: 1760)
    assert m.rounds(4, 25_000_000, 1.0, 56, 256, 16) == 16 * 110


def test_rounds_match_the_measured_packets():
    """The loopback sweep's packets per worker (24 configurations of size, density, workers,
    lanes and slots, where the data's non-zero blocks are the job's blocks) are within 6%
    of the rounds the model counts; the sweep ran before a call used only the slots its
    length fills (8f974a4), so every slot sent its setup round there. Today's runs
    (ina_calibration/: 16 bytes to 16 MiB) send the model's rounds within 10%, the
    smallest dense calls exactly (but for sparse tensors of fewer blocks than 1/density:
    the bench's data holds a block per rank at least, the model a density's share)."""
    import csv
    path = cal.RESULTS / "all_reduce_loopback" / "sweep" / "results.csv"
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "spina"
                and r["block_size"] == r["data_block"]]
    assert len(rows) == 24
    for r in rows:
        e, lanes, block, slots = (int(r[k]) for k in ("elements", "nlanes", "block_size",
                                                       "nslots"))
        want = m.rounds(int(r["workers"]), e, float(r["density"]), lanes, block, slots) \
            + slots - m.active_slots(e, lanes, block, slots)
        assert want == pytest.approx(float(r["packets_per_worker"]), rel=0.06), r["sweep"]
    checked = 0
    for run in cal.ALL_REDUCE_RUNS:
        with open(cal.RESULTS / run / "results.csv") as f:
            for r in csv.DictReader(f):
                e, lanes, slots = int(r["elements"]), int(r["nlanes"]), int(r["nslots"])
                block, d = int(r["block_size"]), float(r["density"])
                if d * e / block < 1:  # the bench gives each rank one block at least
                    continue
                want = m.rounds(int(r["workers"]), e, d, lanes, block, slots)
                got = float(r["packets_per_link"])
                assert want == pytest.approx(got, rel=0.1), (run, r["size"], r["density"])
                if e <= 16384 and d == 1:
                    assert want == got
                checked += 1
    assert checked == 58
    # the reduce-scatter's lanes by shard: today's dense calls send exactly the model's
    # rounds (64 KiB to 8 MiB, 4 and 8 ranks), the sparse ones within 20% where each
    # shard holds a density's share of a block at least
    checked = 0
    for run in cal.REDUCE_SCATTER_RUNS:
        with open(cal.RESULTS / run / "results.csv") as f:
            for r in csv.DictReader(f):
                n, e, d = int(r["workers"]), int(r["elements"]), float(r["density"])
                if d * e / n / 256 < 1:
                    continue
                want = m._packets("reduce_scatter", n, 4 * e, d, 56, 256, 16)[0]
                got = float(r["packets_per_link"])
                assert want == pytest.approx(got, rel=0 if d == 1 else 0.2), (run, e, d)
                checked += 1
    assert checked == 52


def test_tofino_recirculation_by_hand():
    """2 workers, 1024 blocks of 64 int32, dense, 100 Gbit/s: 256 slots of one lane, so
    256 setup rounds and 4 data rounds per slot: 1280 packets per rank each way, each 52
    bytes of SpINA header, 8 UDP, 34 Ethernet and IPv4, 24 framing (374 with a block). One
    switch of 2 children: 2 x 1280 contributions cross the recirculation port, 1280
    replies once more."""
    size = 1024 * 256
    wire = size + 1280 * (52 + 8 + 34 + 24)
    c = m.predict(BARE, 2, size, 100e9, switch="tofino")
    assert c.terms["link"] == pytest.approx(wire * 8 / 100e9)
    assert c.terms["L1 switch"] == pytest.approx(3 * wire * 8 / 100e9)
    assert c.terms["window"] == pytest.approx(5 * 5e-6)  # 5 rounds per slot, 5 us each
    assert c.bottleneck == "L1 switch"
    assert c.seconds == pytest.approx(5e-6 + 3 * wire * 8 / 100e9)
    line = m.predict(BARE, 2, size, 100e9, switch="tofino-line")
    assert line.terms["L1 switch"] == pytest.approx(c.terms["link"])
    # the agent: a scan per value, a cost per packet and per payload byte sent or received
    agent = m.predict(A, 2, size, 100e9, switch="tofino").terms["agent"]
    assert agent == pytest.approx(A.agent_s_per_call + 65536 * A.agent_s_per_element
                                  + 2560 * 1e-7 + 2 * size * A.agent_s_per_byte)


def test_software_switch_nic_by_hand():
    """4 workers under one software switch, 10 datagrams' worth of values, dense: 10 slots
    in use, a setup round and a data round each, 20 datagrams per rank, spread evenly
    (28,944 bytes: 4 IPv4 fragments each at MTU 9000); the switch's NIC takes the 4 uplinks'
    bytes in and sends the result 4 times."""
    n, size = 4, 14336 * 4 * 10
    wire = size + 20 * (272 + 8 + 4 * (34 + 24))
    c = m.predict(BARE, n, size, 10e9, switch="software")
    assert c.terms["link"] == pytest.approx(wire * 8 / 10e9)
    assert c.terms["L1 switch"] == pytest.approx(4 * wire * 8 / 10e9)
    assert c.bottleneck == "L1 switch"


def test_software_switch_all_gather_copies_by_hand():
    """An all-gather of 10 full datagrams per rank (57,344 bytes of values each, 7 IPv4
    fragments at MTU 9000) through one software switch of 4 children: 40 datagrams and 280
    fragments in, each datagram copied out to the 3 others (120 copies), on 16 cores; at
    1 Tbit/s the server's CPU, not its NIC, bounds it."""
    size = 4 * 57344 * 10
    c = m.predict(BARE, 4, size, 1e12, switch="software", collective="all_gather")
    cpu = (40 * A.switch_s_per_datagram + 280 * A.switch_s_per_fragment
           + size * A.switch_s_per_byte + 120 * A.gather_s_per_copy) / 16
    assert c.terms["L1 switch"] == pytest.approx(cpu)
    assert c.bottleneck == "L1 switch"


def test_training_step():
    assert m.step(0.3, 0.1, overlap=True) == 0.3
    assert m.step(0.3, 0.5, overlap=True) == 0.5
    assert m.step(0.3, 0.1, overlap=False) == pytest.approx(0.4)


def test_machine_star_64kib_by_hand():
    """The star's 64 KiB call (the planner's old +74%, then +213% with a 1.3 ms wait per
    round): 2 slots in use, so 4 datagrams per uplink (a setup round and a data round in
    each), spread evenly 16,656 bytes each (2 IPv4 fragments): 65,536 bytes of values, 272
    of header and 8 of UDP per datagram, 34 of Ethernet and IPv4 per fragment, 66,928 bytes.
    With tbf's bucket full at the call's start (128 KiB: the harness checks each result
    between calls) they leave at once: the call is its fixed time, the CPU of 4 agents and
    the switch on the cores (all of it within the burst: on both cores) and its 2 rounds
    per slot's wait. With an empty bucket the last round's result follows its
    contributions: one datagram more at the rate."""
    assert m.machine_streams(A, "all_reduce", 4, 65536, 1.0, 32, 9000) == (4, 4, 8, 8, 66928,
                                                                          66928)
    empty = m.machine(A, "all_reduce", 4, 65536, 200e6, mtu=9000)
    assert empty.terms["link"] == pytest.approx((66928 + 66928 / 4) * 8 / 200e6)
    full = m.machine(A, "all_reduce", 4, 65536, 200e6, mtu=9000, burst=128 << 10)
    agent = A.agent_s_per_call + 16384 * A.agent_s_per_element + 8 * A.agent_s_per_datagram \
        + 16 * A.agent_s_per_fragment + 2 * 65536 * A.agent_s_per_byte
    switch = 4 * (4 * A.switch_s_per_datagram + 8 * A.switch_s_per_fragment
                  + 65536 * A.switch_s_per_byte)
    assert 4 * agent + switch < A.machine_burst_s
    cpu = (4 * agent + switch) / 2
    window = 2 * A.machine_round_s  # each of the 2 slots' 2 rounds, one after another
    assert full.terms["link"] == 0 and full.bottleneck == "cpu"
    assert full.seconds == pytest.approx(A.call_s + cpu + window)


def test_cores_time_by_hand():
    """A call's first machine_burst_s CPU-seconds run on both cores, the rest at the share:
    6 ms of CPU take 3 ms; 13 ms take 3 + 7 / (2 x 0.35) = 13 ms."""
    assert m.cores_time(0.006, 2, 0.35, 0.006) == pytest.approx(0.003)
    assert m.cores_time(0.013, 2, 0.35, 0.006) == pytest.approx(0.003 + 0.007 / 0.7)
    assert m.cores_time(0.001, 2, 0.35, 0.006) == pytest.approx(0.0005)


def test_reduce_scatter_and_all_gather_pay_their_own_fixed_time():
    """One call of each collective on loopback differs from the all-reduce by its fixed
    time (and its bytes): a reduce-scatter's own shard split, an all-gather's."""
    bare = A.with_(call_s=0.0, scatter_call_s=0.0, gather_call_s=0.0)
    for collective, name in (("reduce_scatter", "scatter_call_s"),
                             ("all_gather", "gather_call_s")):
        with_call = m.machine(bare.with_(**{name: 1e-3}), collective, 4, 1 << 20, math.inf)
        assert with_call.seconds == pytest.approx(
            m.machine(bare, collective, 4, 1 << 20, math.inf).seconds + 1e-3)


def test_reduce_scatter_rounds_and_bytes():
    """A reduce-scatter with at least as many slots as ranks lays its lanes out by shard
    (host_agent/scatter.py Owners.lanes): 1 MiB over 4 ranks is 4 shards of 256 blocks,
    each on 4 slots of 56 lanes (224): lanes 0-31 hold 2 positions, so slot 0 runs a setup
    and 2 data rounds, slots 1-3 a setup and 1: 9 rounds per shard, 36 per rank (the
    all-reduce's 1024 blocks over 896 lanes: 16 setup and 19 data rounds, 35). A rank
    receives every round (its shard's whole, the others' header-only: ScatterStrip), S/N of
    payload; a Tofino strips nothing (the TNA program multicasts the result whole)."""
    ar = m.machine_streams(A, "all_reduce", 4, 1 << 20, 1.0, 32, 9000)
    rs = m.machine_streams(A, "reduce_scatter", 4, 1 << 20, 1.0, 32, 9000)
    assert ar[:2] == (35, 35) and rs[:2] == (36, 36)
    assert rs[4] == m.stream(1 << 20, 36, 272, 9000)[1]
    assert rs[5] == m.stream((1 << 20) / 4, 36, 272, 9000)[1]
    # 64 KiB: 16 blocks per shard, one slot each: a setup and a data round in 4 slots
    assert m.machine_streams(A, "reduce_scatter", 4, 65536, 1.0, 32, 9000)[:2] == (8, 8)
    assert m.machine(A, "reduce_scatter", 4, 65536, math.inf).terms["slot_rounds"] == 2
    # fewer slots than ranks: the all-reduce's lanes
    assert m._packets("reduce_scatter", 32, 1 << 20, 1.0, 56, 256, 16) \
        == m._packets("all_reduce", 32, 1 << 20, 1.0, 56, 256, 16)
    soft = m.predict(BARE, 4, 1 << 20, 100e9, switch="software", collective="reduce_scatter")
    tof = m.predict(BARE, 4, 1 << 20, 100e9, switch="tofino", collective="reduce_scatter")
    tof_ar = m.predict(BARE, 4, 1 << 20, 100e9, switch="tofino")
    # 4 shards of 1024 blocks on 64 one-lane slots, 17 rounds each: the all-reduce's 4352
    assert tof.terms["link"] == tof_ar.terms["link"]  # the result whole
    # the uplink carries the whole tensor; the server's NIC sends each child its shard's
    # rounds whole and the others' headers: the uplinks' bytes in bound it
    up = m.stream(1 << 20, 36, 272, 9000, 24)[1]  # with 24 bytes of framing per frame
    assert soft.terms["link"] == pytest.approx(up * 8 / 100e9)
    assert soft.terms["L1 switch"] == pytest.approx(4 * up * 8 / 100e9)
    assert m.caveats("software", "reduce_scatter", 1) == []


def test_bad_model_input_names_the_field():
    with pytest.raises(ValueError, match="lane_bits: the TNA program carries 32-bit"):
        m.predict(A, 8, 1 << 20, 100e9, lane_bits=16, switch="tofino")
    with pytest.raises(ValueError, match="switch: the TNA program drops all-gather"):
        m.predict(A, 8, 1 << 20, 100e9, switch="tofino", collective="all_gather")
    with pytest.raises(ValueError, match="switch: one of"):
        m.predict(A, 8, 1 << 20, 100e9, switch="fpga")
    with pytest.raises(ValueError, match="server_cores: must be at least 1"):
        A.with_(server_cores=0)
    with pytest.raises(ValueError, match="rtt_s: must be a number >= 0"):
        A.with_(rtt_s=-1.0)


def test_assumptions_follow_spina():
    """The datagram constants are SpINA's own; every assumption names its source."""
    from spina import wire
    from spina.config import JobConfig
    job = JobConfig(job=1, workers=())
    assert (A.lanes, A.block, A.slots, A.header) == (job.nlanes, job.block_size, job.nslots,
                                                     wire.HEADER_LEN)
    assert all(m.source(f.name) for f in fields(A))


# ----------------------------------------------------------------------------- calibration
POINTS = cal.load()


def test_points_are_every_committed_spina_point():
    """Today's runs (ina_calibration/): 10 + 9 all-reduces on loopback, 10 on the 200 Mbit/s
    star, 24 at 1 and 10 Gbit/s in three lane widths, 12 with 8 ranks, 6 all-gathers, 12 +
    6 reduce-scatters and 32 + 16 more by factors of 2 (after their lanes by shard); 7
    all-gathers on two groups (the topology planner's)."""
    runs = [p.run for p in POINTS]
    assert [runs.count(r) for r in cal.ALL_REDUCE_RUNS] == [10, 9, 10, 24, 12]
    assert [runs.count(r) for r in cal.GATHER_RUNS] == [6]
    assert [runs.count(r) for r in cal.REDUCE_SCATTER_RUNS] == [12, 6, 32, 16]
    assert runs.count(cal.HIER_RUN) == 7 and len(POINTS) == 144


def test_defaults_are_the_calibration():
    """Assumptions' machine constants are the fit of the committed results (2 digits)."""
    fit = cal.fit(POINTS)
    for name in cal.FITTED:
        assert getattr(A, name) == pytest.approx(getattr(fit, name), rel=0.05, abs=1e-12), name


def test_cpu_columns_fit():
    """The agent's CPU per call is within 20% of the model's at 46 of the 65 all-reduce
    points that measured it, the switch's at 7 of 19 (docs/collectives.md)."""
    ar = [p for p in POINTS if p.collective == "all_reduce"]
    agent = [cal.predict(A, p).terms["agents"] / p.workers / p.agent_cpu_s - 1 for p in ar]
    switch = [cal.predict(A, p).terms["switch"] / p.switch_cpu_s - 1 for p in ar
              if p.switch_cpu_s is not None]
    assert (len(agent), sum(abs(e) <= 0.2 for e in agent)) == (65, 46)
    assert (len(switch), sum(abs(e) <= 0.2 for e in switch)) == (19, 7)


def test_error_table_is_the_documented_one():
    """The target (within 20% of every point) is met at 69 of 144 points; of the others 55
    have repeats of their own more than 20% from their median, 5 resent datagrams, 15 are
    the model's misses; the table in docs/collectives.md is this one, so it names each
    point outside honestly."""
    rows = cal.errors(A, POINTS)
    verdicts = [cal.verdict(r) for r in rows]
    assert [verdicts.count(c) for c in cal.CLASSES] == [69, 55, 5, 15]
    assert "Of the noisy, 29 predict a time within their repeats' range." in cal.table(rows)
    doc = (ROOT / "docs" / "collectives.md").read_text()
    assert cal.table(rows) in doc


# ----------------------------------------------------------------------------- spina plan
def spina(*args):
    return subprocess.run([sys.executable, "-m", "spina_cli", "plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_spina_plan_scale_prints_the_table_and_assumptions():
    r = spina("--scale", "--workers", "8,1024", "--densities", "1,0.01", "--compute", "0.2",
              "--overlap")
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| 8 |")
            or ln.startswith("| 1024 |")]
    assert len(rows) == 4
    for f in fields(A):
        assert f"- {f.name} = " in r.stdout
    assert "the TNA program has no leaf or spine role" in r.stdout  # 1024 needs levels
    out = json.loads(spina("--scale", "--workers", "16", "--densities", "0.1",
                           "--switches", "tofino-line", "--json").stdout)
    row = out["rows"][0]
    want = m.predict(A, 16, 1 << 30, 100e9, 0.1, switch="tofino-line")
    assert (row["workers"], row["switch"]) == (16, "tofino-line")
    assert row["spina_s"] == pytest.approx(want.seconds)
    assert row["ring_s"] == pytest.approx(m.ring(A, 16, 1 << 30, 100e9).seconds)
    assert math.isclose(out["assumptions"]["tofino_recirc_bps"], 100e9)


def test_verdict_by_hand():
    """A point outside the target is noisy when its own repeats reach more than 20% from
    their median, else it resent datagrams, else it is the model's miss."""
    p = POINTS[0]
    tight = dict(measured_s=1.0, fastest_s=0.85, slowest_s=1.15)

    def row(error, **kw):
        return dict(point=replace(p, **{**tight, "resends": 0, **kw}), error=error)
    assert cal.verdict(row(0.2)) == cal.verdict(row(-0.2, fastest_s=0.1)) == "within"
    assert cal.verdict(row(0.5, fastest_s=0.79)) == "noisy"
    assert cal.verdict(row(0.5, slowest_s=1.21, resends=3)) == "noisy"
    assert cal.verdict(row(-0.5, resends=3)) == "resends"
    assert cal.verdict(row(-0.5)) == "model"


def test_spina_plan_calibration_prints_the_error_table():
    r = spina("--calibration")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == cal.table(cal.errors(A, POINTS))
    rows = json.loads(spina("--calibration", "--json").stdout)
    assert len(rows) == 144 and [r["verdict"] for r in rows].count("within") == 69
    assert rows[0]["load"] == "8.09-8.09" and rows[0]["resends"] == 0


@pytest.mark.parametrize("args, msg", [
    (("--scale", "--workers", "1"), "argument --workers: 1 is not in 2.."),
    (("--scale", "--densities", "0"), "argument --densities"),
    (("--scale", "--switches", "fpga"), "argument --switches: 'fpga' is not one of"),
    (("--scale", "--lane-bits", "12"), "argument --lane-bits"),
    (("--scale", "--rate", "fast"), "argument --rate"),
    (("--scale", "--overlap"), "--overlap: needs --compute"),
    (("--scale", "--compute", "-1"), "argument --compute"),
    (("--scale", "--calibration"), "--scale and --calibration: choose one"),
    (("bench/topologies/star4.yaml", "--scale"), "topology: not with --scale"),
    ((), "topology: required"),
    (("--scale", "--switches", "tofino", "--collective", "all_gather"),
     "switch: the TNA program drops all-gather"),
    (("--scale", "--switches", "tofino", "--lane-bits", "8"),
     "lane_bits: the TNA program carries 32-bit lanes only"),
])
def test_spina_plan_scale_bad_input(args, msg):
    r = spina(*args)
    assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
    assert r.stderr.startswith("spina plan: error: ") and r.stderr.count("\n") == 1
