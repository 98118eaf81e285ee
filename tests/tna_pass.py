"""One pass of the Tofino 1 program through its pipe, byte for byte: the ingress parser, the
ingress controls (tofino/include/pipe.p4's SpinaIngress), the ingress deparser, the traffic
manager's choice (drop, one port, a multicast group), the egress parser, SpinaEgress and the
egress deparser, on one frame arriving at one port. P4Testgen's Tofino target writes its tests
at this grain (one input frame, at most one output frame), so tests/test_tna_testgen.py replays
its fixtures (tofino/testgen/) here; `TnaPipe.forward` chains the passes of an aggregated
packet through the recirculation port, which tests/test_tna_testgen.py checks against
tests/tna_model.py's pass-by-pass `TnaModel.process_frame`.

The register cells, counters, admission and congestion entries and RegisterActions are
tests/tna_model.py's (`TnaModel`); this module adds what the packets look like between the
passes (the bridged header, the harvest header, block_e in front) and the tables the model
leaves out (ina_endpoint, l2, ipv4_routes, worker_rewrite). The default program (int32 lanes);
`TnaPipe(recirc=T2NA_RECIRC_PORT, hold=True)` is the Tofino 2 profile (tofino/spina_t2na_roles.p4)
for flat jobs: its recirculation port, and the hold of a newer round (include/hold.p4, the
RegisterAction tests/tna_model.py `hold`) before slot_round. Its roles are not here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spina import wire
from tests.tna_model import (
    BLOCK_SIZE,
    CONST,
    DECIDE,
    EGRESS_PAIRS,
    FLAG_INPUT,
    INGRESS_PAIRS,
    JOB_MASK,
    KIND,
    M32,
    NLANES,
    OP,
    PRED_HI,
    PRED_LO,
    PRED_NONE,
    S,
    TnaModel,
    entry_index,
    hold,
    hold_mask,
    lookup,
)

# Header layouts: (field, bits) in wire order (p4src/shared/header.p4, tofino/include/types.p4).
ETHERNET = (("dst_addr", 48), ("src_addr", 48), ("ether_type", 16))
IPV4 = (("version", 4), ("ihl", 4), ("diffserv", 8), ("total_len", 16), ("identification", 16),
        ("flags", 3), ("frag_offset", 13), ("ttl", 8), ("protocol", 8), ("hdr_checksum", 16),
        ("src_addr", 32), ("dst_addr", 32))
UDP = (("src_port", 16), ("dst_port", 16), ("length", 16), ("checksum", 16))
INA = tuple((name, bits) for name, _, bits in wire.HEADER_FIELDS)
LANE_NEXT = (("pos", 32),)
BRIDGE = (("ina_emitted", 1), ("ipv4_update", 1), ("hold_drop", 1), ("to_harvest", 1),
          ("block_front", 1), ("read_hi", 1), ("last", 1), ("zero_front", 1), ("pad1", 5),
          ("value_op", 3), ("pad2", 7), ("reply_port", 9), ("mcast_grp", 16), ("pad3", 7),
          ("idx", 9))
HARVEST = (("pad0", 7), ("last", 1), ("pad1", 7), ("block", 1), ("pad2", 7), ("port", 9),
           ("mcast_grp", 16))
BLOCK_E = tuple((f"e{e}", 32) for e in range(2 * len(EGRESS_PAIRS)))
BLOCK_I = tuple((f"e{e}", 32) for e in range(2 * len(EGRESS_PAIRS), BLOCK_SIZE))
# The ingress deparser's order (bridge first, block_e behind it); the egress deparser emits
# harvest, block_e, ethernet, ipv4, udp, ina (include/parser.p4).
INGRESS_EMIT = ("bridge", "block_e", "ethernet", "ipv4", "udp", "ina", "lane_next", "block_w",
                "block_i")
EGRESS_EMIT = ("harvest", "block_e", "ethernet", "ipv4", "udp", "ina")
LAYOUT = {"ethernet": ETHERNET, "ipv4": IPV4, "udp": UDP, "ina": INA, "lane_next": LANE_NEXT,
          "bridge": BRIDGE, "harvest": HARVEST, "block_e": BLOCK_E, "block_w": BLOCK_E,
          "block_i": BLOCK_I}

RECIRC_PORT, RECIRC_PORT_MASK = 68, 0x7F  # size.p4
T2NA_RECIRC_PORT = 6  # tofino/spina_t2na_roles.p4
POOL_SLOTS = S["POOL_SLOTS"]
GATE = {n[5:]: v for n, v in CONST.items() if n.startswith("GATE_")}
UDP_HDR, IPV4_HDR, INA_HDR = CONST["UDP_HDR_BYTES"], CONST["IPV4_HDR_BYTES"], wire.HEADER_LEN
BLOCK_BYTES = 4 * BLOCK_SIZE
# InaCheck's two well-formed UDP lengths: header and position, and the block behind them.
UDP_LEN_NO_BLOCK = UDP_HDR + INA_HDR + 4 * NLANES
UDP_LEN_BLOCK = UDP_LEN_NO_BLOCK + BLOCK_BYTES


def nbytes(layout) -> int:
    return sum(bits for _, bits in layout) // 8


def unpack(layout, data: bytes) -> dict[str, int]:
    """A header's fields from its bytes (big-endian bit fields, as a P4 parser extracts)."""
    word, left, out = int.from_bytes(data, "big"), 8 * len(data), {}
    for name, bits in layout:
        left -= bits
        out[name] = (word >> left) & ((1 << bits) - 1)
    return out


def pack(layout, fields: dict[str, int]) -> bytes:
    word = 0
    for name, bits in layout:
        word = (word << bits) | (fields[name] & ((1 << bits) - 1))
    return word.to_bytes(nbytes(layout), "big")


def ipv4_checksum(ip: dict[str, int]) -> int:
    """The egress deparser's Checksum over the IPv4 header without its checksum field."""
    data = pack(IPV4, dict(ip, hdr_checksum=0))
    total = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _sat_sub(a: int, b: int) -> int:
    """|-| on bit<16> fields: a - b, saturated at 0."""
    return max(a - b, 0)


def _valid_or_scratch(hdr: dict, name: str) -> dict:
    """Header `name` if valid, else its fields as zeros that nothing emits (a P4 read of an
    invalid header's field; a write to it changes no output)."""
    return hdr[name] if name in hdr else dict.fromkeys((f for f, _ in LAYOUT[name]), 0)


class Cursor:
    """A parser's position in `buf` (both parsers extract the same way): extract(name)
    takes header `name` into `hdr` and moves on, or returns False (nothing taken) where the
    buffer ends inside it; rest() is what no header took."""
    __slots__ = ("buf", "pos", "hdr")

    def __init__(self, buf: bytes):
        self.buf, self.pos, self.hdr = buf, 0, {}

    def extract(self, name: str) -> bool:
        n = nbytes(LAYOUT[name])
        if self.pos + n > len(self.buf):
            return False
        self.hdr[name] = unpack(LAYOUT[name], self.buf[self.pos:self.pos + n])
        self.pos += n
        return True

    def rest(self) -> bytes:
        return self.buf[self.pos:]


@dataclass
class Out:
    """What one pass sends on: the egress port and the frame, or a multicast group (the
    replicas are the traffic manager's), or nothing (port None, mcast_grp 0: dropped)."""
    port: int | None
    frame: bytes = b""
    mcast_grp: int = 0


@dataclass
class TnaPipe:
    """The default program's tables and state: `model` holds the registers, counters,
    admission and congestion entries (tests/tna_model.py); the rest are the tables the model
    leaves out."""
    model: TnaModel = field(default_factory=TnaModel)
    ina_endpoint: set[int] = field(default_factory=set)  # IPv4 dst_addr
    l2: dict[int, int] = field(default_factory=dict)      # dst MAC -> port
    ipv4_routes: list[tuple] = field(default_factory=list)  # (prefix, plen, action, params)
    ipv4_default: tuple = ("drop", {})  # the table's default action (a control plane may set it)
    worker_rewrite: dict[int, tuple] = field(default_factory=dict)  # rid -> (mac, ip, port)
    # The branches the last `run` took (gate, decide's entry by index, pass, egress branch):
    # what tests/test_tna_testgen.py counts P4Testgen's fixtures by.
    path: list[str] = field(default_factory=list)
    recirc: int = RECIRC_PORT  # the pipe's recirculation port (local port number)
    hold: bool = False         # the hold of a newer round (the Tofino 2 profile)

    def __post_init__(self):
        if self.hold:  # head_round: (head round, pending masks) per slot, 0 when cleared
            self.model.reg.setdefault("head_round", [(0, 0)] * POOL_SLOTS)

    # ------------------------------------------------------------ one pass
    def run(self, port: int, frame: bytes, enq_qdepth: int = 0) -> Out:
        """`frame` arrives at `port`: what leaves this pass (ingress, traffic manager,
        egress). A multicast group's replicas are `egress_pass`'s, one per replica."""
        self.path = []
        hdr, rest, parser_err = self._ingress_parse(port, frame)
        tm = self._ingress(port, hdr, parser_err)
        if tm["drop"] or (tm["ucast"] is None and tm["mcast"] == 0):
            return Out(None)
        buf = b"".join(pack(LAYOUT[h], hdr[h]) for h in INGRESS_EMIT if h in hdr) + rest
        if tm["ucast"] is None:
            return Out(None, buf, tm["mcast"])
        return self.egress_pass(buf, tm["ucast"], enq_qdepth)

    def egress_pass(self, buf: bytes, eg_port: int, enq_qdepth: int = 0,
                    egress_rid: int = 0) -> Out:
        """What the ingress deparser emitted (`buf`, bridged header first), through egress
        towards `eg_port` (a multicast replica: its replication id)."""
        hdr, rest = self._egress_parse(buf)
        if self._egress(hdr, enq_qdepth, egress_rid):
            return Out(None)
        if "ipv4" in hdr and hdr["bridge"]["ipv4_update"] == 1:
            hdr["ipv4"]["hdr_checksum"] = ipv4_checksum(hdr["ipv4"])
        return Out(eg_port, b"".join(pack(LAYOUT[h], hdr[h]) for h in EGRESS_EMIT
                                     if h in hdr) + rest)

    def forward(self, port: int, frame: bytes) -> list[Out]:
        """An INA frame from a worker's port, through every pass it takes (each pass through
        the recirculation port feeds the next): what finally leaves, or nothing."""
        out = self.run(port, frame)
        while out.port is not None and out.port & RECIRC_PORT_MASK == self.recirc:
            out = self.run(out.port, out.frame)
        return [] if out.port is None and out.mcast_grp == 0 else [out]

    # ------------------------------------------------------------ ingress parser
    def _ingress_parse(self, port: int, frame: bytes):
        """SpinaIngressParser. A frame that ends inside a header stops the parser there with
        parser_err set (the header is not valid)."""
        cur = Cursor(frame)
        hdr, extract = cur.hdr, cur.extract

        def parse() -> bool:  # False: cut short
            if port & RECIRC_PORT_MASK == self.recirc:
                if not extract("harvest"):
                    return False
                h = hdr["harvest"]
                if h["block"] == 1 and not extract("block_w" if h["last"] else "block_e"):
                    return False
                for name in ("ethernet", "ipv4", "udp", "ina", "lane_next"):
                    if not extract(name):
                        return False
                return h["block"] != 1 or extract("block_i")
            if not extract("ethernet"):
                return False
            if hdr["ethernet"]["ether_type"] != CONST["ETHERTYPE_IPV4"]:
                return True
            if not extract("ipv4"):
                return False
            if (hdr["ipv4"]["ihl"], hdr["ipv4"]["protocol"]) != (5, CONST["IP_PROTO_UDP"]):
                return True
            if not extract("udp"):
                return False
            if hdr["udp"]["dst_port"] != CONST["INA_UDP_PORT"]:
                return True
            if not extract("ina"):
                return False
            if (hdr["ina"]["nlanes"], hdr["ina"]["block_size"]) != (NLANES, BLOCK_SIZE):
                return True
            if not extract("lane_next"):
                return False
            if hdr["ina"]["present"] & 1 == 0:
                return True
            return extract("block_e") and extract("block_i")

        ok = parse()
        return hdr, cur.rest(), 0 if ok else 1

    # ------------------------------------------------------------ SpinaIngress
    def _ingress(self, port: int, hdr: dict, parser_err: int) -> dict:
        m = self.model
        hdr["bridge"] = dict.fromkeys((f for f, _ in BRIDGE), 0)
        tm = {"drop": 0, "ucast": None, "mcast": 0}
        meta = {"harvest": "harvest" in hdr, "nworkers": 0, "adm": {}}
        ina = hdr.get("ina")
        if meta["harvest"]:
            meta["gate"], meta["slot_room"] = GATE["AGGREGATE"], 1
        else:
            meta["gate"], meta["slot_room"] = self._admission(port, hdr, parser_err, meta)
        # SlotIndex (before any branch; a packet without an INA header reads zeros)
        f = ina or dict.fromkeys((n for n, _ in INA), 0)
        meta["idx"] = ((f["slot"] & 0xFF) << 1) | (f["round"] & 1)
        hdr["bridge"]["idx"] = meta["idx"]
        meta["rank_idx"] = (meta["idx"] << 5) | (f["rank"] & 31)
        meta["round_next"] = (f["round"] + 1) & M32
        meta["loss_tolerant"] = f["flags"] & CONST["FLAG_LOSS_TOLERANT"]
        meta["rank_bit"] = 1 << f["rank"] if f["rank"] < 32 else 0
        meta["count_limit"] = meta["nworkers"] if f["flags"] & CONST["FLAG_PARTIAL"] else 0

        gate = next(n for n, v in GATE.items() if v == meta["gate"])
        self.path.append(f"gate {gate}" if meta["slot_room"] or gate != "AGGREGATE"
                         else "above the slot range")
        if meta["gate"] == GATE["FORWARD"]:
            self._forwarding(hdr, tm)
        elif meta["gate"] in (GATE["MALFORMED"], GATE["UNADMITTED"]) or meta["slot_room"] == 0:
            name = "port_malformed" if meta["gate"] == GATE["MALFORMED"] else "port_unadmitted"
            m.count(name, port)
            tm["drop"] = 1
        else:
            self._aggregator(port, hdr, meta, tm)
        return tm

    def _admission(self, port: int, hdr: dict, parser_err: int, meta: dict):
        """InaEndpoint, InaCheck and Admission (its gate and slot range): (gate, slot_room)."""
        udp, ina = hdr.get("udp"), hdr.get("ina")
        ina_local = (udp is not None and udp["dst_port"] == CONST["INA_UDP_PORT"]
                     and hdr["ipv4"]["dst_addr"] in self.ina_endpoint)
        if not ina_local:
            return GATE["FORWARD"], 0
        malformed = not (
            parser_err == 0 and ina is not None and ina["version"] == CONST["INA_VERSION"]
            and ina["msg_type"] == CONST["MSG_CONTRIB"] and ina["nlanes"] == NLANES
            and ina["block_size"] == BLOCK_SIZE
            and ina["flags"] & CONST["FLAGS_LANE_WIDTH"] == self.model.lane_flag
            and ina["rank"] & CONST["RANK_HIGH_BITS"] == 0
            and ina["nonfinite"] & CONST["LANE_HIGH_BITS"] == 0
            and (ina["present"], udp["length"]) in ((0, UDP_LEN_NO_BLOCK), (1, UDP_LEN_BLOCK)))
        if malformed:
            return GATE["MALFORMED"], 0
        src = (wire_ip(hdr["ipv4"]["src_addr"]), udp["src_port"])
        adm = self.model.admission.get((port, src, ina["job"], ina["rank"]))
        if adm is None:
            return GATE["UNADMITTED"], 0
        meta["adm"] = adm
        meta["nworkers"] = adm["nworkers"] & 0xFF
        slot_below = _sat_sub(adm["slot_base"], ina["slot"])
        if slot_below != 0 or adm["nlanes"] != NLANES or adm["block_size"] != BLOCK_SIZE:
            return GATE["UNADMITTED"], 0
        gate = GATE["AGGREGATE"] if ina["epoch"] == adm["epoch"] else GATE["STALE_EPOCH"]
        slot_off = (ina["slot"] - adm["slot_base"]) & 0xFFFF
        return gate, _sat_sub(adm["nslots"], slot_off)

    def _forwarding(self, hdr: dict, tm: dict) -> None:
        """Forwarding (l2, then ipv4_routes) and Priority (the queue: not on the wire)."""
        eth, ip = hdr.get("ethernet"), hdr.get("ipv4")
        if eth is None:
            tm["drop"] = 1
        elif eth["dst_addr"] in self.l2:
            tm["ucast"] = self.l2[eth["dst_addr"]]
        elif ip is None:
            tm["drop"] = 1
        else:
            best = None
            for prefix, plen, action, params in self.ipv4_routes:
                mask = (M32 << (32 - plen)) & M32
                if ip["dst_addr"] & mask == prefix & mask and (best is None or plen > best[0]):
                    best = (plen, action, params)
            if best is None:
                best = (0, *self.ipv4_default)
            if best[1] == "drop":
                tm["drop"] = 1
                return
            params = best[2]
            tm["ucast"] = params["port"]
            eth["src_addr"], eth["dst_addr"] = params["src_mac"], params["dst_mac"]
            ip["ttl"] = (ip["ttl"] - 1) & 0xFF
            hdr["bridge"]["ipv4_update"] = 1

    def _aggregator(self, port: int, hdr: dict, meta: dict, tm: dict) -> None:
        """Aggregator's apply block (include/aggregator.p4), RegisterActions from the model."""
        m, r, br = self.model, self.model.reg, hdr["bridge"]
        ina, lane_next = _valid_or_scratch(hdr, "ina"), _valid_or_scratch(hdr, "lane_next")
        job = ina["job"] & JOB_MASK
        idx = meta["idx"]
        read_hi = 0
        kind = state_op = flags_op = bitmap_op = value_op = OP["NONE"]
        stored_length = count_delta = 0
        read_zero = False
        if meta["harvest"]:
            hv = hdr["harvest"]
            self.path.append(f"pass {2 + hv['last']}" + " with block" * hv["block"])
            if hv["last"] == 1:  # the third pass: send it on
                br["ina_emitted"] = br["ipv4_update"] = 1
                if hv["mcast_grp"] != 0:
                    tm["mcast"] = hv["mcast_grp"]
                else:
                    tm["ucast"] = hv["port"]
                del hdr["harvest"]
                return
            if hv["block"] == 1:
                value_op = OP["READ"]
            read_hi = 1
        else:
            m.count("job_received", job)
            if meta["gate"] == GATE["STALE_EPOCH"]:
                m.count("job_stale", job)
                tm["drop"] = 1
                return
            if self.hold:  # include/hold.p4: before slot_round, at the slot's one cell
                slot = ina["slot"] & 0xFF
                head = r["head_round"][slot]
                r["head_round"][slot], held = hold(
                    head, ina["round"],
                    hold_mask(ina["rank"], meta["nworkers"]) if meta["rank_bit"] else 0)
                self.path.append(
                    f"hold: {_hold_branch(head, ina['round'], r['head_round'][slot], held)}")
                if held:
                    m.count("job_held", job)
                    tm["drop"] = 1
                    return
            r["slot_round"][idx], round_pred = m.check_round(r["slot_round"][idx], ina["round"])
            rank_idx = meta["rank_idx"]
            r["slot_rank_round"][rank_idx], rank_pred = m.mark_rank(
                r["slot_rank_round"][rank_idx], meta["round_next"])
            if round_pred == PRED_NONE:
                self.path.append("stale round")
                m.count("job_stale", job)
                tm["drop"] = 1
                return
            nworkers, cnt = meta["nworkers"], r["slot_count"][idx]
            if round_pred == PRED_HI:
                r["slot_length"][idx] = stored_length = ina["length"]
                r["slot_count"][idx], count_delta = 1, (0 - nworkers) & M32
            else:
                stored_length = r["slot_length"][idx]
                count_delta = (cnt - nworkers) & M32
                if rank_pred == PRED_LO:
                    if cnt < meta["count_limit"]:
                        r["slot_count"][idx] = meta["count_limit"]
                elif cnt < nworkers:
                    r["slot_count"][idx] = cnt + 1
            key = [round_pred, rank_pred, ina["flags"], count_delta, ina["present"] & 1]
            hit, entry = lookup(DECIDE, key), entry_index(DECIDE, key)
            self.path.append(f"decide {entry}" if entry is not None else "decide none")
            if hit is not None:
                kind, state_op, flags_op, bitmap_op, value_op = hit[1]
                read_zero = hit[0] == "set_outcome_read"
            if read_zero:  # set_outcome_read: block_e invalid, block_i valid and zero
                hdr.pop("block_e", None)
                hdr["block_i"] = dict.fromkeys((n for n, _ in BLOCK_I), 0)
        length_diff = stored_length ^ ina["length"]
        hit = lookup(FLAG_INPUT, [kind, flags_op, ina["flags"], length_diff])
        flag_bits = hit[1][0] if hit is not None else 0
        flags_xor = CONST["FLAG_LAST"] | m.lane_flag
        if kind == KIND["RESEND"]:
            flags_xor |= CONST["FLAG_RESEND"]
        stored_flags = 0
        if state_op != OP["NONE"]:
            present = m._or_register("slot_present", idx, state_op, ina["present"] & M32)
            nonfinite = m._or_register("slot_nonfinite", idx, state_op, ina["nonfinite"] & M32)
            ina["present"] = (ina["present"] & ~M32) | present
            ina["nonfinite"] = (ina["nonfinite"] & ~M32) | nonfinite
            ina["exponent"] = m._exponent(idx, state_op, ina["exponent"]) & 0xFFFF
            lane_next["pos"] = m._next(idx, state_op, lane_next["pos"])
        if bitmap_op != OP["NONE"]:
            ina["bitmap"] = m._or_register("slot_bitmap", idx, bitmap_op, meta["rank_bit"])
        if flags_op != OP["NONE"]:
            stored_flags = m._or_register("slot_flags", idx, flags_op, flag_bits)
        self._pairs(INGRESS_PAIRS, hdr.get("block_i"), value_op, read_hi, idx)

        tm["ucast"] = (port & 0x180) | self.recirc
        br["value_op"] = value_op
        if meta["harvest"]:
            hv = hdr.pop("harvest")
            br["read_hi"] = br["to_harvest"] = br["last"] = 1
            br["reply_port"], br["mcast_grp"] = hv["port"], hv["mcast_grp"]
            if hv["block"] == 1:
                br["block_front"] = 1
        if kind in (KIND["HOLD"], KIND["COMPLETE"]):
            m.count("job_aggregated", job)
        if kind >= KIND["RESEND"]:
            m.count("job_duplicates", job)
        if kind == KIND["HOLD"]:
            br["hold_drop"] = 1
            if "block_e" in hdr:
                br["block_front"] = 1
        if kind == KIND["STATUS"]:
            ina["msg_type"] = CONST["MSG_STATUS"]
            ina["flags"] &= ~(CONST["FLAG_LAST"] | CONST["FLAG_PARTIAL"]) & 0xFF
            ina["present"] = ina["nonfinite"] = 0
            hdr.pop("block_e", None)
            hdr.pop("block_i", None)
        result = KIND["COMPLETE"] <= kind <= KIND["FLUSH"]
        if result:
            ina["msg_type"] = CONST["MSG_RESULT"]
            ina["flags"] = stored_flags ^ flags_xor
            ina["length"] = stored_length
            if ina["present"] & 1 == 0:
                hdr.pop("block_e", None)
                hdr.pop("block_i", None)
                if value_op == OP["READ"]:
                    br["value_op"] = OP["NONE"]
            elif value_op == OP["READ"]:
                br["zero_front"] = 1
            else:
                br["block_front"] = 1
        if kind >= KIND["COMPLETE"]:
            udp = _valid_or_scratch(hdr, "udp")
            udp["length"] = UDP_LEN_BLOCK if "block_i" in hdr else UDP_LEN_NO_BLOCK
            _valid_or_scratch(hdr, "ipv4")["total_len"] = IPV4_HDR + udp["length"]
            ina["flags"] |= meta["loss_tolerant"]
            self._reply_to_sender(port, hdr)
        if kind in (KIND["COMPLETE"], KIND["FLUSH"]):
            br["mcast_grp"] = meta["adm"]["mcast_grp"]


    @staticmethod
    def _reply_to_sender(port: int, hdr: dict) -> None:
        eth, ip, udp = (_valid_or_scratch(hdr, h) for h in ("ethernet", "ipv4", "udp"))
        br = hdr["bridge"]
        eth["dst_addr"], eth["src_addr"] = eth["src_addr"], eth["dst_addr"]
        ip["dst_addr"], ip["src_addr"] = ip["src_addr"], ip["dst_addr"]
        udp["dst_port"], udp["src_port"] = udp["src_port"], udp["dst_port"]
        udp["checksum"] = 0
        br["ipv4_update"] = br["ina_emitted"] = br["to_harvest"] = 1
        br["reply_port"] = port

    def _pairs(self, pairs, blk: dict | None, op: int, read_hi: int, idx: int) -> None:
        """pair_p<P>_ops on the elements of `blk` (a header; None: not valid, its fields read
        as 0 and written nowhere), through the model's pair RegisterActions."""
        if op == OP["NONE"]:
            return
        lo_e = 2 * pairs[0]
        vals = [0] * BLOCK_SIZE
        if blk is not None:
            for name, v in blk.items():
                vals[int(name[1:])] = v
        self.model_pairs(pairs, idx, op, read_hi, vals)
        if blk is not None:
            for e in range(lo_e, 2 * pairs[-1] + 2):
                blk[f"e{e}"] = vals[e] & M32

    def model_pairs(self, pairs, idx: int, op: int, read_hi: int, vals: list) -> None:
        for p in pairs:
            self.model._pair(p, idx, op, read_hi, vals)

    # ------------------------------------------------------------ egress
    @staticmethod
    def _egress_parse(buf: bytes):
        """SpinaEgressParser on what the ingress deparser emitted (bridged header first)."""
        cur = Cursor(buf)
        hdr, extract = cur.hdr, cur.extract
        extract("bridge")
        br = hdr["bridge"]
        if br["block_front"] == 1:
            extract("block_e")
        elif br["zero_front"] == 1:
            hdr["block_e"] = dict.fromkeys((n for n, _ in BLOCK_E), 0)
        elif br["to_harvest"] == 0 and br["hold_drop"] == 0:
            if (extract("ethernet") and hdr["ethernet"]["ether_type"] == CONST["ETHERTYPE_IPV4"]
                    and extract("ipv4")
                    and (hdr["ipv4"]["ihl"], hdr["ipv4"]["protocol"]) == (5, CONST["IP_PROTO_UDP"])
                    and extract("udp")
                    and (br["ina_emitted"] == 1
                         or hdr["udp"]["dst_port"] == CONST["INA_UDP_PORT"])):
                extract("ina")
        return hdr, cur.rest()

    def _egress(self, hdr: dict, enq_qdepth: int, egress_rid: int) -> bool:
        """SpinaEgress; True: dropped."""
        br = hdr["bridge"]
        if br["hold_drop"] == 1 or br["to_harvest"] == 1:
            self.path.append("egress hold drop" if br["hold_drop"] else "egress to harvest")
            self._pairs(EGRESS_PAIRS, hdr.get("block_e"), br["value_op"], br["read_hi"],
                        br["idx"])
            if br["hold_drop"] == 1:
                return True
            hdr["harvest"] = {"pad0": 0, "pad1": 0, "pad2": 0, "last": br["last"],
                              "block": int("block_e" in hdr), "port": br["reply_port"],
                              "mcast_grp": br["mcast_grp"]}
            return False
        ina = hdr.get("ina")
        if br["ina_emitted"] == 1:  # WorkerRewrite
            if egress_rid != 0:
                self.path.append("egress rewrite")
                if egress_rid not in self.worker_rewrite:
                    return True
                mac, ip, udp_port = self.worker_rewrite[egress_rid]
                hdr["ethernet"]["dst_addr"], hdr["ipv4"]["dst_addr"] = mac, ip
                hdr["udp"]["dst_port"] = udp_port
            if ina is not None and ina["msg_type"] == CONST["MSG_RESULT"]:
                self.model.count("job_results", ina["job"] & JOB_MASK)
        if ina is not None and ina["msg_type"] == CONST["MSG_CONTRIB"]:
            dropped = self._congestion(ina, enq_qdepth)
            self.path.append("egress congestion drop" * dropped or "egress contribution")
            return dropped
        return False

    def _congestion(self, ina: dict, enq_qdepth: int) -> bool:
        """CongestionDrop through the model's RegisterActions (TnaModel.congestion_drop reads
        the same fields from a payload)."""
        if ina["job"] not in self.model.congestion:
            return False
        payload = pack(INA, ina)
        return self.model.congestion_drop(payload, enq_qdepth)


def _hold_branch(before: tuple[int, int], rnd: int, after: tuple[int, int], held: int) -> str:
    """Which branch of include/hold.p4's RegisterAction a packet of round `rnd` took."""
    if held:
        return "held"
    if after[0] != before[0]:
        return "a newer round starts" + (" (none pending)" if before[1] == 0 else "")
    if rnd == before[0]:
        return "the head round" + (", its sender heard" if after != before else "")
    return "an older round"


def wire_ip(addr: int) -> str:
    return ".".join(str((addr >> s) & 0xFF) for s in (24, 16, 8, 0))
