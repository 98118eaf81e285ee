"""Unit tests of the BMv2 target's P4Runtime encoding, with no switch (always run).

Run just this file: python -m pytest bmv2_tests/test_bmv2_client.py
"""
from __future__ import annotations

from bmv2_tests.bmv2 import Bmv2Target, _encode
from spina import spec


def _offline_target():
    from p4.v1 import p4runtime_pb2
    t = Bmv2Target.__new__(Bmv2Target)  # no switch: only the encoding helpers are used
    t.pb, t.p4info = p4runtime_pb2, spec.p4info()
    return t


def test_encode_is_canonical():
    """Values are minimal big-endian bytestrings (P4Runtime 1.4 canonical form)."""
    assert _encode(0, 16) == b"\x00"
    assert _encode(47000, 16) == b"\xb7\x98"
    assert _encode("10.0.0.1", 32) == b"\x0a\x00\x00\x01"
    assert _encode("02:00:00:00:00:64", 48) == b"\x02\x00\x00\x00\x00\x64"


def test_admission_entry_fields():
    """An admission entry names its table, five exact keys and the admit parameters."""
    t = _offline_target()
    e = t._table_entry("admission", {"ingress_port": 1, "src_addr": "10.0.0.1",
                                     "src_port": 50000, "job": 7, "rank": 0}, "admit",
                       {"epoch": 1, "slot_base": 0, "nslots": 4, "nworkers": 2,
                        "block_size": 32, "nlanes": 4, "mcast_grp": 1})
    assert e.table_id == t._id("tables", "admission")
    assert [m.exact.value for m in e.match] == [b"\x01", b"\x0a\x00\x00\x01", b"\xc3\x50",
                                                 b"\x07", b"\x00"]
    assert e.action.action.action_id == t._id("actions", "admit")
    assert [p.value for p in e.action.action.params] == [b"\x01", b"\x00", b"\x04", b"\x02",
                                                          b"\x20", b"\x04", b"\x01"]


def test_lpm_entry_fields():
    """An ipv4_routes entry carries the network address and prefix length."""
    t = _offline_target()
    e = t._table_entry("ipv4_routes", {"dst_addr": "10.1.0.0/16"}, "route",
                       {"port": 3, "src_mac": "02:00:00:00:00:fe", "dst_mac": 1})
    assert e.match[0].lpm.value == b"\x0a\x01\x00\x00"
    assert e.match[0].lpm.prefix_len == 16
