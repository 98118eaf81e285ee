"""A statement-by-statement transliteration of the Tofino 1 program's INA path (tofino/:
SpinaIngressParser's INA states, InaCheck, Admission, Aggregator, and egress's EgressSlots,
WorkerRewrite counter and CongestionDrop) into plain Python, RegisterAction by RegisterAction,
pass by pass: every aggregated packet crosses egress (EgressSlots) through the recirculation
port; a held contribution is dropped there, a reply goes round twice more: its second pass
reads the pairs' high halves (ingress, then egress) when it carries the block, its third sends
it on.

tests/test_tna_model.py compares it with the software switch (softswitch.pipeline.Pipeline at
the TNA sizes). Each RegisterAction is a method that takes the cell, returns (new cell, rv),
as the stateful ALU does; the const tables `decide` and `flag_input` are not copied here
but read from tofino/include/decide.p4's text, so that the model follows the P4 entries as
written (`rank_to_bit`'s entries, tofino/include/slot_index.p4, tests/test_tna_agreement.py
checks). If the software switch and this model disagree, one of them is wrong.
`TnaModel(lane_bits=16)` (or 8) is the program compiled with -DSPINA_LANE_BITS=16 (or 8):
elements of that width, another width malformed, pair cells that saturate at each add.
"""
from __future__ import annotations

import pathlib
import re
import socket
import struct

from spina import spec, wire

M32 = 0xFFFFFFFF
ROOT = pathlib.Path(__file__).resolve().parents[1]
TOFINO = ROOT / "tofino"
S = spec.TNA_SIZES
NLANES, BLOCK_SIZE = S["NLANES"], S["BLOCK_SIZE"]
# tofino/size.p4's lane-width profiles (-DSPINA_LANE_BITS): the struct format of one element on
# the wire (int32 as unsigned words, as the pairs add them with wrap-around; narrow lanes signed,
# as the pairs add them with the stateful ALU's saturating add).
LANE_FORMAT = {32: "I", 16: "h", 8: "b"}
PAIRS = S["EGRESS_PAIRS"] + S["INGRESS_PAIRS"]
EGRESS_PAIRS = range(S["EGRESS_PAIRS"])          # elements of block_e
INGRESS_PAIRS = range(S["EGRESS_PAIRS"], PAIRS)  # elements of block_i
JOB_MASK = S["MAX_JOBS"] - 1
UDP_HDR_BYTES = 8
ETH_LEN, IPV4_LEN = 14, 20
INA_OFF = ETH_LEN + IPV4_LEN + UDP_HDR_BYTES  # the parser takes IPv4 without options only
LAST, PARTIAL, RESEND = wire.FLAG_LAST, wire.FLAG_PARTIAL, wire.FLAG_RESEND
MISMATCH, LOSS_TOLERANT = wire.FLAG_MISMATCH, wire.FLAG_LOSS_TOLERANT


# ---------------------------------------------------------------- constants and const tables
def _constants() -> dict[str, int]:
    """define.p4's and types.p4's `const` values by name."""
    out = {}
    for path in (ROOT / "p4src/shared/define.p4", TOFINO / "include/types.p4"):
        for name, value in re.findall(r"const \w+(?:<\d+>)?\s+(\w+) = (\w+);", path.read_text()):
            out[name] = int(value, 0) if value[0].isdigit() else out[value]
    return out


CONST = _constants()
PRED_NONE, PRED_LO, PRED_HI = CONST["PRED_NONE"], CONST["PRED_LO"], CONST["PRED_HI"]
KIND = {n[5:]: v for n, v in CONST.items() if n.startswith("KIND_")}
OP = {n[3:]: v for n, v in CONST.items() if n.startswith("OP_")}


def _value(text: str) -> int:
    """A P4 expression of constants: NAME, 0x.., 8w.., A | B."""
    total = 0
    for part in text.split("|"):
        part = part.strip()
        part = re.sub(r"^\d+w", "", part)
        total |= CONST[part] if part in CONST else int(part, 0)
    return total


def _ternary(text: str):
    """One key of a const entry: '_' (anything), 'V &&& M', or 'V' (exact)."""
    text = text.strip()
    if text == "_":
        return (0, 0)
    if "&&&" in text:
        v, m = text.split("&&&")
        return (_value(v), _value(m))
    return (_value(text), None)


def const_entries(table: str) -> list[tuple[list, str, list[int]]]:
    """`table`'s const entries in decide.p4, in priority order: (keys, action, args)."""
    # The default program: the roles' profile (include/profile_roles.p4) pads each entry with
    # its keys' wildcards (SPINA_*_ANY, empty in profile_flat.p4) and adds entries by macro only.
    text = re.sub(r"\s*SPINA_(?:ROLE|CARRY)_ANY\b", "",
                  (TOFINO / "include/decide.p4").read_text())
    body = re.search(r"table " + table + r" \{.*?const entries = \{(.*?)\n\s*\}\n", text, re.S)
    out = []
    for keys, action, args in re.findall(r"\(([^)]*)\):\s*(\w+)\(([^)]*)\);", body.group(1)):
        out.append(([_ternary(k) for k in keys.split(",")], action,
                    [_value(a) for a in args.split(",") if a.strip()]))
    return out


def entry_index(entries, key: list[int]) -> int | None:
    """A ternary (or exact) const table: the index of the first entry whose keys all match."""
    for i, (keys, _, _) in enumerate(entries):
        if all(k == v if m is None else k & m == v & m for k, (v, m) in zip(key, keys)):
            return i
    return None


def lookup(entries, key: list[int]):
    """A ternary (or exact) const table: the first matching entry's (action, args), else None."""
    i = entry_index(entries, key)
    return None if i is None else entries[i][1:]


DECIDE = const_entries("decide")
FLAG_INPUT = const_entries("flag_input")


def _s16(x: int) -> int:
    return x - 0x10000 if x & 0x8000 else x


def _s32(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


class TnaModel:
    """The TNA program's registers (by their P4 names), counters, tables, and its decisions."""

    def __init__(self, lane_bits: int = 32):
        self.lane_bits = lane_bits
        self.lane_flag = wire.LANE_FLAGS[lane_bits]            # size.p4 LANE_FLAG
        self.block_bytes = wire.row_bytes(BLOCK_SIZE, self.lane_flag)  # size.p4 BLOCK_BYTES
        self.block_format = f">{BLOCK_SIZE}{LANE_FORMAT[lane_bits]}"
        copies = 2 * S["POOL_SLOTS"]
        self.reg: dict[str, list[int]] = {}
        for name, width, cells in spec.tna_registers():
            self.reg[name] = [(0, 0) if width == spec.TNA_PAIR_WIDTH else 0] * cells
        self.reg["slot_flags"] = [LAST] * copies  # Register(..., FLAG_LAST): the empty value
        self.counters: dict[tuple[str, int], int] = {}
        self.admission: dict[tuple, dict] = {}
        self.congestion: dict[int, tuple[int, int]] = {}

    def count(self, name: str, index: int) -> None:
        self.counters[(name, index)] = self.counters.get((name, index), 0) + 1

    def values(self, e: int) -> list[int]:
        """Element e's sums, one per slot copy (the low or high half of its pair)."""
        return [cell[e & 1] for cell in self.reg[f"slot_values_l0_p{e // 2}"]]

    def spec_view(self, name: str) -> list[int]:
        """A register as spec.REGISTERS means it (slot_flags with FLAG_LAST the right way up)."""
        if name == "slot_flags":
            return [c ^ spec.TNA_FLAGS_INVERTED for c in self.reg[name]]
        return self.reg[name]

    # ------------------------------------------------------------ parser + InaCheck
    def malformed(self, pkt: bytes, udp_len: int | None = None) -> bool:
        """SpinaIngressParser's parser_err and InaCheck on a UDP payload `pkt` inside a frame
        that ends where the payload ends (udp_len: the UDP header's length field)."""
        udp_len = UDP_HDR_BYTES + len(pkt) if udp_len is None else udp_len
        if len(pkt) < wire.HEADER_LEN:
            return True  # parser_err: the INA header is cut
        h = wire.unpack_header(pkt)
        extracted = wire.HEADER_LEN
        if h.nlanes == NLANES and h.block_size == BLOCK_SIZE:  # parse_lane_next
            extracted += 4
            if h.present & 1:                                  # parse_block
                extracted += self.block_bytes
        if len(pkt) < extracted:
            return True  # parser_err
        want = UDP_HDR_BYTES + wire.HEADER_LEN + 4 * NLANES
        if h.present & 1:
            want += self.block_bytes
        return (h.version != wire.VERSION or h.msg_type != wire.MSG_CONTRIB
                or h.nlanes != NLANES or h.block_size != BLOCK_SIZE
                or h.flags & wire.FLAGS_LANE_WIDTH != self.lane_flag
                or h.rank >= wire.MAX_WORKERS
                or h.present >> NLANES != 0 or h.nonfinite >> NLANES != 0
                or udp_len != want)

    # ------------------------------------------------------------ ingress, one INA payload
    def process(self, pkt: bytes, port: int, src) -> list[tuple[bytes, bool]]:
        """One UDP payload from `src` (address, UDP port) on `port`: what leaves, as
        (payload, multicast); multicast goes to the job's group, else back to the sender."""
        if self.malformed(pkt):
            self.count("port_malformed", port)
            return []
        return self.admit(pkt, port, src)

    def process_frame(self, frame: bytes, port: int) -> list[tuple[bytes, bool]]:
        """One INA frame addressed to this switch (Ethernet, IPv4 ihl 5, UDP to the INA port)
        on `port`. What leaves is returned as UDP datagram payloads: on the wire, bytes the
        frame carried after its datagram follow a reply (TNA has no truncate)."""
        udp_len = int.from_bytes(frame[INA_OFF - 4:INA_OFF - 2], "big")
        if self.malformed(frame[INA_OFF:], udp_len):
            self.count("port_malformed", port)
            return []
        src = (socket.inet_ntoa(frame[26:30]), int.from_bytes(frame[34:36], "big"))
        return self.admit(frame[INA_OFF:ETH_LEN + IPV4_LEN + udp_len], port, src)

    def admit(self, pkt: bytes, port: int, src) -> list[tuple[bytes, bool]]:
        """Admission (and its gate), then the Aggregator, for a well-formed payload."""
        h = wire.unpack_header(pkt)
        adm = self.admission.get((port, src, h.job, h.rank))           # admission
        if adm is not None:
            slot_below = max(adm["slot_base"] - h.slot, 0)             # |-| (saturating)
            slot_off = (h.slot - adm["slot_base"]) & 0xFFFF
            slot_room = max(adm["nslots"] - slot_off, 0)               # |-| (saturating)
            if (slot_below != 0 or slot_room == 0
                    or adm["nlanes"] != NLANES or adm["block_size"] != BLOCK_SIZE):
                adm = None
        if adm is None:
            self.count("port_unadmitted", port)
            return []
        return self.aggregate(h, pkt, adm)

    # ------------------------------------------------------------ RegisterActions
    @staticmethod
    def check_round(value, rnd):
        newer = _s32((rnd - value) & M32) > 0
        rv = predicate(value == rnd, newer)
        return (rnd if newer else value), rv

    @staticmethod
    def mark_rank(value, round_next):
        newer = _s32((round_next - value) & M32) > 0
        rv = predicate(value == round_next, newer)
        return (round_next if newer else value), rv

    def aggregate(self, h, pkt: bytes, adm: dict) -> list[tuple[bytes, bool]]:
        r = self.reg
        job = h.job & JOB_MASK
        nworkers = adm["nworkers"]
        self.count("job_received", job)
        if (h.epoch ^ adm["epoch"]) != 0:
            self.count("job_stale", job)
            return []
        idx = ((h.slot & 0xFF) << 1) | (h.round & 1)
        rank_idx = (idx << 5) | (h.rank & 31)
        round_next = (h.round + 1) & M32
        count_limit = nworkers if h.flags & PARTIAL else 0
        rank_bit = 1 << h.rank  # rank_to_bit (tests/test_tna_agreement.py checks its entries)
        lane_next = struct.unpack_from(">I", pkt, wire.HEADER_LEN)[0]
        block = (list(struct.unpack_from(self.block_format, pkt, wire.HEADER_LEN + 4))
                 if h.present & 1 else None)

        r["slot_round"][idx], round_pred = self.check_round(r["slot_round"][idx], h.round)
        r["slot_rank_round"][rank_idx], rank_pred = self.mark_rank(
            r["slot_rank_round"][rank_idx], round_next)
        if round_pred == PRED_NONE:
            self.count("job_stale", job)
            return []
        cnt = r["slot_count"][idx]
        if round_pred == PRED_HI:
            r["slot_length"][idx] = stored_length = h.length           # set_length
            r["slot_count"][idx], count_delta = 1, (0 - nworkers) & M32  # count_first
        else:
            stored_length = r["slot_length"][idx]                      # read_length
            if rank_pred == PRED_LO:                                   # count_duplicate
                count_delta = (cnt - nworkers) & M32
                if cnt < count_limit:
                    r["slot_count"][idx] = count_limit
            else:                                                      # count_rank
                count_delta = (cnt - nworkers) & M32
                if cnt < nworkers:
                    r["slot_count"][idx] = cnt + 1
        length_diff = stored_length ^ h.length
        kind = state_op = flags_op = bitmap_op = value_op = 0
        hit = lookup(DECIDE, [round_pred, rank_pred, h.flags, count_delta, h.present & 1])
        read_zero = False
        if hit is not None:
            kind, state_op, flags_op, bitmap_op, value_op = hit[1]
            read_zero = hit[0] == "set_outcome_read"  # both elements of each pair := 0
        flag_bits = 0
        hit = lookup(FLAG_INPUT, [kind, flags_op, h.flags, length_diff])
        if hit is not None:
            flag_bits = hit[1][0]

        out = h.copy()
        nxt = [lane_next]  # hdr.lane_next.pos
        bitmap = None
        if bitmap_op != OP["NONE"]:
            bitmap = self._or_register("slot_bitmap", idx, bitmap_op, rank_bit)
            out.bitmap = bitmap
        present = nonfinite = 0
        stored_flags = 0
        if state_op != OP["NONE"]:
            present = self._or_register("slot_present", idx, state_op, h.present & M32)
            nonfinite = self._or_register("slot_nonfinite", idx, state_op, h.nonfinite & M32)
        if flags_op != OP["NONE"]:
            stored_flags = self._or_register("slot_flags", idx, flags_op, flag_bits)
        if state_op != OP["NONE"]:  # exponent_ops, next_l0_ops: into the header
            out.exponent = _s16(self._exponent(idx, state_op, out.exponent & 0xFFFF))
            nxt[0] = self._next(idx, state_op, nxt[0])
        blk = list(block) if block is not None else [0] * BLOCK_SIZE  # hdr.block_e ++ block_i
        if read_zero:
            self._read_zero(INGRESS_PAIRS, blk)
        for p in INGRESS_PAIRS:
            self._pair(p, idx, value_op, 0, blk)

        if kind in (KIND["HOLD"], KIND["COMPLETE"]):
            self.count("job_aggregated", job)
        else:
            self.count("job_duplicates", job)
        if kind == KIND["HOLD"]:  # to the recirculation port: EgressSlots, then dropped
            self._egress_slots(idx, value_op, 0, blk)
            return []
        block_out = False
        if kind == KIND["STATUS"]:
            out.msg_type = wire.MSG_STATUS
            out.flags = h.flags & ~(LAST | PARTIAL) & 0xFF
            out.present = out.nonfinite = 0
        else:
            extra = RESEND if kind == KIND["RESEND"] else 0
            out.msg_type = wire.MSG_RESULT
            out.flags = (stored_flags ^ (LAST | self.lane_flag)) | (h.flags & LOSS_TOLERANT) | extra
            out.present, out.nonfinite = present, nonfinite
            out.length = stored_length
            block_out = bool(present & 1)
        multicast = kind in (KIND["COMPLETE"], KIND["FLUSH"])
        copies = nworkers if multicast else 1
        # Pass 1's egress (recirculation port): the egress pairs with the bridged op; a READ
        # whose reply has no block is not bridged (its block_e would be unparsed bytes).
        if value_op == OP["READ"] and not block_out:
            value_op = OP["NONE"]
        self._egress_slots(idx, value_op, 0, blk)
        # Pass 2 (ingress, then egress, through the recirculation port): the high halves.
        harvest_op = OP["READ"] if block_out else OP["NONE"]
        for p in INGRESS_PAIRS:
            self._pair(p, idx, harvest_op, 1, blk)
        self._egress_slots(idx, harvest_op, 1, blk)
        # Pass 3: to every worker or back to the sender; no register is touched.
        data = struct.pack(self.block_format, *blk) if block_out else b""
        payload = wire.pack_header(out) + struct.pack(">I", nxt[0]) + data
        if out.msg_type == wire.MSG_RESULT:  # egress WorkerRewrite: job_results per copy
            for _ in range(copies):
                self.count("job_results", job)
        return [(payload, multicast)]

    def _or_register(self, name: str, idx: int, op: int, value: int) -> int:
        """SPINA_OR_REGISTER's _set / _or / _read, and slot_flags' (the same three shapes)."""
        cells = self.reg[name]
        if op == OP["SET"]:
            cells[idx] = value
        elif op == OP["MERGE"]:
            cells[idx] |= value
        return cells[idx]

    def _egress_slots(self, idx: int, value_op: int, read_hi: int, blk: list) -> None:
        """EgressSlots: the egress pairs (block_e). A READ of the low halves adds the zeros the
        egress parser puts into block_e (zero_front)."""
        if value_op == OP["READ"] and not read_hi:
            self._read_zero(EGRESS_PAIRS, blk)
        for p in EGRESS_PAIRS:
            self._pair(p, idx, value_op, read_hi, blk)

    def _exponent(self, idx: int, op: int, exponent: int) -> int:
        cells = self.reg["slot_exponent"]
        if op == OP["SET"] or (op == OP["MERGE"] and _s16(exponent) > _s16(cells[idx])):
            cells[idx] = exponent
        return cells[idx]

    def _next(self, idx: int, op: int, pos: int) -> int:
        cells = self.reg["slot_next_l0"]
        if op == OP["SET"] or (op == OP["MERGE"] and pos < cells[idx]):
            cells[idx] = pos
        return cells[idx]

    def _add(self, cell: int, x: int) -> int:
        """SPINA_LANE_ADD: int32 wraps around; a narrow cell saturates at its lane's range
        (|+| on int<W>)."""
        if self.lane_bits == 32:
            return (cell + x) & M32
        top = 1 << (self.lane_bits - 1)
        return min(max(cell + x, -top), top - 1)

    @staticmethod
    def _read_zero(pairs, blk: list) -> None:
        """SPINA_READ_ZERO: elements 2P and 2P + 1 of each pair := 0 (a READ of the low halves
        is pair_add of zeros)."""
        for p in pairs:
            blk[2 * p] = blk[2 * p + 1] = 0

    def _pair(self, p: int, idx: int, op: int, read_hi: int, blk: list) -> None:
        """pair_p<P>_ops (tofino/include/pairs.p4): one of four RegisterActions on the pair
        of elements 2P (lo) and 2P + 1 (hi); its answer goes into the header's element."""
        cells = self.reg[f"slot_values_l0_p{p}"]
        lo_e, hi_e = 2 * p, 2 * p + 1
        lo, hi = cells[idx]
        if op == OP["SET"]:                                      # pair_set
            lo, hi = blk[lo_e], blk[hi_e]
        elif op == OP["CLEAR"]:                                  # pair_clear
            lo = hi = 0
        elif op == OP["MERGE"] or (op == OP["READ"] and not read_hi):  # pair_add
            lo, hi = self._add(lo, blk[lo_e]), self._add(hi, blk[hi_e])
        elif op == OP["READ"]:                                   # pair_read_hi
            blk[hi_e] = hi
            return
        else:
            return  # not executed: the header keeps the packet's elements
        cells[idx] = (lo, hi)
        blk[lo_e] = lo

    # ------------------------------------------------------------ egress CongestionDrop
    def congestion_drop(self, pkt: bytes, qdepth: int) -> bool:
        """CongestionDrop on an INA payload leaving through egress with enq_qdepth `qdepth`."""
        h = wire.unpack_header(pkt)
        if h.msg_type != wire.MSG_CONTRIB or h.job not in self.congestion:
            return False
        threshold, bound = self.congestion[h.job]
        job = h.job & JOB_MASK
        self.count("job_congestion_seen", job)
        need = (spec.LOSS_CREDIT_ONE - bound) & M32
        room, differs = max(threshold - qdepth, 0), threshold ^ qdepth  # set_congestion
        cells = self.reg["job_loss_credit"]
        value = cells[job]
        paid = PRED_NONE
        if h.flags & LOSS_TOLERANT and room == 0 and differs != 0:    # earn_and_pay
            paid = predicate(value >= need, False)
            if value >= need:
                value = value - need
            else:
                value = value + bound
        else:                                                          # earn
            value = spec.LOSS_CREDIT_MAX if value + bound > spec.LOSS_CREDIT_MAX else value + bound
        cells[job] = value
        if paid != PRED_NONE:
            self.count("job_congestion_drops", job)
        return paid != PRED_NONE


def predicate(cmplo: bool, cmphi: bool) -> int:
    """RegisterAction.predicate(): bit (cmplo + 2 * cmphi) set."""
    return 1 << (int(cmplo) + 2 * int(cmphi))


# ---------------------------------------------------------------- the hold (Tofino 2 profile)
# tofino/include/hold.p4, in tofino/spina_t2na_roles.p4 only (the default program lacks it:
# spec.TNA_LACKS): one head_round cell per slot, (round, pending ranks in hold masks).
def hold_mask(rank: int, nworkers: int) -> int:
    """hold_last_rank's entries: the rank's bit, or for the job's last rank every bit from its
    own up (a job's ranks share the 32 bits)."""
    return (M32 & ~((1 << rank) - 1)) if rank == nworkers - 1 else 1 << rank


def hold(cell: tuple[int, int], rnd: int, mask: int) -> tuple[tuple[int, int], int]:
    """RegisterAction `hold` on head_round: (new cell, held)."""
    head, pending = cell
    if head == rnd:                        # the head round
        return (head, pending & ~mask & M32), 0
    if _s32((rnd - head) & M32) > 0:       # a newer round
        if pending in (0, mask):           # none pending, or the sender
            return (rnd, ~mask & M32), 0
        return (head, pending & ~mask & M32), 1
    return cell, 0                         # an older round
