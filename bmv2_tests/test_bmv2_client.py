"""The entries every target gets, encoded by the controller's client (controller.p4rt) against
the committed p4c P4Info (p4src/build/), with no switch (always run).

Run just this file: python -m pytest bmv2_tests/test_bmv2_client.py
"""
from __future__ import annotations

import pathlib

import pytest

from controller.p4rt import P4InfoIndex
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


def test_unknown_names_are_refused(index):
    """A key or parameter the P4Info lacks is an error naming it, never silently dropped."""
    with pytest.raises(KeyError, match="has no key"):
        index.table_entry("l2", {"mac": "02:00:00:00:00:01"}, "bridge", {"port": 1})
    with pytest.raises(KeyError, match="needs parameter 'port'"):
        index.table_entry("l2", {"dst_mac": "02:00:00:00:00:01"}, "bridge", {})
