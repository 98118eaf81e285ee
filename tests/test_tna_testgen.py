"""The Tofino 1 program pass by pass, byte for byte (tests/tna_pass.py), against the passes'
composition in tests/tna_model.py.

Run just this file: python -m pytest tests/test_tna_testgen.py

tests/tna_pass.py runs one frame through one pass of the pipe (parsers, controls, deparsers,
the bridged and harvest headers, block_e in front): the grain of P4Testgen's tests. Chained
through the recirculation port, its passes must give what TnaModel.process_frame gives for the
whole packet: the same UDP payloads out (and where), counters and register cells after every
frame.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import socket

import numpy as np
from hypothesis import HealthCheck, given, settings

from spina import wire
from tests.test_p4_model import JOB, PORT, SWITCH_IP, frame, src
from tests.test_tna_model import scenario
from tests.tna_model import DECIDE, INA_OFF, TnaModel
from tests.tna_pass import IPV4, T2NA_RECIRC_PORT, TnaPipe, ipv4_checksum, unpack

MCAST_GRP = 7


def _admitted(nworkers: int) -> tuple[TnaPipe, TnaModel]:
    """The job of tests/test_tna_model.py admitted in a pipe and in a model of its own, with a
    multicast group whose replicas go back to the ranks' ports (replication id rank + 1)."""
    pipe, model = TnaPipe(), TnaModel()
    pipe.ina_endpoint.add(int.from_bytes(socket.inet_aton(SWITCH_IP), "big"))
    for r in range(nworkers):
        entry = dict(epoch=1, slot_base=0, nslots=2, nworkers=nworkers, block_size=64, nlanes=1,
                     mcast_grp=MCAST_GRP)
        pipe.model.admission[(PORT, src(r), JOB, r)] = entry
        model.admission[(PORT, src(r), JOB, r)] = entry
        ip = int.from_bytes(socket.inet_aton(src(r)[0]), "big")
        pipe.worker_rewrite[r + 1] = (0x020000000000 + r, ip, src(r)[1])
    return pipe, model


def _leaving(pipe: TnaPipe, port: int, f: bytes, nworkers: int) -> list[tuple[bytes, bool]]:
    """What leaves the pipe for frame `f` from `port`, as TnaModel.process_frame says it:
    (UDP payload, multicast); every replica of a multicast result goes through egress."""
    out = []
    for o in pipe.forward(port, f):
        frames = ([pipe.egress_pass(o.frame, PORT, egress_rid=r + 1).frame
                   for r in range(nworkers)] if o.mcast_grp else [o.frame])
        for fr in frames:
            ip = unpack(IPV4, fr[14:34])
            assert ip["hdr_checksum"] == ipv4_checksum(ip)
        udp_len = int.from_bytes(frames[0][INA_OFF - 4:INA_OFF - 2], "big")
        payloads = {fr[INA_OFF:INA_OFF + udp_len - 8] for fr in frames}
        assert len(payloads) == 1  # replicas differ in their addresses only
        out.append((payloads.pop(), bool(o.mcast_grp)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_the_passes_compose_to_the_model(sc):
    """Random contributions (tests/test_tna_model.py's scenarios) as frames: the chained passes
    send what the model sends, and leave the same counters and register cells."""
    nworkers, packets = sc
    pipe, model = _admitted(nworkers)
    for rank, pkt in packets:
        f = frame(rank, pkt, 8 + len(pkt))
        want = model.process_frame(f, PORT)
        assert _leaving(pipe, PORT, f, nworkers) == want
        assert pipe.model.counters == model.counters
        assert pipe.model.reg == model.reg


def test_a_reply_goes_round_twice_with_its_block_in_front():
    """A one-worker round: the first pass leaves towards the recirculation port with the
    harvest header and block_e (the egress pairs' sums) in front, the second with the high
    halves read, the third sends the result to the job's group."""
    pipe, _ = _admitted(1)
    data = np.arange(64, dtype=np.int32).reshape(1, 64) + 1000
    pkt = wire.pack(wire.Header(msg_type=wire.MSG_CONTRIB, job=JOB, epoch=1, slot=1, rank=0,
                                nlanes=1, round=3, length=5, block_size=64, present=1,
                                flags=wire.FLAG_LAST), [9], data)
    first = pipe.run(PORT, frame(0, pkt, 8 + len(pkt)))
    assert first.port == 68
    assert first.frame[:6] == bytes([0, 1, 0, PORT, 0, MCAST_GRP])  # harvest: block, port, grp
    assert first.frame[6:6 + 120] == data[0, :30].astype(">i4").tobytes()
    second = pipe.run(68, first.frame)
    assert second.port == 68 and second.frame[:2] == bytes([1, 1])  # last, block
    third = pipe.run(68, second.frame)
    assert (third.port, third.mcast_grp) == (None, MCAST_GRP)


# ---------------------------------------------------------------- P4Testgen's fixtures
TESTGEN = pathlib.Path(__file__).resolve().parents[1] / "tofino/testgen"
FIXTURES = sorted(TESTGEN.glob("*.json"))
# The Tofino 2 profile's (tofino/spina_t2na_roles.p4, P4Testgen's tofino2 target on
# tofino/testgen/t2na_flat.p4), replayed on TnaPipe(recirc=T2NA_RECIRC_PORT, hold=True).
T2NA_FIXTURES = sorted((TESTGEN / "t2na").glob("*.json"))
# How P4Testgen (p4c 1.2.5.16's Tofino target with three local fixes, tofino/testgen/README.md)
# and tests/tna_pass.py part, per fixture (counted in test_p4testgen_fixtures_replay):
#   same    the same port and the same bytes under P4Testgen's mask, or nothing on both
#   drop511 P4Testgen takes a unicast to port 511 as a drop (its DROP_CONSTANT): an l2 entry
#           or a harvest header that names port 511; tna_pass sends the frame there
DIVERGENCE = {"same": 832, "drop511": 34}
# The branches the fixtures take in tests/tna_pass.py (TnaPipe.path), each with its number of
# fixtures: every gate but UNADMITTED (a miss leaves the admission's action data unwritten,
# which P4Testgen taints, and the gate's test reads them: it drops such paths), every entry of
# decide (by its index in decide.p4), stale rounds, the reply's second and third passes with
# and without a block, egress's hold drop and harvest branch.
REACH = {
    "gate FORWARD": 80, "gate MALFORMED": 94, "gate STALE_EPOCH": 44, "gate AGGREGATE": 614,
    "above the slot range": 34, "stale round": 68,
    **{f"decide {i}": n for i, n in enumerate((17, 62, 19, 74, 14, 79, 9, 88, 11, 14, 16, 9))},
    "pass 2": 12, "pass 2 with block": 83, "pass 3": 5, "pass 3 with block": 34,
    "egress hold drop": 190, "egress to harvest": 317, "egress contribution": 20,
}


# The Tofino 2 profile's fixtures: every one the same on tests/tna_pass.py (flat jobs, the
# hold), and the branches they take there: every branch of the hold's RegisterAction (a newer
# round starting with nothing pending or only its sender, one held, the head round, an older
# round), first passes of decide's outcomes (all but entry 11), stale rounds.
T2NA_DIVERGENCE = {"same": 100}
T2NA_REACH = {
    "gate AGGREGATE": 100, "hold: the head round": 42, "hold: an older round": 33,
    "hold: a newer round starts": 10, "hold: a newer round starts (none pending)": 8,
    "hold: held": 7, "stale round": 22,
    **{f"decide {i}": n for i, n in enumerate((1, 2, 21, 16, 8, 1, 10, 5, 3, 1, 3))},
    "egress hold drop": 52, "egress to harvest": 19,
}


def _tests(fixtures=FIXTURES) -> list[dict]:
    return [t for path in fixtures for t in json.loads(path.read_text())["tests"]]


def _divergence(t: dict, t2na: bool = False) -> str:
    """One fixture's class (DIVERGENCE), or a description of a new difference."""
    why = _replayed(t, t2na)
    if why is None:
        return "same"
    if (t["expect"] is None
            and _configured(t, t2na).run(t["port"], bytes.fromhex(t["frame"])).port == 511):
        return "drop511"
    return f"{t['name']}: {why}"


def _classes(fixtures, t2na: bool = False) -> dict[str, int]:
    found: dict[str, int] = {}
    for t in _tests(fixtures):
        kind = _divergence(t, t2na)
        found[kind] = found.get(kind, 0) + 1
    return found


def _reach(fixtures, t2na: bool = False) -> dict[str, int]:
    reach: dict[str, int] = {}
    for t in _tests(fixtures):
        pipe = _configured(t, t2na)
        pipe.run(t["port"], bytes.fromhex(t["frame"]))
        for label in pipe.path:
            reach[label] = reach.get(label, 0) + 1
    return reach


def test_p4testgen_fixtures_replay():
    """Every committed P4Testgen test (tofino/testgen/*.json), one pass of tests/tna_pass.py
    each: the same frame out or nothing, or P4Testgen's port-511 drop, counted."""
    assert _classes(FIXTURES) == DIVERGENCE


def test_p4testgen_fixtures_reach_the_aggregator():
    """The fixtures' branches in tests/tna_pass.py, counted (REACH): all twelve entries of
    decide, stale rounds and epochs, both recirculation passes of a reply, the refusals."""
    assert _reach(FIXTURES) == REACH
    assert len(DECIDE) == 12


def test_t2na_fixtures_replay():
    """Every committed P4Testgen test of the Tofino 2 profile (tofino/testgen/t2na/*.json:
    its tofino2 target on t2na_flat.p4), one pass of tests/tna_pass.py's Tofino 2 pipe each:
    the same frame out or nothing (T2NA_DIVERGENCE)."""
    assert T2NA_FIXTURES
    assert _classes(T2NA_FIXTURES, t2na=True) == T2NA_DIVERGENCE


def test_t2na_fixtures_reach_the_hold():
    """The Tofino 2 fixtures' branches in tests/tna_pass.py, counted (T2NA_REACH): every
    branch of the hold's RegisterAction, with the head_round cells P4Testgen assumed."""
    assert _reach(T2NA_FIXTURES, t2na=True) == T2NA_REACH


def _configured(t: dict, t2na: bool = False) -> TnaPipe:
    """A pipe with the fixture's table entries, default actions and register cells; `t2na`:
    the Tofino 2 profile's pipe (its recirculation port, the hold)."""
    pipe = TnaPipe(recirc=T2NA_RECIRC_PORT, hold=True) if t2na else TnaPipe()
    m = pipe.model
    for e in t["entries"]:
        k, p, table, action = e["keys"], e["params"], e["table"], e["action"]
        if t2na and table == "leaf_upstream":
            # t2na_flat.p4 assumes no role (job_level misses); a slot's spine would change
            # only a spine's RESULT or STATUS at its leaf, which the replay does not model: a
            # fixture where it does shows as a difference (T2NA_DIVERGENCE)
            continue
        if table == "ina_endpoint":
            pipe.ina_endpoint.add(k["dst_addr"])
        elif table == "admission" and action == "admit":
            src_ip = socket.inet_ntoa(k["src_addr"].to_bytes(4, "big"))
            m.admission[(k["ingress_port"], (src_ip, k["src_port"]), k["job"], k["rank"])] = p
        elif table == "admission":  # reject: as no entry
            continue
        elif table == "l2":
            pipe.l2[k["dst_mac"]] = p["port"]
        elif table == "ipv4_routes":
            pipe.ipv4_routes.append((*k["dst_addr"], action, p))
        elif table == "worker_rewrite":
            pipe.worker_rewrite[k["rid"]] = (p["dst_mac"], p["dst_addr"], p["dst_port"])
        elif table == "congestion":
            m.congestion[k["job"]] = (p["qdepth"], p["bound"])
        else:
            raise AssertionError(f"{t['name']}: an entry of table {table} the replay cannot set")
    for d in t["defaults"]:
        assert d["table"] == "ipv4_routes", d
        pipe.ipv4_default = (d["action"], d["params"])
    for r in t["registers"]:
        m.reg[r["name"]][r["index"]] = tuple(r["value"]) if isinstance(r["value"], list) \
            else r["value"]
    return pipe


def _replayed(t: dict, t2na: bool = False) -> str | None:
    """Why the pass's output differs from the fixture's expectation, or None."""
    out = _configured(t, t2na).run(t["port"], bytes.fromhex(t["frame"]))
    want = t["expect"]
    if want is None:
        return None if out.port is None else f"expected nothing, got port {out.port}"
    if out.port != want["port"]:
        return f"expected port {want['port']}, got {out.port}"
    exp, care = bytes.fromhex(want["frame"]), bytes.fromhex(want["care"])
    if len(out.frame) != len(exp):
        return f"expected {len(exp)} bytes, got {len(out.frame)}"
    bad = [i for i, (a, b, c) in enumerate(zip(out.frame, exp, care)) if (a ^ b) & c]
    return f"bytes differ at {bad[:8]}" if bad else None


# A PTF test class in the shape P4Testgen's Tofino target writes (its test_backend/ptf.cpp
# template), made by hand to pin the converter and the replay: a contribution of rank 0 of a
# two-worker job, held (nothing leaves), and a forwarded frame routed out of port 9. Test0's
# head_round cell (the Tofino 2 profile's hold: round 2 head, rank 1 pending) is written with
# its members in the other order than head_t's.
_PTF = '''
class Test0(AbstractTest):
    # Current statement coverage: 0.25
    \'\'\'
    [P4Testgen MethodCall]: *.StartIngress(); (its trace: the converter skips it)
    \'\'\'
    def setupCtrlPlane(self):
        self.setRegisterValue('pipe.SpinaIngress.aggregator_ctl.slot_round', 0x00000002, 0x0003)
        self.setRegisterValue('pipe.SpinaIngress.aggregator_ctl.slot_values_l0_p20',
                              [('slot_values_l0_p20.lo', 0x5), ('slot_values_l0_p20.hi', 0x6)], 3)
        self.setRegisterValue('pipe.SpinaIngress.aggregator_ctl.head_round',
                              [('head_round.pending', 0xfffffffe), ('head_round.round', 0x2)], 1)
        # Table SpinaIngress.ina_endpoint_ctl.ina_endpoint
        self.insertTableEntry(
            'pipe.SpinaIngress.ina_endpoint_ctl.ina_endpoint',
            [gc.KeyTuple('dst_addr', 0x0a000064)], 'SpinaIngress.ina_endpoint_ctl.accept_ina', [])
        self.insertTableEntry(
            'pipe.SpinaIngress.admission_ctl.admission',
            [gc.KeyTuple('ingress_port', 0x003), gc.KeyTuple('src_addr', 0x0a000001),
             gc.KeyTuple('src_port', 0x1388), gc.KeyTuple('job', 0x0007),
             gc.KeyTuple('rank', 0x00)],
            'SpinaIngress.admission_ctl.admit',
            [gc.DataTuple('epoch', 0x0001), gc.DataTuple('slot_base', 0x0000),
             gc.DataTuple('nslots', 0x0004), gc.DataTuple('nworkers', 0x02),
             gc.DataTuple('block_size', 0x0040), gc.DataTuple('nlanes', 0x01),
             gc.DataTuple('mcast_grp', 0x0003)])

    def sendPacket(self):
        ig_port = 3
        pkt = b'%s'
        send_packet(self, ig_port, pkt)

    def verifyPackets(self):
        pass


class Test1(AbstractTest):
    # Current statement coverage: 0.3
    def setupCtrlPlane(self):
        self.insertTableEntry(
            'pipe.SpinaIngress.forwarding_ctl.ipv4_routes',
            [gc.KeyTuple('dst_addr', 0x0a000000, prefix_len=8)],
            'SpinaIngress.forwarding_ctl.route',
            [gc.DataTuple('port', 0x009), gc.DataTuple('src_mac', 0x1),
             gc.DataTuple('dst_mac', 0x2)])

    def sendPacket(self):
        ig_port = 4
        pkt = b'%s'
        send_packet(self, ig_port, pkt)

    def verifyPackets(self):
        eg_port = 9
        exp_pkt = b'%s'
        exp_pkt = Mask(exp_pkt)
        exp_pkt.set_do_not_care(192, 16)
        verify_packet(self, exp_pkt, eg_port)
'''


def _hex_escaped(data: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in data)


def test_a_ptf_file_becomes_fixtures_that_replay(tmp_path):
    """scripts/testgen_fixtures.py reads P4Testgen's PTF shape (entries, struct register cells
    in their struct's order, masks) into fixtures, and the replay sets the tables and cells
    they name: the held contribution leaves nothing (and its pair cell took the packet's
    elements 40 and 41 onto [5, 6]), the routed frame leaves port 9 with its TTL less one. On
    the Tofino 2 profile's pipe the contribution (round 3) is held by the hold instead (rank 1
    not heard at round 2): job_held, no slot register touched."""
    from scripts.testgen_fixtures import _without_traces, main
    quotes = "    " + "'" * 3 + "\n"
    assert list(_without_traces(["a\n", quotes, "trace\n", quotes, "b\n"])) == ["a\n", "b\n"]
    data = np.arange(64, dtype=np.int32).reshape(1, 64)
    pkt = wire.pack(wire.Header(msg_type=wire.MSG_CONTRIB, job=7, epoch=1, slot=1, rank=0,
                                nlanes=1, round=3, length=5, block_size=64, present=1), [9], data)
    held = frame(0, pkt, 8 + len(pkt))
    routed = frame(1, b"x" * 30, 38)
    expected = bytearray(routed)
    expected[:12] = (2).to_bytes(6, "big") + (1).to_bytes(6, "big")
    expected[22] -= 1  # TTL; the checksum (bytes 24-25) is not compared
    ptf = tmp_path / "spina_tna.py"
    ptf.write_text(_PTF % (_hex_escaped(held), _hex_escaped(routed), _hex_escaped(expected)))
    cmd = tmp_path / "command"
    cmd.write_text("p4testgen 1.2.5.16\np4testgen --target tofino ...\n")
    out = tmp_path / "fixtures.json"
    with out.open("w") as f, contextlib.redirect_stdout(f):
        assert main([str(ptf), str(cmd)]) == 0
    doc = json.loads(out.read_text())
    assert doc["generator"] == ["p4testgen 1.2.5.16", "p4testgen --target tofino ..."]
    t0, t1 = doc["tests"]
    assert (t0["name"], t0["coverage"], t0["port"], t0["expect"]) == ("Test0", 0.25, 3, None)
    assert t0["registers"] == [{"name": "slot_round", "index": 3, "value": 2},
                               {"name": "slot_values_l0_p20", "index": 3, "value": [5, 6]},
                               {"name": "head_round", "index": 1, "value": [2, 0xFFFFFFFE]}]
    t0_tofino1 = dict(t0, registers=t0["registers"][:2])  # Tofino 1: no head_round
    assert [e["table"] for e in t0["entries"]] == ["ina_endpoint", "admission"]
    assert t0["entries"][1]["params"]["mcast_grp"] == 3
    assert t1["entries"][0]["keys"] == {"dst_addr": [0x0A000000, 8]}
    care = bytes.fromhex(t1["expect"]["care"])
    assert care[22:26] == b"\xff\xff\x00\x00" and t1["expect"]["port"] == 9
    assert [_replayed(t) for t in (t0_tofino1, t1)] == [None, None]
    unrouted = dict(t1, expect=dict(t1["expect"], frame=routed.hex()))  # MACs and TTL as sent
    assert _replayed(unrouted) == "bytes differ at [0, 1, 2, 3, 4, 6, 7, 8]"
    pipe = _configured(t0_tofino1)
    pipe.run(t0["port"], bytes.fromhex(t0["frame"]))
    assert pipe.model.reg["slot_values_l0_p20"][3] == (40, 41)  # a newer round: SET
    assert pipe.model.reg["slot_round"][3] == 3
    assert _replayed(t0, t2na=True) is None
    t2 = _configured(t0, t2na=True)
    t2.run(t0["port"], bytes.fromhex(t0["frame"]))
    assert t2.path == ["gate AGGREGATE", "hold: held"]
    assert t2.model.counters == {("job_received", 7): 1, ("job_held", 7): 1}
    assert t2.model.reg["head_round"][1] == (2, 0xFFFFFFFE)
    assert t2.model.reg["slot_round"][3] == 2 and t2.model.reg["slot_values_l0_p20"][3] == (5, 6)
