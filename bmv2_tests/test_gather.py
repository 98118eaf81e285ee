"""Conformance: the all-gather (msg_type gather, docs/protocol.md "All-gather"). A worker's
gather packet leaves unchanged for every other worker of its job (its own copy dropped in
egress), touches no register, and bad ones are dropped and counted.

Run just this file: python -m pytest bmv2_tests/test_gather.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

import pytest

from bmv2_tests.helpers import (
    BS,
    JOB,
    InaEntries,
    K,
    contrib,
    expect,
    expect_nothing,
    reply,
    results_to_all,
    worker_port,
)
from spina import spec, wire

SHARD = {0: list(range(BS)), 2: [-7] * BS, 3: [2**31 - 1] * BS}  # lane 1 absent (a short chunk)
GATHER = dict(msg_type=wire.MSG_GATHER, blocks=SHARD, call=5, round=3, length=3 * BS + 5,
              next=[0, 1, 2, 3], exponent=-4)
# Slot 0's cells (both copies; of the value registers each lane's first and last element) and
# its head registers: the packets below use slot 0.
CELLS = [(name, i) for name in spec.p4_register_names() if not name.startswith("head_")
         and ("_e" not in name or name.endswith(("_e0", f"_e{BS - 1}"))) for i in (0, 1)] + \
        [(name, 0) for name in ("head_round", "head_heard", "head_missing")]


def registers(target) -> dict:
    return {cell: target.register(*cell) for cell in CELLS}


def gathered(sender: int, nworkers: int, **fields) -> dict[int, list[bytes]]:
    """The gather packet of `sender` as each other worker receives it: from the switch."""
    g = {**GATHER, **fields}
    return {worker_port(r): [reply(r, rank=sender, **g)] for r in range(nworkers) if r != sender}


def test_gather_replicated_to_every_other_worker_unchanged(target):
    """Rank 1's chunk reaches ranks 0 and 2 byte for byte (addresses rewritten per worker),
    not rank 1; job_received counts it, no result is counted, no register changes."""
    InaEntries(target).setup_job(3)
    target.send(worker_port(0), contrib(0, blocks={0: [1] * BS}))  # a round in progress
    before = registers(target)
    target.send(worker_port(1), contrib(1, **GATHER))
    expect(target, gathered(1, 3))
    assert target.counter("job_received", JOB) == 2
    assert target.counter("job_results", JOB) == 0
    assert registers(target) == before


def test_gather_request_replicated_like_a_chunk(target):
    """A request (no data, the asked ranks in bitmap) goes to every other worker the same way."""
    InaEntries(target).setup_job(3)
    ask = dict(blocks=None, present=0, bitmap=0b011, flags=wire.FLAG_RESEND)
    target.send(worker_port(2), contrib(2, **{**GATHER, **ask}))
    expect(target, gathered(2, 3, **ask))


def test_gather_between_contributions_leaves_the_round_alone(target):
    """A gather packet between two contributions of a round: the round completes with the sum
    of the contributions alone."""
    InaEntries(target).setup_job(2)
    target.send(worker_port(0), contrib(0, blocks={0: [3] * BS}, length=9))
    target.send(worker_port(0), contrib(0, **GATHER))
    expect(target, gathered(0, 2))
    target.send(worker_port(1), contrib(1, blocks={0: [4] * BS}, length=9))
    expect(target, results_to_all(2, rank=1, bitmap=0b11, blocks={0: [7] * BS}, length=9))


@pytest.mark.parametrize("fields", [dict(job=JOB + 1),
                                    dict(nlanes=K - 1, next=[0] * (K - 1), blocks={0: [1] * BS}),
                                    dict(slot=4), dict(wire_rank=2)],
                         ids=["unknown-job", "other-lanes", "slot-outside", "other-rank"])
def test_gather_unadmitted_dropped_and_counted(target, fields):
    """A gather packet of a job the switch does not have, with sizes or a slot other than the
    job's, or a rank its source is not admitted for: dropped, port_unadmitted."""
    InaEntries(target).setup_job(3)
    target.send(worker_port(1), contrib(1, **{**GATHER, **fields}))
    expect_nothing(target)
    assert target.counter("port_unadmitted", worker_port(1)) == 1
    assert target.counter("job_received", JOB) == 0


def test_gather_larger_than_its_header_says_malformed(target):
    """A chunk longer than its header's sizes (one block more than present says): malformed."""
    InaEntries(target).setup_job(2)
    target.send(worker_port(1), contrib(1, **{**GATHER, "present": 0b1}))
    expect_nothing(target)
    assert target.counter("port_malformed", worker_port(1)) == 1
    assert target.counter("port_unadmitted", worker_port(1)) == 0


def test_gather_of_another_epoch_stale(target):
    """A gather packet of an earlier run (another epoch): received, stale, dropped."""
    InaEntries(target).setup_job(2)
    target.send(worker_port(1), contrib(1, **{**GATHER, "epoch": 2}))
    expect_nothing(target)
    assert target.counter("job_received", JOB) == 1
    assert target.counter("job_stale", JOB) == 1


@pytest.mark.parametrize("level", ["as_spine", "as_leaf"])
def test_gather_of_a_two_level_job_unadmitted(target, level):
    """The all-gather is a flat job's: at a spine or a leaf of the job it is unadmitted."""
    InaEntries(target).setup_job(2)
    params = (None if level == "as_spine"
              else {"rack": 0, "nlocal": 2, "epoch": 1, "mcast_grp": spec.mcast_grp(JOB)})
    target.table_add("job_level", {"job": JOB}, level, params)
    target.send(worker_port(0), contrib(0, **GATHER))
    expect_nothing(target)
    assert target.counter("port_unadmitted", worker_port(0)) == 1
    assert target.counter("port_malformed", worker_port(0)) == 0
