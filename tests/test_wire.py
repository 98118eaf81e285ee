"""The wire format: struct, numpy batch and scapy encoders agree byte for byte.

Run just this file: .venv/bin/python -m pytest tests/test_wire.py
"""
import numpy as np
import pytest

from spina import wire


def _example(rng, nlanes=5, bs=8):
    present_mask = rng.random(nlanes) < 0.5
    h = wire.Header(msg_type=wire.MSG_CONTRIB, flags=wire.FLAG_LAST | wire.FLAG_LOSS_TOLERANT,
                    priority=3, job=513, epoch=7, call=0xDEADBEEF, slot=300, rank=17,
                    nlanes=nlanes, round=0x80000001, length=123456789, block_size=bs,
                    exponent=-130, bitmap=0x80000001,
                    present=int(wire.mask_to_lane_bits(present_mask[None])[0]),
                    nonfinite=1 if present_mask[0] else 0)
    nxt = rng.integers(0, 2**32, nlanes, dtype=np.uint64).astype(np.uint32)
    nxt[-1] = wire.END
    data = rng.integers(-2**31, 2**31, (int(present_mask.sum()), bs),
                        dtype=np.int64).astype(np.int32)
    return h, nxt, data


def test_pack_unpack_roundtrip():
    """pack then unpack returns every header field, next position and data value."""
    h, nxt, data = _example(np.random.default_rng(1))
    p = wire.unpack(wire.pack(h, nxt, data))
    assert p.header == h
    assert (p.next == nxt).all() and (p.data == data).all()


def test_scapy_layer_gives_identical_bytes():
    """The scapy INA layer encodes exactly the bytes of the struct packer, and decodes them."""
    from scapy.layers.inet import IP, UDP
    INA = wire.scapy_layer()
    rng = np.random.default_rng(2)
    for _ in range(20):
        h, nxt, data = _example(rng, nlanes=int(rng.integers(1, 65)), bs=int(rng.integers(1, 40)))
        fields = {n: getattr(h, n) for n in wire.FIELD_NAMES}
        pkt = INA(**fields, next=[int(v) for v in nxt], data=data.astype(">i4").tobytes())
        assert bytes(pkt) == wire.pack(h, nxt, data)
        dec = IP(bytes(IP(dst="127.0.0.1") / UDP(sport=1234, dport=wire.DEFAULT_UDP_PORT) / pkt))
        assert dec[INA].next == [int(v) for v in nxt]
        assert (dec[INA].block_values() == data).all()
        assert dec[INA].exponent == h.exponent and dec[INA].call == h.call


def test_batch_packer_matches_single_packer():
    """pack_batch gives the same bytes as pack for each packet; unpack_batch inverts it."""
    rng = np.random.default_rng(3)
    k, bs, n = 7, 16, 50
    mask = rng.random((n, k)) < 0.4
    heads = wire.headers_array(n, msg_type=wire.MSG_RESULT, job=9, epoch=2,
                               call=rng.integers(0, 2**32, n), slot=np.arange(n), rank=3,
                               nlanes=k, round=np.arange(n) * 3,
                               length=1000, block_size=bs, exponent=rng.integers(-200, 200, n),
                               bitmap=0xF, present=wire.mask_to_lane_bits(mask))
    nxt = rng.integers(0, 2**32, (n, k), dtype=np.uint64).astype(np.uint32)
    data = rng.integers(-2**31, 2**31, (int(mask.sum()), bs), dtype=np.int64).astype(np.int32)
    pkts = wire.pack_batch(heads, nxt, data)
    row = 0
    for i, p in enumerate(pkts):
        m = int(mask[i].sum())
        h = wire.unpack_header(p)
        assert p == wire.pack(h, nxt[i], data[row:row + m])
        row += m
    h2, n2, d2 = wire.unpack_batch(pkts)
    assert (h2 == heads).all() and (n2 == nxt).all() and (d2 == data).all()


def test_lane_mask_roundtrip():
    """Lane bitmaps convert to boolean masks and back, bit i = lane i, all 64 lanes."""
    rng = np.random.default_rng(4)
    mask = rng.random((10, 64)) < 0.5
    bits = wire.mask_to_lane_bits(mask)
    assert (wire.lane_bits_to_mask(bits, 64) == mask).all()
    assert int(wire.mask_to_lane_bits(np.eye(64, dtype=bool)[63:64])[0]) == 1 << 63


@pytest.mark.parametrize("mutate, why", [
    (lambda b: b[:20], "truncated header"),
    (lambda b: bytes([2]) + b[1:], "version"),
    (lambda b: b[:1] + bytes([9]) + b[2:], "msg_type"),
    (lambda b: b[:-4], "length"),
    (lambda b: b + b"\0\0\0\0", "length"),
    (lambda b: b[:15] + bytes([0]) + b[16:], "nlanes"),
    (lambda b: b[:15] + bytes([65]) + b[16:], "nlanes"),
    (lambda b: b[:14] + bytes([40]) + b[15:], "rank"),
    (lambda b: b[:24] + b"\0\0" + b[26:], "block_size"),
])
def test_malformed_packets_are_rejected(mutate, why):
    """unpack rejects truncated, mis-sized and out-of-range headers with a reason."""
    h, nxt, data = _example(np.random.default_rng(5))
    with pytest.raises(wire.MalformedPacket, match=why):
        wire.unpack(mutate(wire.pack(h, nxt, data)))


def test_max_lanes_fit_a_datagram():
    """max_lanes_for gives the most lanes whose full packet fits a UDP datagram."""
    for bs in (32, 64, 256, 1024):
        k = wire.max_lanes_for(bs)
        assert wire.packet_len(k, bs, k) <= wire.MAX_UDP_PAYLOAD
        assert k == wire.MAX_LANES or wire.packet_len(k + 1, bs, k + 1) > wire.MAX_UDP_PAYLOAD
