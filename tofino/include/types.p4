/* SpINA on Tofino 1: the header struct and metadata of the TNA program.
 *
 * The header types are p4src/shared/header.p4's (the wire format is spina/wire.py's, on every
 * target); only the containers differ: one lane (NLANES = 1) as single headers with its block
 * split where ingress and egress add it (block_e, block_i), a bridged header that tells
 * egress what ingress did (TNA metadata does not cross the traffic manager), and the harvest
 * header a reply carries through the recirculation port.
 */
#ifndef SPINA_TNA_TYPES_P4
#define SPINA_TNA_TYPES_P4

// What a slot register does for this packet (its RegisterAction).
typedef bit<3> op_t;
const op_t OP_NONE = 0;
const op_t OP_SET = 1;    // fresh copy: this packet's value
const op_t OP_MERGE = 2;  // add, OR, min or max this packet's value into the copy
const op_t OP_READ = 3;   // pairs: the low half, or the high half in the harvest pass
const op_t OP_CLEAR = 4;  // values only: fresh copy, lane absent: 0

// Ingress -> egress, in front of everything else (never on the wire outside the switch): what
// ingress did and what egress does. Each field a P4 action writes from another PHV field
// (value_op, reply_port, mcast_grp, idx) shares its bytes only with padding, and the flags
// byte is written from constants only: a Tofino action writes a container from one PHV
// source, and not from a PHV field and a constant at once; the pragmas keep those bytes in
// containers of their own (bf-p4c otherwise packs the header into shared ones).
@pa_container_size("ingress", "hdr.bridge.ina_emitted", 8)
@pa_container_size("ingress", "hdr.bridge.value_op", 8)
@pa_container_size("ingress", "hdr.bridge.reply_port", 16)
@pa_container_size("ingress", "hdr.bridge.mcast_grp", 16)
header bridge_h {
    bit<1>  ina_emitted;  // a result or status this switch wrote: egress rewrites and counts it
    bit<1>  ipv4_update;  // the IPv4 header changed: the egress deparser recomputes its checksum
    bit<1>  hold_drop;    // a held contribution: egress adds its part, then drops it
    bit<1>  to_harvest;   // a reply's first or second pass: egress recirculates it
    bit<1>  block_front;  // block_e follows this header (egress adds or reads those pairs)
    bit<1>  read_hi;      // OP_READ returns the egress pairs' high halves (second pass)
    bit<1>  last;         // to_harvest: the next pass is the reply's third (sends it on)
    bit<1>  zero_front;   // egress: block_e := zeros (a READ of the low halves), none follows
    bit<5>  pad1;
    op_t    value_op;     // the egress pairs' op
    bit<7>  pad2;
    PortId_t reply_port;  // to_harvest: the sender's port (a RESEND, a STATUS go back there)
    bit<16> mcast_grp;    // to_harvest: the job's group for a result to every worker, else 0
    bit<7>  pad3;
    bit<9>  idx;          // the slot copy (meta.idx): egress indexes from its first stage
}

// Egress -> ingress through the pipe's recirculation port, in front of everything else:
// which pass comes next and where the reply goes. Flags in bytes of their own (egress writes
// them from constants, per branch).
@pa_container_size("egress", "hdr.harvest.last", 8)
@pa_container_size("egress", "hdr.harvest.block", 8)
@pa_container_size("egress", "hdr.harvest.port", 16)
@pa_container_size("egress", "hdr.harvest.mcast_grp", 16)
header harvest_h {
    bit<7>   pad0;
    bit<1>   last;        // the reply's third pass: send it on, touch no register
    bit<7>   pad1;
    bit<1>   block;       // block_e follows this header
    bit<7>   pad2;
    PortId_t port;        // the sender's port (unicast replies)
    bit<16>  mcast_grp;   // the job's group, or 0: unicast to port
}

// The block of BLOCK_SIZE int32 in two parts: elements 0 .. 2 * EGRESS_PAIRS - 1, added in
// egress (block_e_h), and the rest, added in ingress (block_i). Tofino 1's egress parser
// reaches 160 bytes (27 of them egress intrinsic metadata), so egress cannot parse the egress
// part at its place on the wire (behind 94 bytes of headers): ingress emits it right behind
// the bridged header as `block_e` and parses it back from there after a recirculation; in a
// reply's last pass the ingress parser extracts those bytes into `block_w` instead, which the
// deparser emits at the wire position (behind lane_next, before block_i).
// An element as the wire carries it at this program's lane width (size.p4 SPINA_LANE_BITS):
// int32 as bit<32> (the pairs add with wrap-around, as every target), int16 and int8 signed
// (the pairs add with the stateful ALU's saturating add, |+|: include/pairs.p4).
#if SPINA_LANE_BITS == 32
typedef bit<32> lane_t;
#else
typedef int<SPINA_LANE_BITS> lane_t;
#endif
#define SPINA_ELEM_FIELD(E) lane_t e##E;
header block_e_h {
    FOR_EACH_EGRESS_ELEM(SPINA_ELEM_FIELD)
}
header block_i_h {
    FOR_EACH_INGRESS_ELEM(SPINA_ELEM_FIELD)
}

struct tna_headers_t {
    bridge_h    bridge;
    harvest_h   harvest;    // a recirculated reply (ingress), and its way back (egress)
    block_e_h   block_e;    // the egress part of lane 0's block, in front (passes 1 and 2)
    ethernet_h  ethernet;
    ipv4_h      ipv4;
    udp_h       udp;
    ina_h       ina;
    lane_next_h lane_next;  // lane 0's next position (NLANES = 1)
    block_e_h   block_w;    // the egress part at its wire position (a reply's last pass)
    block_i_h   block_i;    // the ingress part, when present bit 0 is set
}

// A pair register's cell: element 2P (lo) and 2P + 1 (hi), each as wide as a lane.
struct pair_t {
    lane_t lo;
    lane_t hi;
}

// Outcome of one contribution, chosen by the `decide` const table from what slot_round,
// slot_rank_round and slot_count returned (softswitch Pipeline.process's branches).
typedef bit<3> kind_t;
const kind_t KIND_NONE = 0;      // no register touched after slot_round (stale round)
const kind_t KIND_HOLD = 1;      // added, round incomplete: dropped
const kind_t KIND_COMPLETE = 2;  // added, round complete: the result to every worker
const kind_t KIND_RESEND = 3;    // round complete before: the stored result back (RESEND)
const kind_t KIND_FLUSH = 4;     // duplicate flagged PARTIAL: complete now, to every worker
const kind_t KIND_STATUS = 5;    // duplicate, round incomplete: the bitmap back

// What the packet is, after stage 0's lookups (Admission's `gate` table).
typedef bit<3> gate_t;
const gate_t GATE_FORWARD = 0;      // not an INA packet for this switch
const gate_t GATE_MALFORMED = 1;    // port_malformed
const gate_t GATE_UNADMITTED = 2;   // port_unadmitted
const gate_t GATE_STALE_EPOCH = 3;  // admitted (if the slot's upper bound holds), wrong epoch
const gate_t GATE_AGGREGATE = 4;    // admitted (if the slot's upper bound holds)

// InaCheck's masks: rank < 32, and no present/nonfinite bit beyond lane 0.
const bit<8>  RANK_HIGH_BITS = 0xe0;
const bit<64> LANE_HIGH_BITS = 0xfffffffffffffffe;

// RegisterAction.predicate(cmplo, cmphi) on Tofino 1 returns bit (cmplo + 2 * cmphi) set
// (bf-p4c stateful_alu.cpp: condition masks 0xa / 0xc over the four outcomes).
typedef bit<4> pred_t;
const pred_t PRED_NONE = 1;  // neither condition
const pred_t PRED_LO = 2;    // the first condition only
const pred_t PRED_HI = 4;    // the second condition only

struct tna_ingress_md_t {
    admission_t adm;
    bool        ina_local;
    bool        harvest;       // the harvest pass (a recirculated reply)
    bit<1>      read_hi;       // OP_READ returns the pairs' high halves (the harvest pass)
    bool        malformed;     // InaCheck
    gate_t      gate;
    bit<16>     slot_below;    // slot_base - slot, saturated at 0: non-zero below the range
    bit<16>     slot_off;      // slot - slot_base (the offset when slot_below is 0)
    bit<16>     slot_room;     // nslots - slot_off, saturated at 0: zero above the range
    bit<16>     epoch_diff;    // epoch ^ admitted epoch
    bit<32>     nworkers;      // adm.nworkers, 32 bits for slot_count's comparisons
    bit<32>     count_limit;   // nworkers when the packet asks for a flush, else 0
    bit<9>      idx;           // slot * 2 + (round & 1)
    bit<14>     rank_idx;      // idx * MAX_WORKERS + rank
    bit<32>     round_next;    // round + 1: slot_rank_round's mark (0: never contributed)
    bit<32>     rank_bit;      // 1 << rank, from a const table
    pred_t      round_pred;    // slot_round: PRED_LO same round, PRED_HI newer, else stale
    pred_t      rank_pred;     // slot_rank_round: PRED_LO this rank marked this round, else
                               // PRED_HI (raised now) or PRED_NONE (a stale packet's)
    bit<32>     count_delta;   // slot_count before this packet minus nworkers (signed)
    bit<32>     stored_length; // slot_length of the copy (this packet's when fresh)
    bit<32>     length_diff;   // stored_length ^ length: non-zero is a MISMATCH
    kind_t      kind;
    op_t        state_op;      // slot_present, slot_nonfinite, slot_exponent, slot_next_l0
    op_t        flags_op;      // slot_flags (a flush ORs PARTIAL in and reads the rest)
    op_t        bitmap_op;
    op_t        value_op;
    bit<8>      flag_bits;     // ORed into (or set as) slot_flags
    bit<32>     present;       // slot_present, slot_nonfinite, slot_flags after this packet
    bit<32>     nonfinite;
    bit<8>      stored_flags;
    bit<8>      flags_xor;     // FLAG_LAST (| FLAG_RESEND): stored flags -> a result's
    bit<8>      loss_tolerant; // the packet's FLAG_LOSS_TOLERANT, kept for the reply
    SPINA_ROLE_INGRESS_MD      // the roles' profile: fab (include/profile_roles.p4)
    SPINA_HOLD_INGRESS_MD      // the hold: hold_mask (include/hold.p4)
}

struct tna_egress_md_t {
    qdepth_t qdepth_room;      // threshold - enq_qdepth, saturated at 0
    qdepth_t qdepth_differs;   // threshold ^ enq_qdepth
    bit<32> loss_bound;
    bit<32> loss_need;         // LOSS_CREDIT_ONE - bound: what a drop takes from the earned credit
}

#endif
