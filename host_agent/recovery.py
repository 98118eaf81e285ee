"""Loss recovery of the host agent: when a round in flight is sent again.

Every slot has one round in flight; the switch answers a round with its result (multicast when
the last worker's contribution arrives) or, to a resend of a round still incomplete, with a
status naming who contributed. A round is resent on one of four triggers, all decided here:

  fast retransmit  (RACK, RFC 8985) the switch serves contributions first in, first out, and
                   every worker sends its rounds in the order their previous results arrived,
                   so rounds complete in the order they were sent (within a slot group, the
                   slots one switch aggregates: JobConfig.slot_groups for a job sharded over
                   spines, whose queues reorder across groups). A round is lost once a round
                   first sent after its latest transmission has completed and it has been out
                   longer than that round's latency plus a reorder window; or a round of
                   another group first sent after it has completed and it has been out longer
                   than twice its own group's latency (at least min_rto) plus the window (a
                   group of 2 slots often has no round of its own to compare with). Fires again
                   for a lost resend, with no timer: most losses cost about one round trip.
  timeout          (RTO, RFC 6298) for what fast retransmit cannot see: the rounds nothing was
                   sent after (the tail of a call) and a switch that does not answer. One timer
                   per call, as TCP has one per connection: it runs from the call's last result
                   (or last timeout resend) for srtt + 4 rttvar of the measured round latency,
                   at least `min_rto` (a few ms by default); on expiry the oldest round in
                   flight is resent (from the second expiry in a row on, with every round not
                   sent for a timeout) and the timer doubles (up to MAX_RTO) until a result
                   arrives. A switch that is
                   slow but answering restarts the timer with every result, so it never sees
                   a burst of resends. Only Karn-clean rounds (never
                   resent) are timed, and a resend that turns out to be spurious (its round's
                   result arrives twice) gives the estimator the true latency (Eifel, RFC 3522).
                   The timer fires only if it had expired when the agent last found its socket
                   empty: a descheduled agent that wakes up to a full socket reads its results
                   before it resends anything.
  flush            bounded-loss mode (opt-in): a round older than the job's loss deadline (fixed
                   seconds, or `auto`: AUTO_DEADLINE_MULT x the smoothed latency of its slot
                   group's rounds, within AUTO_DEADLINE_MIN..AUTO_DEADLINE_MAX) is
                   resent flagged PARTIAL while the call's partial rounds fit its budget,
                   counting this agent's flushes in flight as partial already (several rounds
                   may pass the deadline at once; see Recovery.due). One rank per call flushes
                   (the call's flusher, rotating call by call): agents do not see each other's
                   flushes in flight, so two flushing agents could together exceed the budget.
  after a partial  bounded-loss mode: when a slot's round completed PARTIAL without another
                   worker, the switch holds the slot's next round until that worker has been
                   heard (docs/reliability.md, "A newer round waits for every worker"); held
                   packets get no answer, so the round is resent once after the round trip and
                   reorder window instead of waiting for a timeout.

docs/aggregation.md ("Loss, duplicates and failures") and docs/reliability.md describe it.
"""
from __future__ import annotations

from dataclasses import dataclass

from spina import wire

INITIAL_RTO = 0.2  # s, before the first latency sample (TCP uses 1 s; a switch is one hop)
MIN_RTO = 0.005    # s, default floor: round latencies here are 0.1-20 ms, variance covers load
MAX_RTO = 2.0      # s: a slow switch (BMv2 serves 150-300 packets/s) may take this per window
REORDER_MIN = 0.001  # s, smallest reorder window of the fast retransmit
# A round of another slot group (another spine) answered first marks a round lost once it has
# waited this many times its own group's smoothed latency (at least min_rto) plus the reorder
# window: twice, as RFC 8985's probe timeout waits 2 srtt where no ordering is known. Once
# (with no floor) made 63 spurious resends in 20 lossless calls of 8 workers over 2 spines.
OTHER_GROUP_MULT = 2.0
# The `auto` loss deadline (bounded loss): a round is flushed once it has waited this many
# times its slot group's smoothed round latency, so a round flushes when it is clearly late
# on the fabric at hand instead of after a fixed time that suits some other one. Twice: a
# round merely queued behind others takes about one latency, and flushing one that is only
# late costs a partial round and holds the slot's next round (docs/reliability.md).
AUTO_DEADLINE_MULT = 2.0
AUTO_DEADLINE_MIN = 0.002  # s: below this a loaded host's scheduling alone makes rounds late
AUTO_DEADLINE_MAX = 0.05   # s: never longer than the fixed default (and before any sample)


class RttEstimator:
    """Round latency of one agent (kept across calls) and its retransmission timeout."""

    def __init__(self, min_rto: float = MIN_RTO, max_rto: float = MAX_RTO):
        self.min_rto, self.max_rto = min_rto, max_rto
        self.srtt: float | None = None
        self.rttvar = 0.0
        # Learned floor: the latency of the latest round whose timeout proved spurious (it
        # completed by itself, its result came twice): a loaded machine stalls longer than
        # srtt + 4 rttvar foresees. Decays by a quarter per call without such a timeout.
        self.floor = 0.0
        # Reorder window multiplier (RFC 8985 6.2): rounds may complete out of send order (a
        # job's slots sharded over spines with different queues), so each fast retransmit
        # found spurious widens the window by srtt/4, up to srtt; 16 calls without one reset it.
        self.reorder_mult = 1
        self.calls_in_order = 0
        # Per slot group (JobConfig.slot_groups): the smoothed latency of its rounds, for the
        # `auto` loss deadline (groups on different spines see different queues).
        self.group_srtt: dict[int, float] = {}

    def spurious_fast_retransmit(self) -> None:
        """A fast retransmit was not needed (its round's result came twice): rounds complete
        further out of order than the window allowed."""
        self.reorder_mult = min(4, self.reorder_mult + 1)
        self.calls_in_order = 0

    def spurious_timeout(self, latency: float) -> None:
        """A round timed out but was not lost: it took `latency`; wait at least that long."""
        self.floor = min(self.max_rto, max(self.floor, latency))

    def call_done(self, spurious_timeouts: int, spurious_fast: int = 0) -> None:
        if not spurious_timeouts:
            self.floor *= 0.75
        if not spurious_fast:
            self.calls_in_order += 1
            if self.calls_in_order >= 16:
                self.reorder_mult, self.calls_in_order = 1, 0

    def sample(self, seconds: float, group: int = 0) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = seconds, seconds / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - seconds)
            self.srtt = 0.875 * self.srtt + 0.125 * seconds
        g = self.group_srtt.get(group)
        self.group_srtt[group] = seconds if g is None else 0.875 * g + 0.125 * seconds

    def loss_deadline(self, group: int = 0) -> float:
        """The `auto` loss deadline of a round of slot group `group`: AUTO_DEADLINE_MULT x the
        group's smoothed round latency (the agent's, before the group has a sample), within
        AUTO_DEADLINE_MIN..AUTO_DEADLINE_MAX; AUTO_DEADLINE_MAX before any sample."""
        srtt = self.group_srtt.get(group, self.srtt)
        if srtt is None:
            return AUTO_DEADLINE_MAX
        return min(AUTO_DEADLINE_MAX, max(AUTO_DEADLINE_MIN, AUTO_DEADLINE_MULT * srtt))

    @property
    def rto(self) -> float:
        base = INITIAL_RTO if self.srtt is None else self.srtt + 4 * self.rttvar
        return min(self.max_rto, max(self.min_rto, self.floor, base))

    @property
    def reorder_window(self) -> float:
        return max(REORDER_MIN, self.reorder_mult * (self.srtt or 0.0) / 4)


@dataclass(slots=True)
class Timer:
    """Transmissions and answers of one slot's round in flight."""
    seq: int = 0               # send order of the round's first transmission in the call
    last_seq: int = 0          # ... of its latest transmission (or of a status reply to it)
    first_sent_at: float = 0.0
    sent_at: float = 0.0       # latest transmission (or status reply)
    resends: int = 0
    timed_out: bool = False    # resent on a timeout (not only by fast retransmit)
    statuses: int = 0          # status replies: the switch has our contribution, others missing
    flush: bool = False        # resends of this round ask the switch to complete it now
    flushable: bool = True     # bounded loss may complete this round without every worker
    progress_at: float = 0.0   # last result of this slot (the call's no-progress timeout)
    last_bitmap: int = 0       # contributors named by the last status reply
    unanswered: int = 0        # resends since the switch last answered this slot
    prev_round: int = -1       # the slot's previous round, for late duplicates of its result
    prev_resends: int = 0
    prev_timed_out: bool = False
    prev_latency: float = 0.0  # first transmission to first (multicast) result, or 0
    # The previous round completed PARTIAL without another worker: the switch holds this
    # round until that worker has been heard (docs/reliability.md), so resend it once early.
    hold_risk: bool = False
    held_for: int = 0          # ... until these ranks (bitmap) are heard (the timeout names them)
    group: int = 0             # its slot's group (JobConfig.slot_groups): fast retransmit compares
                               # rounds of one group only
    hold_resent: bool = False  # ... and it was (a resend that proves spurious says nothing of
    prev_hold_resent: bool = False  # reordering: it does not widen the reorder window)


def flusher_rank(call_id: int, nworkers: int) -> int:
    """The one rank that may flush call `call_id`'s rounds (bounded loss). Every rank numbers
    its calls alike (the wire's call id), so all agree without a message; rotating spreads the
    flushes' extra datagrams over the ranks. A round that misses only the flusher's own
    contribution completes when that contribution's resend arrives."""
    return call_id % nworkers


class Recovery:
    """Which rounds of one call to resend, and when. The agent transmits; this decides.

    Args:
        rtt: the agent's latency estimator (updated here).
        timers: one Timer per slot of the window.
        now: the call's start.
        bounded_loss, loss_deadline: the job's bounded-loss settings (0: exact mode); a
            loss_deadline of None: `auto`, from the round latency (RttEstimator.loss_deadline).
        budget_rounds: partial rounds the call may have (bounded loss).
        flusher: this agent is the call's one flusher (`flusher_rank`); the others never flush.
    """

    def __init__(self, rtt: RttEstimator, timers: list[Timer], now: float,
                 bounded_loss: float = 0.0, loss_deadline: float | None = 0.0,
                 budget_rounds: float = 0.0,
                 flusher: bool = True):
        self.rtt, self.timers = rtt, timers
        self.bounded_loss, self.loss_deadline = bounded_loss, loss_deadline
        self.budget_rounds = budget_rounds
        self.flusher = flusher
        self.partial_rounds = 0  # rounds of the call completed PARTIAL (by anyone's flush)
        self.flushing = 0        # own flushes whose round has not completed yet
        self.seq = 0            # transmissions so far (send order)
        # Per slot group: (send order of the latest-sent transmission known answered, its
        # latency). Rounds complete in send order within a group (one switch), not across
        # groups (a two-level job's slots sharded over spines with their own queues).
        self.rack: dict[int, tuple[int, float]] = {}
        self.drained_at = now   # when the agent last found its socket empty
        self.timer_from = now   # the call's timer runs from here (last result or timeout)
        self.backoff = 0        # timeouts since the last result
        self.spurious = 0       # resends found unnecessary (the round's result came twice, or a
                                # status reply then the multicast result: nothing of ours lost)
        self.fast_resends = self.timeout_resends = self.hold_resends = 0
        self.spurious_timeouts = self.spurious_fast = 0
        # The latest transmission (or status reply) of each round in flight, by its send order
        # (dict order is insertion order, and seq grows): the first key is the oldest.
        self.flying: dict[int, Timer] = {}
        # A round completed while an older one is still in flight: fast retransmit may be due
        # before the time wait() gave (the agent asks due() at its next chance).
        self.recheck = False
        for tm in timers:
            tm.progress_at = now

    # ---------------------------------------------------------------- events
    def drained(self, now: float) -> None:
        """The agent found its socket empty: from now on an expired timer may fire (a
        descheduled agent reads the results waiting for it before it resends anything)."""
        self.drained_at = now

    def sent(self, tm: Timer, now: float, flushable: bool = True) -> None:
        """A new round's first transmission (`flushable`: bounded loss may complete it without
        every worker; not a setup round, whose exponent every worker must see)."""
        self.seq += 1
        self.flying.pop(tm.last_seq, None)
        self.flying[self.seq] = tm
        tm.seq = tm.last_seq = self.seq
        tm.first_sent_at = tm.sent_at = now
        tm.resends = tm.statuses = 0
        tm.flush = tm.timed_out = tm.hold_resent = False
        tm.flushable = flushable

    def resent(self, tm: Timer, now: float) -> None:
        self.seq += 1
        self.flying.pop(tm.last_seq, None)
        self.flying[self.seq] = tm
        tm.last_seq = self.seq
        tm.sent_at = now
        tm.resends += 1
        tm.unanswered += 1

    @staticmethod
    def resend_flags(tm: Timer) -> int:
        """The flags a resend of `tm`'s round adds: RESEND, and PARTIAL (complete it without
        the missing workers) once the round is flushed."""
        return wire.FLAG_RESEND | (wire.FLAG_PARTIAL if tm.flush else 0)

    def status(self, tm: Timer, bitmap: int, now: float) -> None:
        """The switch has our contribution to the round; `bitmap` names every contributor.
        Only the missing ranks can complete it: fast retransmit waits for newer evidence."""
        tm.last_bitmap = bitmap
        tm.statuses += 1
        tm.unanswered = 0
        self.seq += 1
        self.flying.pop(tm.last_seq, None)
        self.flying[self.seq] = tm
        tm.last_seq, tm.sent_at = self.seq, now

    def result(self, tm: Timer, round_: int, now: float, multicast: bool, partial: bool,
               held_for: int = 0) -> None:
        """The round in flight completed (`multicast`: the completion itself, not a stored
        result returned to a resend; `held_for`: the ranks (bitmap) a PARTIAL result lacks while
        it has ours: the switch holds the slot's next round until they are heard)."""
        tm.progress_at = self.timer_from = now
        tm.unanswered = 0
        self.backoff = 0
        self.flying.pop(tm.last_seq, None)
        latency = now - tm.first_sent_at
        if tm.resends == 0:  # Karn: only rounds sent once are timed
            self.rtt.sample(latency, tm.group)
            # Only rounds sent once say anything about the order: every worker sent them in
            # the order their previous results arrived, the same order at every worker.
            if tm.seq > self.rack.get(tm.group, (0, 0.0))[0]:
                self.rack[tm.group] = (tm.seq, latency)
                # out of send order: a round sent before this one is still in flight
                if self.flying and next(iter(self.flying)) < tm.seq:
                    self.recheck = True
        elif multicast and tm.statuses:
            # Not ours lost, but the round waited for another rank (perhaps for its loss): a
            # spurious resend, yet its latency says nothing about how long to wait.
            self.spurious += min(tm.statuses, tm.resends)
        if partial:
            self.partial_rounds += 1
        if tm.flush:
            self.flushing -= 1
        tm.prev_round, tm.prev_resends, tm.prev_timed_out = round_, tm.resends, tm.timed_out
        tm.prev_hold_resent, tm.held_for = tm.hold_resent, held_for
        tm.hold_risk = bool(held_for)
        tm.prev_latency = now - tm.first_sent_at if multicast and not tm.statuses else 0.0

    def late_result(self, tm: Timer, round_: int) -> None:
        """A result for the slot's previous round came again: one of our resends was spurious.
        If the first one was the multicast completion, its latency is a true sample."""
        if round_ != tm.prev_round or tm.prev_resends == 0:
            return
        tm.prev_resends -= 1
        self.spurious += 1
        if tm.prev_latency:  # the round completed by itself, no status: a true latency
            self.rtt.sample(tm.prev_latency, tm.group)
            if tm.prev_timed_out:
                self.spurious_timeouts += 1
                self.rtt.spurious_timeout(tm.prev_latency)
            elif not tm.prev_hold_resent:
                self.spurious_fast += 1
                self.rtt.spurious_fast_retransmit()
            tm.prev_latency = 0.0

    # ---------------------------------------------------------------- decisions
    def deadline(self, group: int = 0) -> float:
        """Seconds a round of slot group `group` may wait before the flusher flushes it."""
        if self.loss_deadline is None:
            return self.rtt.loss_deadline(group)
        return self.loss_deadline

    @property
    def timeout(self) -> float:
        return min(self.rtt.rto * 2 ** self.backoff, self.rtt.max_rto)

    def due(self, in_flight, now: float, idle: bool) -> list:
        """The (slot, timer) pairs to resend now, out of `in_flight` ((slot, timer) pairs of
        the rounds in flight). `idle`: the agent's socket is empty right now."""
        if idle:
            self.drained(now)
        self.recheck = False
        out = []
        window = self.rtt.reorder_window
        others = self._other_groups_evidence()
        for st, tm in in_flight:
            rack_seq, rack_latency = self.rack.get(tm.group, (0, 0.0))
            rack = rack_latency + window
            other_seq, other_wait = others.get(tm.group, (0, 0.0))
            if (self.bounded_loss and self.flusher and tm.flushable and not tm.flush
                    and now - tm.first_sent_at > self.deadline(tm.group)
                    and self.partial_rounds + self.flushing + 1 <= self.budget_rounds):
                # A flush in flight counts as a partial round already: every round past the
                # deadline is seen in one look, long before the first partial result returns.
                # Only the call's flusher gets here, so its count is the call's.
                tm.flush = True
                self.flushing += 1
                out.append((st, tm))
            elif tm.last_seq < rack_seq and now - tm.sent_at > rack:
                self.fast_resends += 1  # a round sent after this one was answered: lost
                out.append((st, tm))
            elif tm.last_seq < other_seq and now - tm.sent_at > other_wait + window:
                # A round of another group sent after this one was answered: this worker's
                # datagrams get through and the fabric answers, yet this round is well past
                # its own group's usual latency: lost. Without this, a group of few slots (2 per
                # spine, 4 slots over 2 spines) often had no round of its own to compare with:
                # every slot of the group waited on a loss, and only a timeout freed them.
                self.fast_resends += 1
                out.append((st, tm))
            elif tm.hold_risk and not tm.hold_resent and now - tm.sent_at > rack:
                # Held (likely) until the worker the last round lacked is heard; that worker
                # got the same partial result and sends its round about now: one resend after
                # a round trip and the reorder window beats waiting for a timeout.
                tm.hold_resent = True
                self.hold_resends += 1
                out.append((st, tm))
        if not out and in_flight and self.drained_at - self.timer_from > self.timeout:
            # The oldest round; from the second expiry in a row on, also every other round not
            # sent for a timeout. Slots are independent, so one resend per expiry left the
            # others waiting a doubled timeout each (at 20-30% loss each way calls stalled
            # for tens of seconds and timed out), while a first expiry is often spurious on a
            # loaded machine and must cost one resend, not a window's (resending every late
            # round at once multiplied make bench-net's resends by ten).
            oldest = min(in_flight, key=lambda p: p[1].sent_at)
            late = [p for p in in_flight if p is oldest or (
                self.backoff and now - p[1].sent_at > self.timeout)]
            self.timer_from = now
            self.backoff += 1
            self.timeout_resends += len(late)
            for _, tm in late:
                tm.timed_out = True
            out += late
        return out

    def wait(self, in_flight, now: float, longest: float) -> float:
        """Seconds until the next fast retransmit or timeout could fire (at most `longest`),
        unless a result sets `recheck` before (a later sample may also shorten the timeout)."""
        soonest = min(longest, self.timer_from + self.timeout - now)
        window = self.rtt.reorder_window
        others = self._other_groups_evidence()
        for _, tm in in_flight:
            rack_seq, rack_latency = self.rack.get(tm.group, (0, 0.0))
            if tm.last_seq < rack_seq or (tm.hold_risk and not tm.hold_resent):
                soonest = min(soonest, tm.sent_at + rack_latency + window - now)
            other_seq, other_wait = others.get(tm.group, (0, 0.0))
            if tm.last_seq < other_seq:
                soonest = min(soonest, tm.sent_at + other_wait + window - now)
        return max(soonest, 0.0005)

    def _other_groups_evidence(self) -> dict[int, tuple[int, float]]:
        """Per slot group with a latency estimate: (send order of the latest-sent round of any
        other group known answered, how long a round of this group may then wait before the
        reorder window: OTHER_GROUP_MULT x the group's own smoothed latency, at least min_rto).
        Rounds of two groups (two spines, two queues) need not complete in send order, so
        another group's round says only that this worker's datagrams get through and the
        fabric answers; its own latency says nothing of this group's."""
        out = {}
        if len(self.rtt.group_srtt) < 2:  # one group (or no sample yet): nothing to compare
            return out
        for group, latency in self.rtt.group_srtt.items():
            seq = max((seq for g, (seq, _) in self.rack.items() if g != group), default=0)
            if seq:
                out[group] = (seq, max(OTHER_GROUP_MULT * latency, self.rtt.min_rto))
        return out

    def stalled(self, in_flight, now: float, timeout: float):
        """A (slot, timer) pair with no result for `timeout` seconds, else None."""
        for st, tm in in_flight:
            if now - tm.progress_at > timeout:
                return st, tm
        return None
