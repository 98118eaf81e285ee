/* SpINA on Tofino 1: the pair registers that hold a slot copy's sums, two elements per cell.
 *
 * A stateful ALU updates both halves of a pair in one pass (32-bit halves; 16- or 8-bit in a
 * narrow-lane profile, size.p4 SPINA_LANE_BITS) but returns one word, and
 * on Tofino 1 the same word in every branch of a RegisterAction (bf-p4c: "Incompatible
 * outputs in RegisterAction: mem_hi and mem_lo"): SET, CLEAR and MERGE return the low half
 * (element 2P); READ_HI the high half (element 2P + 1, the harvest pass). Four
 * RegisterActions per register, the most a Tofino 1 stateful ALU holds, so a READ of the
 * low half is MERGE with both elements of the header zeroed first (SPINA_READ_ZERO): the
 * cell keeps its value and the low half comes back. One table per register (a Tofino table
 * drives one stateful ALU per index), keyed on the op and the pass, puts the answer into
 * the header.
 * Expanded by the ingress Aggregator (block_i) and by egress EgressSlots (block_e).
 */
#ifndef SPINA_TNA_PAIRS_P4
#define SPINA_TNA_PAIRS_P4

// MERGE's add: int32 wraps around (as every target's int32 registers); a narrow lane's cell
// saturates at its range (|+| on int<W>, the stateful ALU's saturating signed add), so a sum
// beyond the lane answers the lane's bound, as the software switch clips it (tofino/README.md,
// "Narrow lanes": where the two differ).
#if SPINA_LANE_BITS == 32
#define SPINA_LANE_ADD(A, B) ((A) + (B))
#else
#define SPINA_LANE_ADD(A, B) ((A) |+| (B))
#endif

// P: the pair; LO, HI: its elements (2P, 2P + 1); BLK: the header holding them; OP: the op;
// READ_HI: 1 in the harvest pass (READ's answer goes to element HI); IDX: the slot copy;
// PLACE: the table's annotations (its stage).
#define SPINA_PAIR(P, LO, HI, BLK, OP, READ_HI, IDX, PLACE)                                   \
    @name(SPINA_XSTR(.slot_values_l0_p##P)) Register<pair_t, copy_index_t>(SLOT_COPIES)       \
        slot_values_l0_p##P;                                                                  \
    RegisterAction<pair_t, copy_index_t, lane_t>(slot_values_l0_p##P) pair_set_##P = {        \
        void apply(inout pair_t value, out lane_t rv) {                                       \
            value.lo = BLK.e##LO;                                                             \
            value.hi = BLK.e##HI;                                                             \
            rv = value.lo;                                                                    \
        }                                                                                     \
    };                                                                                        \
    RegisterAction<pair_t, copy_index_t, lane_t>(slot_values_l0_p##P) pair_clear_##P = {      \
        void apply(inout pair_t value, out lane_t rv) {                                       \
            value.lo = 0;                                                                     \
            value.hi = 0;                                                                     \
            rv = 0;                                                                           \
        }                                                                                     \
    };                                                                                        \
    RegisterAction<pair_t, copy_index_t, lane_t>(slot_values_l0_p##P) pair_add_##P = {        \
        void apply(inout pair_t value, out lane_t rv) {                                       \
            value.lo = SPINA_LANE_ADD(value.lo, BLK.e##LO);                                   \
            value.hi = SPINA_LANE_ADD(value.hi, BLK.e##HI);                                   \
            rv = value.lo;                                                                    \
        }                                                                                     \
    };                                                                                        \
    RegisterAction<pair_t, copy_index_t, lane_t>(slot_values_l0_p##P) pair_read_hi_##P = {    \
        void apply(inout pair_t value, out lane_t rv) {                                       \
            rv = value.hi;                                                                    \
        }                                                                                     \
    };                                                                                        \
    @hidden action pair_do_set_##P() { BLK.e##LO = pair_set_##P.execute(IDX); }               \
    @hidden action pair_do_clear_##P() { BLK.e##LO = pair_clear_##P.execute(IDX); }           \
    @hidden action pair_do_add_##P() { BLK.e##LO = pair_add_##P.execute(IDX); }               \
    @hidden action pair_do_read_hi_##P() { BLK.e##HI = pair_read_hi_##P.execute(IDX); }       \
    PLACE @hidden table pair_p##P##_ops {                                                     \
        key = { OP: exact; READ_HI: exact; }                                                  \
        actions = { pair_do_set_##P; pair_do_clear_##P; pair_do_add_##P;                      \
                    pair_do_read_hi_##P; @defaultonly NoAction; }                             \
        const entries = {                                                                     \
            (OP_SET, 0): pair_do_set_##P();                                                   \
            (OP_CLEAR, 0): pair_do_clear_##P();                                               \
            (OP_MERGE, 0): pair_do_add_##P();                                                 \
            (OP_READ, 0): pair_do_add_##P();  /* inputs zeroed: SPINA_READ_ZERO */            \
            (OP_READ, 1): pair_do_read_hi_##P();                                              \
        }                                                                                     \
        const default_action = NoAction();                                                    \
        size = 8;                                                                             \
    }

// Applies pair P's op table (ingress Aggregator, egress EgressSlots).
#define SPINA_APPLY_PAIR(P, LO, HI) pair_p##P##_ops.apply();

// Before a READ of the low halves: both elements of each pair of BLK := 0 (MERGE adds 0).
#define SPINA_READ_ZERO(BLK, P, LO, HI) BLK.e##LO = 0; BLK.e##HI = 0;

#endif
