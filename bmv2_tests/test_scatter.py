"""Conformance: the reduce-scatter (docs/protocol.md "Reduce-scatter"). A contribution's
bitmap names the ranks owning its round's blocks: the round is summed as an all-reduce's, the
result's copy for an owner is whole, and the copy for any other rank is its header and next
positions only (present and nonfinite 0, no block, IPv4 and UDP lengths to match); a resend
to the complete round is answered the same way to its sender; bitmap 0 strips nothing.

Run just this file: python -m pytest bmv2_tests/test_scatter.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

from bmv2_tests.helpers import BS, JOB, InaEntries, contrib, expect, reply, worker_port
from spina import wire

END = wire.END
NEXT = [5, 6, END, 8]


def vals(seed: int) -> list[int]:
    return [(seed * 1000 + i) * (-1) ** i for i in range(BS)]


def add(a, b):
    return [x + y for x, y in zip(a, b)]


def copies(nworkers: int, owners: int, **fields) -> dict[int, list[bytes]]:
    """The result with `fields` to each worker: whole to the owners, header-only to the rest."""
    head = {k: v for k, v in fields.items() if k not in ("blocks", "nonfinite")}
    return {worker_port(r): [reply(r, **(fields if owners >> r & 1 else head))]
            for r in range(nworkers)}


def test_result_whole_to_owners_header_to_the_rest(target):
    """3 workers, a round owned by rank 1: rank 1 gets the sums, ranks 0 and 2 the header with
    the round's bitmap, flags, exponent and next positions; counters as an all-reduce's."""
    InaEntries(target).setup_job(3)
    for r in range(3):
        target.send(worker_port(r), contrib(r, bitmap=0b010, blocks={0: vals(r), 3: vals(r + 5)},
                                            next=NEXT, exponent=r, nonfinite=0b1000 * (r == 1)))
    expect(target, copies(3, 0b010, rank=2, bitmap=0b111, exponent=2, nonfinite=0b1000,
                          blocks={0: add(add(vals(0), vals(1)), vals(2)),
                                  3: add(add(vals(5), vals(6)), vals(7))}, next=NEXT))
    assert target.counter("job_results", JOB) == 3
    assert target.counter("job_aggregated", JOB) == 3


def test_two_owners_and_narrow_lanes(target):
    """A round across a shard boundary (owners 0 and 2 of 3) in 16-bit lanes: both owners get
    the int16 sums, rank 1 the header (its lanes16 flag kept)."""
    InaEntries(target).setup_job(3)
    f = wire.FLAG_LANES16
    for r in range(3):
        target.send(worker_port(r), contrib(r, bitmap=0b101, flags=f, blocks={1: [r + 1] * BS}))
    expect(target, copies(3, 0b101, rank=2, bitmap=0b111, flags=f, blocks={1: [6] * BS}))


def test_resend_to_a_complete_round_answered_per_owner(target):
    """After the round, a non-owner's resend gets the stored result's header only, an owner's
    the whole result, each to its sender alone."""
    InaEntries(target).setup_job(2)
    for r in range(2):
        target.send(worker_port(r), contrib(r, bitmap=0b10, blocks={2: vals(r)}))
    target.received(0.3)
    for r in range(2):
        target.send(worker_port(r), contrib(r, bitmap=0b10, blocks={2: vals(r)},
                                            flags=wire.FLAG_RESEND))
        fields = dict(rank=r, bitmap=0b11, flags=wire.FLAG_RESEND)
        if r == 1:
            fields["blocks"] = {2: add(vals(0), vals(1))}
        expect(target, {worker_port(r): [reply(r, **fields)]})
    assert target.counter("job_duplicates", JOB) == 2


def test_status_and_bitmap_zero_unchanged(target):
    """A resend to an incomplete round gets the status (no data either way); a round with
    bitmap 0 (an all-reduce) goes whole to every worker."""
    InaEntries(target).setup_job(2)
    target.send(worker_port(0), contrib(0, bitmap=0b10, blocks={0: vals(1)}, next=NEXT))
    target.send(worker_port(0), contrib(0, bitmap=0b10, blocks={0: vals(1)}, next=NEXT,
                                        flags=wire.FLAG_RESEND))
    expect(target, {worker_port(0): [reply(0, msg_type=wire.MSG_STATUS, rank=0, bitmap=0b1,
                                           flags=wire.FLAG_RESEND, next=NEXT)]})
    target.send(worker_port(1), contrib(1, bitmap=0b10, blocks={0: vals(2)}, next=NEXT))
    target.received(0.3)
    for r in range(2):
        target.send(worker_port(r), contrib(r, slot=1, blocks={0: vals(r)}))
    expect(target, copies(2, 0b11, slot=1, rank=1, bitmap=0b11,
                          blocks={0: add(vals(0), vals(1))}))


def test_status_and_flush_carry_no_other_owners_data(target):
    """A status never carries data: the slot holds the owner's blocks (rank 1 of 3), and a
    resend of non-owner rank 0 to the incomplete round gets the status, header and next
    positions only. Its flush (FLAG_PARTIAL) completes the round: the owner gets the partial
    sum whole, ranks 0 and 2 its header only (the result's flags: the slot's PARTIAL)."""
    InaEntries(target).setup_job(3)
    target.send(worker_port(1), contrib(1, bitmap=0b010, blocks={0: vals(1)}, next=NEXT))
    target.send(worker_port(0), contrib(0, bitmap=0b010, blocks={0: vals(0)}, next=NEXT))
    expect(target, {})  # the round waits for rank 2
    target.send(worker_port(0), contrib(0, bitmap=0b010, blocks={0: vals(0)}, next=NEXT,
                                        flags=wire.FLAG_RESEND))
    expect(target, {worker_port(0): [reply(0, msg_type=wire.MSG_STATUS, rank=0, bitmap=0b011,
                                           flags=wire.FLAG_RESEND, next=NEXT)]})
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    target.send(worker_port(0), contrib(0, bitmap=0b010, blocks={0: vals(0)}, next=NEXT,
                                        flags=flush))
    expect(target, copies(3, 0b010, rank=0, bitmap=0b011, flags=wire.FLAG_PARTIAL,
                          blocks={0: add(vals(0), vals(1))}, next=NEXT))
    assert target.counter("job_duplicates", JOB) == 2
