"""Conformance: priority queues, and loss-tolerant INA packets dropped when the egress queue is deep.

Run just this file: python -m pytest bmv2_tests/test_priority.py
(SPINA_TARGETS=soft or bmv2 to pick one target; default both, BMv2 skips if absent.)
The queue depth is forced on the software target (those cases skip on BMv2). The `slow_queue`
cases rate-limit a real egress queue on both targets (BMv2: set_queue_rate over Thrift; the
software switch: Dataplane.set_queue_rate on a virtual clock) and send a burst into it.
"""
from __future__ import annotations

import pytest

from bmv2_tests.helpers import (JOB, SWITCH_MAC, ForwardingEntries, InaEntries, contrib, expect,
                                reply)
from spina import wire


@pytest.fixture
def deep_queue(target):
    if not target.can_force_qdepth:
        pytest.skip(f"{target.name}: enq_qdepth cannot be forced deterministically")
    for port in (1, 2):
        target.set_qdepth(port, 10)
    return target


def test_loss_tolerant_dropped_when_queue_deep(deep_queue):
    """Result copies flagged loss-tolerant are dropped above the threshold and counted."""
    t = deep_queue
    InaEntries(t).setup_job(2)
    ForwardingEntries(t).set_qdepth_threshold(5)
    t.send(1, contrib(0))
    t.send(2, contrib(1, flags=wire.FLAG_LOSS_TOLERANT))
    expect(t, {})
    assert t.counter("job_congestion_drops", JOB) == 2
    assert t.counter("job_results", JOB) == 2


def test_not_loss_tolerant_kept_when_queue_deep(deep_queue):
    """Packets without the loss-tolerant flag are never dropped for congestion."""
    t = deep_queue
    InaEntries(t).setup_job(2)
    ForwardingEntries(t).set_qdepth_threshold(5)
    t.send(1, contrib(0))
    t.send(2, contrib(1))
    expect(t, {1: [reply(0, rank=1, bitmap=3)], 2: [reply(1, rank=1, bitmap=3)]})
    assert t.counter("job_congestion_drops", JOB) == 0


def test_queue_at_threshold_not_dropped(deep_queue):
    """Only a queue deeper than the threshold drops (enq_qdepth > threshold)."""
    t = deep_queue
    InaEntries(t).setup_job(2)
    ForwardingEntries(t).set_qdepth_threshold(10)
    t.send(1, contrib(0))
    t.send(2, contrib(1, flags=wire.FLAG_LOSS_TOLERANT))
    lt = wire.FLAG_LOSS_TOLERANT
    expect(t, {1: [reply(0, rank=1, bitmap=3, flags=lt)],
               2: [reply(1, rank=1, bitmap=3, flags=lt)]})


def test_default_threshold_never_drops(target):
    """Without a controller threshold nothing is dropped for congestion."""
    InaEntries(target).setup_job(2)
    if target.can_force_qdepth:
        target.set_qdepth(1, 1000)
    target.send(1, contrib(0))
    target.send(2, contrib(1, flags=wire.FLAG_LOSS_TOLERANT))
    lt = wire.FLAG_LOSS_TOLERANT
    expect(target, {1: [reply(0, rank=1, bitmap=3, flags=lt)],
                    2: [reply(1, rank=1, bitmap=3, flags=lt)]})


def test_forwarded_loss_tolerant_dropped_when_queue_deep(deep_queue):
    """A loss-tolerant INA packet being forwarded is dropped too (counted by its job)."""
    t = deep_queue
    ForwardingEntries(t).add_l2_entry("02:00:00:00:00:64", 2)
    ForwardingEntries(t).set_qdepth_threshold(0)
    t.send(1, contrib(0, dst_ip="10.0.0.200", flags=wire.FLAG_LOSS_TOLERANT))
    expect(t, {})
    assert t.counter("job_congestion_drops", JOB) == 1


@pytest.fixture
def slow_queue(target):
    """Port 2 sends at most 2 packets a second: a burst to it really queues."""
    if not target.can_rate_limit:
        pytest.skip(f"{target.name}: cannot rate-limit an egress queue (set_queue_rate)")
    target.set_queue_rate(2, 2)
    return target


@pytest.mark.parametrize("threshold, dropped", [(1, True), (10, False)])
def test_real_queue_behind_burst(slow_queue, threshold, dropped):
    """A loss-tolerant INA packet enqueued behind a burst (enq_qdepth 2 or 3: the burst leaves
    at 2 packets a second) is dropped above the threshold and kept below; the burst is kept."""
    t = slow_queue
    fwd = ForwardingEntries(t)
    fwd.add_l2_entry(SWITCH_MAC, 2)
    fwd.set_qdepth_threshold(threshold)
    burst = [contrib(0, dst_ip="10.0.0.200", round=r) for r in (1, 2, 3)]
    lt = contrib(0, dst_ip="10.0.0.200", round=4, flags=wire.FLAG_LOSS_TOLERANT)
    for frame in burst + [lt]:
        t.send(1, frame)
    expect(t, {2: burst + ([] if dropped else [lt])}, timeout=3.0)
    assert t.counter("job_congestion_drops", JOB) == int(dropped)


def test_each_priority_has_its_own_queue(slow_queue):
    """A priority-7 frame sent behind a priority-0 burst on a rate-limited port does not wait
    for the burst (its queue has its own rate clock; at a tie the higher priority leaves
    first): at most the burst's first frame goes before it. Each class keeps its order."""
    t = slow_queue
    ForwardingEntries(t).add_l2_entry(SWITCH_MAC, 2)
    low = [contrib(0, dst_ip="10.0.0.200", round=r, priority=0) for r in (1, 2, 3)]
    high = contrib(0, dst_ip="10.0.0.200", round=4, priority=7)
    for frame in low + [high]:
        t.send(1, frame)
    got = t.received(3.0)
    assert [p for p, _ in got] == [2, 2, 2, 2], got
    frames = [f for _, f in got]
    assert sorted(frames) == sorted(low + [high])
    assert frames.index(high) <= 1, "the priority-7 frame waited behind the priority-0 burst"
    assert [f for f in frames if f != high] == low
    assert t.counter("job_congestion_drops", JOB) == 0


def test_queue_depth_counts_every_priority(slow_queue):
    """enq_qdepth is the port's whole queue, all priorities: a loss-tolerant priority-7 frame
    arriving behind a priority-0 burst sees the burst and is dropped above the threshold."""
    t = slow_queue
    fwd = ForwardingEntries(t)
    fwd.add_l2_entry(SWITCH_MAC, 2)
    fwd.set_qdepth_threshold(1)
    low = [contrib(0, dst_ip="10.0.0.200", round=r, priority=0) for r in (1, 2, 3)]
    lt = contrib(0, dst_ip="10.0.0.200", round=4, priority=7, flags=wire.FLAG_LOSS_TOLERANT)
    for frame in low + [lt]:
        t.send(1, frame)
    expect(t, {2: low}, timeout=3.0)
    assert t.counter("job_congestion_drops", JOB) == 1
