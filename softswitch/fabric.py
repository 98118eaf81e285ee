"""Leaf and spine roles of the software switch: two-level aggregation (docs/scale_out.md).

The software twin of the P4 program's roles (p4src/v1model/fabric.p4: FabricRoles, ToSpine,
FromSpine; the Aggregator's spine rules): the same packets in give the same packets out,
registers and counters.
The level of each job is chosen per job, as the P4 tables do: `FabricRoles.leaves` (P4 table
job_level, action as_leaf), `FabricRoles.spines` (as_spine), `FabricRoles.upstream`
(leaf_upstream), in the L2 and the UDP mode alike (softswitch/dataplane.py writes them from the
table rows). The class has the name of the P4 control it mirrors (fabric.p4), as the
controller's control of those tables does.

A leaf aggregates its rack's workers with the ordinary pipeline (admitted by their rank
within the rack, 0..size-1, the rank they send: spina.config.JobConfig.switch_rank; complete
at the rack's size) and, instead of multicasting a completed round, sends it up as
one contribution of its own (rank = the rack's index in the job) to the spine owning the slot.
The spine's result comes back, is stored in the leaf's slot copy (`slot_count` = rack size + 1
says so) and is replicated to the rack. A spine is the ordinary pipeline with the leaves as its
workers, plus one rule: a partial's `mismatch` and `partial` flags are ORed into its round.

`process_into` returns (n, to, key) for the packet written to `out[:n]` (n = 0: nothing leaves):
to TO_GROUP: every (local) worker of job `key`; TO_SENDER: back to the packet's source;
TO_UPSTREAM: to the spine `key` = (ingress port, (IPv4, UDP port), MAC) that owns the slot;
TO_OTHERS: an all-gather packet, unchanged, to every worker of job `key` but its sender. The
all-gather is a flat job's: at a leaf or a spine of the job it is unadmitted (counted in
port_unadmitted, as the P4's Admission refuses it).
`route_into` adds the multicast group of a TO_GROUP packet (the L2 mode's replication).

job_results counts result copies sent to workers, as the P4 egress counts RESULT copies: a
round that goes up as a partial is not counted at the leaf; the spine's result is, once per
rack worker, when the leaf replicates it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from softswitch.egress import scatter_owners
from softswitch.pipeline import ADDED, COMPLETED, GATHERED, MAX_PORTS, Pipeline, rows
from spina import wire
from spina.spec import FLAGS_CARRIED, FLAGS_RESULT

# TO_OTHERS: an all-gather packet, for every worker of the job's group but its sender (the
# egress drops the replica whose rewrite addresses the sender: egress_rewrite.p4).
TO_GROUP, TO_SENDER, TO_UPSTREAM, TO_OTHERS = 1, 2, 3, 4
_NOTHING = (0, 0, None, 0)
_UNPACK, _PACK_INTO = wire.HEADER_STRUCT.unpack_from, wire.HEADER_STRUCT.pack_into
(_MSG_TYPE, _FLAGS, _JOB, _EPOCH, _SLOT, _RANK, _NLANES, _ROUND, _BLOCK_SIZE, _BITMAP,
 _PRESENT) = (wire.FIELD_INDEX[f] for f in (
    "msg_type", "flags", "job", "epoch", "slot", "rank", "nlanes", "round", "block_size",
    "bitmap", "present"))
_AT = wire.FIELD_OFFSET
_JOB_AT, _SLOT_AT, _FLAGS_AT = _AT["job"], _AT["slot"], _AT["flags"]
HLEN = wire.HEADER_LEN


def _set_u32(out, name: str, value: int) -> None:
    at = _AT[name]
    out[at:at + 4] = value.to_bytes(4, "big")


@dataclass(frozen=True)
class LeafJob:
    """A job at a leaf, as the P4 action as_leaf takes it: the rack's index (its rank at the
    spines), its worker count (their ranks here: 0..nlocal-1), the job's epoch and the rack's
    multicast group."""
    rack: int
    nlocal: int
    epoch: int
    mcast_grp: int

    def local_ranks(self, rack_bitmap: int, result: bool, stored_bitmap: int) -> int:
        """A spine's rack bitmap as this rack's local ranks. With the rack's bit, a result
        names the ranks its partial carried (`stored_bitmap`, the slot copy's: a flushed
        rack's partial lacks some), a status every local rank (the rack is done: only other
        racks can complete the round); without it (the spine flushed the round without this
        rack's partial), none."""
        if not rack_bitmap >> self.rack & 1:
            return 0
        return stored_bitmap if result else (1 << self.nlocal) - 1


class FabricRoles:
    """The leaf and spine roles on `pipeline`, per job; jobs in neither are flat. Written only
    through the Dataplane's tables job_level and leaf_upstream."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.leaves: dict[int, LeafJob] = {}   # job -> as_leaf
        self.spines: set[int] = set()          # jobs admitted as_spine
        # (job, slot) -> (ingress port, (IPv4, UDP port)[, MAC]) of the spine owning the slot.
        self.upstream: dict[tuple[int, int], tuple] = {}

    def clear(self) -> None:
        self.leaves.clear()
        self.spines.clear()
        self.upstream.clear()

    def remove_job(self, job: int) -> None:
        self.leaves.pop(job, None)
        self.spines.discard(job)
        for key in [k for k in self.upstream if k[0] == job]:
            del self.upstream[key]

    def process_into(self, pkt, port: int, src, out) -> tuple[int, int, object]:
        """One packet from ingress `port`, source `src`; the caller holds pipeline.lock."""
        return self.route_into(pkt, port, src, out)[:3]

    def owners(self, pkt, out) -> int:
        """ReduceScatter: the ranks that get the result `out` (made of `pkt`) whole
        (egress.scatter_owners; 0: every copy whole). A spine's contributions are leaves'
        partials, whose bitmap is their rack's contributors: never owners."""
        if out[1] != wire.MSG_RESULT:
            return 0
        owners = scatter_owners(pkt)
        return owners if owners and (pkt[_JOB_AT] << 8 | pkt[_JOB_AT + 1]) not in self.spines \
            else 0

    def route_into(self, pkt, port: int, src, out) -> tuple[int, int, object, int]:
        """`process_into` plus the multicast group of a TO_GROUP packet."""
        size = len(pkt)
        job = pkt[_JOB_AT] << 8 | pkt[_JOB_AT + 1] if size >= HLEN else -1
        if self.upstream and size >= HLEN and pkt[1] != wire.MSG_CONTRIB:
            up = self.upstream.get((job, pkt[_SLOT_AT] << 8 | pkt[_SLOT_AT + 1]))
            if up is not None:  # a result or status for a leaf's slot: the spine's answer
                return self._from_spine(pkt, port, src, out, job, up)
        p = self.pipeline
        spine = size >= HLEN and job in self.spines
        if size >= HLEN and pkt[1] == wire.MSG_GATHER and (spine or job in self.leaves):
            if p.ina_check(pkt, port, src) is not None:  # malformed first, as InaCheck
                p.counters["port_unadmitted"][port % MAX_PORTS] += 1
            return _NOTHING
        carried = pkt[_FLAGS_AT] & FLAGS_CARRIED if spine else 0
        n, multicast, adm, outcome = p.process_into(pkt, port, src, out, spine)
        if outcome == GATHERED:
            return n, TO_OTHERS, adm.job, adm.mcast_grp
        if carried and outcome in (ADDED, COMPLETED):
            # A rack's mismatch or flush: the round's result says so to every rack.
            t = _UNPACK(pkt)
            p.registers["slot_flags"][2 * t[_SLOT] + (t[_ROUND] & 1)] |= carried
            if n and multicast:
                out[_FLAGS_AT] |= carried
        if not n:
            return _NOTHING
        lj = self.leaves.get(adm.job)
        if lj is None:  # a flat or spine job
            if multicast or spine and out[1] == wire.MSG_STATUS:
                # A spine's status goes to every leaf: one that stored the round's result while
                # this spine has lost it (a restart) replays it (_from_spine).
                return n, TO_GROUP, adm.job, adm.mcast_grp
            return n, TO_SENDER, None, 0
        t = _UNPACK(out)
        if t[_MSG_TYPE] == wire.MSG_STATUS:
            return n, TO_SENDER, None, 0  # the rack's round is incomplete: its local ranks
        idx = 2 * t[_SLOT] + (t[_ROUND] & 1)
        if not multicast and p.registers["slot_count"][idx] > lj.nlocal:
            return n, TO_SENDER, None, 0  # the spine's result is stored: answered here
        # The rack's round just completed (or was flushed): its partial goes up. Or a worker
        # resent a round whose spine result is missing: the partial goes up again. Either
        # way no result leaves for the workers (the pipeline counted one per copy).
        p.counters["job_results"][adm.job] -= adm.nworkers if multicast else 1
        flags = t[_FLAGS] & (FLAGS_RESULT | wire.FLAG_LOSS_TOLERANT)
        if not multicast:  # a resend up: partial only if the worker asks for a flush
            asked = pkt[_FLAGS_AT] & wire.FLAG_PARTIAL
            if not asked and pkt[_AT["rank"]] != 0:
                # Only the rack's designated worker (local rank 0) makes the partial go up
                # again, or a flush request: H workers resending would cost the spine links
                # H partials. Live: the spine's result is stored nowhere in the rack, so the
                # designated worker waits for it too and resends. Dropped here; counted once
                # in job_duplicates by the pipeline, as every resend that adds nothing.
                return _NOTHING
            flags = (flags & ~wire.FLAG_PARTIAL) | wire.FLAG_RESEND | asked
        out[_AT["msg_type"]] = wire.MSG_CONTRIB
        out[_FLAGS_AT] = flags
        out[_AT["rank"]] = lj.rack
        up = self.upstream.get((adm.job, t[_SLOT]))
        if up is None:
            return _NOTHING  # no spine for this slot (P4: dropped)
        return n, TO_UPSTREAM, up, 0

    def _from_spine(self, pkt, port: int, src, out, job: int, up) -> tuple[int, int, object, int]:
        """A spine's result (stored, then to the rack) or status (to the rack)."""
        p, size = self.pipeline, len(pkt)
        t = _UNPACK(pkt)
        err = wire.header_error(t, size)
        if err is None and t[_MSG_TYPE] == wire.MSG_GATHER:
            err = "a spine answers with results and statuses only"  # InaCheck's from_spine test
        if err is not None:
            return p.drop_malformed(port, src, err)[:2] + (None, 0)
        slot, k, bs = t[_SLOT], t[_NLANES], t[_BLOCK_SIZE]
        lj = self.leaves.get(job)
        c = p.counters
        if lj is None or up[0] != port or up[1] != src:
            c["port_unadmitted"][port % MAX_PORTS] += 1
            return _NOTHING
        c["job_received"][job] += 1
        idx = 2 * slot + (t[_ROUND] & 1)
        r = p.registers
        if t[_EPOCH] != lj.epoch or r["slot_round"][idx] != t[_ROUND]:
            c["job_stale"][job] += 1
            return _NOTHING
        count = int(r["slot_count"][idx])
        if t[_MSG_TYPE] == wire.MSG_STATUS and t[_RANK] != lj.rack:
            # Another rack's status (a spine sends its statuses to every leaf). If this leaf
            # stored the round's result and the spine lacks this rack, the spine lost it (a
            # restart) and this rack will never send the round again: the stored result goes
            # back up, REPLAY, and the spine takes it as the round's result.
            if count <= lj.nlocal or t[_BITMAP] >> lj.rack & 1:
                return _NOTHING
            n = p.result_into(out, t, idx, 0)
            out[_AT["msg_type"]] = wire.MSG_CONTRIB
            out[_FLAGS_AT] = ((r["slot_flags"][idx] & FLAGS_RESULT) | wire.FLAG_RESEND
                              | wire.FLAG_REPLAY)
            out[_AT["rank"]] = lj.rack
            return n, TO_UPSTREAM, up, 0
        if count != lj.nlocal:  # stored already (a duplicate), or never sent up (stale)
            c["job_duplicates" if count > lj.nlocal else "job_stale"][job] += 1
            return _NOTHING
        out[:size] = pkt
        bitmap = lj.local_ranks(t[_BITMAP], t[_MSG_TYPE] == wire.MSG_RESULT,
                                int(r["slot_bitmap"][idx]))
        _set_u32(out, "bitmap", bitmap)
        if t[_MSG_TYPE] == wire.MSG_STATUS:
            return size, TO_GROUP, job, lj.mcast_grp  # every worker of the rack waits for it
        # The result: stored in the slot copy (resends are answered here), then to the rack.
        present = t[_PRESENT]
        _, _, vals, slot_next = p.views(idx, k, bs)
        slot_next[:] = np.frombuffer(pkt, wire.NEXT_DTYPE, k, HLEN)
        if present:
            data = rows(pkt, t)
            if present == (1 << k) - 1:
                vals[:] = data
            else:
                vals[wire.lane_indices(present, k)] = data
        flags = t[_FLAGS] & FLAGS_RESULT
        for name, value in (("slot_present", present), ("slot_bitmap", bitmap),
                            ("slot_flags", flags), ("slot_count", count + 1)):
            r[name][idx] = value
        for name in ("nonfinite", "exponent", "length"):
            r[f"slot_{name}"][idx] = t[wire.FIELD_INDEX[name]]
        c["job_results"][job] += lj.nlocal  # one copy per rack worker
        # To the rack as a completion, not as the answer to a resend.
        out[_FLAGS_AT] = flags | (t[_FLAGS] & wire.FLAG_LOSS_TOLERANT)
        return size, TO_GROUP, job, lj.mcast_grp
