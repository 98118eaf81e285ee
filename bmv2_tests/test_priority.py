"""Conformance: priority queues, and the congestion drop of loss-tolerant INA contributions
within each job's loss budget (p4src/v1model/priority.p4; docs/dlcp.md, "Switch").

Run just this file: python -m pytest bmv2_tests/test_priority.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
The queue depth is forced on the software target (those cases skip on BMv2). The `slow_queue`
cases rate-limit a real egress queue on both targets (BMv2: set_queue_rate over Thrift; the
software switch: Dataplane.set_queue_rate on a virtual clock) and send a burst into it.

The budget rule every expectation here is computed from (`budget`): per contribution of a job
with a `congestion` entry, credit = min(credit + bound, LOSS_CREDIT_MAX); a loss-tolerant one
whose queue is deeper than the threshold is dropped iff credit >= LOSS_CREDIT_ONE, paying it.
"""
from __future__ import annotations

import pytest

from bmv2_tests.helpers import (
    JOB,
    SWITCH_MAC,
    ForwardingEntries,
    InaEntries,
    contrib,
    expect,
    reply,
)
from spina import spec, wire

ONE, CAP = spec.LOSS_CREDIT_ONE, spec.LOSS_CREDIT_MAX
LT = wire.FLAG_LOSS_TOLERANT
REMOTE = "10.0.0.200"  # not the switch's INA address: the contribution is forwarded


@pytest.fixture(autouse=True)
def _zero_credit(request):
    """Every job's credit cell a test uses starts at 0 (BMv2's reset leaves it)."""
    if "target" in request.fixturenames:
        t = request.getfixturevalue("target")
        t.registers.clear(["job_loss_credit"], JOB, 2)


def set_congestion(t, qdepth: int, bound: int, job: int = JOB):
    """The controller's entry for `job`: drop above `qdepth`, `bound` / LOSS_CREDIT_ONE."""
    t.table_add("congestion", {"job": job}, "set_congestion", {"qdepth": qdepth, "bound": bound})


def forwarded(round: int, flags: int = 0, job: int = JOB, priority: int = 0) -> bytes:
    """A contribution passing through this switch on its way to another aggregator."""
    return contrib(0, dst_ip=REMOTE, round=round, flags=flags, job=job, priority=priority)


def budget(flags_seq, bound: int, congested=None, credit: int = 0) -> tuple[list[bool], int]:
    """Which packets of the sequence the switch drops (all congested unless said), and the
    credit left: the rule in priority.p4, written independently of both targets."""
    drops = []
    for i, flags in enumerate(flags_seq):
        credit = min(credit + bound, CAP)
        drop = bool(flags & LT) and (congested is None or congested[i]) and credit >= ONE
        if drop:
            credit -= ONE
        drops.append(drop)
    return drops, credit


@pytest.fixture
def deep_queue(target):
    if not target.can_force_qdepth:
        pytest.skip(f"{target.name}: enq_qdepth cannot be forced deterministically")
    for port in (1, 2):
        target.set_qdepth(port, 10)
    ForwardingEntries(target).add_l2_entry(SWITCH_MAC, 2)
    return target


def test_results_never_dropped(deep_queue):
    """Result copies are never dropped for congestion, even flagged loss-tolerant with the
    largest bound and a deep queue: the aggregating switch consumed the contributions in
    ingress, and a lost result would cost a resend, not gradient."""
    t = deep_queue
    InaEntries(t).setup_job(2)
    set_congestion(t, 0, ONE - 1)
    t.send(1, contrib(0, flags=LT))
    t.send(2, contrib(1, flags=LT))
    expect(t, {1: [reply(0, rank=1, bitmap=3, flags=LT)],
               2: [reply(1, rank=1, bitmap=3, flags=LT)]})
    assert t.counter("job_congestion_drops", JOB) == 0
    assert t.counter("job_congestion_seen", JOB) == 0
    assert t.counter("job_results", JOB) == 2
    assert t.register("job_loss_credit", JOB) == 0


def test_only_loss_tolerant_contributions_dropped(deep_queue):
    """At a 50% bound a forwarded loss-tolerant contribution is dropped every second packet;
    one without the flag is never dropped but earns credit; all are seen."""
    t = deep_queue
    set_congestion(t, 5, ONE // 2)
    frames = [forwarded(1, LT), forwarded(2, LT), forwarded(3), forwarded(4, LT),
              forwarded(5, LT)]
    for f in frames:
        t.send(1, f)
    # credit: .5 keep, 1 -> drop (0), .5 keep (no flag), 1 -> drop (0), .5 keep
    expect(t, {2: [frames[0], frames[2], frames[4]]})
    assert t.counter("job_congestion_drops", JOB) == 2
    assert t.counter("job_congestion_seen", JOB) == 5
    assert t.register("job_loss_credit", JOB) == ONE // 2


def test_queue_at_threshold_not_dropped(deep_queue):
    """Only a queue deeper than the threshold drops (enq_qdepth > threshold); the packet still
    earns its job credit."""
    t = deep_queue
    set_congestion(t, 10, ONE - 1)
    frames = [forwarded(r, LT) for r in (1, 2, 3)]
    for f in frames:
        t.send(1, f)
    expect(t, {2: frames})
    assert t.counter("job_congestion_drops", JOB) == 0
    assert t.counter("job_congestion_seen", JOB) == 3
    assert t.register("job_loss_credit", JOB) == 3 * (ONE - 1)


def test_no_entry_never_drops(target):
    """A job without a congestion entry (bound 0: the controller installs none) is never
    dropped, however deep the queue, and spends no register."""
    ForwardingEntries(target).add_l2_entry(SWITCH_MAC, 2)
    if target.can_force_qdepth:
        target.set_qdepth(2, 1000)
    frames = [forwarded(r, LT) for r in (1, 2, 3)]
    for f in frames:
        target.send(1, f)
    expect(target, {2: frames})
    assert target.counter("job_congestion_drops", JOB) == 0
    assert target.counter("job_congestion_seen", JOB) == 0
    assert target.register("job_loss_credit", JOB) == 0


@pytest.mark.parametrize("bound", [1, spec.loss_bound(0.01), spec.loss_bound(0.1), ONE // 3,
                                   ONE - 1])
def test_budget_exact_packet_by_packet(deep_queue, bound):
    """100 contributions, every third without the flag: exactly the packets the budget rule
    picks are dropped, and the counters and credit register are exact."""
    t = deep_queue
    set_congestion(t, 0, bound)
    flags = [0 if i % 3 == 2 else LT for i in range(100)]
    frames = [forwarded(i + 1, f) for i, f in enumerate(flags)]
    for f in frames:
        t.send(1, f)
    drops, credit = budget(flags, bound)
    expect(t, {2: [f for f, d in zip(frames, drops) if not d]})
    assert t.counter("job_congestion_drops", JOB) == sum(drops)
    assert t.counter("job_congestion_seen", JOB) == 100
    assert t.register("job_loss_credit", JOB) == credit


@pytest.mark.parametrize("bounded_loss", [0.01, 0.1])
def test_lying_host_capped_at_bound(deep_queue, bounded_loss):
    """A host that flags every packet loss-tolerant loses exactly floor(k x bound) of k
    packets, never more than its job's bounded_loss."""
    t = deep_queue
    bound = spec.loss_bound(bounded_loss)
    set_congestion(t, 0, bound)
    k = 300
    for r in range(k):
        t.send(1, forwarded(r + 1, LT))
    got = t.received(0.5)
    drops = k * bound // ONE
    assert len(got) == k - drops
    assert t.counter("job_congestion_drops", JOB) == drops == (29 if bounded_loss == 0.1 else 2)
    assert drops <= bounded_loss * k
    assert t.counter("job_congestion_seen", JOB) == k
    assert t.register("job_loss_credit", JOB) == k * bound - drops * ONE


def test_two_jobs_budgets_independent(deep_queue):
    """Interleaved jobs keep their own credit: job A at 50%, job B at 25%; B's packets never
    pay for A's drops."""
    t = deep_queue
    a, b = JOB, JOB + 1
    set_congestion(t, 0, ONE // 2, job=a)
    set_congestion(t, 0, ONE // 4, job=b)
    frames = [forwarded(i // 2 + 1, LT, job=(a, b)[i % 2]) for i in range(16)]
    for f in frames:
        t.send(1, f)
    drops_a, _ = budget([LT] * 8, ONE // 2)
    drops_b, _ = budget([LT] * 8, ONE // 4)
    keep = [not d for pair in zip(drops_a, drops_b) for d in pair]
    expect(t, {2: [f for f, k in zip(frames, keep) if k]})
    assert (t.counter("job_congestion_drops", a), t.counter("job_congestion_drops", b)) == (4, 2)
    assert (t.counter("job_congestion_seen", a), t.counter("job_congestion_seen", b)) == (8, 8)
    assert (t.register("job_loss_credit", a), t.register("job_loss_credit", b)) == (0, 0)


@pytest.fixture
def slow_queue(target):
    """Port 2's priority queues send at most 2 packets a second each: a burst really queues."""
    if not target.can_rate_limit:
        pytest.skip(f"{target.name}: cannot rate-limit an egress queue (set_queue_rate)")
    target.set_queue_rate(2, 2)
    ForwardingEntries(target).add_l2_entry(SWITCH_MAC, 2)
    return target


@pytest.mark.parametrize("threshold, dropped", [(1, True), (10, False)])
def test_real_queue_behind_burst(slow_queue, threshold, dropped):
    """A loss-tolerant contribution enqueued behind a burst (enq_qdepth 2 or 3: the burst
    leaves at 2 packets a second) is dropped above the threshold and kept below (the burst
    earned the credit, and egress runs at departure, after the burst); the burst is kept."""
    t = slow_queue
    set_congestion(t, threshold, ONE - 1)
    burst = [forwarded(r) for r in (1, 2, 3)]
    lt = forwarded(4, LT)
    for frame in burst + [lt]:
        t.send(1, frame)
    expect(t, {2: burst + ([] if dropped else [lt])}, timeout=3.0)
    assert t.counter("job_congestion_drops", JOB) == int(dropped)
    assert t.counter("job_congestion_seen", JOB) == 4
    assert t.register("job_loss_credit", JOB) == 4 * (ONE - 1) - int(dropped) * ONE


def test_budget_on_real_queue(slow_queue):
    """Three plugs hold a real queue deep (rate 2/s), then 12 loss-tolerant contributions at a
    25% bound: egress sees them in queue order, so exactly the rule's drops happen."""
    t = slow_queue
    t.set_queue_rate(2, 5)
    set_congestion(t, 0, ONE // 4)
    plugs = [forwarded(r) for r in (1, 2, 3)]
    lts = [forwarded(r, LT) for r in range(4, 16)]
    for f in plugs + lts:
        t.send(1, f)
    drops, credit = budget([0] * 3 + [LT] * 12, ONE // 4)
    assert sum(drops) == 3  # 15 x 0.25 = 3.75
    expect(t, {2: [f for f, d in zip(plugs + lts, drops) if not d]}, timeout=4.0)
    assert t.counter("job_congestion_drops", JOB) == 3
    assert t.counter("job_congestion_seen", JOB) == 15
    assert t.register("job_loss_credit", JOB) == credit == 15 * (ONE // 4) - 3 * ONE


def test_high_priority_never_dropped_while_loss_tolerant_queued(slow_queue):
    """Priority-7 contributions sent among queued loss-tolerant priority-0 ones, with the
    budget allowing every drop: every high-priority packet arrives on its own queue's clock
    (the i-th waits for at most i + 1 frames of the priority-0 burst, never for the backlog);
    every loss-tolerant one queued behind the burst is dropped."""
    t = slow_queue
    set_congestion(t, 1, ONE - 1)
    burst = [forwarded(r) for r in (1, 2, 3)]
    high = [forwarded(r, priority=7) for r in (5, 7, 9)]
    lts = [forwarded(r, LT) for r in (4, 6, 8)]
    for f in burst + [x for pair in zip(lts, high) for x in pair]:
        t.send(1, f)
    got = t.received(4.0)
    frames = [f for _, f in got]
    assert [p for p, _ in got] == [2] * 6
    assert sorted(frames) == sorted(burst + high)
    assert all(frames.index(h) <= 2 * i + 1 for i, h in enumerate(high)), \
        "a priority-7 packet waited behind the priority-0 backlog"
    assert [f for f in frames if f in high] == high
    assert [f for f in frames if f in burst] == burst
    assert t.counter("job_congestion_drops", JOB) == 3
    assert t.counter("job_congestion_seen", JOB) == 9
    # Six packets without the flag left first and filled the credit to its cap; each drop then
    # paid ONE and the next packet earned ONE - 1 back, capped again at CAP.
    assert t.register("job_loss_credit", JOB) == CAP - ONE - 2


def test_each_priority_has_its_own_queue(slow_queue):
    """A priority-7 frame sent behind a priority-0 burst on a rate-limited port does not wait
    for the burst (its queue has its own rate clock; at a tie the higher priority leaves
    first): at most the burst's first frame goes before it. Each class keeps its order."""
    t = slow_queue
    low = [forwarded(r, priority=0) for r in (1, 2, 3)]
    high = forwarded(4, priority=7)
    for frame in low + [high]:
        t.send(1, frame)
    got = t.received(3.0)
    assert [p for p, _ in got] == [2, 2, 2, 2], got
    frames = [f for _, f in got]
    assert sorted(frames) == sorted(low + [high])
    assert frames.index(high) <= 1, "the priority-7 frame waited behind the priority-0 burst"
    assert [f for f in frames if f != high] == low
    assert t.counter("job_congestion_drops", JOB) == 0


def test_queue_depth_is_the_packets_own_priority_queue(slow_queue):
    """enq_qdepth is the depth of the packet's own priority queue (BMv2 1.15.5:
    egress_buffers.size(port, priority)): a loss-tolerant priority-7 contribution behind a
    priority-0 burst sees no burst and passes, with credit to spare; a loss-tolerant
    priority-0 one behind the same burst sees it and is dropped."""
    t = slow_queue
    set_congestion(t, 1, ONE - 1)
    earner = forwarded(1, priority=7)
    low = [forwarded(r, priority=0) for r in (2, 3, 4)]
    lt7 = forwarded(5, LT, priority=7)
    lt0 = forwarded(6, LT, priority=0)
    for frame in [earner] + low + [lt7, lt0]:
        t.send(1, frame)
    got = t.received(3.0)
    assert sorted(f for _, f in got) == sorted([earner] + low + [lt7])
    assert t.counter("job_congestion_drops", JOB) == 1
