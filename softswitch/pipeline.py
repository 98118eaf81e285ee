"""The SpINA aggregation pipeline in Python: the same per-packet state operations as the P4
program (p4src/), on the same register, table and counter names.

Each packet touches every register at most once, at one index (slot*2 + shadow copy), with
a fixed amount of work: no loop over workers, rounds or the tensor. docs/aggregation.md
explains the scheme; docs/protocol.md the header.

Per slot and shadow copy (idx = slot*2 + (round & 1)):
  slot_round      round tag of the copy's contents; an older round is stale, a newer one
                  resets the copy (slots clean themselves: no control-plane clear)
  slot_bitmap     ranks that contributed to this round (duplicate detection)
  slot_count      number of contributions; the round completes at the job's worker count
  slot_values     nlanes*block_size int32 sums (wrap-around, as 32-bit switch ALUs)
  slot_next       per-lane minimum of the workers' next non-zero block positions
  slot_present    OR of the lanes that carried data
  slot_nonfinite  OR of the lanes that held a NaN/Inf at some worker
  slot_exponent   max of the workers' quantization exponents
  slot_length     tensor length of the round's first packet (others must agree)
  slot_flags      LAST (AND over contributions), MISMATCH (OR: a length or lane width
                  disagreed) and the lane width of the round's first contribution
                  (wire.FLAGS_LANE_WIDTH: the result's rows have that width, docs/bits.md)

Per slot (both copies): the hold of a newer round. A round newer than any on the slot takes
the copy of the round before last, which a worker that lost that round's result still needs
(it resends the old round to get it). In exact mode nobody can be two rounds ahead, but a
flush (bounded loss) lets the others move on without that worker. So:
  head_round      newest round started on the slot
  head_heard      ranks heard at head_round: any packet of it, or a held packet of a newer one
  head_missing    workers not yet heard at head_round (0 after a clear: nothing to protect)
A newer round starts only when its sender is the last worker missing or none is; otherwise
the packet is dropped (job_held) and its sender marked heard, and it is sent again by its
agent's loss recovery. docs/reliability.md explains the hazard and the cost.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from spina import log as spina_log, wire
from spina.config import ConfigError, JobConfig
from spina.spec import (  # noqa: F401
    DEFAULT_SLOT_CAPACITY,
    FLAGS_RESULT,
    HEAD_REGISTERS,
    JOB_COUNTERS,
    JOB_REGISTERS,
    MAX_JOBS,
    MAX_PORTS,
    PORT_COUNTERS,
    REGISTER_NAMES as REGISTERS,
    TABLES,
)

log = logging.getLogger("spina.softswitch")

HLEN = wire.HEADER_LEN
NEXT_DTYPE, DATA_DTYPE = wire.NEXT_DTYPE, wire.DATA_DTYPE
MSG_CONTRIB, MSG_RESULT, MSG_STATUS = wire.MSG_CONTRIB, wire.MSG_RESULT, wire.MSG_STATUS
MSG_GATHER = wire.MSG_GATHER
FLAG_RESEND, FLAG_LOSS_TOLERANT = wire.FLAG_RESEND, wire.FLAG_LOSS_TOLERANT
FLAG_LAST = wire.FLAG_LAST
FLAG_PARTIAL, FLAG_MISMATCH, FLAG_REPLAY = wire.FLAG_PARTIAL, wire.FLAG_MISMATCH, wire.FLAG_REPLAY
FLAGS_LANE_WIDTH = wire.FLAGS_LANE_WIDTH
# A narrow lane's answer range, by its width flag: sums beyond it saturate (docs/bits.md).
_LANE_RANGE = {wire.FLAG_LANES16: (-(1 << 15), (1 << 15) - 1),
               wire.FLAG_LANES8: (-(1 << 7), (1 << 7) - 1)}
_UNPACK, _PACK_INTO = wire.HEADER_STRUCT.unpack_from, wire.HEADER_STRUCT.pack_into
_header_error = wire.header_error
# Positions of the header fields in HEADER_STRUCT's tuple, by name (spina/wire.py's order).
(_MSG_TYPE, _FLAGS, _JOB, _EPOCH, _CALL, _SLOT, _RANK, _NLANES, _ROUND, _LENGTH, _BLOCK_SIZE,
 _EXPONENT, _BITMAP, _PRESENT, _NONFINITE) = (wire.FIELD_INDEX[f] for f in (
    "msg_type", "flags", "job", "epoch", "call", "slot", "rank", "nlanes", "round", "length",
    "block_size", "exponent", "bitmap", "present", "nonfinite"))
# What process_into did with a packet (aggregator.p4's outcomes, the TNA program's KIND_*):
# dropped (malformed, unadmitted, stale or held), answered with the stored result (a resend
# to a complete round), a replay adopted (a spine), a round flushed, a status, added to an
# incomplete round, added and the round complete; an all-gather packet replicated.
DROPPED, ANSWERED, ADOPTED, FLUSHED, STATUS, ADDED, COMPLETED, GATHERED = range(8)
_DROP = (0, False, None, DROPPED)

# Register, table and counter names live in spina/spec.py (imported above); the P4
# program declares the same (tests/test_p4_agreement.py checks it).
DEFAULT_POOL_SLOTS = 256
MAX_POOL_SLOTS = 1 << 16  # the header's slot field is 16 bits
MAX_REGISTER_BYTES = 4 << 30  # a bound on the slot registers' memory, against typos


def _about(t: tuple) -> dict:
    """A packet's log fields (spina.log): the job, epoch, call and rank its header names."""
    return spina_log.fields(job=t[_JOB], epoch=t[_EPOCH], call=t[_CALL], rank=t[_RANK])


def rows(pkt, t: tuple) -> np.ndarray:
    """The data rows of packet `pkt` (header fields `t`), (present lanes, block_size), of the
    width its flags name (int32, int16 or int8, big-endian): a view, nothing copied."""
    bs = t[_BLOCK_SIZE]
    return np.frombuffer(pkt, wire.data_dtype(t[_FLAGS]), t[_PRESENT].bit_count() * bs,
                         HLEN + 4 * t[_NLANES]).reshape(-1, bs)


def register_bytes(pool_slots: int, slot_capacity: int) -> int:
    """Memory of a pipeline's slot registers: two copies per slot, each slot_capacity int32
    values, MAX_LANES next pointers and ~40 bytes of scalars."""
    return 2 * pool_slots * (4 * slot_capacity + 4 * wire.MAX_LANES + 40)


@dataclass(frozen=True)
class Admission:
    """What an admission table hit gives: the job's slot range, workers and sizes."""
    job: int
    epoch: int
    slot_base: int
    nslots: int
    nworkers: int
    block_size: int
    nlanes: int
    mcast_grp: int = 0  # the P4 multicast group of the job's workers (L2 mode and P4 targets)


@dataclass
class Emit:
    """A packet leaving the pipeline: to all of the job's workers, or back to the sender."""
    data: bytes
    job: int
    multicast: bool  # True: every worker of `job`; False: unicast to the sender
    mcast_grp: int = 0


class Pipeline:
    """Target-independent aggregation pipeline. Instantiate as many as you like."""

    def __init__(self, pool_slots: int = DEFAULT_POOL_SLOTS,
                 slot_capacity: int = DEFAULT_SLOT_CAPACITY):
        self.pool_slots = pool_slots
        self.slot_capacity = slot_capacity
        # Held by whoever runs packets (around process_into) and by every control-plane change,
        # so a re-admission with a new epoch and its slot clear are atomic to the data path: no
        # packet of the old epoch can pass the epoch check before and write a slot after it.
        self.lock = threading.RLock()
        n = 2 * pool_slots
        self.registers = {
            "slot_round": np.zeros(n, np.uint32),
            "slot_bitmap": np.zeros(n, np.uint32),
            "slot_count": np.zeros(n, np.uint32),
            "slot_values": np.zeros((n, slot_capacity), np.int32),
            "slot_next": np.zeros((n, wire.MAX_LANES), np.uint32),
            "slot_present": np.zeros(n, np.uint64),
            "slot_nonfinite": np.zeros(n, np.uint64),
            "slot_exponent": np.zeros(n, np.int16),
            "slot_length": np.zeros(n, np.uint32),
            "slot_flags": np.zeros(n, np.uint8),
            "head_round": np.zeros(pool_slots, np.uint32),
            "head_heard": np.zeros(pool_slots, np.uint32),
            "head_missing": np.zeros(pool_slots, np.uint8),
        }
        # The hold of a newer round (above). Off only to compare with the Tofino program's
        # model, which lacks it (tests/test_tna_model.py; spec.TNA_LACKS).
        self.hold_newer_rounds = True
        # Bumped by add_job and remove_job (the Dataplane counts its own table writes): the
        # compiled UDP data path rebuilds its tables when either changed.
        self.version = 0
        self.counters = {name: np.zeros(MAX_JOBS, np.uint64) for name in JOB_COUNTERS}
        self.counters.update({name: np.zeros(MAX_PORTS, np.uint64) for name in PORT_COUNTERS})
        # admission: (ingress port, (source IPv4, source UDP port), job, rank) -> Admission.
        # P4: table `admission`, keys ingress_port, src_addr, src_port, job, rank (all exact).
        # The address stays in the form the socket layer gives ('a.b.c.d', port): no per-packet
        # conversion on the data path.
        self.admission: dict[tuple, Admission] = {}
        # P4: register job_loss_credit, one cell per job id, held here with the other arrays;
        # the egress's CongestionDrop (softswitch/egress.py) owns its table and writes it.
        self.job_registers = {r.name: np.zeros(MAX_JOBS, np.uint32) for r in JOB_REGISTERS}
        # Data-path handles on the same cells: memoryviews of the 1-D registers and counters
        # (Python ints in and out), cached (values, next) views per slot copy. The arrays are
        # only ever modified in place, so these stay valid.
        r, c = self.registers, self.counters
        self._r_round = r["slot_round"].data
        self._r_bitmap = r["slot_bitmap"].data
        self._r_count = r["slot_count"].data
        self._r_present = r["slot_present"].data
        self._r_nonfinite = r["slot_nonfinite"].data
        self._r_exponent = r["slot_exponent"].data
        self._r_length = r["slot_length"].data
        self._r_flags = r["slot_flags"].data
        self._h_round = r["head_round"].data
        self._h_heard = r["head_heard"].data
        self._h_missing = r["head_missing"].data
        self._c_received = c["job_received"].data
        self._c_stale = c["job_stale"].data
        self._c_held = c["job_held"].data
        self._c_duplicates = c["job_duplicates"].data
        self._c_results = c["job_results"].data
        self._c_aggregated = c["job_aggregated"].data
        self._c_malformed = c["port_malformed"].data
        self._c_unadmitted = c["port_unadmitted"].data
        self._c_saturated = c["job_lane_saturated"].data
        self._c_lane_mismatch = c["job_lane_mismatch"].data
        # Per slot copy: (nlanes, block_size, values view, next view) of the last shape used.
        self._view_cache: list[tuple | None] = [None] * n

    # ---------------------------------------------------------------- control plane
    def add_job(self, cfg: JobConfig, sources: dict[int, tuple[int, object]],
                mcast_grp: int = 0) -> None:
        """Admit `cfg`'s workers: sources[rank] = (ingress port, (source IPv4, UDP port))."""
        with self.lock:
            self._add_job(cfg, sources, mcast_grp)

    def check_job(self, cfg: JobConfig) -> None:
        """ConfigError naming the field unless `cfg` fits this pool beside the other jobs."""
        cfg.validate(self.pool_slots, self.slot_capacity)
        for other in {a for a in self.admission.values() if a.job != cfg.job}:
            if (cfg.slot_base < other.slot_base + other.nslots
                    and other.slot_base < cfg.slot_base + cfg.nslots):
                raise ConfigError(f"job {cfg.job}: field 'slot_base': slots {cfg.slot_base}.."
                                  f"{cfg.slot_base + cfg.nslots - 1} overlap job {other.job}'s")

    def job_slots(self, job: int) -> set[tuple[int, int]]:
        """(slot_base, nslots) of every admission of `job` here."""
        return {(a.slot_base, a.nslots) for a in self.admission.values() if a.job == job}

    def _add_job(self, cfg: JobConfig, sources: dict[int, tuple[int, object]],
                 mcast_grp: int) -> None:
        self.check_job(cfg)
        self.remove_job(cfg.job)
        adm = Admission(cfg.job, cfg.epoch, cfg.slot_base, cfg.nslots, cfg.nworkers,
                        cfg.block_size, cfg.nlanes, mcast_grp)
        for rank in range(cfg.nworkers):
            port, addr = sources[rank]
            self.admission[(port, addr, cfg.job, rank)] = adm
        self.clear_slots(cfg.slot_base, cfg.nslots)
        self.version += 1
        log.info("job %d admitted: %d workers, slots %d..%d, %d lanes x %d elements",
                 cfg.job, cfg.nworkers, cfg.slot_base, cfg.slot_base + cfg.nslots - 1,
                 cfg.nlanes, cfg.block_size)

    def remove_job(self, job: int) -> None:
        with self.lock:
            keys = [k for k, a in self.admission.items() if a.job == job]
            for k in keys:
                adm = self.admission.pop(k)
                self.clear_slots(adm.slot_base, adm.nslots)
            self.version += 1

    def clear_slots(self, base: int, n: int) -> None:
        with self.lock:
            for name, reg in self.registers.items():
                if name in HEAD_REGISTERS:
                    reg[base:base + n] = 0
                else:
                    reg[2 * base:2 * (base + n)] = 0

    # ---------------------------------------------------------------- data plane
    def process(self, pkt: bytes, port: int, src) -> list[Emit]:
        """Run one packet from ingress `port` and source address `src` through the pipeline."""
        out = bytearray(self.max_packet_len)
        n, multicast, adm, _ = self.process_into(pkt, port, src, out)
        if not n:
            return []
        return [Emit(bytes(out[:n]), adm.job, multicast, adm.mcast_grp if multicast else 0)]

    @property
    def max_packet_len(self) -> int:
        """The largest packet the pipeline can emit (all lanes present, a full slot copy)."""
        return wire.HEADER_LEN + 4 * wire.MAX_LANES + 4 * self.slot_capacity

    def process_into(self, pkt, port: int, src, out,
                     spine: bool = False) -> tuple[int, bool, Admission | None, int]:
        """`process` without allocation: the packet leaving the pipeline, if any, is written to
        the writable buffer `out` (at least `max_packet_len` bytes).

        Returns (n, multicast, admission, outcome): n = 0 if nothing leaves, else the packet is
        out[:n] and goes to every worker of admission's job (multicast) or back to the sender;
        outcome is one of DROPPED ... GATHERED (above). The stages are the P4 program's:
        `ina_check` (InaCheck), `admit` (Admission), `aggregate` (the Aggregator: the hold,
        slot_round, duplicates and completion, `add_lanes`, the result).
        `pkt` may be a reused buffer (bytes, bytearray or memoryview of exactly the datagram):
        nothing keeps a reference to it. `spine`: the job is aggregated here as a spine
        (softswitch/fabric.py), where a leaf's REPLAY partial is taken as the round's result.

        The data path's per-packet cost is Python overhead, so this reads header fields from
        one struct tuple and scalar registers and counters through memoryviews of their numpy
        arrays (same cells, no numpy scalars), and caches per-slot register views.
        """
        t = self.ina_check(pkt, port, src)
        if t is None:
            return _DROP
        adm = self.admit(t, port, src)
        if adm is None:
            return _DROP
        return self.aggregate(pkt, t, adm, out, spine)

    def ina_check(self, pkt, port: int, src) -> tuple | None:
        """InaCheck: the header's fields as a tuple (HEADER_STRUCT's order), or None for a
        malformed packet (counted in port_malformed)."""
        size = len(pkt)
        if size < HLEN:
            self.drop_malformed(port, src, f"truncated header: {size} < {HLEN} bytes")
            return None
        t = _UNPACK(pkt)
        err = _header_error(t, size)
        if err is None and t[_MSG_TYPE] != MSG_CONTRIB and t[_MSG_TYPE] != MSG_GATHER:
            err = f"hosts send contributions and all-gather packets only, not type {t[_MSG_TYPE]}"
        if err is not None:
            self.drop_malformed(port, src, err)
            return None
        return t

    def admit(self, t: tuple, port: int, src) -> Admission | None:
        """Admission: the job's entry for this rank from this source, with the slot and sizes
        in its range, and the job's current epoch; None otherwise (counted in port_unadmitted,
        or in job_received and job_stale for another epoch)."""
        job, slot = t[_JOB], t[_SLOT]
        adm = self.admission.get((port, src, job, t[_RANK]))
        if (adm is None or not adm.slot_base <= slot < adm.slot_base + adm.nslots
                or t[_NLANES] != adm.nlanes or t[_BLOCK_SIZE] != adm.block_size):
            self._c_unadmitted[port % MAX_PORTS] += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("drop unadmitted from %s: slot %d", src, slot, extra=_about(t))
            return None
        self._c_received[job] += 1
        if t[_EPOCH] != adm.epoch:
            self._c_stale[job] += 1
            return None
        return adm

    def aggregate(self, pkt, t: tuple, adm: Admission, out,
                  spine: bool = False) -> tuple[int, bool, Admission | None, int]:
        """Aggregator, for an admitted contribution with header fields `t`: the hold of a newer
        round, the slot copy's round, duplicate detection and completion, the lanes' sums;
        returns what process_into returns."""
        if t[_MSG_TYPE] == MSG_GATHER:
            # All-gather: the packet leaves as it came, for every other worker of the job
            # (the egress drops the sender's copy); no register is read or written.
            n = len(pkt)
            out[:n] = pkt
            return n, True, adm, GATHERED
        job, rank, slot, k = t[_JOB], t[_RANK], t[_SLOT], t[_NLANES]
        rnd, flags = t[_ROUND], t[_FLAGS]
        nworkers = adm.nworkers
        bit = 1 << rank
        if self.hold_newer_rounds and self._held(slot, rnd, bit, nworkers):
            self._c_held[job] += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("hold slot %d round %d: %d workers not yet at round %d", slot, rnd,
                          self._h_missing[slot], self._h_round[slot], extra=_about(t))
            return _DROP
        idx = 2 * slot + (rnd & 1)
        # slot_round: a newer round resets this copy, an older one is stale.
        delta = (rnd - self._r_round[idx] + (1 << 31)) % (1 << 32) - (1 << 31)
        if delta < 0:
            self._c_stale[job] += 1
            return _DROP
        new = delta > 0
        if new:
            self._r_round[idx] = rnd
            old_bitmap = old_count = 0
        else:
            old_bitmap = self._r_bitmap[idx]
            old_count = self._r_count[idx]
        if old_count >= nworkers:
            # Complete: a resend, or a late packet of a round completed without it (bounded
            # loss). Either way the stored result goes back to the sender; nothing is added.
            self._c_duplicates[job] += 1
            self._c_results[job] += 1
            return self.result_into(out, t, idx, FLAG_RESEND), False, adm, ANSWERED
        if spine and flags & FLAG_REPLAY:
            # A leaf's stored result of a round this spine lost (a restart): it is the round's
            # result, whoever else was added since. Written, not added; complete now.
            return self._adopt_into(out, pkt, t, idx, nworkers), True, adm, ADOPTED
        if old_bitmap & bit:
            self._c_duplicates[job] += 1
            if flags & FLAG_PARTIAL:
                # A flush (bounded-loss mode, opt-in by the job's agents): complete the round
                # now without the missing workers and tell everyone it is partial.
                self._r_count[idx] = nworkers
                self._r_flags[idx] |= FLAG_PARTIAL
                self._c_results[job] += nworkers
                return self.result_into(out, t, idx, 0), True, adm, FLUSHED
            # STATUS: the sender's header and next positions, with the round's bitmap.
            f = list(t)
            f[_MSG_TYPE] = MSG_STATUS
            f[_FLAGS] = flags & ~(FLAG_LAST | FLAG_PARTIAL)
            f[_BITMAP] = old_bitmap
            f[_PRESENT] = f[_NONFINITE] = 0
            _PACK_INTO(out, 0, *f)
            n = HLEN + 4 * k
            out[HLEN:n] = pkt[HLEN:n]
            return n, False, adm, STATUS
        self._r_bitmap[idx] = old_bitmap | bit
        count = old_count + 1
        self._r_count[idx] = count

        self.add_lanes(pkt, t, idx, new)
        self._c_aggregated[job] += 1
        if count < nworkers:
            return 0, False, adm, ADDED
        # P4 counts job_results per replica in egress (before the congestion check): the job's
        # multicast group has exactly its nworkers members.
        self._c_results[job] += nworkers
        return self.result_into(out, t, idx, 0), True, adm, COMPLETED

    def add_lanes(self, pkt, t: tuple, idx: int, new: bool) -> None:
        """The lanes of contribution `pkt` (header fields `t`) into slot copy `idx`: written
        into a copy its round starts (`new`), else added (values with int32 wrap-around, the
        minimum of next positions, ORs, max exponent, LAST and MISMATCH). Narrow rows (int16,
        int8) add into the same int32 registers."""
        k, bs, flags = t[_NLANES], t[_BLOCK_SIZE], t[_FLAGS]
        _, _, vals, slot_next = self.views(idx, k, bs)
        nxt = np.frombuffer(pkt, NEXT_DTYPE, k, HLEN)
        present, nonfinite, exponent, length = t[_PRESENT], t[_NONFINITE], t[_EXPONENT], t[_LENGTH]
        full = (1 << k) - 1
        if present:
            data = rows(pkt, t)
        if new:
            if present == full:
                vals[:] = data
            else:
                vals[:] = 0
                if present:
                    vals[wire.lane_indices(present, k)] = data
            slot_next[:] = nxt
            self._r_present[idx] = present
            self._r_nonfinite[idx] = nonfinite
            self._r_exponent[idx] = exponent
            self._r_length[idx] = length
            self._r_flags[idx] = flags & (FLAG_LAST | FLAGS_LANE_WIDTH)
        else:
            if present == full:
                np.add(vals, data, out=vals)  # int32 wrap-around, as the switch's 32-bit adders
            elif present:
                lanes = wire.lane_indices(present, k)
                vals[lanes] += data
            np.minimum(slot_next, nxt, out=slot_next)
            self._r_present[idx] |= present
            self._r_nonfinite[idx] |= nonfinite
            if exponent > self._r_exponent[idx]:
                self._r_exponent[idx] = exponent
            old_flags = self._r_flags[idx]
            new_flags = (old_flags & ~FLAG_LAST) | (old_flags & flags & FLAG_LAST)
            if length != self._r_length[idx]:
                new_flags |= FLAG_MISMATCH
            if (flags ^ old_flags) & FLAGS_LANE_WIDTH:
                # Another lane width than the round's first: its sum means nothing, so the
                # result says MISMATCH to every rank (one XOR of slot_flags, as P4 can).
                new_flags |= FLAG_MISMATCH
                self._c_lane_mismatch[t[_JOB]] += 1
            self._r_flags[idx] = new_flags

    def _adopt_into(self, out, pkt, t: tuple, idx: int, nworkers: int) -> int:
        """A spine takes a leaf's replayed result as round `idx`'s result; the result leaves for
        every leaf (job_results per copy, as egress counts them); returns its length."""
        k, bs, present = t[_NLANES], t[_BLOCK_SIZE], t[_PRESENT]
        _, _, vals, slot_next = self.views(idx, k, bs)
        slot_next[:] = np.frombuffer(pkt, NEXT_DTYPE, k, HLEN)
        vals[:] = 0
        if present:
            vals[wire.lane_indices(present, k)] = rows(pkt, t)
        # Its contributors: every rack for a whole result; for a PARTIAL one only the replaying
        # rack, if its stored ranks say it was in (the leaf kept no other rack's bit): no rack
        # is told its blocks were summed when they may not have been.
        self._r_bitmap[idx] = ((1 << nworkers) - 1 if not t[_FLAGS] & FLAG_PARTIAL
                               else 1 << t[_RANK] if t[_BITMAP] else 0)
        self._r_count[idx] = nworkers
        self._r_present[idx] = present
        self._r_nonfinite[idx] = t[_NONFINITE]
        self._r_exponent[idx] = t[_EXPONENT]
        self._r_length[idx] = t[_LENGTH]
        self._r_flags[idx] = t[_FLAGS] & (FLAGS_RESULT | FLAGS_LANE_WIDTH)  # rows: its width
        self._c_results[t[_JOB]] += nworkers
        return self.result_into(out, t, idx, 0)

    def _held(self, slot: int, rnd: int, bit: int, nworkers: int) -> bool:
        """head_*: note that rank `bit` reached round `rnd` of `slot`; True if `rnd` is newer
        than every round on the slot and must wait for a worker that may still need the copy
        it would take (the round before last)."""
        head = self._h_round[slot]
        missing = self._h_missing[slot]
        unheard = not self._h_heard[slot] & bit
        delta = (rnd - head) & 0xFFFFFFFF
        if delta == 0 or delta >= 1 << 31:  # head_round itself, or an older round
            if delta == 0 and unheard and missing:
                self._h_heard[slot] |= bit
                self._h_missing[slot] = missing - 1
            return False
        if missing == 0 or (missing == 1 and unheard):
            self._h_round[slot] = rnd
            self._h_heard[slot] = bit
            self._h_missing[slot] = nworkers - 1
            return False
        if unheard:  # its sender has the result of head_round, so has the copy's round
            self._h_heard[slot] |= bit
            self._h_missing[slot] = missing - 1
        return True

    def drop_malformed(self, port: int, src, why: str) -> tuple[int, bool, None, int]:
        """Count and drop a malformed packet from ingress `port` (process_into's return)."""
        self._c_malformed[port % MAX_PORTS] += 1
        log.debug("drop malformed from %s: %s", src, why)
        return _DROP

    def views(self, idx: int, k: int, bs: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """(k, bs, (k, bs) view of slot_values, (k,) view of slot_next) at copy `idx` (cached)."""
        got = self._view_cache[idx]
        if got is None or got[0] != k or got[1] != bs:
            r = self.registers
            got = (k, bs, r["slot_values"][idx, :k * bs].reshape(k, bs), r["slot_next"][idx, :k])
            self._view_cache[idx] = got
        return got

    def result_into(self, out, t: tuple, idx: int, extra_flags: int) -> int:
        """Write the result of the round stored at `idx`, in reply to header fields `t`, into
        `out`; return its length."""
        k, bs = t[_NLANES], t[_BLOCK_SIZE]
        present = self._r_present[idx]
        # the request's identity (version, priority, job ... round); the rest is the slot's
        f = list(t)
        f[_MSG_TYPE] = MSG_RESULT
        f[_FLAGS] = self._r_flags[idx] | (t[_FLAGS] & FLAG_LOSS_TOLERANT) | extra_flags
        f[_LENGTH] = self._r_length[idx]
        f[_EXPONENT] = self._r_exponent[idx]
        f[_BITMAP] = self._r_bitmap[idx]
        f[_PRESENT] = present
        f[_NONFINITE] = self._r_nonfinite[idx]
        _PACK_INTO(out, 0, *f)
        _, _, vals, slot_next = self.views(idx, k, bs)
        np.frombuffer(out, NEXT_DTYPE, k, HLEN)[:] = slot_next
        if not present:
            return HLEN + 4 * k
        width = f[_FLAGS] & FLAGS_LANE_WIDTH
        if present == (1 << k) - 1:
            n, sums = k, vals
        else:
            lanes = wire.lane_indices(present, k)
            n, sums = len(lanes), vals[lanes]
        dst = np.frombuffer(out, wire.data_dtype(width), n * bs, HLEN + 4 * k).reshape(n, bs)
        if width:
            # The answer has the contributions' width: an honest job's sums fit it (the shift,
            # docs/bits.md); others saturate to its range, and the packet is counted.
            lo, hi = _LANE_RANGE[width]
            if sums.min() < lo or sums.max() > hi:
                self._c_saturated[t[_JOB]] += 1
                sums = np.clip(sums, lo, hi)
        dst[:] = sums
        return HLEN + 4 * k + wire.row_bytes(bs, width) * n

    # ---------------------------------------------------------------- observation
    def job_counters(self, job: int) -> dict[str, int]:
        return {name: int(self.counters[name][job]) for name in JOB_COUNTERS}

    def port_counters(self, port: int = 0) -> dict[str, int]:
        return {name: int(self.counters[name][port]) for name in PORT_COUNTERS}
