"""The leaf and spine roles' test packets and helpers (imported by the fabric tests): a job of
4 workers in 2 racks, its leaves and spine as FabricRoles on their own pipelines, and the
packets of one round.
"""
from __future__ import annotations

import numpy as np

from softswitch.dataplane import Dataplane
from softswitch.fabric import FabricRoles
from spina import rows, wire
from spina.config import JobConfig, WorkerAddr

K, BS = 2, 4  # lanes, block size
WORKER = [(0, ("10.0.0.1", 5000 + r)) for r in range(4)]  # (ingress port, source) per rank
LEAF = [(0, ("10.0.1.1", 47000 + i)) for i in range(2)]    # as the spine sees the leaves
SPINE = (0, ("10.0.2.1", 47000))                           # as the leaves see the spine
UP = SPINE + (bytes(6),)  # leaf_upstream's spine: port, (IPv4, UDP port), MAC (none here)
JOB = JobConfig(job=1, workers=tuple(WorkerAddr(r, *WORKER[r][1]) for r in range(4)),
                slot_base=0, nslots=2, nlanes=K, block_size=BS, epoch=3, racks=(2, 2))
SPINE_JOB = JobConfig(job=1, workers=tuple(WorkerAddr(i, *LEAF[i][1]) for i in range(2)),
                      slot_base=0, nslots=2, nlanes=K, block_size=BS, epoch=3)


def leaf(rack: int) -> FabricRoles:
    """Leaf `rack` of JOB (job ranks 2*rack, 2*rack+1: local ranks 0, 1), all slots owned by
    SPINE: a switch given the rows the plan writes for it (spina.rows.leaf_job)."""
    dp = Dataplane(pool_slots=4, slot_capacity=K * BS)
    dp.apply(rows.leaf_job(JOB, rack, [rows.Sender(0, *WORKER[2 * rack + r][1]) for r in (0, 1)],
                           [rows.Upstream(0, 2, SPINE[0], SPINE[1][0])]))
    return dp.roles


def spine() -> FabricRoles:
    dp = Dataplane(pool_slots=4, slot_capacity=K * BS)
    dp.apply(rows.spine_job(JOB, 0, 2, [rows.Sender(0, *LEAF[i][1]) for i in range(2)]))
    return dp.roles


def header(**kw) -> wire.Header:
    d = dict(job=1, epoch=3, call=9, slot=1, round=5, nlanes=K, block_size=BS, length=100)
    d.update(kw)
    return wire.Header(**d)


def contrib(rank, lanes, nxt, exponent=0, **kw) -> bytes:
    """Rank's contribution to slot 1 round 5: lanes {lane: value}, each block filled with it."""
    data = [np.full(BS, v, np.int32) for _, v in sorted(lanes.items())]
    present = sum(1 << lane for lane in lanes)
    return wire.pack(header(rank=rank, exponent=exponent, present=present, **kw), nxt,
                     np.array(data) if data else None)


def run(role, pkt, src):
    out = bytearray(role.pipeline.max_packet_len)
    with role.pipeline.lock:
        n, to, key = role.process_into(pkt, src[0], src[1], out)
    return bytes(out[:n]), to, key


# Rack 0: rank 0 sends lane 0 (= 1), rank 1 lanes 0 and 1 (= 2, 3). Rack 1: rank 2 nothing,
# rank 3 lane 1 (= 10). Next positions and exponents differ per rank. Each worker sends its
# rank within the rack (0, 1 in each).
RACK0 = [contrib(0, {0: 1}, [7, 20], 2), contrib(1, {0: 2, 1: 3}, [9, 11], 5, flags=wire.FLAG_LAST)]
RACK1 = [contrib(0, {}, [8, wire.END], -32768), contrib(1, {1: 10}, [30, 12], 4)]
PARTIAL0 = wire.pack(header(rank=0, exponent=5, bitmap=0b0011, present=0b11),
                     [7, 11], np.array([[3] * BS, [3] * BS], np.int32))
PARTIAL1 = wire.pack(header(rank=1, exponent=4, bitmap=0b11, present=0b10),
                     [8, 12], np.array([[10] * BS], np.int32))
RESULT = wire.pack(header(msg_type=wire.MSG_RESULT, rank=1, exponent=5, bitmap=0b11,
                          present=0b11), [7, 11], np.array([[3] * BS, [13] * BS], np.int32))


def completed_leaves():
    """Both leaves with their racks' round complete, and what each sent up."""
    leaves, ups = [leaf(0), leaf(1)], []
    for lf, pkts, base in zip(leaves, (RACK0, RACK1), (0, 2)):
        assert run(lf, pkts[0], WORKER[base]) == (b"", 0, None)
        ups.append(run(lf, pkts[1], WORKER[base + 1]))
    return leaves, ups


def patched(pkt: bytes, **fields) -> bytes:
    """`pkt` with some header fields changed."""
    return wire.pack_header(wire.unpack_header(pkt).copy(**fields)) + pkt[wire.HEADER_LEN:]


def relayed(flags=0, rank=1) -> bytes:
    """RESULT as a leaf hands it to its rack: the spine's rack bitmap as the rack's local
    ranks in its partial (`rank`: the sender of the packet answered, as in any result)."""
    return patched(RESULT, bitmap=0b11, flags=flags, rank=rank)
