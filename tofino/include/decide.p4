/* SpINA on Tofino 1: a contribution's outcome (Aggregator's decide) and slot_flags' input
 * (flag_input), const tables over what slot_round, slot_rank_round and slot_count returned.
 *
 * Included inside Aggregator's body (aggregator.p4), not a control of its own: the tables
 * read and write Aggregator's metadata and headers in place, and the program bf-p4c compiled
 * (tofino/build/) declares them there; a control of their own would give them other names in
 * bf-p4c's outputs. tests/tna_model.py reads both tables' entries from this file.
 */
    // ------------------------------------------------------------------ decide
    // Pipeline.process's branches from the three answers (and the PARTIAL flag and lane 0's
    // present bit); value_op also says whether lane 0's block is added, set or cleared.
    @hidden action set_outcome(kind_t kind, op_t state_op, op_t flags_op, op_t bitmap_op,
                               op_t value_op) {
        meta.kind = kind;
        meta.state_op = state_op;
        meta.flags_op = flags_op;
        meta.bitmap_op = bitmap_op;
        meta.value_op = value_op;
    }
    // The same, for the entries whose values are READ: both elements of each pair become 0,
    // so that MERGE reads the low half (include/pairs.p4): block_i here (made valid: a packet
    // without a block may read a stored one); block_e is not sent, the egress parser makes
    // it zeros (zero_front).
#define SPINA_INGRESS_READ_LO(P, LO, HI) SPINA_READ_ZERO(hdr.block_i, P, LO, HI)
    @hidden action set_outcome_read(kind_t kind, op_t state_op, op_t flags_op, op_t bitmap_op,
                                    op_t value_op) {
        meta.kind = kind;
        meta.state_op = state_op;
        meta.flags_op = flags_op;
        meta.bitmap_op = bitmap_op;
        meta.value_op = value_op;
        hdr.block_e.setInvalid();
        hdr.block_i.setValid();
        FOR_EACH_INGRESS_PAIR(SPINA_INGRESS_READ_LO)
    }
#ifdef SPINA_TNA_ROLES
    // The roles' outcomes (p4src/v1model/fabric.p4, aggregator.p4's role branches), before
    // the flat entries: a leaf sends what completes here up (the reply goes to its spine,
    // up_reply), stores its spine's RESULT, turns the spine's rack bitmap into local ranks
    // and replays a stored result the spine lacks; a spine adopts a leaf's REPLAY.
    @hidden action set_outcome_up(kind_t kind, op_t state_op, op_t flags_op, op_t bitmap_op,
                                  op_t value_op) {
        set_outcome(kind, state_op, flags_op, bitmap_op, value_op);
        meta.fab.up_reply = 1;
    }
    @hidden action set_outcome_read_up(kind_t kind, op_t state_op, op_t flags_op,
                                       op_t bitmap_op, op_t value_op) {
        set_outcome_read(kind, state_op, flags_op, bitmap_op, value_op);
        meta.fab.up_reply = 1;
    }
    // A spine's STATUS about this rack, to the rack: every local rank (the rack is done), or
    // none when the spine's bitmap lacks the rack.
    @hidden action set_status_rack() {
        set_outcome(KIND_STATUS, OP_NONE, OP_NONE, OP_NONE, OP_NONE);
        hdr.ina.bitmap = meta.fab.all_local;
    }
    @hidden action set_status_rack_none() {
        set_outcome(KIND_STATUS, OP_NONE, OP_NONE, OP_NONE, OP_NONE);
        hdr.ina.bitmap = 0;
    }
    // A leaf's stored result up to a spine that lacks it: RESEND | REPLAY (REPLAY where the
    // packet's LOSS_TOLERANT would be ORed in: one write of the flags fewer).
    @hidden action set_outcome_replay() {
        set_outcome_read_up(KIND_RESEND, OP_READ, OP_READ, OP_READ, OP_READ);
        meta.loss_tolerant = FLAG_REPLAY;
    }
    @hidden action set_drop() {
        set_outcome(KIND_DROP, OP_NONE, OP_NONE, OP_NONE, OP_NONE);
    }
#define SPINA_ROLE_ACTIONS set_outcome_up; set_outcome_read_up; set_outcome_replay; \
    set_status_rack; set_status_rack_none; set_drop;
#define SPINA_ROLE_ANY , _, _, _, _, _, _, _
#define DECIDE_ENTRIES 48
// keys: round, rank, flags, count_delta, present, leaf, from_spine, replay, msg_type,
// rack_hit, rank_diff, rank
#define SPINA_ROLE_ENTRIES \
    /* a leaf, its spine's RESULT for the copy whose partial went up: stored, to the rack */ \
    (PRED_LO, _, _, 0, 1, true, true, _, MSG_RESULT, 0, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_SET); \
    (PRED_LO, _, _, 0, 0, true, true, _, MSG_RESULT, 0, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_CLEAR); \
    (PRED_LO, _, _, 0, 1, true, true, _, MSG_RESULT, _, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_READ, OP_SET); \
    (PRED_LO, _, _, 0, 0, true, true, _, MSG_RESULT, _, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_READ, OP_CLEAR); \
    /* its spine's STATUS about this rack, for the copy whose partial went up: to the rack */ \
    (PRED_LO, _, _, 0, _, true, true, _, MSG_STATUS, 0, 0, _): set_status_rack_none(); \
    (PRED_LO, _, _, 0, _, true, true, _, MSG_STATUS, _, 0, _): set_status_rack(); \
    /* another rack's STATUS lacking this rack, where the copy stored the result: REPLAY up */ \
    (PRED_LO, _, _, 0x00000001, _, true, true, _, MSG_STATUS, 0, _, _): set_outcome_replay(); \
    (_, _, _, _, _, true, true, _, _, _, _, _): set_drop(); \
    /* a leaf, a worker's packet that completes the round here: the partial goes up */ \
    (PRED_HI, _, _, 0xffffffff, 1, true, false, _, _, _, _, _): set_outcome_up(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_SET); \
    (PRED_HI, _, _, 0xffffffff, 0, true, false, _, _, _, _, _): set_outcome_up(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_CLEAR); \
    (PRED_LO, 0 &&& PRED_LO, _, 0xffffffff, 1, true, false, _, _, _, _, _): set_outcome_up(KIND_COMPLETE, OP_MERGE, OP_MERGE, OP_MERGE, OP_MERGE); \
    (PRED_LO, 0 &&& PRED_LO, _, 0xffffffff, 0, true, false, _, _, _, _, _): set_outcome_read_up(KIND_COMPLETE, OP_MERGE, OP_MERGE, OP_MERGE, OP_READ); \
    /* a resend to a round complete here whose spine result is missing (count = nlocal): */ \
    /* up again from local rank 0 or as a flush request, others' dropped */ \
    (PRED_LO, _, _, 0, _, true, false, _, _, _, _, 0): set_outcome_read_up(KIND_RESEND, OP_READ, OP_READ, OP_READ, OP_READ); \
    (PRED_LO, _, FLAG_PARTIAL &&& FLAG_PARTIAL, 0, _, true, false, _, _, _, _, _): set_outcome_read_up(KIND_RESEND, OP_READ, OP_READ, OP_READ, OP_READ); \
    (PRED_LO, _, _, 0, _, true, false, _, _, _, _, _): set_drop(); \
    /* a flush here: the partial goes up */ \
    (PRED_LO, PRED_LO &&& PRED_LO, FLAG_PARTIAL &&& FLAG_PARTIAL, 0x80000000 &&& 0x80000000, _, true, false, _, _, _, _, _): set_outcome_read_up(KIND_FLUSH, OP_READ, OP_MERGE, OP_READ, OP_READ); \
    /* a spine, a leaf's REPLAY of a round not complete here: written as its result */ \
    (PRED_HI, _, _, _, 1, _, _, true, _, _, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_SET); \
    (PRED_HI, _, _, _, 0, _, _, true, _, _, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_CLEAR); \
    (PRED_LO, _, _, 0x80000000 &&& 0x80000000, 1, _, _, true, _, _, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_SET); \
    (PRED_LO, _, _, 0x80000000 &&& 0x80000000, 0, _, _, true, _, _, _, _): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_CLEAR);
#else
#define SPINA_ROLE_ACTIONS
#define SPINA_ROLE_ANY
#define SPINA_ROLE_ENTRIES
#define DECIDE_ENTRIES 16
#endif
    @hidden table decide {
        key = {
            meta.round_pred:        ternary;
            meta.rank_pred:         ternary;
            hdr.ina.flags:          ternary;
            meta.count_delta:       ternary;
            hdr.ina.present[0:0]:   ternary;
#ifdef SPINA_TNA_ROLES
            meta.fab.leaf:          ternary;
            meta.fab.from_spine:    ternary;
            meta.fab.replay:        ternary;
            hdr.ina.msg_type:       ternary;
            meta.fab.rack_hit:      ternary;
            meta.fab.rank_diff:     ternary;
            hdr.ina.rank:           ternary;
#endif
        }
        actions = { set_outcome; set_outcome_read; SPINA_ROLE_ACTIONS @defaultonly NoAction; }
        const entries = {
            SPINA_ROLE_ENTRIES
            // A newer round: the copy starts afresh with this packet (a round of one worker
            // completes at once).
            (PRED_HI, _, _, 0xffffffff, 1 SPINA_ROLE_ANY): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_SET);
            (PRED_HI, _, _, 0xffffffff, 0 SPINA_ROLE_ANY): set_outcome(KIND_COMPLETE, OP_SET, OP_SET, OP_SET, OP_CLEAR);
            (PRED_HI, _, _, _, 1 SPINA_ROLE_ANY): set_outcome(KIND_HOLD, OP_SET, OP_SET, OP_SET, OP_SET);
            (PRED_HI, _, _, _, 0 SPINA_ROLE_ANY): set_outcome(KIND_HOLD, OP_SET, OP_SET, OP_SET, OP_CLEAR);
            // The same round, a rank not seen (slot_rank_round's cell was not round + 1: its
            // PRED_LO bit is clear): added while incomplete, else the stored result.
            (PRED_LO, 0 &&& PRED_LO, _, 0xffffffff, 1 SPINA_ROLE_ANY): set_outcome(KIND_COMPLETE, OP_MERGE, OP_MERGE, OP_MERGE, OP_MERGE);
            (PRED_LO, 0 &&& PRED_LO, _, 0xffffffff, 0 SPINA_ROLE_ANY): set_outcome_read(KIND_COMPLETE, OP_MERGE, OP_MERGE, OP_MERGE, OP_READ);
            (PRED_LO, 0 &&& PRED_LO, _, 0x80000000 &&& 0x80000000, 1 SPINA_ROLE_ANY): set_outcome(KIND_HOLD, OP_MERGE, OP_MERGE, OP_MERGE, OP_MERGE);
            (PRED_LO, 0 &&& PRED_LO, _, 0x80000000 &&& 0x80000000, 0 SPINA_ROLE_ANY): set_outcome(KIND_HOLD, OP_MERGE, OP_MERGE, OP_MERGE, OP_NONE);
            (PRED_LO, 0 &&& PRED_LO, _, _, _ SPINA_ROLE_ANY): set_outcome_read(KIND_RESEND, OP_READ, OP_READ, OP_READ, OP_READ);
            // A duplicate: the stored result when complete, a flush, or a status.
            (PRED_LO, PRED_LO &&& PRED_LO, _, 0x00000000 &&& 0x80000000, _ SPINA_ROLE_ANY): set_outcome_read(KIND_RESEND, OP_READ, OP_READ, OP_READ, OP_READ);
            (PRED_LO, PRED_LO &&& PRED_LO, FLAG_PARTIAL &&& FLAG_PARTIAL, _, _ SPINA_ROLE_ANY): set_outcome_read(KIND_FLUSH, OP_READ, OP_MERGE, OP_READ, OP_READ);
            (PRED_LO, PRED_LO &&& PRED_LO, _, _, _ SPINA_ROLE_ANY): set_outcome(KIND_STATUS, OP_NONE, OP_NONE, OP_READ, OP_NONE);
        }
        const default_action = NoAction();  // stale: kind stays KIND_NONE
        size = DECIDE_ENTRIES;
    }

#ifdef SPINA_TNA_ROLES
// A spine ORs a partial's MISMATCH and PARTIAL into the round; a leaf stores its spine's
// result's flags (SET). C: the carried flags, one entry per combination (a const ternary
// table: its entries are the only way to "OR a field into an input" without a stage).
#define SPINA_CARRY_ANY , _
#define SPINA_CARRIED(C) \
    (_, OP_SET, FLAG_LAST | C &&& FLAG_LAST | FLAGS_CARRIED, _, true): set_flag_bits(C); \
    (_, OP_SET, C &&& FLAG_LAST | FLAGS_CARRIED, _, true): set_flag_bits(FLAG_LAST | C); \
    (_, OP_MERGE, FLAG_LAST | C &&& FLAG_LAST | FLAGS_CARRIED, 0, true): set_flag_bits(C); \
    (_, OP_MERGE, FLAG_LAST | C &&& FLAG_LAST | FLAGS_CARRIED, _, true): set_flag_bits(FLAG_MISMATCH | C); \
    (_, OP_MERGE, C &&& FLAG_LAST | FLAGS_CARRIED, 0, true): set_flag_bits(FLAG_LAST | C); \
    (_, OP_MERGE, C &&& FLAG_LAST | FLAGS_CARRIED, _, true): set_flag_bits(FLAG_LAST | FLAG_MISMATCH | C);
#define SPINA_CARRIED_FLAG_ENTRIES \
    SPINA_CARRIED(0) SPINA_CARRIED(FLAG_MISMATCH) SPINA_CARRIED(FLAG_PARTIAL) \
    SPINA_CARRIED(FLAGS_CARRIED)
#define FLAG_INPUT_ENTRIES 32
#else
#define SPINA_CARRY_ANY
#define SPINA_CARRIED_FLAG_ENTRIES
#define FLAG_INPUT_ENTRIES 8
#endif
    // slot_flags' input: FLAG_LAST when this contribution lacks it (inverted), MISMATCH when
    // its length differs from the copy's, PARTIAL for a flush.
    @hidden action set_flag_bits(bit<8> bits) {
        meta.flag_bits = bits;
    }
    @hidden table flag_input {
        key = {
            meta.kind:        ternary;
            meta.flags_op:    ternary;
            hdr.ina.flags:    ternary;
            meta.length_diff: ternary;
#ifdef SPINA_TNA_ROLES
            meta.fab.carry:   ternary;
#endif
        }
        actions = { set_flag_bits; @defaultonly NoAction; }
        const entries = {
            (KIND_FLUSH, _, _, _ SPINA_CARRY_ANY): set_flag_bits(FLAG_PARTIAL);
            SPINA_CARRIED_FLAG_ENTRIES
            (_, OP_SET, FLAG_LAST &&& FLAG_LAST, _ SPINA_CARRY_ANY): set_flag_bits(0);
            (_, OP_SET, _, _ SPINA_CARRY_ANY): set_flag_bits(FLAG_LAST);
            (_, OP_MERGE, FLAG_LAST &&& FLAG_LAST, 0 SPINA_CARRY_ANY): set_flag_bits(0);
            (_, OP_MERGE, FLAG_LAST &&& FLAG_LAST, _ SPINA_CARRY_ANY): set_flag_bits(FLAG_MISMATCH);
            (_, OP_MERGE, _, 0 SPINA_CARRY_ANY): set_flag_bits(FLAG_LAST);
            (_, OP_MERGE, _, _ SPINA_CARRY_ANY): set_flag_bits(FLAG_LAST | FLAG_MISMATCH);
        }
        const default_action = NoAction();
        size = FLAG_INPUT_ENTRIES;
    }
