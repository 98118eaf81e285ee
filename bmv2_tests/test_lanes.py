"""Conformance: 16- and 8-bit lanes (docs/bits.md): narrow rows add into the int32 registers,
the result leaves in the round's width, a sum beyond it saturates (job_lane_saturated), another
width than the round's first marks the result MISMATCH (job_lane_mismatch), and a header that
names two widths, or rows of another width than it names, is malformed.

Run just this file: python -m pytest bmv2_tests/test_lanes.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

import pytest

from bmv2_tests.helpers import (
    BS,
    JOB,
    InaEntries,
    contrib,
    expect,
    expect_nothing,
    results_to_all,
)
from spina import wire

L16, L8 = wire.FLAG_LANES16, wire.FLAG_LANES8


def ramp(scale: int, lo: int, hi: int) -> list[int]:
    """BS values that alternate in sign and stay within [lo, hi]."""
    return [max(lo, min(hi, scale * (i + 1) * (-1) ** i)) for i in range(BS)]


@pytest.mark.parametrize("width, scale", [(L16, 700), (L8, 3)], ids=["16-bit", "8-bit"])
def test_narrow_rows_sum_in_their_width(target, width, scale):
    """Two workers' narrow rows, signs mixed: the exact sum in the same width, flagged so."""
    lo, hi = (-(1 << 15), (1 << 15) - 1) if width == L16 else (-128, 127)
    a, b = ramp(scale, lo, hi), ramp(-2 * scale, lo, hi)
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, flags=width, blocks={0: a, 3: b}, next=[4, 5, 6, 7]))
    expect_nothing(target)
    target.send(2, contrib(1, flags=width, blocks={0: b}, next=[4, 5, 6, 2]))
    want = [x + y for x, y in zip(a, b)]
    assert all(lo <= v <= hi for v in want)
    expect(target, results_to_all(2, rank=1, bitmap=0b11, flags=width,
                                  blocks={0: want, 3: b}, next=[4, 5, 6, 2]))
    assert target.counter("job_aggregated", JOB) == 2
    assert target.counter("job_lane_saturated", JOB) == 0
    assert target.counter("job_lane_mismatch", JOB) == 0


def test_a_sum_beyond_the_lane_saturates_and_is_counted_once(target):
    """16-bit sums past +-2**15 are clipped to the lane's range; the result packet counts once."""
    InaEntries(target).setup_job(2)
    up = [30000] * (BS // 2) + [-30000] * (BS // 2)
    target.send(1, contrib(0, flags=L16, blocks={1: up}))
    target.send(2, contrib(1, flags=L16, blocks={1: up}))
    clipped = [32767] * (BS // 2) + [-32768] * (BS // 2)
    expect(target, results_to_all(2, rank=1, bitmap=0b11, flags=L16, blocks={1: clipped}))
    assert target.counter("job_lane_saturated", JOB) == 1


def test_another_width_than_the_rounds_first_is_mismatch(target):
    """A 16-bit round that an 8-bit contribution joins: added (sign-extended), the result in 16
    bits and MISMATCH, counted once in job_lane_mismatch."""
    InaEntries(target).setup_job(2)
    a = ramp(1000, -(1 << 15), (1 << 15) - 1)
    b = ramp(-5, -128, 127)
    target.send(1, contrib(0, flags=L16, blocks={2: a}))
    target.send(2, contrib(1, flags=L8, blocks={2: b}))
    expect(target, results_to_all(2, rank=1, bitmap=0b11, flags=L16 | wire.FLAG_MISMATCH,
                                  blocks={2: [x + y for x, y in zip(a, b)]}))
    assert target.counter("job_lane_mismatch", JOB) == 1


# (case, frame), every one malformed on port 1
MALFORMED = [
    ("two widths named", lambda: contrib(0, flags=L16 | L8, present=0b1, data=b"\0" * 2 * BS)),
    ("int32 rows flagged 16-bit",
     lambda: contrib(0, flags=L16, present=0b1, data=b"\0" * 4 * BS)),
    ("16-bit rows flagged 8-bit",
     lambda: contrib(0, flags=L8, present=0b1, data=b"\0" * 2 * BS)),
]


@pytest.mark.parametrize("frame", [c[1] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_rows_of_another_width_than_named_are_malformed(target, frame):
    InaEntries(target).setup_job(2)
    target.send(1, frame())
    expect_nothing(target)
    assert target.counter("port_malformed", 1) == 1
    assert target.counter("job_received", JOB) == 0
