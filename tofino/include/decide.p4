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
    SPINA_ROLE_DECIDE_ACTIONS  // roles' profile: set_outcome_up, set_drop, ...
    @hidden table decide {
        key = {
            meta.round_pred:        ternary;
            meta.rank_pred:         ternary;
            hdr.ina.flags:          ternary;
            meta.count_delta:       ternary;
            hdr.ina.present[0:0]:   ternary;
            SPINA_ROLE_DECIDE_KEYS  // roles' profile: leaf, from_spine, replay, ...
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
            SPINA_ROLE_FLAG_INPUT_KEYS  // roles' profile: carry
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
