"""The entries every target gets, encoded by the controller's client (controller.p4rt) against
the committed p4c P4Info (p4src/build/), with no switch (always run).

Run just this file: python -m pytest bmv2_tests/test_bmv2_client.py
"""
from __future__ import annotations

import pathlib

import pytest

from controller.p4rt import P4InfoError, P4InfoIndex
from spina.config import ConfigError
from spina.p4runtime import encode

P4INFO = pathlib.Path(__file__).resolve().parents[1] / "p4src" / "build" / \
    "spina_v1model.p4info.txtpb"


@pytest.fixture(scope="module")
def index() -> P4InfoIndex:
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    return P4InfoIndex(text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info()))


def test_encode_is_canonical():
    """Values are minimal big-endian bytestrings (P4Runtime 1.4 canonical form)."""
    assert encode(0, 16) == b"\x00"
    assert encode(47000, 16) == b"\xb7\x98"
    assert encode("10.0.0.1", 32) == b"\x0a\x00\x00\x01"
    assert encode("02:00:00:00:00:64", 48) == b"\x02\x00\x00\x00\x00\x64"
    with pytest.raises(ValueError, match="does not fit in 9 bits"):
        encode(512, 9)


def test_admission_entry_fields(index):
    """An admission entry carries p4c's ids: each key by its P4Info field id (looked up by
    name, not by position) and each admit parameter by its parameter id."""
    e = index.table_entry("admission", {"rank": 0, "job": 7, "src_port": 50000,
                                        "src_addr": "10.0.0.1", "ingress_port": 1}, "admit",
                          {"epoch": 1, "slot_base": 0, "nslots": 4, "nworkers": 2,
                           "block_size": 32, "nlanes": 4, "mcast_grp": 1})
    t = index.get("tables", "admission")
    fid = {m.name: m.id for m in t.match_fields}
    assert e.table_id == t.preamble.id
    assert {m.field_id: m.exact.value for m in e.match} == {
        fid["ingress_port"]: b"\x01", fid["src_addr"]: b"\x0a\x00\x00\x01",
        fid["src_port"]: b"\xc3\x50", fid["job"]: b"\x07", fid["rank"]: b"\x00"}
    admit = index.get("actions", "admit")
    pid = {p.name: p.id for p in admit.params}
    assert e.action.action.action_id == admit.preamble.id
    assert {p.param_id: p.value for p in e.action.action.params} == {
        pid["epoch"]: b"\x01", pid["slot_base"]: b"\x00", pid["nslots"]: b"\x04",
        pid["nworkers"]: b"\x02", pid["block_size"]: b"\x20", pid["nlanes"]: b"\x04",
        pid["mcast_grp"]: b"\x01"}


def test_lpm_entry_fields(index):
    """An ipv4_routes entry carries the network address and prefix length."""
    e = index.table_entry("ipv4_routes", {"dst_addr": "10.1.7.0/16"}, "route",
                          {"port": 3, "src_mac": "02:00:00:00:00:fe", "dst_mac": 1})
    assert (e.match[0].lpm.value, e.match[0].lpm.prefix_len) == (b"\x0a\x01\x00\x00", 16)


def refusal(f) -> P4InfoError:
    with pytest.raises(P4InfoError) as e:
        f()
    return e.value


def test_unknown_names_are_refused(index):
    """A table, action, register or counter, a key or a parameter the P4Info lacks is one
    P4InfoError naming it and the names the P4Info has, never silently dropped."""
    e = refusal(lambda: index.get("tables", "admision"))
    assert (str(e), e.kind, e.name) == (
        "P4Info has no table named 'admision' (tables: admission, congestion, ina_endpoint, "
        "ipv4_routes, job_level, l2, leaf_upstream, spray_ports, worker_rewrite)",
        "tables", "admision")
    assert str(refusal(lambda: index.table_entry("l2", {"dst_mac": 1}, "brige", {}))) == (
        "P4Info has no action named 'brige' (actions: NoAction, accept_ina, admit, as_leaf, "
        "as_spine, bridge, drop, drop_replica, reject, rewrite_for_worker, route, "
        "set_congestion, spray, to_spine)")
    assert str(refusal(lambda: index.id("counters", "job_recieved"))) == (
        "P4Info has no counter named 'job_recieved' (counters: job_aggregated, "
        "job_congestion_drops, job_congestion_seen, job_duplicates, job_held, "
        "job_lane_mismatch, job_lane_saturated, job_received, job_results, job_stale, "
        "port_malformed, port_unadmitted)")
    # 145 registers: the closest names and how many there are
    e = refusal(lambda: index.id("registers", "slot_values_l9_e0"))
    assert str(e).startswith("P4Info has no register named 'slot_values_l9_e0' (registers: "
                             "slot_values_l") and str(e).endswith(", ... 145 in all)")
    assert str(refusal(lambda: index.table_entry(
        "l2", {"mac": "02:00:00:00:00:01"}, "bridge", {"port": 1}))) == (
        "table 'l2' has no key field 'mac' (its keys: dst_mac)")
    assert str(refusal(lambda: index.table_entry(
        "l2", {"dst_mac": "02:00:00:00:00:01"}, "bridge", {}))) == (
        "action 'bridge' needs parameter 'port' (its parameters: port)")
    assert str(refusal(lambda: index.table_entry(
        "l2", {"dst_mac": "02:00:00:00:00:01"}, "bridge", {"port": 1, "prot": 2}))) == (
        "action 'bridge' has no parameter 'prot' (its parameters: port)")
    assert str(refusal(lambda: index.name("tables", 12345))) == (
        "P4Info has no table with id 12345")


def test_values_too_wide_name_their_field(index):
    """A key or parameter value that does not fit its width is a P4InfoError naming the
    table's key or the action's parameter (and a config error: one line, exit 2)."""
    e = refusal(lambda: index.table_entry(
        "l2", {"dst_mac": "02:00:00:00:00:01"}, "bridge", {"port": 512}))
    assert (str(e), e.kind, e.name) == (
        "action 'bridge' parameter 'port': 512 does not fit in 9 bits", "actions", "bridge")
    assert isinstance(e, ConfigError)
    assert str(refusal(lambda: index.table_entry("admission", {"job": 1 << 16}))) == (
        "table 'admission' key 'job': 65536 does not fit in 16 bits")
    assert str(refusal(lambda: index.table_entry("ipv4_routes", {"dst_addr": "10.0.0.0/33"}))) \
        == "table 'ipv4_routes' key 'dst_addr': '33' is not a valid netmask"
