"""The pipeline's names and sizes as data: the one place the software switch, the controller
and the tests take them from.

p4src/ declares the same tables, actions, registers and counters (tests/test_p4_agreement.py
checks both directions), and p4src/v1model/size.p4 the same P4 sizes (P4_SIZES below). Keys and
action parameters carry their bit widths, so that a P4Info can be generated from this module and
compared with the one p4c writes.

Registers come in four shapes. A "slot" register has one cell per slot copy; a "head" register
one cell per slot (both copies' shared state: which round is newest and who has reached it); a
"lane" register
one array per lane (`slot_next_l<L>` in P4, a column of `slot_next` here); a "value" register one
array per lane and element (`slot_values_l<L>_e<E>` in P4, SwitchML's layout: a switch stage
updates each register array once per packet, so the elements of a block cannot share one).
The software switch keeps each shape in one numpy array; `p4_register_names` expands them.
"""
from __future__ import annotations

from dataclasses import dataclass

from spina import wire

# ---------------------------------------------------------------- sizes (p4src/v1model/size.p4)
# The P4 program's sizes; the software switch accepts larger blocks and fusion than these.
P4_SIZES = {
    "POOL_SLOTS": 256,      # slots in the pool; registers hold 2 shadow copies each
    "BLOCK_SIZE": 32,       # int32 elements per block (one register array per element)
    "NLANES": 4,            # blocks fused per packet (one set of value registers per lane)
    "MAX_WORKERS": 32,      # ranks per job: slot_bitmap is 32 bits
    "MAX_JOBS": 65536,      # job id is 16 bits: counters indexed by job
    "MAX_PORTS": 512,       # v1model port is 9 bits: counters indexed by port
    "MAX_RIDS": 4096,       # worker rewrite entries (multicast replication ids)
    "L2_ENTRIES": 1024,
    "IPV4_ENTRIES": 1024,
    "ADMISSION_ENTRIES": 1024,
    "SPRAY_GROUPS": 256,    # spray groups: spray's group is 8 bits, spray_turn one cell each
    "SPRAY_PORT_ENTRIES": 1024,
}
MAX_JOBS = P4_SIZES["MAX_JOBS"]
MAX_PORTS = P4_SIZES["MAX_PORTS"]
# The software switch's default slot size (its --slot-capacity): int32 elements per slot copy,
# 64 lanes of 256. The controller validates softswitch jobs against it.
DEFAULT_SLOT_CAPACITY = 64 * 256

# Constants the P4 program hard-codes (p4src/shared/define.p4).
ETHERTYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17
INA_UDP_PORT = wire.DEFAULT_UDP_PORT  # the parser recognises INA packets by this dst port

# ---------------------------------------------------------------- flag sets (shared/define.p4)
# Two-level aggregation: what a rack's partial carries into a spine's round besides LAST (a
# mismatch or a flush in one rack concerns every rack), and so what a stored result keeps.
FLAGS_CARRIED = wire.FLAG_MISMATCH | wire.FLAG_PARTIAL
FLAGS_RESULT = wire.FLAG_LAST | FLAGS_CARRIED

# ---------------------------------------------------------------- registers
SLOT, HEAD, LANE, VALUE, JOB = "slot", "head", "lane", "value", "job"  # JOB: one cell per job id


@dataclass(frozen=True)
class Register:
    name: str
    width: int
    shape: str = SLOT


REGISTERS = (
    Register("slot_round", 32),
    Register("slot_bitmap", 32),
    Register("slot_count", 32),
    Register("slot_values", 32, VALUE),
    Register("slot_next", 32, LANE),
    Register("slot_present", 64),
    Register("slot_nonfinite", 64),
    Register("slot_exponent", 16),
    Register("slot_length", 32),
    Register("slot_flags", 8),
    # The hold (docs/reliability.md, "A newer round waits for every worker"): a round newer
    # than head_round may take its copy, which holds the round before last, only when every
    # worker has been heard at head_round (so has the result that copy holds); else the packet
    # is dropped (job_held) and its sender marked heard.
    Register("head_round", 32, HEAD),    # newest round started on the slot
    Register("head_heard", 32, HEAD),    # ranks heard at head_round (or at a held newer round)
    Register("head_missing", 8, HEAD),   # workers not yet heard at head_round
)
REGISTER_NAMES = tuple(r.name for r in REGISTERS)
HEAD_REGISTERS = frozenset(r.name for r in REGISTERS if r.shape == HEAD)  # one cell per slot


def p4_register_names(nlanes: int = P4_SIZES["NLANES"],
                      block_size: int = P4_SIZES["BLOCK_SIZE"]) -> list[str]:
    """The register arrays as the P4 program names them."""
    out = []
    for r in REGISTERS:
        if r.shape in (SLOT, HEAD):
            out.append(r.name)
        elif r.shape == LANE:
            out += [f"{r.name}_l{lane}" for lane in range(nlanes)]
        else:
            out += [f"{r.name}_l{lane}_e{e}" for lane in range(nlanes) for e in range(block_size)]
    return out


def register_cells(name: str, pool_slots: int = P4_SIZES["POOL_SLOTS"]) -> int:
    """Cells of P4 register array `name` (a P4 name, as p4_register_names gives)."""
    return pool_slots if name in HEAD_REGISTERS else 2 * pool_slots


def split_p4_register(name: str) -> tuple[str, int | None, int | None]:
    """'slot_values_l1_e5' -> ('slot_values', 1, 5); 'slot_next_l2' -> ('slot_next', 2, None);
    a TNA pair register 'slot_values_l0_p3' (elements 6 and 7) -> ('slot_values', 0, 6)."""
    parts = name.split("_")
    lane = elem = None
    if parts[-1].startswith("e") and parts[-1][1:].isdigit():
        elem = int(parts.pop()[1:])
    elif parts[-1].startswith("p") and parts[-1][1:].isdigit():
        elem = 2 * int(parts.pop()[1:])
    if parts[-1].startswith("l") and parts[-1][1:].isdigit():
        lane = int(parts.pop()[1:])
    return "_".join(parts), lane, elem


# ---------------------------------------------------------------- counters
# Narrow lanes (docs/bits.md; v1model, not TNA): job_lane_saturated: result packets in which
# some sum left its lane's range and was clipped to it; job_lane_mismatch: contributions whose
# lane width (wire.FLAGS_LANE_WIDTH) differed from their round's first (the result: MISMATCH).
LANE_COUNTERS = ("job_lane_saturated", "job_lane_mismatch")
# Every counter (job_*: indexed by job; port_*: by ingress port) by the P4 control that counts
# it (p4src/v1model/; FromSpine, fabric.p4, counts some of the Aggregator's too): the
# controller's class of that name (controller/controls.py) reads it.
COUNTER_CONTROLS = {
    "job_received": "Aggregator", "job_aggregated": "Aggregator",
    "job_duplicates": "Aggregator", "job_results": "WorkerRewrite", "job_stale": "Aggregator",
    "job_held": "Aggregator", "job_congestion_drops": "CongestionDrop",
    "job_congestion_seen": "CongestionDrop", **{n: "Aggregator" for n in LANE_COUNTERS},
    "port_malformed": "InaCheck", "port_unadmitted": "Admission"}
JOB_COUNTERS = tuple(n for n in COUNTER_CONTROLS if n.startswith("job_"))
PORT_COUNTERS = tuple(n for n in COUNTER_CONTROLS if n.startswith("port_"))
COUNTERS = {**{n: MAX_JOBS for n in JOB_COUNTERS}, **{n: MAX_PORTS for n in PORT_COUNTERS}}


# ---------------------------------------------------------------- the loss budget (priority.p4)
# A job's loss bound is a fixed-point fraction of its packets: `bound` / LOSS_CREDIT_ONE. Each
# contribution of the job the congestion drop sees earns `bound` credit and each drop pays
# LOSS_CREDIT_ONE, so drops never exceed floor(seen x bound / LOSS_CREDIT_ONE): the bound is the
# switch's, whatever the hosts flag. Credit saturates at LOSS_CREDIT_MAX, so a long quiet spell
# buys a burst of at most LOSS_BURST drops beyond the bound, never a run of losses.
LOSS_BOUND_BITS = 16
LOSS_CREDIT_ONE = 1 << LOSS_BOUND_BITS  # one packet's worth of credit
LOSS_BURST = 4
LOSS_CREDIT_MAX = LOSS_BURST * LOSS_CREDIT_ONE
# Per-job registers (one cell per job id, not per slot copy): the loss credit.
JOB_REGISTERS = (Register("job_loss_credit", 32, JOB),)
# Per spray group (forwarding.p4, v1model only): the turn the group's next packet takes.
SPRAY = "spray_group"
SPRAY_REGISTERS = (Register("spray_turn", 8, SPRAY),)
# The most ports one spray group takes turns over (spray's `ways`; the turn is 8 bits).
MAX_SPRAY_WAYS = 255


def loss_bound(fraction: float) -> int:
    """A job's `bounded_loss` (a fraction in [0, 1)) as the switch's fixed-point `bound`,
    rounded down so that the switch never allows more than the job asked for."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"bounded_loss must be a fraction in [0, 1), got {fraction!r}")
    return int(fraction * LOSS_CREDIT_ONE)


# ---------------------------------------------------------------- tables and actions
@dataclass(frozen=True)
class Key:
    name: str      # the @name of the key in P4
    match: str     # exact | lpm | ternary
    width: int


@dataclass(frozen=True)
class Action:
    name: str
    params: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Table:
    name: str
    keys: tuple[Key, ...]
    actions: tuple[str, ...]
    default: str
    size: int


ACTIONS = {a.name: a for a in (
    Action("accept_ina"),
    Action("admit", (("epoch", 16), ("slot_base", 16), ("nslots", 16), ("nworkers", 8),
                     ("block_size", 16), ("nlanes", 8), ("mcast_grp", 16))),
    Action("reject"),
    Action("set_congestion", (("qdepth", 19), ("bound", LOSS_BOUND_BITS))),
    Action("bridge", (("port", 9),)),
    # Per-packet spraying (v1model only): the port is spray_ports' entry for the group's turn.
    Action("spray", (("group", 8), ("ways", 8))),
    Action("route", (("port", 9), ("src_mac", 48), ("dst_mac", 48))),
    Action("rewrite_for_worker", (("dst_mac", 48), ("dst_addr", 32), ("dst_port", 16))),
    Action("drop"),
    Action("drop_replica"),
    # Two-level aggregation (p4src/v1model/fabric.p4, docs/scale_out.md).
    Action("as_leaf", (("rack", 8), ("nlocal", 8), ("epoch", 16), ("mcast_grp", 16))),
    Action("as_spine"),
    Action("to_spine", (("port", 9), ("dst_mac", 48), ("dst_addr", 32))),
    Action("NoAction"),
)}

TABLES = {t.name: t for t in (
    # INA packets addressed to one of the switch's own addresses are aggregated here; any other
    # INA packet (a leaf forwarding to the aggregating spine) takes ordinary forwarding.
    Table("ina_endpoint", (Key("dst_addr", "exact", 32),), ("accept_ina", "NoAction"),
          "NoAction", 64),
    # The sender's identity with the (job, rank) it claims: a host cannot speak for another.
    Table("admission", (Key("ingress_port", "exact", 9), Key("src_addr", "exact", 32),
                        Key("src_port", "exact", 16), Key("job", "exact", 16),
                        Key("rank", "exact", 8)),
          ("admit", "reject"), "reject", P4_SIZES["ADMISSION_ENTRIES"]),
    # Per job: the queue depth above which its loss-tolerant contributions may be dropped, and
    # its loss bound (a miss: never dropped). Sized like admission: a job has one entry there
    # at least.
    Table("congestion", (Key("job", "exact", 16),), ("set_congestion", "NoAction"), "NoAction",
          P4_SIZES["ADMISSION_ENTRIES"]),
    Table("l2", (Key("dst_mac", "exact", 48),), ("bridge", "spray", "NoAction"), "NoAction",
          P4_SIZES["L2_ENTRIES"]),
    # A spray group's ports, one per turn 0..ways-1 (a missing turn drops the packet).
    Table("spray_ports", (Key("group", "exact", 8), Key("turn", "exact", 8)), ("bridge", "drop"),
          "drop", P4_SIZES["SPRAY_PORT_ENTRIES"]),
    Table("ipv4_routes", (Key("dst_addr", "lpm", 32),), ("route", "drop"), "drop",
          P4_SIZES["IPV4_ENTRIES"]),
    Table("worker_rewrite", (Key("rid", "exact", 16),), ("rewrite_for_worker", "drop_replica"),
          "drop_replica",
          P4_SIZES["MAX_RIDS"]),
    # The job's level on this switch: no entry, flat; as_leaf, one rack of it, its rounds go up
    # to the spines; as_spine, its workers are the leaves (docs/scale_out.md).
    Table("job_level", (Key("job", "exact", 16),), ("as_leaf", "as_spine", "NoAction"),
          "NoAction", P4_SIZES["ADMISSION_ENTRIES"]),
    # At a leaf, per slot of a leaf job: the spine owning it (a leaf's slots are the pool's).
    Table("leaf_upstream", (Key("job", "exact", 16), Key("slot", "exact", 16)),
          ("to_spine", "NoAction"), "NoAction", P4_SIZES["POOL_SLOTS"]),
)}

# The queue depth threshold's default: never drop (bit<19> maximum, BMv2's enq_qdepth width).
QDEPTH_NEVER = (1 << 19) - 1


# ---------------------------------------------------------------- a job's multicast
def mcast_grp(job: int) -> int:
    """The multicast group a job's results leave by (v1model: group 0 is "no multicast")."""
    return job + 1


def rid(job: int, rank: int) -> int:
    """The replication id of the copy of job `job`'s result for `rank`: worker_rewrite turns
    it into that worker's addresses. Unique per switch; 0 means "no rewrite"."""
    return job * wire.MAX_WORKERS + rank + 1


def rid_rank(rid: int) -> int:
    """The rank whose copy replication id `rid` is (rid's low 5 bits, less one: P4 reads them
    as a bit slice of egress_rid)."""
    return (rid - 1) % wire.MAX_WORKERS


MAX_JOB_ID = (1 << 16) // wire.MAX_WORKERS - 2  # rid(MAX_JOB_ID, 31) fits egress_rid (16 bits)


# ---------------------------------------------------------------- the Tofino 1 program (tofino/)
# tofino/size.p4's sizes (tests/test_tna_agreement.py checks them): one lane of 64 int32 per
# packet in 32 pair registers (two elements per stateful ALU), EGRESS_PAIRS of them added in
# egress and the rest in ingress; a reply takes two more passes, the first for the pairs'
# high halves (the reasons are in size.p4 and tofino/README.md).
TNA_SIZES = {
    "POOL_SLOTS": 256,
    "BLOCK_SIZE": 64,       # int32 elements per block: 2 * (EGRESS_PAIRS + INGRESS_PAIRS)
    "EGRESS_PAIRS": 15,     # pair registers in egress: elements 0 .. 2 * EGRESS_PAIRS - 1
    "INGRESS_PAIRS": 17,    # pair registers in ingress: the rest
    "NLANES": 1,            # blocks per packet
    "MAX_WORKERS": 32,
    "MAX_JOBS": 2048,       # counters and job_loss_credit: admitted job ids are <= MAX_JOB_ID
    "MAX_PORTS": 512,       # Tofino 1 port ids are 9 bits
    "MAX_RIDS": 4096,
    "L2_ENTRIES": 1024,
    "IPV4_ENTRIES": 1024,
    "ADMISSION_ENTRIES": 1024,
    "RANK_CELLS": 16384,    # slot_rank_round: one cell per slot copy and rank
}
TNA_PAIR_WIDTH = 64  # a pair register's cell: struct pair_t { bit<32> lo; bit<32> hi; }
TNA_PAIR_TYPE = "pair_t"
# Flat jobs only: the leaf and spine roles (job_level, leaf_upstream) are not in the TNA program.
TNA_TABLES = ("ina_endpoint", "admission", "congestion", "l2", "ipv4_routes", "worker_rewrite")
# Not in the TNA program: the hold of a newer round (the head registers and job_held; its
# update does not fit a Tofino 1 stateful ALU, tofino/README.md), so the controller refuses a
# bounded-loss job on it (a flush there could strand a worker). The Tofino 2 profile has it
# as one register, head_round (include/hold.p4), which the controller reads in its P4Info.
# Nor the lane counters: its narrow-lane profiles (tofino/size.p4 SPINA_LANE_BITS) take one
# width, another is malformed (no job_lane_mismatch), and saturate in the registers without
# counting it (no job_lane_saturated; tofino/README.md, "Narrow lanes").
TNA_LACKS = frozenset({"job_held", *LANE_COUNTERS} | {r.name for r in REGISTERS if r.shape == HEAD})
# Nor per-packet spraying (l2's spray, spray_ports, spray_turn): v1model only (tofino/README.md).
TNA_LACKS_ACTIONS = frozenset({"spray"})
TNA_COUNTERS = {**{n: TNA_SIZES["MAX_JOBS"] for n in JOB_COUNTERS if n not in TNA_LACKS},
                **{n: TNA_SIZES["MAX_PORTS"] for n in PORT_COUNTERS}}
# Where the TNA registers differ from REGISTERS: 32-bit lane bitmaps (a Tofino cell is at most
# 32 bits; one lane needs one bit), and slot_flags holds FLAG_LAST inverted (set: some
# contribution lacked LAST), so that every update is one OR; its empty value is FLAG_LAST.
TNA_REGISTER_WIDTHS = {"slot_present": 32, "slot_nonfinite": 32}
TNA_FLAGS_INVERTED = wire.FLAG_LAST
# TNA only: per slot copy and rank, round + 1 of the rank's last contribution (duplicates are
# found there, one stage before slot_count, instead of in slot_bitmap).
TNA_RANK_REGISTER = Register("slot_rank_round", 32)


def tna_registers() -> list[tuple[str, int, int]]:
    """(name, cell width, cells) of every register array of the TNA program."""
    widths = {r.name: TNA_REGISTER_WIDTHS.get(r.name, r.width) for r in REGISTERS}
    copies = 2 * TNA_SIZES["POOL_SLOTS"]
    out = [(n, widths[split_p4_register(n)[0]], copies)  # block_size 0: no per-element arrays
           for n in p4_register_names(TNA_SIZES["NLANES"], 0) if n not in TNA_LACKS]
    out += [(n, TNA_PAIR_WIDTH, copies) for n in tna_pair_registers()]
    out.append((TNA_RANK_REGISTER.name, TNA_RANK_REGISTER.width, TNA_SIZES["RANK_CELLS"]))
    out += [(r.name, r.width, TNA_SIZES["MAX_JOBS"]) for r in JOB_REGISTERS]
    return out


def tna_pair_registers() -> list[str]:
    """The TNA program's value registers: slot_values_l0_p<P> holds elements 2P (its low
    half) and 2P + 1 (its high half); pairs below EGRESS_PAIRS live in egress."""
    pairs = TNA_SIZES["EGRESS_PAIRS"] + TNA_SIZES["INGRESS_PAIRS"]
    return [f"slot_values_l0_p{p}" for p in range(pairs)]


# ---------------------------------------------------------------- P4Info
_ID_PREFIX = {"action": 0x01, "table": 0x02, "counter": 0x12, "register": 0x16}
_MATCH_TYPE = {"exact": 2, "lpm": 3, "ternary": 4}  # p4info MatchField.MatchType values


def _p4_id(kind: str, name: str) -> int:
    import zlib
    return _ID_PREFIX[kind] << 24 | (zlib.crc32(name.encode()) & 0xFFFFFF)


def p4info():
    """This declared pipeline as a P4Info message (p4.config.v1), for the software switch's
    P4Runtime side and for comparing with p4c's output by name (IDs here are our own: the
    controller looks names up, never IDs)."""
    widths = {r.name: r.width for r in REGISTERS}
    registers = [(name, widths[split_p4_register(name)[0]], register_cells(name))
                 for name in p4_register_names()]
    registers += [(r.name, r.width, MAX_JOBS) for r in JOB_REGISTERS]
    registers += [(r.name, r.width, P4_SIZES["SPRAY_GROUPS"]) for r in SPRAY_REGISTERS]
    return _p4info(TABLES.values(), COUNTERS, registers)


def tna_p4info():
    """The Tofino 1 program's declared pipeline (tofino/): tests/test_tna_agreement.py
    compares it with bf-p4c's P4Info by name."""
    tables = [Table(t.name, t.keys, tuple(a for a in t.actions if a not in TNA_LACKS_ACTIONS),
                    t.default, t.size) for t in (TABLES[n] for n in TNA_TABLES)]
    return _p4info(tables, TNA_COUNTERS, tna_registers())


def p4info_register_width(info, r) -> int:
    """Register `r`'s cell width in P4Info `info`: its bitstring's, or the sum of its struct's
    members (the TNA pair registers: two 32-bit halves)."""
    if r.type_spec.HasField("struct"):
        members = info.type_info.structs[r.type_spec.struct.name].members
        return sum(m.type_spec.bitstring.bit.bitwidth for m in members)
    return r.type_spec.bitstring.bit.bitwidth


def _p4info(tables, counters: dict, registers):
    from p4.config.v1 import p4info_pb2

    tables = list(tables)
    used = {a for t in tables for a in t.actions}
    info = p4info_pb2.P4Info()
    for a in ACTIONS.values():
        if a.name not in used:
            continue
        pa = info.actions.add()
        pa.preamble.id, pa.preamble.name = _p4_id("action", a.name), a.name
        for i, (pname, width) in enumerate(a.params, start=1):
            pa.params.add(id=i, name=pname, bitwidth=width)
    for t in tables:
        pt = info.tables.add()
        pt.preamble.id, pt.preamble.name = _p4_id("table", t.name), t.name
        for i, k in enumerate(t.keys, start=1):
            pt.match_fields.add(id=i, name=k.name, bitwidth=k.width,
                                match_type=_MATCH_TYPE[k.match])
        for a in t.actions:
            ref = pt.action_refs.add(id=_p4_id("action", a))
            if a in ("NoAction", "drop_replica"):  # @defaultonly in the P4
                ref.scope = p4info_pb2.ActionRef.DEFAULT_ONLY
        pt.const_default_action_id = 0
        pt.size = t.size
    for name, size in counters.items():
        pc = info.counters.add()
        pc.preamble.id, pc.preamble.name = _p4_id("counter", name), name
        pc.spec.unit = p4info_pb2.CounterSpec.PACKETS
        pc.size = size
    pairs = set(tna_pair_registers())
    for name, width, size in registers:
        pr = info.registers.add()
        pr.preamble.id, pr.preamble.name = _p4_id("register", name), name
        if name in pairs:  # two 32-bit halves, as a P4 struct (bf-p4c's form); a 64-bit
            # bitstring register (v1model's slot_present) stays a bitstring
            pr.type_spec.struct.name = TNA_PAIR_TYPE
            if TNA_PAIR_TYPE not in info.type_info.structs:
                pair = info.type_info.structs[TNA_PAIR_TYPE]
                for half in ("lo", "hi"):
                    pair.members.add(name=half).type_spec.bitstring.bit.bitwidth = 32
        else:
            pr.type_spec.bitstring.bit.bitwidth = width
        pr.size = size
    return info
