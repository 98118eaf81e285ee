"""The SpINA wire format: the one place that defines the INA header.

An INA packet is a UDP payload (default port 47000, configurable per deployment):

    0               1               2               3
    0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7
   +---------------+---------------+---------------+---------------+
 0 |    version    |   msg_type    |     flags     |   priority    |
   +---------------+---------------+---------------+---------------+
 4 |              job              |             epoch             |
   +---------------+---------------+---------------+---------------+
 8 |                              call                             |
   +---------------+---------------+---------------+---------------+
12 |             slot              |     rank      |    nlanes     |
   +---------------+---------------+---------------+---------------+
16 |                    round (low bit = shadow copy)              |
   +---------------+---------------+---------------+---------------+
20 |                  length (tensor elements)                     |
   +---------------+---------------+---------------+---------------+
24 |       block_size (elements)   |     exponent (signed)         |
   +---------------+---------------+---------------+---------------+
28 |                  bitmap (contributing ranks)                  |
   +---------------+---------------+---------------+---------------+
32 |                  present (one bit per lane)  ...              |
   +                                                               +
36 |                                                               |
   +---------------+---------------+---------------+---------------+
40 |                  nonfinite (one bit per lane) ...             |
   +                                                               +
44 |                                                               |
   +---------------+---------------+---------------+---------------+
48 |  next[0] ... next[nlanes-1]: u32 block positions              |
   +---------------+---------------+---------------+---------------+
   |  data: block_size values per lane whose present bit is set,    |
   |  lanes in ascending order: int32, or int16 / int8 (flags 0x40 /  |
   |  0x80: narrow lanes, docs/bits.md)                             |
   +---------------------------------------------------------------+

Every field is big-endian (network order), as a P4 parser sees it. Lane i is bit i of
`present`/`nonfinite` (bit 0 = least significant). docs/protocol.md explains each field.

Two encoders live here and must agree byte for byte (tests/test_wire.py checks it):
`pack`/`unpack` and the batch forms (numpy, used on the data path), and the scapy layer
`INA` (for tests, pcaps and debugging; built lazily so the data path never imports scapy).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

import numpy as np

VERSION = 1
DEFAULT_UDP_PORT = 47000

# Message types.
MSG_CONTRIB = 1  # a worker's contribution to one round of one slot; its bitmap: 0 (all-reduce)
                 # or the ranks owning the round's blocks (reduce-scatter: the switch strips
                 # the data of the others' copies; docs/protocol.md "Reduce-scatter")
MSG_RESULT = 2   # the switch's aggregate for that round (multicast, or unicast to a resend)
MSG_STATUS = 3   # the switch's answer to a resend for a round that is still incomplete
MSG_GATHER = 4   # all-gather: a chunk of the sender's shard (bitmap 0) or a request for chunks
                 # of the ranks in `bitmap`; the switch replicates it unchanged to every other
                 # worker of the job and keeps no state (docs/protocol.md "All-gather")

MSG_NAMES = {MSG_CONTRIB: "contrib", MSG_RESULT: "result", MSG_STATUS: "status",
             MSG_GATHER: "gather"}

# Flag bits.
FLAG_RESEND = 0x01         # a retransmission by the worker (timeout)
FLAG_LOSS_TOLERANT = 0x02  # may be dropped under congestion (DLCP)
FLAG_LAST = 0x04           # worker: none of its lanes in this slot has a further non-zero block;
                           # result: set when every contributor set it (the slot's stream is done)
FLAG_PARTIAL = 0x08        # worker resend: flush request (bounded-loss mode, complete the round
                           # without the missing workers); result: completed without every worker
FLAG_MISMATCH = 0x10       # result: workers disagreed on the tensor length
FLAG_REPLAY = 0x20         # leaf to spine: the round's result the leaf stored, sent back up to a
                           # spine that lost it (a restart); the spine takes it as the round's
                           # result

FLAG_NAMES = {FLAG_RESEND: "resend", FLAG_LOSS_TOLERANT: "loss_tolerant", FLAG_LAST: "last",
              FLAG_PARTIAL: "partial", FLAG_MISMATCH: "mismatch", FLAG_REPLAY: "replay"}
# The width of the data rows (docs/bits.md, narrow lanes): none set, int32; one, int16 or int8,
# in a contribution and in the result that answers it. Both set is malformed. Apart from
# FLAG_NAMES because the P4 programs' define.p4 does not have them yet.
FLAG_LANES16 = 0x40
FLAG_LANES8 = 0x80
FLAGS_LANE_WIDTH = FLAG_LANES16 | FLAG_LANES8  # the width's bits (the parser's: one owner)
LANE_FLAG_NAMES = {FLAG_LANES16: "lanes16", FLAG_LANES8: "lanes8"}
LANE_BITS = (32, 16, 8)  # the widths a job's `lane_bits` may take
LANE_FLAGS = {32: 0, 16: FLAG_LANES16, 8: FLAG_LANES8}  # lane_bits -> its flag

END = 0xFFFFFFFF     # `next` sentinel: no further non-zero block in this lane
MAX_LANES = 64       # present/nonfinite are 64-bit lane bitmaps
MAX_WORKERS = 32     # bitmap is a 32-bit rank bitmap
EXPONENT_NONE = -32768  # exponent sent by a worker whose lanes hold no finite non-zero value

# (name, struct code, bit width) in wire order. The P4 header `ina_h` in
# p4src/shared/header.p4 must list the same fields with the same widths.
HEADER_FIELDS = (
    ("version", "B", 8),
    ("msg_type", "B", 8),
    ("flags", "B", 8),
    ("priority", "B", 8),
    ("job", "H", 16),
    ("epoch", "H", 16),
    ("call", "I", 32),
    ("slot", "H", 16),
    ("rank", "B", 8),
    ("nlanes", "B", 8),
    ("round", "I", 32),
    ("length", "I", 32),
    ("block_size", "H", 16),
    ("exponent", "h", 16),
    ("bitmap", "I", 32),
    ("present", "Q", 64),
    ("nonfinite", "Q", 64),
)
FIELD_NAMES = tuple(f[0] for f in HEADER_FIELDS)
_STRUCT = struct.Struct(">" + "".join(f[1] for f in HEADER_FIELDS))
HEADER_STRUCT = _STRUCT  # for the data path: unpack_from -> a plain tuple in FIELD_NAMES order
FIELD_INDEX = {name: i for i, name in enumerate(FIELD_NAMES)}  # position in that tuple
FIELD_OFFSET = {name: struct.calcsize(">" + "".join(f[1] for f in HEADER_FIELDS[:i]))
                for i, name in enumerate(FIELD_NAMES)}  # byte offset in the header
HEADER_LEN = _STRUCT.size
assert HEADER_LEN == 48

# The same header as a numpy record, for batches of packets.
HEADER_DTYPE = np.dtype([(name, ">" + np.dtype(code.replace("Q", "u8").replace("I", "u4")
                                               .replace("H", "u2").replace("h", "i2")
                                               .replace("B", "u1")).str[1:])
                         for name, code, _ in HEADER_FIELDS])
assert HEADER_DTYPE.itemsize == HEADER_LEN

NEXT_DTYPE = np.dtype(">u4")
DATA_DTYPE = np.dtype(">i4")

# Largest UDP payload over IPv4; the software switch's fusion is bounded by it.
MAX_UDP_PAYLOAD = 65507


class MalformedPacket(ValueError):
    """A packet that does not parse as an INA packet."""


def popcount64(x: int) -> int:
    return bin(x).count("1")


_ROW_ITEM = {0: 4, FLAG_LANES16: 2, FLAG_LANES8: 1}  # width flags -> bytes per value
_ROW_DTYPE = {0: DATA_DTYPE, FLAG_LANES16: np.dtype(">i2"), FLAG_LANES8: np.dtype("i1")}


def lane_item_bytes(flags: int) -> int:
    """Bytes per data value of a packet with header `flags`: 4, or 2 / 1 for narrow lanes;
    0 when both width flags are set (no width: malformed). Every packer and parser sizes
    rows with this (row_bytes, packet_len, data_dtype)."""
    return _ROW_ITEM.get(flags & FLAGS_LANE_WIDTH, 0)


def data_dtype(flags: int) -> np.dtype:
    """The big-endian dtype of the data values of a packet with header `flags`."""
    return _ROW_DTYPE[flags & FLAGS_LANE_WIDTH]


def row_bytes(block_size: int, flags: int = 0) -> int:
    """Bytes of one lane's data row (block_size values of the width `flags` names)."""
    return block_size * lane_item_bytes(flags)


def packet_len(nlanes: int, block_size: int, npresent: int, flags: int = 0) -> int:
    return HEADER_LEN + 4 * nlanes + row_bytes(block_size, flags) * npresent


def data_offset(nlanes: int) -> int:
    """Byte offset of the first data row: after the header and the per-lane next positions."""
    return HEADER_LEN + 4 * nlanes


def max_lanes_for(block_size: int, limit: int = MAX_UDP_PAYLOAD, flags: int = 0) -> int:
    """Most lanes whose all-present packet (values of the width `flags` names) still fits in
    `limit` bytes."""
    return max(0, min(MAX_LANES, (limit - HEADER_LEN) // (4 + row_bytes(block_size, flags))))


@dataclass
class Header:
    """The fixed part of an INA header (field meanings: docs/protocol.md)."""
    version: int = VERSION
    msg_type: int = MSG_CONTRIB
    flags: int = 0
    priority: int = 0
    job: int = 0
    epoch: int = 0
    call: int = 0
    slot: int = 0
    rank: int = 0
    nlanes: int = 1
    round: int = 0
    length: int = 0
    block_size: int = 256
    exponent: int = 0
    bitmap: int = 0
    present: int = 0
    nonfinite: int = 0

    def copy(self, **changes) -> "Header":
        return replace(self, **changes)


@dataclass
class Packet:
    """A parsed INA packet: header, per-lane `next` positions and the present lanes' data."""
    header: Header
    next: np.ndarray = field(default_factory=lambda: np.zeros(0, NEXT_DTYPE))
    data: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), DATA_DTYPE))


def pack_header(h: Header) -> bytes:
    return _STRUCT.pack(*(getattr(h, n) for n in FIELD_NAMES))


def unpack_header(buf, offset: int = 0) -> Header:
    if len(buf) - offset < HEADER_LEN:
        raise MalformedPacket(f"truncated header: {len(buf) - offset} < {HEADER_LEN} bytes")
    return Header(*_STRUCT.unpack_from(buf, offset))


def pack(h: Header, next_pos, data=None) -> bytes:
    """Encode one packet. `next_pos` has nlanes entries; `data` is (npresent, block_size)
    integers of the width h.flags names (int32; int16 / int8 for narrow lanes)."""
    parts = [pack_header(h), np.asarray(next_pos, dtype=NEXT_DTYPE).tobytes()]
    if data is not None and len(data):
        parts.append(np.asarray(data).astype(data_dtype(h.flags)).tobytes())
    return b"".join(parts)


def check_header(h: Header, size: int) -> None:
    """Raise MalformedPacket unless `h` is a well-formed header of a packet of `size` bytes."""
    err = header_error(tuple(getattr(h, n) for n in FIELD_NAMES), size)
    if err is not None:
        raise MalformedPacket(err)


def header_error(t: tuple, size: int) -> str | None:
    """Why header fields `t` (HEADER_STRUCT.unpack_from order) are not a well-formed header of
    a packet of `size` bytes, or None if they are. The data path's form of check_header: no
    Header object, no exception on the good path."""
    (version, msg_type, flags, _, _, _, _, _, rank, nlanes, _, _, block_size, _, _, present,
     nonfinite) = t
    if version != VERSION:
        return f"version {version} != {VERSION}"
    if msg_type not in MSG_NAMES:
        return f"unknown msg_type {msg_type}"
    if not 1 <= nlanes <= MAX_LANES:
        return f"nlanes {nlanes} outside 1..{MAX_LANES}"
    if block_size == 0:
        return "block_size 0"
    if rank >= MAX_WORKERS:
        return f"rank {rank} >= {MAX_WORKERS}"
    if present >> nlanes or nonfinite >> nlanes:
        return "present/nonfinite bits beyond nlanes"
    if not lane_item_bytes(flags):
        return "flags name two lane widths (lanes16 and lanes8)"
    npresent = present.bit_count()
    if size != packet_len(nlanes, block_size, npresent, flags):
        return (f"length {size} != {packet_len(nlanes, block_size, npresent, flags)} for "
                f"{nlanes} lanes, {npresent} present blocks of {block_size}"
                f" x {lane_item_bytes(flags)} bytes")
    return None


def unpack(buf) -> Packet:
    """Decode and validate one packet (raises MalformedPacket)."""
    h = unpack_header(buf)
    check_header(h, len(buf))
    nxt = np.frombuffer(buf, NEXT_DTYPE, h.nlanes, HEADER_LEN)
    npresent = popcount64(h.present)
    data = np.frombuffer(buf, data_dtype(h.flags), npresent * h.block_size,
                         HEADER_LEN + 4 * h.nlanes).reshape(npresent, h.block_size)
    return Packet(h, nxt, data)


# ---------------------------------------------------------------------------------------
# Batch forms: many packets of one job (same nlanes and block_size) at once.

_LANE_CACHE: dict[tuple[int, int], np.ndarray] = {}


def lane_indices(bits: int, nlanes: int) -> np.ndarray:
    """The lanes whose bit is set in a `present`/`nonfinite` bitmap, ascending (cached: a job's
    bitmaps repeat a lot, and both data paths ask once per packet)."""
    key = (bits, nlanes)
    got = _LANE_CACHE.get(key)
    if got is None:
        got = np.flatnonzero([(bits >> i) & 1 for i in range(nlanes)])
        if len(_LANE_CACHE) < 4096:
            _LANE_CACHE[key] = got
    return got


def lane_bits_to_mask(bits: np.ndarray, nlanes: int) -> np.ndarray:
    """(n,) uint64 lane bitmaps -> (n, nlanes) bool."""
    shifts = np.arange(nlanes, dtype=np.uint64)
    return ((np.asarray(bits, dtype=np.uint64)[:, None] >> shifts) & np.uint64(1)).astype(bool)


def mask_to_lane_bits(mask: np.ndarray) -> np.ndarray:
    """(n, nlanes) bool -> (n,) uint64 lane bitmaps."""
    weights = np.left_shift(np.uint64(1), np.arange(mask.shape[1], dtype=np.uint64))
    return (mask.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)


def pack_batch(headers: np.ndarray, next_pos: np.ndarray, data: np.ndarray) -> list[bytes]:
    """Encode n packets at once.

    headers: (n,) HEADER_DTYPE records (present bits must match `data`);
    next_pos: (n, nlanes) positions; data: (sum of present lanes, block_size) integer rows,
    packet by packet, lanes in ascending order, of the width the first header's flags name
    (one width per batch, as one job's lane count).
    """
    n = len(headers)
    if n == 0:
        return []
    nlanes = int(headers["nlanes"][0])
    bs = int(headers["block_size"][0])
    flags = int(headers["flags"][0])
    row = row_bytes(bs, flags)
    npresent = lane_bits_to_mask(headers["present"], nlanes).sum(axis=1)
    fixed = HEADER_LEN + 4 * nlanes
    sizes = fixed + row * npresent
    out = np.empty(int(sizes.sum()), np.uint8)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    # Header+next for all packets in one vectorised copy into a (n, fixed) view.
    front = np.empty((n, fixed), np.uint8)
    front[:, :HEADER_LEN] = np.asarray(headers, HEADER_DTYPE).view(np.uint8).reshape(n, HEADER_LEN)
    front[:, HEADER_LEN:] = np.ascontiguousarray(next_pos, NEXT_DTYPE).view(np.uint8).reshape(n, -1)
    idx = starts[:, None] + np.arange(fixed)
    out[idx.ravel()] = front.ravel()
    if len(data):
        body = np.ascontiguousarray(np.asarray(data).astype(data_dtype(flags))).view(np.uint8)
        body = body.ravel()
        # Each data row goes to its packet's body, after the rows of earlier lanes.
        pkt_of_row = np.repeat(np.arange(n), npresent)
        first_row = np.cumsum(npresent) - npresent  # of each packet
        row_in_pkt = np.arange(len(pkt_of_row)) - np.repeat(first_row, npresent)
        row_start = starts[pkt_of_row] + fixed + row_in_pkt * row
        out[(row_start[:, None] + np.arange(row)).ravel()] = body
    mv = out.tobytes()
    return [mv[s:s + z] for s, z in zip(starts.tolist(), sizes.tolist())]


def unpack_batch(bufs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode n packets of one job: (headers, next (n, nlanes), data rows) as pack_batch takes.

    Raises MalformedPacket if any packet is malformed or the batch mixes lane/block sizes or
    lane widths. The rows come back as int32 whatever their width on the wire.
    """
    n = len(bufs)
    if n == 0:
        return np.zeros(0, HEADER_DTYPE), np.zeros((0, 0), np.uint32), np.zeros((0, 0), np.int32)
    for b in bufs:
        check_header(unpack_header(b), len(b))
    heads = np.frombuffer(b"".join(bytes(b[:HEADER_LEN]) for b in bufs), HEADER_DTYPE)
    nlanes, bs = int(heads["nlanes"][0]), int(heads["block_size"][0])
    width = heads["flags"] & FLAGS_LANE_WIDTH
    if (heads["nlanes"] != nlanes).any() or (heads["block_size"] != bs).any() \
            or (width != width[0]).any():
        raise MalformedPacket("batch mixes lane counts, block sizes or lane widths")
    fixed = HEADER_LEN + 4 * nlanes
    nxt = np.frombuffer(b"".join(bytes(b[HEADER_LEN:fixed]) for b in bufs), NEXT_DTYPE)
    data = np.frombuffer(b"".join(bytes(b[fixed:]) for b in bufs), data_dtype(int(width[0])))
    return heads.copy(), nxt.reshape(n, nlanes).astype(np.uint32), \
        data.reshape(-1, bs).astype(np.int32)


def headers_array(n: int, **fields) -> np.ndarray:
    """n header records with version set and the given fields (scalars or arrays)."""
    h = np.zeros(n, HEADER_DTYPE)
    h["version"] = VERSION
    for k, v in fields.items():
        h[k] = v
    return h


# ---------------------------------------------------------------------------------------
# scapy layer, built on first use so that importing the data path does not import scapy.

_scapy_layer = None


def scapy_layer(udp_port: int = DEFAULT_UDP_PORT):
    """The scapy `INA` Packet class, bound to UDP `udp_port` (both directions)."""
    global _scapy_layer
    from scapy.fields import (
        ByteEnumField,
        ByteField,
        FieldListField,
        FlagsField,
        IntField,
        ShortField,
        SignedShortField,
        StrField,
        XIntField,
        XLongField,
    )
    from scapy.layers.inet import UDP
    from scapy.packet import Packet as ScapyPacket, bind_layers

    if _scapy_layer is None:
        flag_names = [{**FLAG_NAMES, **LANE_FLAG_NAMES}.get(1 << i, f"bit{i}") for i in range(8)]

        class INA(ScapyPacket):
            name = "SpINA"
            fields_desc = [
                ByteField("version", VERSION),
                ByteEnumField("msg_type", MSG_CONTRIB, MSG_NAMES),
                FlagsField("flags", 0, 8, flag_names),
                ByteField("priority", 0),
                ShortField("job", 0),
                ShortField("epoch", 0),
                IntField("call", 0),
                ShortField("slot", 0),
                ByteField("rank", 0),
                ByteField("nlanes", 1),
                IntField("round", 0),
                IntField("length", 0),
                ShortField("block_size", 256),
                SignedShortField("exponent", 0),
                XIntField("bitmap", 0),
                XLongField("present", 0),
                XLongField("nonfinite", 0),
                FieldListField("next", [], XIntField("", END), count_from=lambda p: p.nlanes),
                StrField("data", b""),  # present lanes' blocks, big-endian, of flags' width
            ]

            def block_values(self) -> np.ndarray:
                return np.frombuffer(self.data, data_dtype(int(self.flags))).reshape(
                    -1, self.block_size)

        assert [f.name for f in INA.fields_desc[:len(FIELD_NAMES)]] == list(FIELD_NAMES)
        _scapy_layer = INA
    bind_layers(UDP, _scapy_layer, dport=udp_port)
    bind_layers(UDP, _scapy_layer, sport=udp_port)
    return _scapy_layer
