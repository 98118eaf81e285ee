"""Leaf and spine roles of the software switch: two-level aggregation (docs/scale_out.md).

Software switch only: the P4 program does not have these roles yet.

A leaf aggregates its rack's workers with the ordinary pipeline (admitted by global rank,
complete at the rack's size) and, instead of multicasting a completed round, sends it up as
one contribution of its own (rank = the rack's index in the job) to the spine owning the slot.
The spine's result comes back, is stored in the leaf's slot copy (`slot_count` = rack size + 1
says so) and is replicated to the rack. A spine is the ordinary pipeline with the leaves as its
workers, plus one rule: a partial's `mismatch` and `partial` flags are ORed into its round.

Both roles return (n, to, key) for the packet written to `out[:n]` (n = 0: nothing leaves):
to TO_GROUP: every (local) worker of job `key`; TO_SENDER: back to the packet's source;
TO_UPSTREAM: to the spine `key` = (ingress port, address) that owns the slot.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from softswitch.pipeline import MAX_PORTS, Pipeline
from spina import wire
from spina.config import ConfigError, JobConfig

TO_GROUP, TO_SENDER, TO_UPSTREAM = 1, 2, 3
_NOTHING = (0, 0, None)
_UNPACK, _PACK_INTO = wire.HEADER_STRUCT.unpack_from, wire.HEADER_STRUCT.pack_into
(_MSG_TYPE, _FLAGS, _JOB, _EPOCH, _SLOT, _RANK, _NLANES, _ROUND, _BLOCK_SIZE, _BITMAP,
 _PRESENT) = (wire.FIELD_INDEX[f] for f in (
    "msg_type", "flags", "job", "epoch", "slot", "rank", "nlanes", "round", "block_size",
    "bitmap", "present"))
_AT = wire.FIELD_OFFSET
HLEN = wire.HEADER_LEN
# What a rack's partial carries up besides `last`: a leaf's mismatch or flush concerns every rack.
CARRIED = wire.FLAG_MISMATCH | wire.FLAG_PARTIAL
RESULT_FLAGS = wire.FLAG_LAST | CARRIED  # a stored result's flags (the rest is per packet)


def _set_u32(out, field: str, value: int) -> None:
    at = _AT[field]
    out[at:at + 4] = value.to_bytes(4, "big")


@dataclass(frozen=True)
class _LeafJob:
    """A job at a leaf: the rack's index (its rank at the spines), its worker count, the rank
    masks of every rack of the job (to turn a spine's rack bitmap into ranks), the job's epoch."""
    rack: int
    nlocal: int
    rack_masks: tuple[int, ...]
    epoch: int

    def ranks_of(self, rack_bitmap: int) -> int:
        return sum(m for i, m in enumerate(self.rack_masks) if rack_bitmap >> i & 1)

    @property
    def remote_mask(self) -> int:
        return self.ranks_of(((1 << len(self.rack_masks)) - 1) & ~(1 << self.rack))


class Leaf:
    """The leaf role on `pipeline`; jobs admitted with `add_job` only take part (others: flat)."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.jobs: dict[int, _LeafJob] = {}
        self.upstream: dict[tuple[int, int], tuple] = {}  # (job, slot) -> (port, address)
        self.spines: dict[tuple, int] = {}  # (port, address) -> how many (job, slot) it owns

    def add_job(self, cfg: JobConfig, rack_sizes: tuple[int, ...], rack: int,
                sources: dict[int, tuple[int, object]],
                upstream: tuple[tuple[int, int, tuple], ...]) -> None:
        """Admit rack `rack` of `cfg` (ranks rack by rack, `rack_sizes` workers each; sources
        of this rack's ranks); upstream: (slot_base, nslots, (port, address) of the spine)."""
        masks, first = [], 0
        for size in rack_sizes:
            masks.append(((1 << size) - 1) << first)
            first += size
        ranks = [r for r in range(cfg.nworkers) if masks[rack] >> r & 1]
        owned = sorted(slot for base, n, _ in upstream for slot in range(base, base + n))
        if owned != list(range(cfg.slot_base, cfg.slot_base + cfg.nslots)):
            raise ConfigError(f"job {cfg.job}: field 'upstream': slots {owned} must be the "
                              f"job's {cfg.slot_base}..{cfg.slot_base + cfg.nslots - 1}, each "
                              "owned by one spine")
        with self.pipeline.lock:
            self.remove_job(cfg.job)
            self.pipeline.add_rack_job(cfg, ranks, sources)
            self.jobs[cfg.job] = _LeafJob(rack, len(ranks), tuple(masks), cfg.epoch)
            for base, n, spine in upstream:
                for slot in range(base, base + n):
                    self.upstream[(cfg.job, slot)] = spine
                    self.spines[spine] = self.spines.get(spine, 0) + 1

    def remove_job(self, job: int) -> None:
        with self.pipeline.lock:
            self.pipeline.remove_job(job)
            self.jobs.pop(job, None)
            for key in [k for k in self.upstream if k[0] == job]:
                spine = self.upstream.pop(key)
                self.spines[spine] -= 1
                if not self.spines[spine]:
                    del self.spines[spine]

    def process_into(self, pkt, port: int, src, out) -> tuple[int, int, object]:
        """One packet from ingress `port`, source `src`; the caller holds pipeline.lock."""
        if len(pkt) >= HLEN and pkt[1] != wire.MSG_CONTRIB and (port, src) in self.spines:
            return self._from_spine(pkt, port, src, out)
        p = self.pipeline
        n, multicast, adm = p.process_into(pkt, port, src, out)
        if not n:
            return _NOTHING
        lj = self.jobs.get(adm.job)
        if lj is None:  # a flat job on this switch
            return (n, TO_GROUP, adm.job) if multicast else (n, TO_SENDER, None)
        t = _UNPACK(out)
        if t[_MSG_TYPE] == wire.MSG_STATUS:
            # The rack's round is incomplete: only its own missing ranks can complete it.
            _set_u32(out, "bitmap", t[_BITMAP] | lj.remote_mask)
            return n, TO_SENDER, None
        idx = 2 * t[_SLOT] + (t[_ROUND] & 1)
        if not multicast and p.registers["slot_count"][idx] > lj.nlocal:
            return n, TO_SENDER, None  # the spine's result is stored: answered here
        # The rack's round just completed (or was flushed): its partial goes up. Or a worker
        # resent a round whose spine result is missing: the partial goes up again.
        flags = t[_FLAGS] & (RESULT_FLAGS | wire.FLAG_LOSS_TOLERANT)
        if not multicast:  # a resend up: partial only if the worker asks for a flush
            asked = pkt[_AT["flags"]] & wire.FLAG_PARTIAL
            flags = (flags & ~wire.FLAG_PARTIAL) | wire.FLAG_RESEND | asked
        out[_AT["msg_type"]] = wire.MSG_CONTRIB
        out[_AT["flags"]] = flags
        out[_AT["rank"]] = lj.rack
        return n, TO_UPSTREAM, self.upstream[(adm.job, t[_SLOT])]

    def _from_spine(self, pkt, port: int, src, out) -> tuple[int, int, object]:
        """A spine's result (stored, then to the rack) or status (to the rack)."""
        p, size = self.pipeline, len(pkt)
        t = _UNPACK(pkt)
        err = wire.header_error(t, size)
        if err is not None:
            return p._malformed(port, src, err)[:2] + (None,)
        job, slot, k, bs = t[_JOB], t[_SLOT], t[_NLANES], t[_BLOCK_SIZE]
        lj = self.jobs.get(job)
        c = p.counters
        if lj is None or self.upstream.get((job, slot)) != (port, src):
            c["port_unadmitted"][port % MAX_PORTS] += 1
            return _NOTHING
        c["job_received"][job] += 1
        idx = 2 * slot + (t[_ROUND] & 1)
        r = p.registers
        if t[_EPOCH] != lj.epoch or r["slot_round"][idx] != t[_ROUND]:
            c["job_stale"][job] += 1
            return _NOTHING
        count = int(r["slot_count"][idx])
        if count != lj.nlocal:  # stored already (a duplicate), or never sent up (stale)
            c["job_duplicates" if count > lj.nlocal else "job_stale"][job] += 1
            return _NOTHING
        out[:size] = pkt
        bitmap = lj.ranks_of(t[_BITMAP])
        _set_u32(out, "bitmap", bitmap)
        if t[_MSG_TYPE] == wire.MSG_STATUS:
            return size, TO_GROUP, job  # every worker of the rack waits for this round
        # The result: stored in the slot copy (resends are answered here), then to the rack.
        present = t[_PRESENT]
        _, _, vals, slot_next = p._views(idx, k, bs)
        slot_next[:] = np.frombuffer(pkt, wire.NEXT_DTYPE, k, HLEN)
        if present:
            data = np.frombuffer(pkt, wire.DATA_DTYPE, (size - HLEN) // 4 - k,
                                 HLEN + 4 * k).reshape(-1, bs)
            if present == (1 << k) - 1:
                vals[:] = data
            else:
                vals[wire.lane_indices(present, k)] = data
        flags = t[_FLAGS] & RESULT_FLAGS
        for name, value in (("slot_present", present), ("slot_bitmap", bitmap),
                            ("slot_flags", flags), ("slot_count", count + 1)):
            r[name][idx] = value
        for name in ("nonfinite", "exponent", "length"):
            r[f"slot_{name}"][idx] = t[wire.FIELD_INDEX[name]]
        # To the rack as a completion, not as the answer to a resend.
        out[_AT["flags"]] = flags | (t[_FLAGS] & wire.FLAG_LOSS_TOLERANT)
        return size, TO_GROUP, job


class Spine:
    """The spine role on `pipeline`: its jobs' workers are the leaves (Pipeline.add_job)."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def process_into(self, pkt, port: int, src, out) -> tuple[int, int, object]:
        """One packet; the caller holds pipeline.lock."""
        p = self.pipeline
        carried = pkt[_AT["flags"]] & CARRIED if len(pkt) >= HLEN else 0
        if carried:
            job = int.from_bytes(pkt[_AT["job"]:_AT["job"] + 2], "big")
            added = int(p.counters["job_aggregated"][job])
        n, multicast, adm = p.process_into(pkt, port, src, out)
        if carried and p.counters["job_aggregated"][job] != added:
            # A rack's mismatch or flush: the round's result says so to every rack.
            t = _UNPACK(pkt)
            p.registers["slot_flags"][2 * t[_SLOT] + (t[_ROUND] & 1)] |= carried
            if n and multicast:
                out[_AT["flags"]] |= carried
        if not n:
            return _NOTHING
        return (n, TO_GROUP, adm.job) if multicast else (n, TO_SENDER, None)
