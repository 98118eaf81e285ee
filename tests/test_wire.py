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


@pytest.mark.parametrize("flag, dtype", [(wire.FLAG_LANES16, ">i2"), (wire.FLAG_LANES8, "i1")])
def test_narrow_rows_pack_unpack_and_match_scapy_and_the_batch(flag, dtype):
    """A width flag makes the rows int16 / int8 (big-endian): pack, unpack, the scapy layer and
    the batch forms agree, and a packet is that much shorter."""
    from scapy.layers.inet import IP, UDP
    INA = wire.scapy_layer()
    rng = np.random.default_rng(6)
    h, nxt, _ = _example(rng, nlanes=6, bs=10)
    h.flags |= flag
    info = np.iinfo(np.dtype(dtype))
    data = rng.integers(info.min, info.max + 1, (h.present.bit_count(), 10)).astype(dtype)
    buf = wire.pack(h, nxt, data)
    item = np.dtype(dtype).itemsize
    assert len(buf) == wire.packet_len(6, 10, len(data), h.flags) == 48 + 24 + item * data.size
    assert wire.row_bytes(10, h.flags) == 10 * item
    p = wire.unpack(buf)
    assert p.header == h and p.data.dtype == np.dtype(dtype) and (p.data == data).all()
    pkt = INA(**{n: getattr(h, n) for n in wire.FIELD_NAMES}, next=[int(v) for v in nxt],
              data=data.tobytes())
    assert bytes(pkt) == buf
    dec = IP(bytes(IP(dst="127.0.0.1") / UDP(sport=1, dport=wire.DEFAULT_UDP_PORT) / pkt))
    assert (dec[INA].block_values() == data).all()
    heads = np.frombuffer(buf[:wire.HEADER_LEN], wire.HEADER_DTYPE)
    assert wire.pack_batch(heads, nxt[None], data) == [buf]
    h2, n2, d2 = wire.unpack_batch([buf, buf])
    assert (d2 == np.concatenate([data, data])).all() and d2.dtype == np.int32


def test_two_widths_and_mixed_batches_are_malformed():
    """Both width flags set is no width; a batch mixing widths is refused like mixed sizes."""
    h, nxt, data = _example(np.random.default_rng(7))
    h.flags |= wire.FLAG_LANES16 | wire.FLAG_LANES8
    assert wire.lane_item_bytes(h.flags) == 0
    with pytest.raises(wire.MalformedPacket, match="two lane widths"):
        wire.unpack(wire.pack_header(h) + nxt.tobytes())
    h.present = 0
    plain = wire.pack(h.copy(flags=0), nxt)
    narrow = wire.pack(h.copy(flags=wire.FLAG_LANES8), nxt)
    with pytest.raises(wire.MalformedPacket, match="lane widths"):
        wire.unpack_batch([plain, narrow])
