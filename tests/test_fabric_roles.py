"""The software switch's leaf and spine roles packet by packet (softswitch/fabric.py; the P4
program's roles have their conformance tests in bmv2_tests/test_fabric.py).

Run just this file: python -m pytest tests/test_fabric_roles.py
"""
from __future__ import annotations

import numpy as np

from softswitch.fabric import TO_GROUP, TO_SENDER, TO_UPSTREAM
from softswitch.pipeline import Pipeline
from spina import wire
from spina.config import JobConfig
from tests.fabric_packets import (
    BS,
    JOB,
    LEAF,
    PARTIAL0,
    PARTIAL1,
    RACK0,
    RACK1,
    RESULT,
    SPINE,
    UP,
    WORKER,
    K,
    completed_leaves,
    contrib,
    header,
    leaf,
    patched,
    relayed,
    run,
    spine,
)


# ---------------------------------------------------------------- the roles, packet by packet
def test_leaf_sends_one_partial_up():
    """A rack's last contribution makes one partial to the spine: sums of the present lanes,
    OR of present, minimum next, maximum exponent, AND of last, rank = the rack's index."""
    (l0, l1), ups = completed_leaves()
    assert ups[0] == (PARTIAL0, TO_UPSTREAM, UP)
    assert ups[1] == (PARTIAL1, TO_UPSTREAM, UP)
    r = l0.pipeline.registers
    idx = 2 * 1 + 1
    assert (r["slot_count"][idx], r["slot_bitmap"][idx], r["slot_round"][idx]) == (2, 0b11, 5)
    assert l0.pipeline.job_counters(1)["job_aggregated"] == 2


def test_spine_adds_partials_and_multicasts():
    """The spine sums the two racks' partials and multicasts the result to both leaves; a
    repeated partial is a duplicate, answered with a status while the round is open."""
    sp = spine()
    assert run(sp, PARTIAL0, LEAF[0]) == (b"", 0, None)
    status = wire.pack(header(msg_type=wire.MSG_STATUS, flags=wire.FLAG_RESEND, rank=0,
                              exponent=5, bitmap=0b01), [7, 11])
    # A spine's status goes to every leaf (a leaf that stored the result replays it).
    assert run(sp, patched(PARTIAL0, flags=wire.FLAG_RESEND), LEAF[0]) == (status, TO_GROUP, 1)
    assert run(sp, PARTIAL1, LEAF[1]) == (RESULT, TO_GROUP, 1)
    assert sp.pipeline.job_counters(1)["job_duplicates"] == 1


def test_leaf_stores_the_spine_result_and_answers_resends_itself():
    """The spine's result is stored in the leaf's slot copy and replicated to the rack; a
    worker's resend then gets the stored result from the leaf; a repeated result is dropped."""
    (l0, _), _ = completed_leaves()
    assert run(l0, RESULT, SPINE) == (relayed(), TO_GROUP, 1)
    r, idx = l0.pipeline.registers, 3
    assert (r["slot_count"][idx], r["slot_bitmap"][idx], r["slot_present"][idx]) == (3, 0b11, 3)
    assert (r["slot_values"][idx] == [3] * BS + [13] * BS).all()
    assert list(r["slot_next"][idx][:K]) == [7, 11]
    resend = patched(RACK0[0], flags=wire.FLAG_RESEND)
    assert run(l0, resend, WORKER[0]) == (relayed(wire.FLAG_RESEND, rank=0), TO_SENDER, None)
    before = l0.pipeline.job_counters(1)["job_duplicates"]
    assert run(l0, RESULT, SPINE) == (b"", 0, None)
    assert l0.pipeline.job_counters(1)["job_duplicates"] == before + 1


def test_resend_before_the_spine_result_resends_the_partial():
    """The designated worker's (the rack's local rank 0's) resend while its rack is complete
    but the spine's result missing makes the leaf resend its partial; the spine's status comes
    back to the rack as every local rank (only other racks can complete it), its stored result
    (to a later resend) is stored and multicast as a completion."""
    (l0, l1), ups = completed_leaves()
    sp = spine()
    resend = patched(RACK0[0], flags=wire.FLAG_RESEND)
    up_again = patched(PARTIAL0, flags=wire.FLAG_RESEND)
    assert run(l0, resend, WORKER[0]) == (up_again, TO_UPSTREAM, UP)
    # The first partial was lost: the spine adds the resent one.
    assert run(sp, up_again, LEAF[0]) == (b"", 0, None)
    status, to, _ = run(sp, up_again, LEAF[0])
    assert to == TO_GROUP and wire.unpack_header(status).bitmap == 0b01
    # Rack 1's leaf, still waiting for the spine too, ignores rack 0's status.
    assert run(l1, status, SPINE) == (b"", 0, None)
    out, to, key = run(l0, status, SPINE)
    assert (to, key, wire.unpack_header(out).bitmap) == (TO_GROUP, 1, 0b11)
    assert out[wire.HEADER_LEN:] == status[wire.HEADER_LEN:]
    assert run(sp, ups[1][0], LEAF[1])[1] == TO_GROUP  # rack 1 completes the spine's round
    answer, to, _ = run(sp, up_again, LEAF[0])
    assert to == TO_SENDER and answer == patched(RESULT, flags=wire.FLAG_RESEND, rank=0)
    assert run(l0, answer, SPINE) == (relayed(rank=0), TO_GROUP, 1)


def test_a_restarted_spine_takes_the_result_a_leaf_stored():
    """The spine's result reached leaf 0 but was lost to leaf 1, then the spine restarted
    (registers lost). Rack 0 never sends the round again; rack 1's designated worker resends:
    the new spine adds leaf 1's partial and, at the next resend, sends its status to every
    leaf; leaf 0 stored the result and sees its rack missing, so it replays the result up
    (REPLAY); the spine takes it as the round's result, complete, and multicasts it: leaf 1
    stores it and replicates it to its rack exactly as the lost one, leaf 0 drops it."""
    (l0, l1), ups = completed_leaves()
    old = spine()
    run(old, ups[0][0], LEAF[0])
    assert run(old, ups[1][0], LEAF[1]) == (RESULT, TO_GROUP, 1)
    assert run(l0, RESULT, SPINE) == (relayed(), TO_GROUP, 1)  # lost on the way to leaf 1
    sp = spine()  # the restarted spine
    resend = patched(RACK1[0], flags=wire.FLAG_RESEND)  # rank 2: rack 1's designated worker
    up_again = patched(PARTIAL1, flags=wire.FLAG_RESEND)
    assert run(l1, resend, WORKER[2]) == (up_again, TO_UPSTREAM, UP)
    assert run(sp, up_again, LEAF[1]) == (b"", 0, None)
    status, to, key = run(sp, up_again, LEAF[1])
    assert (to, key) == (TO_GROUP, 1)
    assert wire.unpack_header(status).bitmap == 0b10  # rack 0 missing
    replay, to, key = run(l0, status, SPINE)
    h = wire.unpack_header(replay)
    assert (to, key, h.msg_type, h.rank) == (TO_UPSTREAM, UP, wire.MSG_CONTRIB, 0)
    assert h.flags == wire.FLAG_RESEND | wire.FLAG_REPLAY
    assert replay[wire.HEADER_LEN:] == RESULT[wire.HEADER_LEN:]  # next positions and sums
    result, to, key = run(sp, replay, LEAF[0])
    assert (to, key) == (TO_GROUP, 1)
    assert result == patched(RESULT, rank=0)  # the lost result, every rack's bit set
    c = sp.pipeline.job_counters(1)
    assert (c["job_aggregated"], c["job_results"]) == (1, 2)
    assert run(l1, result, SPINE) == (relayed(rank=0), TO_GROUP, 1)
    assert run(l0, result, SPINE) == (b"", 0, None)
    # The round is complete at the spine: another replay gets the stored result back.
    assert run(sp, replay, LEAF[0])[1] == TO_SENDER
    # A status naming leaf 0's rack, or its own status, makes no replay.
    assert run(l0, patched(status, bitmap=0b11), SPINE) == (b"", 0, None)


def test_only_the_designated_worker_makes_the_partial_go_up_again():
    """Rack 1's second rank (local 1) resends a round whose spine result is missing: nothing
    leaves (its designated worker, local rank 0, waits for the same result and resends),
    counted once as a duplicate; its flush request does go up; local rank 0's resend goes up.
    None counts a result."""
    (_, l1), _ = completed_leaves()
    counters = l1.pipeline.job_counters
    assert counters(1)["job_duplicates"] == 0
    assert run(l1, patched(RACK1[1], flags=wire.FLAG_RESEND), WORKER[3]) == (b"", 0, None)
    assert run(l1, patched(RACK1[1], flags=wire.FLAG_RESEND | wire.FLAG_LOSS_TOLERANT),
               WORKER[3]) == (b"", 0, None)
    assert counters(1)["job_duplicates"] == 2
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    assert run(l1, patched(RACK1[1], flags=flush), WORKER[3]) == (
        patched(PARTIAL1, flags=flush), TO_UPSTREAM, UP)
    assert run(l1, patched(RACK1[0], flags=wire.FLAG_RESEND), WORKER[2]) == (
        patched(PARTIAL1, flags=wire.FLAG_RESEND), TO_UPSTREAM, UP)
    c = counters(1)
    assert (c["job_duplicates"], c["job_results"], c["job_aggregated"]) == (4, 0, 2)
    assert l1.pipeline.registers["slot_count"][3] == 2


def test_leaf_status_names_only_its_racks_missing_ranks():
    """A resend to a round the rack has not completed: a status naming the rack's local ranks
    heard (local rank 0 of 0..1), so the agent blames only its own rack's missing workers."""
    l0 = leaf(0)
    run(l0, RACK0[0], WORKER[0])
    out, to, _ = run(l0, patched(RACK0[0], flags=wire.FLAG_RESEND), WORKER[0])
    h = wire.unpack_header(out)
    assert (to, h.msg_type, h.bitmap) == (TO_SENDER, wire.MSG_STATUS, 0b01)


def test_spine_results_bitmap_as_local_ranks():
    """The spine's rack bitmap at the leaf: with the rack's bit, the local ranks its partial
    carried (a rack flushed without local rank 1: 0b01); without it (the spine flushed the
    round without this rack), none: the agents count their blocks as lost."""
    l0 = leaf(0)
    run(l0, RACK0[0], WORKER[0])
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    up, to, _ = run(l0, patched(RACK0[0], flags=flush), WORKER[0])
    assert to == TO_UPSTREAM and wire.unpack_header(up).bitmap == 0b01
    down, to, _ = run(l0, patched(RESULT, flags=wire.FLAG_PARTIAL), SPINE)
    assert to == TO_GROUP and wire.unpack_header(down).bitmap == 0b01
    (_, l1), _ = completed_leaves()
    down, to, _ = run(l1, patched(RESULT, bitmap=0b01, flags=wire.FLAG_PARTIAL), SPINE)
    assert to == TO_GROUP and wire.unpack_header(down).bitmap == 0
    assert l1.pipeline.registers["slot_bitmap"][3] == 0


def test_leaf_checks_what_comes_from_the_spine():
    """A spine result from a switch that does not own the slot, of another epoch, or of a
    round the slot copy does not hold is dropped and counted; nothing is stored."""
    (l0, _), _ = completed_leaves()
    other = (0, ("10.0.2.9", 47000))  # not the spine owning the slot
    stale_epoch, old_round = patched(RESULT, epoch=4), patched(RESULT, round=3)
    c0 = l0.pipeline.job_counters(1)
    assert run(l0, RESULT, other) == (b"", 0, None)
    assert run(l0, stale_epoch, SPINE) == (b"", 0, None)
    assert run(l0, old_round, SPINE) == (b"", 0, None)
    c1 = l0.pipeline.job_counters(1)
    assert c1["job_stale"] - c0["job_stale"] == 2
    assert l0.pipeline.port_counters(0)["port_unadmitted"] == 1
    assert l0.pipeline.registers["slot_count"][3] == 2


def test_a_racks_length_mismatch_reaches_every_rack():
    """Lengths that disagree inside one rack: the partial says mismatch, the spine ORs it
    into the round, every rack's result says mismatch."""
    l0, l1, sp = leaf(0), leaf(1), spine()
    run(l0, RACK0[0], WORKER[0])
    bad = contrib(1, {0: 2, 1: 3}, [9, 11], 5, flags=wire.FLAG_LAST, length=99)
    up0, _, _ = run(l0, bad, WORKER[1])
    assert wire.unpack_header(up0).flags & wire.FLAG_MISMATCH
    run(l1, RACK1[0], WORKER[2])
    up1, _, _ = run(l1, RACK1[1], WORKER[3])
    run(sp, up0, LEAF[0])
    result, to, _ = run(sp, up1, LEAF[1])
    assert to == TO_GROUP and wire.unpack_header(result).flags & wire.FLAG_MISMATCH
    assert sp.pipeline.registers["slot_flags"][3] & wire.FLAG_MISMATCH
    down, _, _ = run(l1, result, SPINE)
    assert wire.unpack_header(down).flags & wire.FLAG_MISMATCH


def test_a_flat_job_on_a_leaf_switch_is_unchanged():
    """A job admitted the ordinary way on a leaf switch: the same packets out as a plain
    pipeline, multicast to its workers."""
    flat = JobConfig(job=2, workers=JOB.workers[:2], slot_base=2, nslots=2, nlanes=K,
                     block_size=BS, epoch=3)
    l0, plain = leaf(0), Pipeline(pool_slots=4, slot_capacity=K * BS)
    for p in (l0.pipeline, plain):
        p.add_job(flat, {r: WORKER[r] for r in range(2)})
    pkts = [wire.pack(header(job=2, slot=2, rank=r, present=1), [wire.END] * K,
                      np.full((1, BS), r + 1, np.int32)) for r in range(2)]
    run(l0, pkts[0], WORKER[0])
    plain.process(pkts[0], *WORKER[0])
    (emit,) = plain.process(pkts[1], *WORKER[1])
    assert run(l0, pkts[1], WORKER[1]) == (emit.data, TO_GROUP, 2)


def test_bounded_loss_flushes_cross_both_levels():
    """A worker's flush request completes its rack's round without the missing worker (the
    partial goes up marked partial and the spine's result says so); a flush request at a rack
    whose round is complete goes up as a flushing resend, and the spine completes its round
    without the missing rack."""
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    l0, sp = leaf(0), spine()
    run(l0, RACK0[0], WORKER[0])
    up, to, _ = run(l0, patched(RACK0[0], flags=flush), WORKER[0])
    h = wire.unpack_header(up)
    assert (to, h.msg_type, h.flags & flush, h.bitmap) == (
        TO_UPSTREAM, wire.MSG_CONTRIB, wire.FLAG_PARTIAL, 0b01)
    run(sp, up, LEAF[0])
    result, to, _ = run(sp, PARTIAL1, LEAF[1])
    assert to == TO_GROUP and wire.unpack_header(result).flags & wire.FLAG_PARTIAL
    # Rack 0 complete and sent up; rack 1 never arrives: a flush goes up and completes it.
    (l0, _), (up0, _) = completed_leaves()
    sp = spine()
    run(sp, up0[0], LEAF[0])
    again, to, _ = run(l0, patched(RACK0[1], flags=wire.FLAG_LAST | flush), WORKER[1])
    assert to == TO_UPSTREAM and wire.unpack_header(again).flags & flush == flush
    result, to, key = run(sp, again, LEAF[0])
    h = wire.unpack_header(result)
    assert (to, key, h.bitmap, h.flags & wire.FLAG_PARTIAL) == (TO_GROUP, 1, 0b01,
                                                                 wire.FLAG_PARTIAL)
    down, _, _ = run(l0, result, SPINE)
    assert wire.unpack_header(down).bitmap == 0b0011
