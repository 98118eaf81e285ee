"""P4Runtime values and errors: the one encoding and the one error type the controller's client
(controller/p4rt.py), the software switch's P4Runtime server (softswitch/p4runtime_server.py)
and the conformance tests share.

P4Runtime spec v1.4, section 8.4 "Bytestrings": a value of a bit<W> field travels as a
big-endian bytestring, canonically the shortest one (no leading zero bytes, at least one byte).
Servers may answer reads with full-width values (older PI/BMv2), so entries are compared in
canonical form (`canonical_entry`) and identified by their match fields (`match_key`).
"""
from __future__ import annotations

import ipaddress


class P4RuntimeError(RuntimeError):
    """A P4Runtime call that failed, or a request a server refuses; `code` is its gRPC status
    (a grpc.StatusCode: the client's from the server's answer, the server's to answer with;
    None when no call was answered, e.g. no server listening)."""

    def __init__(self, msg: str, code=None):
        super().__init__(msg)
        self.code = code


def encode(value, width: int) -> bytes:
    """A value as a canonical bytestring of a bit<`width`> field.

    Accepts ints, 'a.b.c.d' IPv4 addresses, 'aa:bb:cc:dd:ee:ff' MAC addresses and bytes.
    Raises ValueError if the value is negative or does not fit in `width` bits.
    """
    if isinstance(value, (bytes, bytearray)):
        value = int.from_bytes(value, "big")
    elif isinstance(value, str):
        if ":" in value:
            value = int(value.replace(":", ""), 16)
        elif "." in value:
            value = int(ipaddress.IPv4Address(value))
        else:
            value = int(value, 0)
    value = int(value)
    if value < 0 or value >> width:
        raise ValueError(f"{value} does not fit in {width} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode(b: bytes) -> int:
    """A bytestring (canonical or full-width) as an unsigned int; empty is 0."""
    return int.from_bytes(b, "big") if b else 0


def canonical(b: bytes) -> bytes:
    """The canonical form of a bytestring: leading zero bytes dropped, at least one byte."""
    return b.lstrip(b"\0") or b"\0"


def canonical_entry(entry):
    """A copy of a TableEntry with canonical match values and action parameters, without
    counter data: what the software switch answers reads with and what the controller compares."""
    e = type(entry)()
    e.CopyFrom(entry)
    for m in e.match:
        kind = m.WhichOneof("field_match_type")
        if kind == "exact":
            m.exact.value = canonical(m.exact.value)
        elif kind == "lpm":
            m.lpm.value = canonical(m.lpm.value)
    if e.action.WhichOneof("type") == "action":
        for prm in e.action.action.params:
            prm.value = canonical(prm.value)
    e.ClearField("counter_data")
    return e


def match_key(entry) -> bytes:
    """An entry's identity in its table: its table id and canonical match fields, in field-id
    order (the order a client lists them in does not matter)."""
    e = canonical_entry(entry)
    return entry.table_id.to_bytes(4, "big") + b"".join(
        m.SerializeToString() for m in sorted(e.match, key=lambda m: m.field_id))
