"""Conformance: the leaf and spine roles of two-level aggregation (docs/scale_out.md), chosen
by table entries (job_level, leaf_upstream; p4src/v1model/fabric.p4), packet by packet.

Run just this file: python -m pytest bmv2_tests/test_fabric.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)

The job has 2 racks of 2 workers (job ranks 0-1, 2-3). As a leaf, the switch under test holds
rack 1: hosts 2 and 3 on ports 3 and 4, which send their ranks within the rack (0 and 1: the
leaf's admission, bitmaps and replication ids count local ranks), the spine on port 1. As a
spine, it admits the job's two leaves (rank = rack index) on ports 1 and 2.
"""
from __future__ import annotations

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from bmv2_tests.helpers import (
    BS,
    INA_PORT,
    JOB,
    MCAST_GRP,
    SWITCH_IP,
    SWITCH_MAC,
    InaEntries,
    contrib,
    expect,
    expect_nothing,
    ina,
    reply,
    rid,
    worker_port,
)
from spina import wire

END = wire.END
SPINE_PORT, SPINE_MAC, SPINE_IP = 1, "02:00:00:00:00:c8", "10.0.2.1"
RACK = (2, 3)          # the leaf's hosts (rack 1: job ranks 2 and 3)
LOCAL = {2: 0, 3: 1}   # their ranks on the wire: within the rack
LOCAL_RANKS = 0b11     # every local rank
NSLOTS = 4


def leaf_mac(rack: int) -> str:
    return f"02:00:00:00:02:{rack:02x}"


def leaf_ip(rack: int) -> str:
    return f"10.0.1.{rack + 1}"


def frame(src: tuple[str, str, int], dst: tuple[str, str, int], **fields) -> bytes:
    """An INA frame from (MAC, IPv4, UDP port) to (MAC, IPv4, UDP port); UDP checksum 0 unless
    `udp_chksum` is given (scapy computes it then)."""
    chk = fields.pop("udp_chksum", 0)
    udp = UDP(sport=src[2], dport=dst[2]) if chk is None else UDP(sport=src[2], dport=dst[2],
                                                                  chksum=chk)
    return bytes(Ether(src=src[0], dst=dst[0]) / IP(src=src[1], dst=dst[1]) / udp
                 / ina(**fields))


LEAF_SELF = (SWITCH_MAC, SWITCH_IP, INA_PORT)
SPINE = (SPINE_MAC, SPINE_IP, INA_PORT)


def to_spine(**fields) -> bytes:
    """The leaf's partial as it leaves for the spine: from the leaf, UDP checksum 0."""
    fields.setdefault("msg_type", wire.MSG_CONTRIB)
    fields.setdefault("rank", 1)
    fields.setdefault("round", 1)
    return frame(LEAF_SELF, SPINE, **fields)


def from_spine(**fields) -> bytes:
    """The spine's answer as it reaches the leaf (scapy's UDP checksum, as a real sender)."""
    fields.setdefault("msg_type", wire.MSG_RESULT)
    fields.setdefault("round", 1)
    return frame(SPINE, LEAF_SELF, udp_chksum=None, **fields)


def vals(seed: int) -> list[int]:
    return [(seed * 1000 + i) * (-1) ** i for i in range(BS)]


def add(*blocks) -> list[int]:
    return [int(x) for x in np.sum(np.array(blocks, np.int64), axis=0).astype(np.int32)]


def setup_leaf(target, epoch: int = 1):
    """Rack 1 of the job admitted, the job's level `as_leaf`, every slot owned by the spine."""
    e = InaEntries(target)
    e.add_ina_endpoint_entry()
    for r in RACK:
        e.add_admission_entry(r, len(RACK), epoch=epoch, nslots=NSLOTS, wire_rank=LOCAL[r])
        e.add_worker_rewrite_entry(r, wire_rank=LOCAL[r])
    target.mcast_group_set(MCAST_GRP, [(worker_port(r), rid(LOCAL[r])) for r in RACK])
    target.table_add("job_level", {"job": JOB}, "as_leaf",
                     {"rack": 1, "nlocal": len(RACK), "epoch": epoch, "mcast_grp": MCAST_GRP})
    for slot in range(NSLOTS):
        target.table_add("leaf_upstream", {"job": JOB, "slot": slot}, "to_spine",
                         {"port": SPINE_PORT, "dst_mac": SPINE_MAC, "dst_addr": SPINE_IP})


RACK_PKTS = [
    dict(blocks={0: vals(1), 2: vals(2)}, next=[5, 6, 7, 8], exponent=-3, flags=wire.FLAG_LAST,
         nonfinite=0b1, length=77),
    dict(blocks={0: vals(3)}, next=[9, 4, END, 8], exponent=2, flags=wire.FLAG_LAST,
         length=77),
]
PARTIAL = dict(bitmap=LOCAL_RANKS, blocks={0: add(vals(1), vals(3)), 2: vals(2)}, next=[5, 4, 7, 8],
               exponent=2, flags=wire.FLAG_LAST, nonfinite=0b1, length=77)
# The spine's sum over both racks (rack 0 sent lane 1 only).
SPINE_RESULT = dict(bitmap=0b11, blocks={0: add(vals(1), vals(3)), 1: vals(7), 2: vals(2)},
                    next=[1, 4, 7, 8], exponent=6, flags=wire.FLAG_LAST, nonfinite=0b11,
                    length=77)


def mine(host: int, **fields) -> bytes:
    """Host `host`'s contribution (RACK_PKTS) with its local rank, `fields` changed."""
    return contrib(host, wire_rank=LOCAL[host], **{**RACK_PKTS[RACK.index(host)], **fields})


def complete_rack(target):
    target.send(worker_port(2), mine(2))
    expect_nothing(target)
    target.send(worker_port(3), mine(3))


def test_leaf_sends_one_partial_up(target):
    """The rack's last contribution: one partial to the spine (rank = the rack's index; sums,
    OR of present and nonfinite, minimum next, maximum exponent, the rack's local ranks as
    bitmap);
    nothing to the workers, no result counted."""
    setup_leaf(target)
    complete_rack(target)
    expect(target, {SPINE_PORT: [to_spine(**PARTIAL)]})
    assert target.counter("job_aggregated", JOB) == 2
    assert target.counter("job_results", JOB) == 0
    assert target.register("slot_count", 1) == 2
    assert target.register("slot_bitmap", 1) == LOCAL_RANKS


def test_leaf_stores_the_spine_result_and_replicates_it(target):
    """The spine's result goes to every worker of the rack (with the rack's bit: the local
    ranks of its partial, a completion), is stored in the slot copy (count = rack size + 1), and
    answers a worker's resend from the leaf; a repeated result is a duplicate."""
    setup_leaf(target)
    complete_rack(target)
    target.received(0.5)
    target.send(SPINE_PORT, from_spine(rank=1, **SPINE_RESULT))
    down = {**SPINE_RESULT, "bitmap": LOCAL_RANKS}
    expect(target, {worker_port(r): [reply(r, rank=1, **down)] for r in RACK})
    assert target.register("slot_count", 1) == 3
    assert target.register("slot_bitmap", 1) == LOCAL_RANKS
    assert target.register("slot_present", 1) == 0b111
    assert target.register("slot_exponent", 1) == 6
    assert target.register("slot_values_l1_e2", 1) == vals(7)[2] & 0xFFFFFFFF
    assert target.register("slot_next_l0", 1) == 1
    assert target.counter("job_results", JOB) == 2
    target.send(worker_port(2), mine(2, flags=wire.FLAG_RESEND))
    expect(target, {worker_port(2): [reply(2, rank=0, **{
        **down, "flags": wire.FLAG_LAST | wire.FLAG_RESEND})]})
    target.send(SPINE_PORT, from_spine(rank=1, **SPINE_RESULT))
    expect_nothing(target)
    assert target.counter("job_duplicates", JOB) == 2
    assert target.counter("job_results", JOB) == 3


def test_leaf_resends_its_partial_when_the_spine_result_is_missing(target):
    """A worker's resend to a round its rack completed but whose spine result never came: the
    partial goes up again, flagged RESEND (and PARTIAL for a flush request), when the resend
    comes from the rack's designated worker (local rank 0: host 2) or asks for a flush. Local
    rank 1's plain resend is dropped (local rank 0 waits for the same result and resends),
    counted in job_duplicates as every resend is. No result is counted."""
    setup_leaf(target)
    complete_rack(target)
    target.received(0.5)
    target.send(worker_port(3), mine(3, flags=wire.FLAG_RESEND))
    expect_nothing(target)
    assert target.counter("job_duplicates", JOB) == 1
    target.send(worker_port(3), mine(3, flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL))
    expect(target, {SPINE_PORT: [to_spine(**{**PARTIAL, "flags": wire.FLAG_LAST
                                             | wire.FLAG_RESEND | wire.FLAG_PARTIAL})]})
    target.send(worker_port(2), mine(2, flags=wire.FLAG_RESEND))
    expect(target, {SPINE_PORT: [to_spine(**{**PARTIAL, "flags": wire.FLAG_LAST
                                             | wire.FLAG_RESEND})]})
    assert target.counter("job_results", JOB) == 0
    assert target.counter("job_duplicates", JOB) == 3
    assert target.register("slot_count", 1) == 2


def test_leaf_flush_goes_up_as_a_partial_round(target):
    """A worker's flush (a resend flagged PARTIAL) completes the rack's round without the
    missing worker: it goes up flagged PARTIAL, with the rack's contributing local ranks."""
    setup_leaf(target)
    target.send(worker_port(2), mine(2))
    target.send(worker_port(2), mine(2, flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL))
    own = {k: v for k, v in RACK_PKTS[0].items() if k != "flags"}
    expect(target, {SPINE_PORT: [to_spine(**{**own, "bitmap": 0b01,
                                             "flags": wire.FLAG_LAST | wire.FLAG_PARTIAL})]})
    assert target.register("slot_count", 1) == 2
    assert target.register("slot_flags", 1) == wire.FLAG_LAST | wire.FLAG_PARTIAL
    assert target.counter("job_results", JOB) == 0


def test_leaf_status_names_only_its_racks_missing_ranks(target):
    """A resend to a round the rack has not completed: a status naming the rack's local
    ranks heard (local rank 0 of 0..1), nothing of the other racks."""
    setup_leaf(target)
    target.send(worker_port(2), mine(2))
    target.send(worker_port(2), mine(2, flags=wire.FLAG_RESEND))
    expect(target, {worker_port(2): [reply(2, msg_type=wire.MSG_STATUS, rank=0,
                                           flags=wire.FLAG_RESEND, bitmap=0b01,
                                           next=RACK_PKTS[0]["next"], exponent=-3, length=77)]})


def test_spine_status_reaches_the_rack_as_ranks(target):
    """The spine's status (its rack bitmap, this rack's bit set) is replicated to the rack
    naming every local rank (the rack is done: only other racks can complete the round);
    nothing is stored."""
    setup_leaf(target)
    complete_rack(target)
    target.received(0.5)
    st = dict(msg_type=wire.MSG_STATUS, rank=1, flags=wire.FLAG_RESEND, bitmap=0b10,
              next=[5, 4, 7, 8], exponent=2, length=77)
    target.send(SPINE_PORT, from_spine(**st))
    expect(target, {worker_port(r): [reply(r, **{**st, "bitmap": LOCAL_RANKS})] for r in RACK})
    assert target.register("slot_count", 1) == 2
    assert target.counter("job_results", JOB) == 0


def test_leaf_replays_its_stored_result_to_a_spine_that_lost_it(target):
    """Another rack's status (a spine sends its statuses to every leaf): dropped while the
    leaf waits for the spine itself or when it names this rack; when the leaf stored the
    round's result and the status lacks this rack, the spine lost it (a restart): the stored
    result goes up as a REPLAY partial (stored sums, positions, bitmap, flags | RESEND)."""
    setup_leaf(target)
    complete_rack(target)
    target.received(0.5)
    other = dict(msg_type=wire.MSG_STATUS, rank=0, flags=wire.FLAG_RESEND, bitmap=0b01,
                 next=[1, 9, END, END], exponent=6, length=77)
    target.send(SPINE_PORT, from_spine(**other))  # the leaf still waits: not for its rack
    expect_nothing(target)
    target.send(SPINE_PORT, from_spine(rank=1, **SPINE_RESULT))
    target.received(0.5)  # replicated to the rack
    target.send(SPINE_PORT, from_spine(**{**other, "bitmap": 0b11}))  # names rack 1
    expect_nothing(target)
    target.send(SPINE_PORT, from_spine(**other))
    replay = {**SPINE_RESULT, "bitmap": LOCAL_RANKS,
              "flags": wire.FLAG_LAST | wire.FLAG_RESEND | wire.FLAG_REPLAY}
    expect(target, {SPINE_PORT: [to_spine(**replay)]})
    assert target.register("slot_count", 1) == 3
    assert target.counter("job_results", JOB) == 2


def test_leaf_checks_what_comes_from_the_spine(target):
    """A result from another port or address than the slot's spine is unadmitted; of another
    epoch or a round the copy does not hold, stale; before the rack completed, stale; for a
    slot no spine owns, malformed (hosts send contributions only). Nothing is stored."""
    setup_leaf(target)
    target.send(worker_port(2), mine(2))
    target.send(SPINE_PORT, from_spine(rank=1, **SPINE_RESULT))  # rack not complete
    target.send(worker_port(3), mine(3))
    target.received(0.5)
    target.send(2, from_spine(rank=1, **SPINE_RESULT))  # wrong port
    target.send(SPINE_PORT, frame((SPINE_MAC, "10.0.2.9", INA_PORT), LEAF_SELF, udp_chksum=None,
                                  msg_type=wire.MSG_RESULT, round=1, rank=1, **SPINE_RESULT))
    target.send(SPINE_PORT, from_spine(rank=1, epoch=2, **SPINE_RESULT))
    target.send(SPINE_PORT, from_spine(rank=1, **{**SPINE_RESULT, "round": 3}))
    target.send(SPINE_PORT, from_spine(rank=1, slot=NSLOTS, **SPINE_RESULT))
    expect_nothing(target)
    assert target.counter("port_unadmitted", 2) == 1
    assert target.counter("port_unadmitted", SPINE_PORT) == 1
    assert target.counter("port_malformed", SPINE_PORT) == 1
    assert target.counter("job_stale", JOB) == 3
    assert target.register("slot_count", 1) == 2
    assert target.register("slot_bitmap", 1) == LOCAL_RANKS


def test_spine_result_without_the_racks_bit_names_no_local_rank(target):
    """A spine result (bounded loss) completed without this rack's partial: stored and
    replicated with an empty bitmap (none of the rack's blocks is in it); a result of a
    flushed rack with its bit: the local ranks its partial carried (0b01)."""
    setup_leaf(target)
    complete_rack(target)
    target.received(0.5)
    without = {**SPINE_RESULT, "bitmap": 0b01, "flags": wire.FLAG_LAST | wire.FLAG_PARTIAL}
    target.send(SPINE_PORT, from_spine(rank=0, **without))
    expect(target, {worker_port(r): [reply(r, rank=0, **{**without, "bitmap": 0})]
                    for r in RACK})
    assert target.register("slot_bitmap", 1) == 0
    target.reset()
    setup_leaf(target)
    target.send(worker_port(2), mine(2))
    target.send(worker_port(2), mine(2, flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL))
    target.received(0.5)
    flushed = {**SPINE_RESULT, "flags": wire.FLAG_LAST | wire.FLAG_PARTIAL}
    target.send(SPINE_PORT, from_spine(rank=1, **flushed))
    expect(target, {worker_port(r): [reply(r, rank=1, **{**flushed, "bitmap": 0b01})]
                    for r in RACK})
    assert target.register("slot_bitmap", 1) == 0b01


def test_a_full_rack_of_32_workers(target):
    """A leaf of 32 workers (local ranks 0..31, each with its own address, all behind port 3):
    the round goes up with all 32 bits; the spine's status comes back to every one of them
    naming every local rank (0xFFFFFFFF: the P4 computes 1 << 32 in 64 bits), then its result
    with the rack's bit names the partial's 32 ranks."""
    e = InaEntries(target)
    e.add_ina_endpoint_entry()
    hosts = range(32)
    for h in hosts:
        e.add_admission_entry(h, 32, port=3, nslots=NSLOTS)
        e.add_worker_rewrite_entry(h)
    target.mcast_group_set(MCAST_GRP, [(3, rid(h)) for h in hosts])
    target.table_add("job_level", {"job": JOB}, "as_leaf",
                     {"rack": 0, "nlocal": 32, "epoch": 1, "mcast_grp": MCAST_GRP})
    target.table_add("leaf_upstream", {"job": JOB, "slot": 0}, "to_spine",
                     {"port": SPINE_PORT, "dst_mac": SPINE_MAC, "dst_addr": SPINE_IP})
    for h in hosts:
        target.send(3, contrib(h, blocks={0: vals(1)}, length=77))
    (up,) = target.received(1.0)
    head = wire.unpack_header(up[1][42:])
    assert (up[0], head.msg_type, head.rank, head.bitmap) == (SPINE_PORT, wire.MSG_CONTRIB, 0,
                                                              0xFFFFFFFF)
    assert target.register("slot_count", 1) == 32  # slot 0, round 1: copy 1
    for msg in (dict(msg_type=wire.MSG_STATUS, flags=wire.FLAG_RESEND, rank=0, length=77),
                dict(blocks={0: add(*[vals(1)] * 32)}, rank=0, length=77)):
        target.send(SPINE_PORT, from_spine(slot=0, bitmap=0b01, **msg))
        got = sorted(frame for port, frame in target.received(1.0) if port == 3)
        assert got == sorted(reply(h, slot=0, **{**msg, "bitmap": 0xFFFFFFFF}) for h in hosts)
    assert target.register("slot_count", 1) == 33
    assert target.register("slot_bitmap", 1) == 0xFFFFFFFF


def test_leaf_without_an_upstream_entry_sends_nothing(target):
    """A leaf job whose slot has no leaf_upstream entry: the completed round is dropped."""
    setup_leaf(target)
    _delete_upstream(target, 0)
    target.send(worker_port(2), mine(2, slot=0))
    target.send(worker_port(3), mine(3, slot=0))
    expect_nothing(target)
    assert target.counter("job_aggregated", JOB) == 2
    assert target.counter("job_results", JOB) == 0


def _delete_upstream(target, slot: int) -> None:
    from p4.v1 import p4runtime_pb2 as pb
    e = target.conn.index.table_entry("leaf_upstream", {"job": JOB, "slot": slot}, "to_spine",
                                      {"port": SPINE_PORT, "dst_mac": SPINE_MAC,
                                       "dst_addr": SPINE_IP})
    target.conn.write([(pb.Update.DELETE, pb.Entity(table_entry=e))])


# ---------------------------------------------------------------- the spine
def leaf_side(rack: int) -> tuple[str, str, int]:
    return (leaf_mac(rack), leaf_ip(rack), INA_PORT)


SPINE_SELF = (SWITCH_MAC, SWITCH_IP, INA_PORT)


def setup_spine(target, level: str | None = "as_spine"):
    """The job's two leaves admitted as ranks 0 and 1 (ports 1 and 2), results multicast to
    both; the job's level `as_spine` (None: no job_level entry, a flat job)."""
    e = InaEntries(target)
    e.add_ina_endpoint_entry()
    for rack in (0, 1):
        e.add_admission_entry(rack, 2, port=rack + 1, src_addr=leaf_ip(rack), src_port=INA_PORT,
                              nslots=NSLOTS)
        target.table_add("worker_rewrite", {"rid": rid(rack)}, "rewrite_for_worker",
                         {"dst_mac": leaf_mac(rack), "dst_addr": leaf_ip(rack),
                          "dst_port": INA_PORT})
    target.mcast_group_set(MCAST_GRP, [(rack + 1, rid(rack)) for rack in (0, 1)])
    if level:
        target.table_add("job_level", {"job": JOB}, level)


def partial(rack: int, **fields) -> bytes:
    fields.setdefault("msg_type", wire.MSG_CONTRIB)
    fields.setdefault("round", 1)
    return frame(leaf_side(rack), SPINE_SELF, udp_chksum=None, rank=rack, **fields)


def down(rack: int, **fields) -> bytes:
    fields.setdefault("msg_type", wire.MSG_RESULT)
    fields.setdefault("round", 1)
    return frame(SPINE_SELF, leaf_side(rack), **fields)


def test_spine_adds_partials_and_multicasts_to_the_leaves(target):
    """The spine sums the racks' partials and multicasts the result to both leaves."""
    setup_spine(target)
    target.send(1, partial(0, blocks={1: vals(7)}, next=[1, 9, END, END], exponent=6,
                           flags=wire.FLAG_LAST, nonfinite=0b10, length=77, bitmap=0b11))
    expect_nothing(target)
    target.send(2, partial(1, **PARTIAL))
    want = dict(rank=1, **SPINE_RESULT)
    expect(target, {rack + 1: [down(rack, **want)] for rack in (0, 1)})
    assert target.counter("job_results", JOB) == 2


def test_spine_status_goes_to_every_leaf_and_a_replay_completes_the_round(target):
    """A spine's status goes to every leaf (the job's group). A leaf's REPLAY partial (its
    stored result of a round the spine lost) is written as the round's result, whatever was
    added: complete, every rack's bit, multicast as a completion; a second replay gets the
    stored result back (RESEND)."""
    setup_spine(target)
    target.send(2, partial(1, **PARTIAL))
    expect_nothing(target)
    target.send(2, partial(1, **{**PARTIAL, "flags": wire.FLAG_LAST | wire.FLAG_RESEND}))
    status = dict(msg_type=wire.MSG_STATUS, rank=1, flags=wire.FLAG_RESEND, bitmap=0b10,
                  next=PARTIAL["next"], exponent=2, length=77)
    expect(target, {rack + 1: [down(rack, **status)] for rack in (0, 1)})
    replay = {**SPINE_RESULT, "bitmap": 0b1111,
              "flags": wire.FLAG_LAST | wire.FLAG_RESEND | wire.FLAG_REPLAY}
    target.send(1, partial(0, **replay))
    expect(target, {rack + 1: [down(rack, rank=0, **SPINE_RESULT)] for rack in (0, 1)})
    assert target.register("slot_count", 1) == 2
    assert target.register("slot_bitmap", 1) == 0b11
    assert target.register("slot_values_l1_e2", 1) == vals(7)[2] & 0xFFFFFFFF
    assert target.counter("job_aggregated", JOB) == 1
    assert target.counter("job_results", JOB) == 2
    target.send(1, partial(0, **replay))
    expect(target, {1: [down(0, rank=0, **{**SPINE_RESULT,
                                           "flags": wire.FLAG_LAST | wire.FLAG_RESEND})]})


def test_spine_takes_a_partial_replay_with_only_the_replaying_rack(target):
    """A replayed PARTIAL result (the round was flushed without some rack before the spine
    lost it): its bitmap names only the replaying rack, and only if the leaf's stored ranks
    say it was in; nobody is told their blocks were summed when they may not have been."""
    flags = wire.FLAG_LAST | wire.FLAG_PARTIAL
    for stored, named in ((LOCAL_RANKS, 0b01), (0, 0)):
        setup_spine(target)
        target.send(2, partial(1, **PARTIAL))
        expect_nothing(target)
        target.send(1, partial(0, **{**SPINE_RESULT, "bitmap": stored,
                                     "flags": flags | wire.FLAG_RESEND | wire.FLAG_REPLAY}))
        want = {**SPINE_RESULT, "bitmap": named, "flags": flags}
        expect(target, {rack + 1: [down(rack, rank=0, **want)] for rack in (0, 1)})
        assert target.register("slot_bitmap", 1) == named
        assert target.register("slot_flags", 1) == flags
        target.reset()


def test_spine_carries_a_racks_mismatch_and_flush(target):
    """A partial's MISMATCH and PARTIAL are ORed into the round at a spine (every rack learns
    of them); on a flat job (no job_level entry) they are not: the level is the entry's."""
    for level, carried in (("as_spine", wire.FLAG_MISMATCH | wire.FLAG_PARTIAL), (None, 0)):
        setup_spine(target, level)
        target.send(1, partial(0, length=77, flags=wire.FLAG_MISMATCH))
        target.send(2, partial(1, length=77, flags=wire.FLAG_PARTIAL | wire.FLAG_LAST))
        want = dict(rank=1, bitmap=0b11, length=77, flags=carried)
        expect(target, {rack + 1: [down(rack, **want)] for rack in (0, 1)})
        assert target.register("slot_flags", 1) == carried
        target.reset()


def test_leaf_and_a_software_spine_complete_a_round(target):
    """The target as rack 1's leaf and a software switch (SoftTarget) as the spine, frames
    carried between them: the leaf's partial is what the spine adds, the spine's result is what
    the leaf stores and replicates to its rack (both targets agree on the wire between them)."""
    from bmv2_tests.target import SoftTarget
    setup_leaf(target)
    spine = SoftTarget()
    try:
        spine.table_add("ina_endpoint", {"dst_addr": SPINE_IP}, "accept_ina")
        sources = {0: (1, leaf_mac(0), leaf_ip(0)), 1: (2, SWITCH_MAC, SWITCH_IP)}
        for rack, (port, mac, ip) in sources.items():
            spine.table_add("admission", {"ingress_port": port, "src_addr": ip,
                                          "src_port": INA_PORT, "job": JOB, "rank": rack},
                            "admit", {"epoch": 1, "slot_base": 0, "nslots": NSLOTS,
                                      "nworkers": 2, "block_size": BS, "nlanes": 4,
                                      "mcast_grp": MCAST_GRP})
            spine.table_add("worker_rewrite", {"rid": rid(rack)}, "rewrite_for_worker",
                            {"dst_mac": mac, "dst_addr": ip, "dst_port": INA_PORT})
        spine.mcast_group_set(MCAST_GRP, [(1, rid(0)), (2, rid(1))])
        spine.table_add("job_level", {"job": JOB}, "as_spine")
        rack0 = frame((leaf_mac(0), leaf_ip(0), INA_PORT), SPINE, udp_chksum=None,
                      msg_type=wire.MSG_CONTRIB, round=1, rank=0, blocks={1: vals(7)},
                      next=[1, 9, END, END], exponent=6, flags=wire.FLAG_LAST, nonfinite=0b10,
                      length=77, bitmap=0b11)
        spine.send(1, rack0)
        assert spine.received() == []
        complete_rack(target)
        (up,) = target.received(0.5)
        assert up[0] == SPINE_PORT
        spine.send(2, up[1])
        downs = dict(spine.received())
        assert sorted(downs) == [1, 2]
        assert downs[1] == frame(SPINE, leaf_side(0), msg_type=wire.MSG_RESULT, round=1,
                                 rank=1, **SPINE_RESULT)
        target.send(SPINE_PORT, downs[2])
        expect(target, {worker_port(r): [reply(r, rank=1, **{**SPINE_RESULT,
                                                             "bitmap": LOCAL_RANKS})]
                        for r in RACK})
        assert target.register("slot_count", 1) == 3
        assert spine.counter("job_aggregated", JOB) == 2
    finally:
        spine.close()
