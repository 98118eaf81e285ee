"""Conformance: slot registers, completion, duplicates, staleness and self-cleaning slots.

Run just this file: python -m pytest bmv2_tests/test_aggregation.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

import numpy as np

from bmv2_tests.helpers import (
    BS,
    JOB,
    InaEntries,
    contrib,
    expect,
    expect_nothing,
    reply,
    results_to_all,
    worker_port,
)
from spina import wire

END = wire.END


def vals(seed: int) -> list[int]:
    return [(seed * 1000 + i) * (-1) ** i for i in range(BS)]


def add(*blocks) -> list[int]:
    return [int(x) for x in np.sum(np.array(blocks, np.int64), axis=0).astype(np.int32)]


def test_complete_round_multicasts_sum(target):
    """The last contribution of a round makes the switch multicast the sum to every worker."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: vals(1), 2: vals(2)}, next=[5, 6, 7, 8]))
    expect_nothing(target)
    target.send(2, contrib(1, blocks={0: vals(3), 2: vals(4)}, next=[9, 6, 3, 8]))
    expect(target, results_to_all(
        2, rank=1, bitmap=0b11, blocks={0: add(vals(1), vals(3)), 2: add(vals(2), vals(4))},
        next=[5, 6, 3, 8]))
    assert target.counter("job_received", JOB) == 2
    assert target.counter("job_aggregated", JOB) == 2
    assert target.counter("job_results", JOB) == 2


def test_sparse_lanes_union_and_min_next(target):
    """Lanes sent by only some workers are summed with zeros; present is the union."""
    InaEntries(target).setup_job(3)
    target.send(1, contrib(0, blocks={1: vals(1)}, next=[END, 4, END, END]))
    target.send(2, contrib(1, blocks={3: vals(2)}, next=[END, END, END, 9]))
    expect_nothing(target)
    target.send(3, contrib(2, next=[7, END, END, 2]))  # no data at all
    expect(target, results_to_all(3, rank=2, bitmap=0b111, blocks={1: vals(1), 3: vals(2)},
                                  next=[7, 4, END, 2]))


def test_int32_sum_wraps_around(target):
    """Sums wrap at 32 bits, as the switch's adders."""
    InaEntries(target).setup_job(2)
    big = [2**31 - 1] * BS
    target.send(1, contrib(0, blocks={0: big}))
    target.send(2, contrib(1, blocks={0: [1] * BS}))
    expect(target, results_to_all(2, rank=1, bitmap=3, blocks={0: [-2**31] * BS}))


def test_result_header_state(target):
    """Exponent is the max, nonfinite the OR, LAST the AND, length the first packet's."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, exponent=-3, nonfinite=0b10, flags=wire.FLAG_LAST, length=77,
                           blocks={1: vals(1)}))
    target.send(2, contrib(1, exponent=5, nonfinite=0b01, flags=wire.FLAG_LAST, length=77,
                           blocks={0: vals(2)}))
    expect(target, results_to_all(2, rank=1, bitmap=3, exponent=5, nonfinite=0b11, length=77,
                                  flags=wire.FLAG_LAST, blocks={0: vals(2), 1: vals(1)}))


def test_last_flag_needs_every_worker(target):
    """LAST is set in the result only when every contribution set it."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, flags=wire.FLAG_LAST))
    target.send(2, contrib(1))
    expect(target, results_to_all(2, rank=1, bitmap=3, flags=0))


def test_length_mismatch_flagged(target):
    """Workers disagreeing on the tensor length get MISMATCH in the result."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, length=10))
    target.send(2, contrib(1, length=11))
    expect(target, results_to_all(2, rank=1, bitmap=3, length=10, flags=wire.FLAG_MISMATCH))


def test_loss_tolerant_flag_copied_to_result(target):
    """The completing packet's LOSS_TOLERANT flag is carried by the result."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0))
    target.send(2, contrib(1, flags=wire.FLAG_LOSS_TOLERANT))
    expect(target, results_to_all(2, rank=1, bitmap=3, flags=wire.FLAG_LOSS_TOLERANT))


def test_duplicate_incomplete_gets_status(target):
    """A resend before the round completes gets a STATUS with the bitmap so far, unicast."""
    InaEntries(target).setup_job(3)
    target.send(1, contrib(0, blocks={0: vals(1)}, next=[1, 2, 3, 4], flags=wire.FLAG_LAST))
    target.send(1, contrib(0, blocks={0: vals(1)}, next=[1, 2, 3, 4],
                           flags=wire.FLAG_LAST | wire.FLAG_RESEND))
    expect(target, {1: [reply(0, msg_type=wire.MSG_STATUS, rank=0, bitmap=0b1,
                              flags=wire.FLAG_RESEND, next=[1, 2, 3, 4])]})
    assert target.counter("job_duplicates", JOB) == 1
    assert target.counter("job_aggregated", JOB) == 1


def test_duplicate_complete_gets_stored_result(target):
    """A resend after completion gets the stored result back by unicast, not a second add."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: vals(1)}))
    target.send(2, contrib(1, blocks={0: vals(2)}))
    target.received(0.3)
    target.send(1, contrib(0, blocks={0: vals(1)}, flags=wire.FLAG_RESEND))
    expect(target, {1: [reply(0, rank=0, bitmap=3, flags=wire.FLAG_RESEND,
                              blocks={0: add(vals(1), vals(2))})]})
    assert target.counter("job_results", JOB) == 3
    assert target.counter("job_duplicates", JOB) == 1


def test_flush_completes_round_partial_and_multicasts(target):
    """A resend flagged PARTIAL completes the round without the missing worker, for everyone."""
    InaEntries(target).setup_job(3)
    target.send(1, contrib(0, blocks={0: vals(1)}, next=[4, END, END, END]))
    target.send(2, contrib(1, blocks={0: vals(2)}, next=[6, END, END, END]))
    expect_nothing(target)
    target.send(1, contrib(0, blocks={0: vals(1)}, next=[4, END, END, END],
                           flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL))
    expect(target, results_to_all(3, rank=0, bitmap=0b011, flags=wire.FLAG_PARTIAL,
                                  blocks={0: add(vals(1), vals(2))}, next=[4, END, END, END]))
    assert target.counter("job_results", JOB) == 3
    assert target.counter("job_aggregated", JOB) == 2


def test_late_packet_to_flushed_round_gets_stored_result(target):
    """The missing worker's late packet is not added: it gets the stored partial result back."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: vals(1)}))
    target.send(1, contrib(0, blocks={0: vals(1)}, flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL))
    target.received(0.3)
    target.send(2, contrib(1, blocks={0: vals(2)}))
    expect(target, {2: [reply(1, rank=1, bitmap=0b01, flags=wire.FLAG_PARTIAL | wire.FLAG_RESEND,
                              blocks={0: vals(1)})]})
    assert target.counter("job_aggregated", JOB) == 1
    assert target.counter("job_duplicates", JOB) == 2


def test_older_round_is_stale(target):
    """A contribution for an older round of the same shadow copy is dropped as stale."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, round=3))
    target.send(2, contrib(1, round=1))
    expect_nothing(target)
    assert target.counter("job_stale", JOB) == 1
    assert target.register("slot_round", 1) == 3


def test_wrong_epoch_is_stale(target):
    """A packet of another job incarnation (epoch) is counted received and stale, not added."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, epoch=2))
    expect_nothing(target)
    assert target.counter("job_received", JOB) == 1
    assert target.counter("job_stale", JOB) == 1
    assert target.register("slot_bitmap", 1) == 0


def test_newer_round_resets_copy(target):
    """A newer round on a copy starts from zero: slots clean themselves in the data plane."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, round=1, blocks={0: vals(1)}, next=[1, 1, 1, 1]))
    target.send(2, contrib(1, round=1, next=[1, 1, 1, 1]))
    expect(target, results_to_all(2, rank=1, round=1, bitmap=3, blocks={0: vals(1)},
                                  next=[1, 1, 1, 1]))
    target.send(1, contrib(0, round=3, blocks={1: vals(2)}, next=[9, 9, 9, 9]))
    target.send(2, contrib(1, round=3, blocks={1: vals(3)}, next=[8, 9, 9, 9]))
    expect(target, results_to_all(2, rank=1, round=3, bitmap=3,
                                  blocks={1: add(vals(2), vals(3))}, next=[8, 9, 9, 9]))
    assert target.register("slot_values_l0_e1", 1) == 0


def test_shadow_copies_are_independent(target):
    """Rounds r and r+1 of one slot use different copies (idx = 2*slot + round&1)."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, slot=2, round=4, blocks={0: vals(1)}))
    target.send(2, contrib(1, slot=2, round=4))
    expect(target, results_to_all(2, rank=1, slot=2, round=4, bitmap=3, blocks={0: vals(1)}))
    target.send(1, contrib(0, slot=2, round=5, blocks={0: vals(2)}))
    expect_nothing(target)
    assert target.register("slot_round", 4) == 4
    assert target.register("slot_round", 5) == 5
    assert target.register("slot_values_l0_e3", 4) == vals(1)[3] & 0xFFFFFFFF
    assert target.register("slot_values_l0_e3", 5) == vals(2)[3] & 0xFFFFFFFF


def flush_round_without(target, missing: int, nworkers: int, slot: int = 0, round: int = 1):
    """Round `round` of `slot` completed by a flush without rank `missing`; the results to
    everyone consumed."""
    ranks = [r for r in range(nworkers) if r != missing]
    for r in ranks:
        target.send(r + 1, contrib(r, slot=slot, round=round, blocks={0: vals(r)}))
    target.send(1, contrib(ranks[0], slot=slot, round=round, blocks={0: vals(ranks[0])},
                           flags=wire.FLAG_RESEND | wire.FLAG_PARTIAL))
    target.received(0.3)


def test_newer_round_is_held_until_every_worker_reached_the_newest(target):
    """Rank 2 lost round 1's result; round 2 was flushed without it. Round 3 would take round
    1's copy, which rank 2 still needs: held (counted, nothing changed) until rank 2 is heard
    at round 2; rank 2's resend of round 1 still gets that result."""
    InaEntries(target).setup_job(3)
    for r in range(3):
        target.send(r + 1, contrib(r, round=1, blocks={0: vals(r)}))
    target.received(0.3)  # round 1 complete (rank 2's copy of the result is "lost")
    flush_round_without(target, missing=2, nworkers=3, round=2)
    assert (target.register("head_round", 0), target.register("head_heard", 0),
            target.register("head_missing", 0)) == (2, 0b011, 1)
    target.send(1, contrib(0, round=3, blocks={0: vals(9)}))
    target.send(2, contrib(1, round=3, blocks={0: vals(9)}))
    expect_nothing(target)
    assert target.counter("job_held", JOB) == 2
    assert target.register("slot_round", 1) == 1  # round 1's copy kept for rank 2
    assert (target.register("head_round", 0), target.register("head_missing", 0)) == (2, 1)
    target.send(3, contrib(2, round=1, blocks={0: vals(2)}, flags=wire.FLAG_RESEND))
    expect(target, {worker_port(2): [reply(2, rank=2, round=1, bitmap=0b111,
                                           flags=wire.FLAG_RESEND,
                                           blocks={0: add(vals(0), vals(1), vals(2))})]})
    # its round 2 is late (not added) but heard: round 3 may start
    target.send(3, contrib(2, round=2, blocks={0: vals(7)}))
    expect(target, {worker_port(2): [reply(2, rank=2, round=2, bitmap=0b011,
                                           flags=wire.FLAG_PARTIAL | wire.FLAG_RESEND,
                                           blocks={0: add(vals(0), vals(1))})]})
    assert (target.register("head_heard", 0), target.register("head_missing", 0)) == (0b111, 0)
    for r in range(3):
        target.send(r + 1, contrib(r, round=3, blocks={0: vals(r + 3)}))
    expect(target, results_to_all(3, rank=2, round=3, bitmap=0b111,
                                  blocks={0: add(vals(3), vals(4), vals(5))}))
    assert target.counter("job_held", JOB) == 2
    assert (target.register("head_round", 0), target.register("head_missing", 0)) == (3, 0)


def test_held_sender_is_heard_so_the_missing_worker_starts_the_round(target):
    """A held packet marks its sender heard at the newest round (it has that result): when the
    last missing worker's own newer round comes, it starts the round at once."""
    InaEntries(target).setup_job(2)
    flush_round_without(target, missing=1, nworkers=2, round=1)
    assert (target.register("head_round", 0), target.register("head_heard", 0),
            target.register("head_missing", 0)) == (1, 0b01, 1)
    target.send(1, contrib(0, round=2, blocks={0: vals(3)}))  # rank 1 not heard at round 1
    expect_nothing(target)
    assert target.counter("job_held", JOB) == 1
    target.send(2, contrib(1, round=2, blocks={0: vals(4)}))  # missing, so allowed: starts 2
    expect_nothing(target)
    assert (target.register("head_round", 0), target.register("head_heard", 0),
            target.register("head_missing", 0)) == (2, 0b10, 1)
    target.send(1, contrib(0, round=2, blocks={0: vals(3)}, flags=wire.FLAG_RESEND))
    expect(target, results_to_all(2, rank=0, round=2, bitmap=0b11,
                                  blocks={0: add(vals(3), vals(4))}))
    assert target.counter("job_held", JOB) == 1


def test_registers_after_one_contribution(target):
    """Slot registers hold the round, bitmap, count, values and positions after a packet."""
    InaEntries(target).setup_job(3)
    target.send(2, contrib(1, slot=1, round=7, exponent=-2, length=99, blocks={2: vals(5)},
                           next=[3, 4, 5, 6]))
    idx = 2 * 1 + 1
    assert target.register("slot_round", idx) == 7
    assert target.register("slot_bitmap", idx) == 0b10
    assert target.register("slot_count", idx) == 1
    assert target.register("slot_present", idx) == 0b100
    assert target.register("slot_exponent", idx) == (-2) & 0xFFFF
    assert target.register("slot_length", idx) == 99
    assert target.register("slot_next_l3", idx) == 6
    assert target.register("slot_values_l2_e0", idx) == vals(5)[0] & 0xFFFFFFFF
    assert target.register("slot_values_l2_e31", idx) == vals(5)[31] & 0xFFFFFFFF


TRAILER = b"\0" * 6  # Ethernet trailer bytes after the UDP datagram (padding, an FCS kept)


def test_trailer_is_not_copied_into_results(target):
    """A contribution with bytes after its UDP datagram is aggregated; the multicast result
    ends at its UDP length on every copy (BMv2's deparser once kept the trailer)."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: vals(1)}) + TRAILER)
    target.send(2, contrib(1, blocks={0: vals(2)}) + TRAILER)
    expect(target, results_to_all(2, rank=1, bitmap=3, blocks={0: add(vals(1), vals(2))}))
    assert target.counter("job_aggregated", JOB) == 2


def test_trailer_is_not_copied_into_unicast_replies(target):
    """A STATUS reply and a stored result sent back to a resend carry no trailer either."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: vals(1)}) + TRAILER)
    target.send(1, contrib(0, blocks={0: vals(1)}, flags=wire.FLAG_RESEND) + TRAILER)
    expect(target, {1: [reply(0, msg_type=wire.MSG_STATUS, rank=0, bitmap=0b1,
                              flags=wire.FLAG_RESEND)]})
    target.send(2, contrib(1, blocks={0: vals(2)}))
    target.received(0.3)
    target.send(2, contrib(1, blocks={0: vals(2)}, flags=wire.FLAG_RESEND) + TRAILER)
    expect(target, {2: [reply(1, rank=1, bitmap=3, flags=wire.FLAG_RESEND,
                              blocks={0: add(vals(1), vals(2))})]})
