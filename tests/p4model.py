"""A line-by-line transliteration of p4src's INA path (SpinaParser's INA states, InaCheck,
Admission, Aggregator) into plain Python: scalar registers, one list per lane and element, no
numpy, no shortcuts.

It exists to be compared with the software switch (tests/test_p4_model.py): payloads with
softswitch.pipeline.Pipeline, whole frames with softswitch.dataplane.Dataplane, the leaf and spine
roles (fabric.p4's FabricRoles, ToSpine and FromSpine, and the Aggregator's spine rules) with
softswitch.fabric.FabricRoles. What leaves is (payload, kind): kind True multicast (the job's or the
rack's group), False back to the sender, "up" to the slot's spine. If the software switch
and this transliteration of the P4 disagree, one of them is wrong. Keep it as
close to the P4 text as Python allows; statement order follows aggregator.p4.
"""
from __future__ import annotations

import socket
import struct

from spina import wire
from spina.spec import FLAGS_CARRIED, FLAGS_RESULT

M32 = 0xFFFFFFFF
ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8
INA_OFF = ETH_LEN + IPV4_LEN + UDP_LEN  # the parser takes IPv4 without options only


class P4Model:
    def __init__(self, pool_slots: int, nlanes: int, block_size: int):
        n = 2 * pool_slots
        self.NLANES, self.BLOCK_SIZE = nlanes, block_size
        self.reg = {name: [0] * n for name in (
            "slot_round", "slot_bitmap", "slot_count", "slot_present", "slot_nonfinite",
            "slot_exponent", "slot_length", "slot_flags")}
        self.reg.update({name: [0] * pool_slots  # one cell per slot
                         for name in ("head_round", "head_heard", "head_missing")})
        self.next = [[0] * n for _ in range(nlanes)]                          # slot_next_l<L>
        self.values = [[[0] * n for _ in range(block_size)] for _ in range(nlanes)]
        self.counters: dict[tuple[str, int], int] = {}
        self.admission: dict[tuple, dict] = {}
        # fabric.p4: job -> dict(leaf=..., spine=..., as_leaf's parameters); (job, slot) ->
        # (ingress port, source) of the spine (the P4 compares the IPv4 source and the UDP
        # source port with INA_UDP_PORT: here the whole source).
        self.job_level: dict[int, dict] = {}
        self.leaf_upstream: dict[tuple[int, int], tuple] = {}

    def count(self, name, index):
        self.counters[(name, index)] = self.counters.get((name, index), 0) + 1

    # ------------------------------------------------------------ SpinaParser + InaCheck
    def fabric_roles(self, pkt: bytes) -> dict:
        """FabricRoles: meta.fab for a packet whose INA header is valid."""
        fab = dict(leaf=False, spine=False, up=None, from_spine=False)
        if len(pkt) < wire.HEADER_LEN:
            return fab
        h = wire.unpack_header(pkt)
        fab.update(self.job_level.get(h.job, {}))
        fab["up"] = self.leaf_upstream.get((h.job, h.slot))
        fab["from_spine"] = fab["up"] is not None and h.msg_type != wire.MSG_CONTRIB
        return fab

    def bad_header(self, h, udp_payload_len: int, from_spine: bool = False) -> bool:
        """InaCheck's field tests and the UDP length against the header's sizes."""
        want = wire.HEADER_LEN + 4 * h.nlanes + 4 * h.block_size * bin(h.present).count("1")
        bad_type = (h.msg_type not in (wire.MSG_RESULT, wire.MSG_STATUS) if from_spine
                    else h.msg_type not in (wire.MSG_CONTRIB, wire.MSG_GATHER))
        return (h.version != wire.VERSION or bad_type
                or h.nlanes == 0 or h.nlanes > wire.MAX_LANES or h.block_size == 0
                or h.rank >= wire.MAX_WORKERS or (h.present >> h.nlanes) != 0
                or (h.nonfinite >> h.nlanes) != 0 or udp_payload_len != want)

    def malformed(self, pkt: bytes, from_spine: bool = False) -> bool:
        """InaCheck on a whole UDP payload (a frame that holds exactly its datagram)."""
        return len(pkt) < wire.HEADER_LEN or self.bad_header(wire.unpack_header(pkt), len(pkt),
                                                              from_spine)

    def malformed_frame(self, frame: bytes) -> bool:
        """SpinaParser + InaCheck on an INA frame for this switch (Ethernet, IPv4 ihl 5, UDP to
        the INA port): parser_error where the parser runs out of frame, the header against the
        UDP length, and the UDP length against the frame's real length (std.packet_length)."""
        if len(frame) < INA_OFF + wire.HEADER_LEN:
            return True  # parser_error: no INA header
        h = wire.unpack_header(frame, INA_OFF)
        # parse_lane_next_*: min(nlanes, NLANES) positions; parse_blocks only after all nlanes
        # of them and for the P4's block size: one block per present bit of lanes 0..NLANES-1.
        parsed = INA_OFF + wire.HEADER_LEN + 4 * min(h.nlanes, self.NLANES)
        if 0 < h.nlanes <= self.NLANES and h.block_size == self.BLOCK_SIZE:
            parsed += 4 * self.BLOCK_SIZE * bin(h.present & ((1 << self.NLANES) - 1)).count("1")
        udp_len = int.from_bytes(frame[INA_OFF - 4:INA_OFF - 2], "big")
        return (len(frame) < parsed  # parser_error
                or self.bad_header(h, udp_len - UDP_LEN)
                or len(frame) < ETH_LEN + IPV4_LEN + udp_len)

    # ------------------------------------------------------------ ingress for one INA packet
    def process(self, pkt: bytes, port: int, src) -> list[tuple[bytes, bool]]:
        """One UDP payload from `src` on `port` (the software pipeline's input)."""
        fab = self.fabric_roles(pkt)
        if self.malformed(pkt, fab["from_spine"]):
            self.count("port_malformed", port)
            return []
        return self.admit(pkt, port, src, fab)

    def scatter_strip(self, pkt: bytes, out: bytes, rid: int) -> bytes:
        """ScatterStrip (v1model/scatter_strip.p4) on the copy `out` of what contribution `pkt`
        made, for replica `rid` (0: the reply to its sender). SpinaIngress keeps a
        contribution's bitmap in meta.owners (not at a spine: this model's flat path)."""
        h_in = wire.unpack_header(pkt)
        owners = h_in.bitmap if h_in.msg_type == wire.MSG_CONTRIB else 0
        h = wire.unpack_header(out)
        if owners != 0 and h.msg_type == wire.MSG_RESULT:
            rank = h.rank & 31                   # bit<5> rank = (bit<5>)hdr.ina.rank;
            if rid != 0:
                rank = (rid - 1) & 31            # rank = (bit<5>)(std.egress_rid - 1);
            if ((owners >> rank) & 1) == 0:
                h.present = 0                    # FOR_EACH_LANE(SPINA_DROP_BLOCK), lengths
                h.nonfinite = 0
                return wire.pack_header(h) + out[wire.HEADER_LEN:wire.HEADER_LEN + 4 * h.nlanes]
        return out

    def process_frame(self, frame: bytes, port: int) -> list[tuple[bytes, bool]]:
        """One INA frame addressed to this switch on `port`; what it emits as UDP payloads."""
        if self.malformed_frame(frame):
            self.count("port_malformed", port)
            return []
        udp_len = int.from_bytes(frame[INA_OFF - 4:INA_OFF - 2], "big")
        src = (socket.inet_ntoa(frame[26:30]), int.from_bytes(frame[34:36], "big"))
        return self.admit(frame[INA_OFF:ETH_LEN + IPV4_LEN + udp_len], port, src)

    def admit(self, pkt: bytes, port: int, src, fab=None) -> list[tuple[bytes, bool]]:
        """Admission, then the Aggregator, for a well-formed payload."""
        fab = fab or dict(leaf=False, spine=False, up=None, from_spine=False)
        h = wire.unpack_header(pkt)
        if fab["from_spine"]:
            ok = (fab["leaf"] and (port, src) == fab["up"] and h.nlanes <= self.NLANES
                  and h.block_size == self.BLOCK_SIZE)
            if not ok:
                self.count("port_unadmitted", port)
                return []
            return self.from_spine(h, pkt, fab)
        adm = self.admission.get((port, src, h.job, h.rank))
        if adm is not None and not (adm["slot_base"] <= h.slot < adm["slot_base"] + adm["nslots"]
                                    and h.nlanes == adm["nlanes"]
                                    and h.block_size == adm["block_size"]
                                    and h.nlanes <= self.NLANES
                                    and h.block_size == self.BLOCK_SIZE
                                    and not (h.msg_type == wire.MSG_GATHER
                                             and (fab["leaf"] or fab["spine"]))):
            adm = None
        if adm is None:
            self.count("port_unadmitted", port)
            return []
        return self.aggregate(h, pkt, adm, fab)

    def lanes(self, h, pkt):
        lane_next = list(struct.unpack_from(f">{h.nlanes}I", pkt, wire.HEADER_LEN))
        block, off = {}, wire.HEADER_LEN + 4 * h.nlanes
        for lane in range(h.nlanes):
            if h.present >> lane & 1:
                block[lane] = list(struct.unpack_from(f">{self.BLOCK_SIZE}i", pkt, off))
                off += 4 * self.BLOCK_SIZE
        return lane_next, block

    def from_spine(self, h, pkt, fab):
        """fabric.p4's FromSpine: a leaf meets the spine's answer."""
        r, job = self.reg, h.job
        lane_next, block = self.lanes(h, pkt)
        self.count("job_received", job)
        idx = (h.slot << 1) | (h.round & 1)
        in_flags = h.flags
        held_round = r["slot_round"][idx]
        if h.epoch != fab["epoch"] or held_round != h.round:
            self.count("job_stale", job)
            return []
        held = r["slot_count"][idx]
        nlocal = fab["nlocal"]
        if h.msg_type == wire.MSG_STATUS and h.rank != fab["rack"]:
            # another rack's status: replay the stored result if the spine lacks this rack
            if held <= nlocal or h.bitmap >> fab["rack"] & 1:
                return []
            out = h.copy()
            present = r["slot_present"][idx]
            out.msg_type = wire.MSG_CONTRIB
            out.flags = (r["slot_flags"][idx] & FLAGS_RESULT) | wire.FLAG_RESEND | wire.FLAG_REPLAY
            out.rank = fab["rack"]
            out.present, out.bitmap = present, r["slot_bitmap"][idx]
            out.nonfinite, out.exponent = r["slot_nonfinite"][idx], _s16(r["slot_exponent"][idx])
            out.length = r["slot_length"][idx]
            # FOR_EACH_LANE(SPINA_LOAD_LANE)
            nxt = [self.next[lane][idx] for lane in range(h.nlanes)]
            data = b"".join(struct.pack(f">{self.BLOCK_SIZE}I",
                                        *(self.values[lane][e][idx]
                                          for e in range(self.BLOCK_SIZE)))
                            for lane in range(h.nlanes) if present >> lane & 1)
            return [(wire.pack_header(out) + struct.pack(f">{h.nlanes}I", *nxt) + data, "up")]
        if held != nlocal:
            self.count("job_duplicates" if held > nlocal else "job_stale", job)
            return []
        local_ranks = 0
        if (h.bitmap >> fab["rack"]) & 1 == 1:
            if h.msg_type == wire.MSG_RESULT:
                local_ranks = r["slot_bitmap"][idx]
            else:
                local_ranks = ((1 << fab["nlocal"]) - 1) & 0xFFFFFFFF
        out = h.copy()
        out.bitmap = local_ranks
        if h.msg_type == wire.MSG_RESULT:
            rflags = in_flags & FLAGS_RESULT
            for lane in range(self.NLANES):  # FOR_EACH_LANE(SPINA_STORE_LANE)
                if h.nlanes > lane:
                    self.next[lane][idx] = lane_next[lane]
                    if h.present >> lane & 1:
                        for e in range(self.BLOCK_SIZE):
                            self.values[lane][e][idx] = block[lane][e] & M32
            r["slot_present"][idx] = h.present
            r["slot_bitmap"][idx] = out.bitmap
            r["slot_flags"][idx] = rflags
            r["slot_count"][idx] = held + 1
            r["slot_nonfinite"][idx] = h.nonfinite
            r["slot_exponent"][idx] = h.exponent & 0xFFFF
            r["slot_length"][idx] = h.length
            out.flags = rflags | (in_flags & wire.FLAG_LOSS_TOLERANT)
            for _ in range(nlocal):  # egress: job_results per RESULT copy (the rack's group)
                self.count("job_results", job)
        return [(wire.pack_header(out) + pkt[wire.HEADER_LEN:], True)]

    def aggregate(self, h, pkt, adm, fab=None):
        fab = fab or dict(leaf=False, spine=False, up=None, from_spine=False)
        r, job = self.reg, h.job
        lane_next, block = self.lanes(h, pkt)
        self.count("job_received", job)
        idx = (h.slot << 1) | (h.round & 1)
        in_flags = h.flags
        if h.epoch != adm["epoch"]:
            self.count("job_stale", job)
            return []
        if h.msg_type == wire.MSG_GATHER:
            return [(pkt, True)]  # reply_to_sender, the job's group; no register
        rank_bit = 1 << h.rank
        slot = h.slot
        head, heard, missing = r["head_round"][slot], r["head_heard"][slot], r["head_missing"][slot]
        ahead = (h.round - head) & M32
        unheard = (heard & rank_bit) == 0
        if ahead == 0 or ahead >> 31 == 1:
            if ahead == 0 and unheard and missing != 0:
                r["head_heard"][slot] = heard | rank_bit
                r["head_missing"][slot] = missing - 1
        elif missing == 0 or (missing == 1 and unheard):
            r["head_round"][slot] = h.round
            r["head_heard"][slot] = rank_bit
            r["head_missing"][slot] = (adm["nworkers"] - 1) & 0xFF
        else:
            if unheard:
                r["head_heard"][slot] = heard | rank_bit
                r["head_missing"][slot] = missing - 1
            self.count("job_held", job)
            return []
        old_round = r["slot_round"][idx]
        delta = (h.round - old_round) & M32
        if delta >> 31 == 1:
            self.count("job_stale", job)
            return []
        fresh = delta != 0
        if fresh:
            r["slot_round"][idx] = h.round
        old_bitmap = count = 0
        if not fresh:
            old_bitmap = r["slot_bitmap"][idx]
        duplicate = (old_bitmap & rank_bit) != 0
        if not fresh:
            count = r["slot_count"][idx]
        complete = count >= adm["nworkers"]
        adopt = fab["spine"] and (in_flags & wire.FLAG_REPLAY) != 0 and not complete
        flush = duplicate and not complete and not adopt and (h.flags & wire.FLAG_PARTIAL) != 0
        accumulate = not duplicate and not complete and not adopt
        reset = fresh or adopt
        replayed = (((1 << adm["nworkers"]) - 1) & M32 if not in_flags & wire.FLAG_PARTIAL
                    else rank_bit if h.bitmap else 0)
        if accumulate:
            r["slot_bitmap"][idx] = old_bitmap | rank_bit
            count += 1
            r["slot_count"][idx] = count
        elif adopt:
            r["slot_bitmap"][idx] = replayed
            count = adm["nworkers"]
            r["slot_count"][idx] = count
        else:
            self.count("job_duplicates", job)
            if flush:
                count = adm["nworkers"]
                r["slot_count"][idx] = count
        send_result = count >= adm["nworkers"]

        out = h.copy()
        out_blocks = {}
        if duplicate and not send_result:
            out.msg_type = wire.MSG_STATUS
            out.flags = h.flags & ~(wire.FLAG_LAST | wire.FLAG_PARTIAL) & 0xFF
            out.bitmap = old_bitmap
            out.present = out.nonfinite = 0
            out_next = lane_next
        else:
            present, nonfinite, exponent = h.present, h.nonfinite, h.exponent & 0xFFFF
            length, sflags = h.length, h.flags & wire.FLAG_LAST
            carried = in_flags & FLAGS_CARRIED if fab["spine"] else 0
            if reset:
                sflags |= carried
                r["slot_present"][idx], r["slot_nonfinite"][idx] = present, nonfinite
                r["slot_exponent"][idx], r["slot_length"][idx] = exponent, length
                r["slot_flags"][idx] = sflags
            else:
                present, nonfinite = r["slot_present"][idx], r["slot_nonfinite"][idx]
                exponent, length = r["slot_exponent"][idx], r["slot_length"][idx]
                sflags = r["slot_flags"][idx]
                if accumulate:
                    present |= h.present
                    r["slot_present"][idx] = present
                    nonfinite |= h.nonfinite
                    r["slot_nonfinite"][idx] = nonfinite
                    if _s16(h.exponent & 0xFFFF) > _s16(exponent):
                        exponent = h.exponent & 0xFFFF
                        r["slot_exponent"][idx] = exponent
                    sflags = (sflags & ~wire.FLAG_LAST) | (sflags & h.flags & wire.FLAG_LAST)
                    if h.length != length:
                        sflags |= wire.FLAG_MISMATCH
                    sflags |= carried
                    r["slot_flags"][idx] = sflags
                elif flush:
                    sflags |= wire.FLAG_PARTIAL
                    r["slot_flags"][idx] = sflags
            out_next = list(lane_next)
            for lane in range(self.NLANES):  # FOR_EACH_LANE(SPINA_LANE)
                if not h.nlanes > lane:
                    continue
                add = (accumulate or adopt) and (h.present >> lane & 1) == 1
                out_l = send_result and (present >> lane & 1) == 1
                nxt = lane_next[lane]
                if reset:
                    self.next[lane][idx] = nxt
                else:
                    nxt = self.next[lane][idx]
                    if accumulate:
                        if lane_next[lane] < nxt:
                            nxt = lane_next[lane]
                        self.next[lane][idx] = nxt
                if send_result:
                    out_next[lane] = nxt
                if reset or add or out_l:
                    vals = []
                    for e in range(self.BLOCK_SIZE):  # FOR_EACH_ELEM(SPINA_VALUE_CELL)
                        v = 0
                        if not reset:
                            v = self.values[lane][e][idx]
                        if add:
                            v = (v + block[lane][e]) & M32
                        if reset or add:
                            self.values[lane][e][idx] = v
                        vals.append(v)
                    if out_l:
                        out_blocks[lane] = vals
            if accumulate:
                self.count("job_aggregated", job)
            if not send_result:
                return []
            out.msg_type = wire.MSG_RESULT
            out.flags = sflags | (h.flags & wire.FLAG_LOSS_TOLERANT) | (
                0 if accumulate or flush or adopt else wire.FLAG_RESEND)
            out.bitmap = (old_bitmap | rank_bit if accumulate
                          else replayed if adopt else old_bitmap)
            out.present, out.nonfinite, out.exponent = present, nonfinite, _s16(exponent)
            out.length = length
        data = b"".join(struct.pack(f">{self.BLOCK_SIZE}I", *out_blocks[lane])
                        for lane in sorted(out_blocks))
        multicast = accumulate or flush or adopt
        kind = multicast or (fab["spine"] and out.msg_type == wire.MSG_STATUS)
        if fab["leaf"] and out.msg_type == wire.MSG_RESULT and (
                multicast or count <= fab["nlocal"]):
            out.msg_type = wire.MSG_CONTRIB
            goes_up = multicast or h.rank == 0 or (in_flags & wire.FLAG_PARTIAL) != 0
            if not multicast:
                out.flags = ((out.flags & ~(wire.FLAG_PARTIAL | wire.FLAG_RESEND) & 0xFF)
                             | wire.FLAG_RESEND | (in_flags & wire.FLAG_PARTIAL))
            out.rank = fab["rack"]
            if fab["up"] is None or not goes_up:
                return []
            kind = "up"
        frame = wire.pack_header(out) + struct.pack(f">{h.nlanes}I", *out_next) + data
        # Egress: job_results per RESULT copy (a job's group has its nworkers members).
        if out.msg_type == wire.MSG_RESULT:
            for _ in range(adm["nworkers"] if multicast else 1):
                self.count("job_results", job)
        return [(frame, kind)]




def _s16(x: int) -> int:
    return x - 0x10000 if x & 0x8000 else x
