/* SpINA on Tofino 1, the fabric roles' profile (tofino/spina_tna_roles.p4): what the leaf and
 * spine roles add to the shared controls, as the hooks those expand (include/profile_flat.p4
 * defines the same names for the default profile), and the roles' metadata. The roles' own
 * lookups are include/fabric.p4's FabricRoles. The profile is a measurement of what the roles
 * cost on Tofino 1 (tofino/README.md, "The hold and the roles on Tofino 1"): bf-p4c's answer,
 * not a program the controller deploys or a transliteration checks.
 *
 * A hook with an argument, FLAT, wraps the default program's statements: the roles replace
 * them (or keep them in a branch of their own). Comments inside a macro are C comments.
 */
#ifndef SPINA_TNA_PROFILE_ROLES_P4
#define SPINA_TNA_PROFILE_ROLES_P4

// The fabric roles (include/fabric.p4; p4src/v1model/fabric.p4's meta.fab), at this program's
// sizes: a rack's bit and its local ranks' mask come as action data (no variable shift).
struct tna_fabric_md_t {
    bool        leaf;
    bool        spine;
    bit<8>      rack;
    bit<32>     rack_bit;      // 1 << rack
    bit<32>     all_local;     // (1 << nlocal) - 1
    bit<16>     epoch_diff;    // epoch ^ the spine's epoch for the job (as_leaf)
    bool        up;            // leaf_upstream hit: the slot's spine
    PortId_t    up_port;
    bit<48>     up_mac;
    bit<32>     up_addr;
    bool        from_spine;    // a RESULT or STATUS from the slot's spine
    bit<32>     rack_hit;      // the spine's bitmap & rack_bit
    bit<8>      rank_diff;     // rank ^ rack: 0 for a STATUS about this rack
    bool        carry;         // a spine's MISMATCH / PARTIAL (or a leaf's stored result)
    bool        store;         // a spine's RESULT at a leaf: slot_count's count_store
    bool        replay;        // a leaf's REPLAY at a spine
    bool        dup;           // slot_count's count_duplicate: a replay, or the spine's answer
    bit<32>     all_ranks;     // (1 << nworkers) - 1: a whole replay's ranks
    bit<32>     bitmap_in;     // slot_bitmap's input: rank_bit, or a replay's ranks
    bit<1>      up_reply;      // decide: the reply goes up to the spine (a leaf)
}

// ---------------------------------------------------------------- types.p4
// tna_ingress_md_t's fields of the roles.
#define SPINA_ROLE_INGRESS_MD                                                           \
    tna_fabric_md_t fab;       /* include/fabric.p4 (the roles' measurement profile) */

// ---------------------------------------------------------------- ina_check.p4
// ina_check's entries: the spine's answers a leaf takes.
#define SPINA_ROLE_WELL_FORMED                                                                     \
            /* A spine's RESULT (with or without the block) and STATUS, for a leaf (FromSpine). */ \
            (0, true, INA_VERSION, MSG_RESULT, NLANES, BLOCK_SIZE, LANE_FLAG &&& FLAGS_LANE_WIDTH, \
             0 &&& RANK_HIGH_BITS, 0,                                                              \
             0 &&& LANE_HIGH_BITS, UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES): well_formed();     \
            (0, true, INA_VERSION, MSG_RESULT, NLANES, BLOCK_SIZE, LANE_FLAG &&& FLAGS_LANE_WIDTH, \
             0 &&& RANK_HIGH_BITS, 1,                                                              \
             0 &&& LANE_HIGH_BITS, UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES + BLOCK_BYTES):      \
                well_formed();                                                                     \
            (0, true, INA_VERSION, MSG_STATUS, NLANES, BLOCK_SIZE, LANE_FLAG &&& FLAGS_LANE_WIDTH, \
             0 &&& RANK_HIGH_BITS, 0,                                                              \
             0 &&& LANE_HIGH_BITS, UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES): well_formed();
#define INA_CHECK_ENTRIES 8

// ---------------------------------------------------------------- admission.p4
#define SPINA_GATE_ANY , _, _, _
#define GATE_ENTRIES 8
#define SPINA_ROLE_GATE_KEYS                                                                      \
            /* A spine's RESULT or STATUS at a leaf (leaf_upstream hit, not a CONTRIB) carries */ \
            /* the spine's epoch for the job (as_leaf), not the rack's (admission). */            \
            meta.fab.up:           ternary;                                                       \
            hdr.ina.msg_type:      ternary;                                                       \
            meta.fab.epoch_diff:   ternary;
#define SPINA_ROLE_GATE_ENTRIES                                                                             \
            (true, false, true, 0, _, NLANES, BLOCK_SIZE, true, MSG_RESULT, 0): set_gate(GATE_AGGREGATE);   \
            (true, false, true, 0, _, NLANES, BLOCK_SIZE, true, MSG_STATUS, 0): set_gate(GATE_AGGREGATE);   \
            (true, false, true, 0, _, NLANES, BLOCK_SIZE, true, MSG_RESULT, _): set_gate(GATE_STALE_EPOCH); \
            (true, false, true, 0, _, NLANES, BLOCK_SIZE, true, MSG_STATUS, _): set_gate(GATE_STALE_EPOCH);

// ---------------------------------------------------------------- slot_index.p4
#define SPINA_ALL_RANKS_ENTRY(R) (R + 1): set_all_ranks((bit<32>)((33w1 << (R + 1)) - 1));
#define SPINA_ROLE_SLOT_INDEX                                                                     \
    @hidden action set_all_ranks(bit<32> mask) {                                                  \
        meta.fab.all_ranks = mask;                                                                \
    }                                                                                             \
    @hidden table all_ranks {                                                                     \
        key = { meta.adm.nworkers: exact; }                                                       \
        actions = { set_all_ranks; @defaultonly NoAction; }                                       \
        const entries = {                                                                         \
            FOR_EACH_RANK(SPINA_ALL_RANKS_ENTRY)                                                  \
        }                                                                                         \
        const default_action = NoAction();                                                        \
        size = MAX_WORKERS;                                                                       \
    }                                                                                             \
                                                                                                  \
    /* A spine adopting a leaf's REPLAY: the copy, fresh or incomplete, is raised to nworkers */  \
    /* by count_duplicate (a spine's count never exceeds nworkers; count_first cannot take */     \
    /* nworkers as a third input: experiments/roles.p4 -DVARIANT=5), and slot_bitmap is set */    \
    /* to the replay's ranks (every rack for a whole result, the replaying rack for a PARTIAL */  \
    /* one that names ranks, none otherwise). A leaf storing its spine's result sets no bit of */ \
    /* its own. One lookup: `if`s here delayed slot_round by three stages (tofino/README.md). */  \
    @hidden action bitmap_rank_bit() {                                                            \
        meta.fab.bitmap_in = meta.rank_bit;                                                       \
    }                                                                                             \
    @hidden action bitmap_all_ranks() {                                                           \
        meta.fab.bitmap_in = meta.fab.all_ranks;                                                  \
        meta.count_limit = meta.nworkers;                                                         \
    }                                                                                             \
    @hidden action bitmap_replaying_rack() {                                                      \
        meta.fab.bitmap_in = meta.rank_bit;                                                       \
        meta.count_limit = meta.nworkers;                                                         \
    }                                                                                             \
    @hidden action bitmap_none() {                                                                \
        meta.fab.bitmap_in = 0;                                                                   \
    }                                                                                             \
    @hidden action bitmap_none_limit() {                                                          \
        meta.fab.bitmap_in = 0;                                                                   \
        meta.count_limit = meta.nworkers;                                                         \
    }                                                                                             \
    @hidden table role_inputs {                                                                   \
        key = {                                                                                   \
            meta.fab.replay:      ternary;                                                        \
            meta.fab.from_spine:  ternary;                                                        \
            hdr.ina.flags:        ternary;                                                        \
            hdr.ina.bitmap:       ternary;                                                        \
        }                                                                                         \
        actions = { bitmap_rank_bit; bitmap_all_ranks; bitmap_replaying_rack; bitmap_none;        \
                    bitmap_none_limit; @defaultonly NoAction; }                                   \
        const entries = {                                                                         \
            (true, _, 0 &&& FLAG_PARTIAL, _): bitmap_all_ranks();                                 \
            (true, _, _, 0): bitmap_none_limit();                                                 \
            (true, _, _, _): bitmap_replaying_rack();                                             \
            (_, true, _, _): bitmap_none();                                                       \
        }                                                                                         \
        const default_action = NoAction();                                                        \
        size = 4;                                                                                 \
    }
#define SPINA_ROLE_SLOT_INDEX_APPLY                         \
        meta.fab.all_ranks = 0;                             \
        all_ranks.apply();                                  \
        meta.fab.bitmap_in = meta.rank_bit;                 \
        role_inputs.apply();

// ---------------------------------------------------------------- aggregator.p4
#define SPINA_ROLE_ROUND_ACTIONS                                                                 \
    /* A spine's answer at a leaf: for the round this copy holds (PRED_LO), else stale; never */ \
    /* takes the copy. */                                                                        \
    RegisterAction<bit<32>, copy_index_t, pred_t>(slot_round) peek_round = {                     \
        void apply(inout bit<32> value, out pred_t rv) {                                         \
            rv = this.predicate(value == hdr.ina.round);                                         \
        }                                                                                        \
    };
#define SPINA_ROLE_COUNT_ACTIONS                                                                  \
    /* A leaf storing its spine's RESULT: only a copy whose partial went up (count = nlocal, */   \
    /* the leaf's nworkers) takes it, and counts nlocal + 1 (stored: a later RESULT is a */       \
    /* duplicate, a worker's resend gets it). slot_count's fourth RegisterAction, the most one */ \
    /* Tofino 1 register holds. */                                                                \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_count) count_store = {                    \
        void apply(inout bit<32> value, out bit<32> rv) {                                         \
            rv = value - meta.nworkers;                                                           \
            if (value == meta.nworkers) {                                                         \
                value = value + 1;                                                                \
            }                                                                                     \
        }                                                                                         \
    };
#define SPINA_ROLE_BITMAP_INPUT(FLAT) meta.fab.bitmap_in
#define SPINA_ROLE_REPLY_ACTIONS                                                                  \
    /* A result's header, or (a leaf) its partial's going up as one contribution of the rack: */  \
    /* one table keyed on the kind and up_reply (two `if`s writing msg_type are not known */      \
    /* to exclude each other, and cost a stage). */                                               \
    @hidden action to_result() {                                                                  \
        hdr.ina.msg_type = MSG_RESULT;                                                            \
        hdr.ina.flags = meta.stored_flags ^ meta.flags_xor;                                       \
        hdr.ina.length = meta.stored_length;                                                      \
    }                                                                                             \
    @hidden action to_spine_contrib() {                                                           \
        hdr.ina.msg_type = MSG_CONTRIB;                                                           \
        hdr.ina.rank = meta.fab.rack;                                                             \
        hdr.ina.flags = meta.stored_flags ^ meta.flags_xor;                                       \
        hdr.ina.length = meta.stored_length;                                                      \
    }                                                                                             \
    @hidden table result_header {                                                                 \
        key = { meta.kind: exact; meta.fab.up_reply: exact; }                                     \
        actions = { to_result; to_spine_contrib; @defaultonly NoAction; }                         \
        const entries = {                                                                         \
            (KIND_COMPLETE, 0): to_result();                                                      \
            (KIND_RESEND, 0): to_result();                                                        \
            (KIND_FLUSH, 0): to_result();                                                         \
            (KIND_COMPLETE, 1): to_spine_contrib();                                               \
            (KIND_RESEND, 1): to_spine_contrib();                                                 \
            (KIND_FLUSH, 1): to_spine_contrib();                                                  \
        }                                                                                         \
        const default_action = NoAction();                                                        \
        size = 8;                                                                                 \
    }                                                                                             \
    /* A leaf's reply that goes up instead (ToSpine): from this switch to the slot's spine, as */ \
    /* one contribution of the rack (rank = the rack's index); the third pass unicasts it to */   \
    /* the spine's port (harvest mcast_grp 0). */                                                 \
    @hidden action reply_up() {                                                                   \
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;                                            \
        hdr.ethernet.dst_addr = meta.fab.up_mac;                                                  \
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;                                                    \
        hdr.ipv4.dst_addr = meta.fab.up_addr;                                                     \
        hdr.udp.src_port = hdr.udp.dst_port;                                                      \
        hdr.udp.dst_port = INA_UDP_PORT;                                                          \
        hdr.udp.checksum = 0;                                                                     \
        hdr.bridge.ipv4_update = 1;                                                               \
        hdr.bridge.ina_emitted = 1;                                                               \
        hdr.bridge.to_harvest = 1;                                                                \
        hdr.bridge.reply_port = meta.fab.up_port;                                                 \
    }
#define SPINA_ROLE_ROUND_CHECK(FLAT)                                                   \
            /* A spine's answer at a leaf reads the copy's round and marks no rank. */ \
            if (meta.fab.from_spine) {                                                 \
                meta.round_pred = peek_round.execute(meta.idx);                        \
                meta.rank_pred = PRED_NONE;                                            \
            } else {                                                                   \
                FLAT                                                                   \
            }
// A leaf's REPLAY at a spine, in a newer round: slot_count raised to nworkers (a flush).
#define SPINA_ROLE_REPLAY_FIRST                                       \
            if (meta.round_pred == PRED_HI && meta.fab.replay) {      \
                meta.stored_length = set_length.execute(meta.idx);    \
                meta.count_delta = count_duplicate.execute(meta.idx); \
            } else
// The spine's RESULT at a leaf is stored (count_store); the spine's answers count no rank.
#define SPINA_ROLE_STORE                                              \
                if (meta.fab.store) {                                 \
                    meta.count_delta = count_store.execute(meta.idx); \
                } else
#define SPINA_ROLE_OR_DUP || meta.fab.dup
#define SPINA_ROLE_DROP                                                                      \
        if (meta.kind == KIND_DROP) {                                                        \
            hdr.bridge.hold_drop = 1;  /* egress drops it (nothing to add: value_op NONE) */ \
        }
#define SPINA_ROLE_RESULT_HEADER(FLAT)                                       \
        result_header.apply();  /* a result, or a leaf's partial going up */
#define SPINA_ROLE_REPLY(FLAT)                                                                  \
        /* A result to every worker (or, at a leaf, to the rack); a spine's STATUS to every */  \
        /* leaf, a leaf's to the rack. One condition: two writes would take two stages. */      \
        if (((meta.kind == KIND_COMPLETE || meta.kind == KIND_FLUSH) && meta.fab.up_reply == 0) \
                || (meta.kind == KIND_STATUS && meta.fab.carry)) {                              \
            hdr.bridge.mcast_grp = meta.adm.mcast_grp;  /* else 0, as the bridge starts */      \
        }                                                                                       \
        /* Back to the sender, or a leaf's partial up to its spine: exclusive branches (two */  \
        /* `if`s writing the addresses took two stages; a table keyed on kind and up_reply */   \
        /* found no room in stages 6-11 and went to a 13th), last in the sequence. */           \
        if (meta.kind >= KIND_COMPLETE) {                                                       \
            if (meta.fab.up_reply == 0) {                                                       \
                reply_to_sender();                                                              \
            } else {                                                                            \
                reply_up();                                                                     \
            }                                                                                   \
        }

// ---------------------------------------------------------------- decide.p4
#define SPINA_ROLE_DECIDE_ACTIONS                                                                \
    /* The roles' outcomes (p4src/v1model/fabric.p4, aggregator.p4's role branches), before */   \
    /* the flat entries: a leaf sends what completes here up (the reply goes to its spine, */    \
    /* up_reply), stores its spine's RESULT, turns the spine's rack bitmap into local ranks */   \
    /* and replays a stored result the spine lacks; a spine adopts a leaf's REPLAY. */           \
    @hidden action set_outcome_up(kind_t kind, op_t state_op, op_t flags_op, op_t bitmap_op,     \
                                  op_t value_op) {                                               \
        set_outcome(kind, state_op, flags_op, bitmap_op, value_op);                              \
        meta.fab.up_reply = 1;                                                                   \
    }                                                                                            \
    @hidden action set_outcome_read_up(kind_t kind, op_t state_op, op_t flags_op,                \
                                       op_t bitmap_op, op_t value_op) {                          \
        set_outcome_read(kind, state_op, flags_op, bitmap_op, value_op);                         \
        meta.fab.up_reply = 1;                                                                   \
    }                                                                                            \
    /* A spine's STATUS about this rack, to the rack: every local rank (the rack is done), or */ \
    /* none when the spine's bitmap lacks the rack. */                                           \
    @hidden action set_status_rack() {                                                           \
        set_outcome(KIND_STATUS, OP_NONE, OP_NONE, OP_NONE, OP_NONE);                            \
        hdr.ina.bitmap = meta.fab.all_local;                                                     \
    }                                                                                            \
    @hidden action set_status_rack_none() {                                                      \
        set_outcome(KIND_STATUS, OP_NONE, OP_NONE, OP_NONE, OP_NONE);                            \
        hdr.ina.bitmap = 0;                                                                      \
    }                                                                                            \
    /* A leaf's stored result up to a spine that lacks it: RESEND | REPLAY (REPLAY where the */  \
    /* packet's LOSS_TOLERANT would be ORed in: one write of the flags fewer). */                \
    @hidden action set_outcome_replay() {                                                        \
        set_outcome_read_up(KIND_RESEND, OP_READ, OP_READ, OP_READ, OP_READ);                    \
        meta.loss_tolerant = FLAG_REPLAY;                                                        \
    }                                                                                            \
    @hidden action set_drop() {                                                                  \
        set_outcome(KIND_DROP, OP_NONE, OP_NONE, OP_NONE, OP_NONE);                              \
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
#define SPINA_ROLE_DECIDE_KEYS                              \
            meta.fab.leaf:          ternary;                \
            meta.fab.from_spine:    ternary;                \
            meta.fab.replay:        ternary;                \
            hdr.ina.msg_type:       ternary;                \
            meta.fab.rack_hit:      ternary;                \
            meta.fab.rank_diff:     ternary;                \
            hdr.ina.rank:           ternary;
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
#define SPINA_ROLE_FLAG_INPUT_KEYS                          \
            meta.fab.carry:   ternary;

// ---------------------------------------------------------------- pipe.p4
#define SPINA_ROLE_INGRESS_CONTROLS FabricRoles() fabric_roles_ctl;
#define SPINA_ROLE_INGRESS_FIRST fabric_roles_ctl.apply(hdr, meta);

#endif
