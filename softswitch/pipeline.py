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
  slot_flags      LAST (AND over contributions) and MISMATCH (OR: a length disagreed)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from softswitch.spec import (JOB_COUNTERS, MAX_JOBS, MAX_PORTS, PORT_COUNTERS,  # noqa: F401
                             QDEPTH_NEVER, REGISTER_NAMES as REGISTERS, TABLES)
from spina import wire
from spina.config import ConfigError, JobConfig

log = logging.getLogger("spina.softswitch")

# Register, table and counter names live in softswitch/spec.py (imported above); the P4
# program declares the same (tests/test_p4_agreement.py checks it).
DEFAULT_POOL_SLOTS = 256
DEFAULT_SLOT_CAPACITY = 64 * 256  # elements per slot copy: 64 lanes of 256


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
        }
        self.counters = {name: np.zeros(MAX_JOBS, np.uint64) for name in JOB_COUNTERS}
        self.counters.update({name: np.zeros(MAX_PORTS, np.uint64) for name in PORT_COUNTERS})
        # admission: (ingress port, (source IPv4, source UDP port), job, rank) -> Admission.
        # P4: table `admission`, keys ingress_port, src_addr, src_port, job, rank (all exact).
        # The address stays in the form the socket layer gives ('a.b.c.d', port): no per-packet
        # conversion on the data path.
        self.admission: dict[tuple, Admission] = {}
        # P4: table `congestion`, action set_qdepth_threshold: loss-tolerant packets leaving
        # through a queue deeper than this are dropped (QDEPTH_NEVER: never).
        self.qdepth_threshold = QDEPTH_NEVER

    # ---------------------------------------------------------------- control plane
    def add_job(self, cfg: JobConfig, sources: dict[int, tuple[int, object]],
                mcast_grp: int = 0) -> None:
        """Admit `cfg`'s workers: sources[rank] = (ingress port, (source IPv4, UDP port))."""
        cfg.validate(self.pool_slots, self.slot_capacity)
        for other in {a for a in self.admission.values() if a.job != cfg.job}:
            if (cfg.slot_base < other.slot_base + other.nslots
                    and other.slot_base < cfg.slot_base + cfg.nslots):
                raise ConfigError(f"job {cfg.job}: field 'slot_base': slots {cfg.slot_base}.."
                                  f"{cfg.slot_base + cfg.nslots - 1} overlap job {other.job}'s")
        self.remove_job(cfg.job)
        adm = Admission(cfg.job, cfg.epoch, cfg.slot_base, cfg.nslots, cfg.nworkers,
                        cfg.block_size, cfg.nlanes, mcast_grp)
        for rank in range(cfg.nworkers):
            port, addr = sources[rank]
            self.admission[(port, addr, cfg.job, rank)] = adm
        self.clear_slots(cfg.slot_base, cfg.nslots)
        log.info("job %d admitted: %d workers, slots %d..%d, %d lanes x %d elements",
                 cfg.job, cfg.nworkers, cfg.slot_base, cfg.slot_base + cfg.nslots - 1,
                 cfg.nlanes, cfg.block_size)

    def remove_job(self, job: int) -> None:
        keys = [k for k, a in self.admission.items() if a.job == job]
        for k in keys:
            adm = self.admission.pop(k)
            self.clear_slots(adm.slot_base, adm.nslots)

    def clear_slots(self, base: int, n: int) -> None:
        for reg in self.registers.values():
            reg[2 * base:2 * (base + n)] = 0

    # ---------------------------------------------------------------- data plane
    def process(self, pkt: bytes, port: int, src) -> list[Emit]:
        """Run one packet from ingress `port` and source address `src` through the pipeline."""
        c = self.counters
        try:
            h = wire.unpack_header(pkt)
            wire.check_header(h, len(pkt))
            if h.msg_type != wire.MSG_CONTRIB:
                raise wire.MalformedPacket(f"hosts send contributions only, not type {h.msg_type}")
        except wire.MalformedPacket as e:
            c["port_malformed"][port % MAX_PORTS] += 1
            log.debug("drop malformed from %s: %s", src, e)
            return []
        adm = self.admission.get((port, src, h.job, h.rank))
        if (adm is None or not adm.slot_base <= h.slot < adm.slot_base + adm.nslots
                or h.nlanes != adm.nlanes or h.block_size != adm.block_size):
            c["port_unadmitted"][port % MAX_PORTS] += 1
            log.debug("drop unadmitted from %s: job %d rank %d slot %d", src, h.job, h.rank, h.slot)
            return []
        job = h.job
        c["job_received"][job] += 1
        if h.epoch != adm.epoch:
            c["job_stale"][job] += 1
            return []

        r = self.registers
        idx = 2 * h.slot + (h.round & 1)
        # slot_round: a newer round resets this copy, an older one is stale.
        delta = (h.round - int(r["slot_round"][idx]) + (1 << 31)) % (1 << 32) - (1 << 31)
        if delta < 0:
            c["job_stale"][job] += 1
            return []
        new = delta > 0
        if new:
            r["slot_round"][idx] = h.round
        bit = 1 << h.rank
        old_bitmap = 0 if new else int(r["slot_bitmap"][idx])
        old_count = 0 if new else int(r["slot_count"][idx])
        if old_count >= adm.nworkers:
            # Complete: a resend, or a late packet of a round completed without it (bounded
            # loss). Either way the stored result goes back to the sender; nothing is added.
            c["job_duplicates"][job] += 1
            c["job_results"][job] += 1
            return [Emit(self._result(h, idx, wire.FLAG_RESEND), job, multicast=False)]
        if old_bitmap & bit:
            c["job_duplicates"][job] += 1
            if h.flags & wire.FLAG_PARTIAL:
                # A flush (bounded-loss mode, opt-in by the job's agents): complete the round
                # now without the missing workers and tell everyone it is partial.
                r["slot_count"][idx] = adm.nworkers
                r["slot_flags"][idx] |= wire.FLAG_PARTIAL
                c["job_results"][job] += adm.nworkers
                return [Emit(self._result(h, idx, 0), job, True, adm.mcast_grp)]
            status = h.copy(msg_type=wire.MSG_STATUS, bitmap=old_bitmap, present=0, nonfinite=0,
                            flags=h.flags & ~(wire.FLAG_LAST | wire.FLAG_PARTIAL))
            return [Emit(wire.pack_header(status) + bytes(pkt[wire.HEADER_LEN:wire.HEADER_LEN + 4 * h.nlanes]),
                         job, multicast=False)]
        r["slot_bitmap"][idx] = old_bitmap | bit
        count = old_count + 1
        r["slot_count"][idx] = count

        k, bs = h.nlanes, h.block_size
        vals = r["slot_values"][idx, :k * bs].reshape(k, bs)
        nxt = np.frombuffer(pkt, wire.NEXT_DTYPE, k, wire.HEADER_LEN)
        data_off = wire.HEADER_LEN + 4 * k
        if h.present:
            data = np.frombuffer(pkt, wire.DATA_DTYPE, offset=data_off).reshape(-1, bs)
            lanes = _lanes(h.present, k)
        if new:
            if h.present == (1 << k) - 1:
                vals[:] = data
            else:
                vals[:] = 0
                if h.present:
                    vals[lanes] = data
            r["slot_next"][idx, :k] = nxt
            r["slot_present"][idx] = h.present
            r["slot_nonfinite"][idx] = h.nonfinite
            r["slot_exponent"][idx] = h.exponent
            r["slot_length"][idx] = h.length
            r["slot_flags"][idx] = h.flags & wire.FLAG_LAST
        else:
            if h.present == (1 << k) - 1:
                vals += data  # int32 wrap-around, as the switch's 32-bit adders
            elif h.present:
                vals[lanes] += data
            np.minimum(r["slot_next"][idx, :k], nxt, out=r["slot_next"][idx, :k])
            r["slot_present"][idx] |= np.uint64(h.present)
            r["slot_nonfinite"][idx] |= np.uint64(h.nonfinite)
            if h.exponent > r["slot_exponent"][idx]:
                r["slot_exponent"][idx] = h.exponent
            flags = int(r["slot_flags"][idx])
            flags = (flags & ~wire.FLAG_LAST) | (flags & h.flags & wire.FLAG_LAST)
            if h.length != int(r["slot_length"][idx]):
                flags |= wire.FLAG_MISMATCH
            r["slot_flags"][idx] = flags
        c["job_aggregated"][job] += 1
        if count < adm.nworkers:
            return []
        # P4 counts job_results per replica in egress (before the congestion check): the job's
        # multicast group has exactly its nworkers members.
        c["job_results"][job] += adm.nworkers
        return [Emit(self._result(h, idx, 0), job, True, adm.mcast_grp)]

    def _result(self, h: wire.Header, idx: int, extra_flags: int) -> bytes:
        """The result of the round stored at `idx`, in reply to packet header `h`."""
        r = self.registers
        k, bs = h.nlanes, h.block_size
        present = int(r["slot_present"][idx])
        res = h.copy(msg_type=wire.MSG_RESULT,
                     flags=int(r["slot_flags"][idx]) | (h.flags & wire.FLAG_LOSS_TOLERANT) | extra_flags,
                     bitmap=int(r["slot_bitmap"][idx]), present=present,
                     nonfinite=int(r["slot_nonfinite"][idx]),
                     exponent=int(r["slot_exponent"][idx]), length=int(r["slot_length"][idx]))
        vals = r["slot_values"][idx, :k * bs].reshape(k, bs)
        if present != (1 << k) - 1:
            vals = vals[_lanes(present, k)]
        return b"".join((wire.pack_header(res), r["slot_next"][idx, :k].astype(wire.NEXT_DTYPE).tobytes(),
                         vals.astype(wire.DATA_DTYPE).tobytes()))

    def congestion_drop(self, data, qdepth: int) -> bool:
        """Egress: True (and counted) if this INA packet is loss-tolerant and its queue is deep.

        P4: SpinaEgress's priority/drop control, on `standard_metadata.enq_qdepth`.
        """
        if qdepth > self.qdepth_threshold and data[2] & wire.FLAG_LOSS_TOLERANT:
            self.counters["job_congestion_drops"][(data[4] << 8) | data[5]] += 1
            return True
        return False

    # ---------------------------------------------------------------- observation
    def job_counters(self, job: int) -> dict[str, int]:
        return {name: int(self.counters[name][job]) for name in JOB_COUNTERS}

    def port_counters(self, port: int = 0) -> dict[str, int]:
        return {name: int(self.counters[name][port]) for name in PORT_COUNTERS}


_LANE_CACHE: dict[tuple[int, int], np.ndarray] = {}


def _lanes(bits: int, k: int) -> np.ndarray:
    """Indices of the set bits of a lane bitmap (cached: bitmaps repeat a lot)."""
    key = (bits, k)
    got = _LANE_CACHE.get(key)
    if got is None:
        got = np.flatnonzero([(bits >> i) & 1 for i in range(k)])
        if len(_LANE_CACHE) < 4096:
            _LANE_CACHE[key] = got
    return got
