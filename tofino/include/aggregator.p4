/* SpINA on Tofino 1: the slot registers and the per-packet aggregation of a flat job
 * (softswitch Pipeline.process, p4src/v1model/aggregator.p4), in RegisterActions.
 *
 * Per slot and shadow copy, idx = slot * 2 + (round & 1), as in p4src:
 *   slot_round          round tag; older is stale, newer resets the copy (self-recycling)
 *   slot_rank_round     per copy and rank: round + 1 of the rank's last contribution there
 *   slot_length         tensor length of the round's first packet
 *   slot_count          contributions so far
 *   slot_bitmap         ranks that contributed
 *   slot_present, slot_nonfinite   OR of the lanes (32-bit cells: NLANES = 1)
 *   slot_exponent       max (signed)
 *   slot_flags          FLAG_LAST INVERTED (set: some contribution lacked LAST), MISMATCH,
 *                       PARTIAL; every update is then one OR (an AND and an OR of the same
 *                       cell are two ALU operations). Initial and cleared value: FLAG_LAST.
 *   slot_next_l0        min of the workers' next positions
 *   slot_values_l0_p<P> pair registers, elements 2P (lo) and 2P + 1 (hi): the int32 sums
 *                       (wrap-around); pairs INGRESS_PAIRS.. here, the rest in egress
 *
 * The order a stage pipeline allows (a register's result reaches another register one stage
 * later, and each register is read and written once per packet):
 *   slot_round, slot_rank_round   stale / same round / newer round (written); duplicate?
 *                  (this rank marked the same round)
 *   slot_count     its value minus nworkers before this packet, returned; incremented when
 *                  the rank is new and the round incomplete, raised to nworkers by a flush;
 *                  slot_length (written on a newer round) beside it
 *   decide         a const table turns those answers into the outcome and each register's op
 *   the rest       set / merge / read, each returning the copy's value after this packet
 *                  (a pair: its low half; a reply's second pass reads the high halves)
 * Every aggregated packet then crosses egress through the pipe's recirculation port (one
 * queue, so egress sees a slot copy's packets in ingress order), where EgressSlots adds the
 * egress pairs (block_e, in front of the packet). A held contribution is dropped there; a
 * reply gets a harvest header in front and comes back: its second pass reads the high halves
 * of the ingress pairs, then (round again) of the egress pairs; its third puts block_e back
 * at its wire position and sends the reply on.
 * p4src finds duplicates in slot_bitmap itself; here slot_bitmap's write would depend on
 * slot_count, which depends on the duplicate test: slot_rank_round answers that test from
 * header fields alone, in slot_round's stage. Every contribution raises its rank's cell to
 * round + 1 (in slot_round's wrap-around order; never lowered, so stale packets leave it);
 * the cell equals round + 1 of the copy's round exactly when the rank was counted in it, or
 * when the round was already complete (then a duplicate and a new rank get the same answer:
 * the stored result). A cleared cell (0) is raised by rounds 0 .. 2^31 - 2 only: after a
 * clear, rounds must start there (agents start at 1).
 */
#ifndef SPINA_TNA_AGGREGATOR_P4
#define SPINA_TNA_AGGREGATOR_P4

control Aggregator(inout tna_headers_t hdr, inout tna_ingress_md_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Priority() priority_ctl;  // a reply's last pass leaves in its priority class
    @name(".job_received")   Counter<bit<32>, job_index_t>(MAX_JOBS, CounterType_t.PACKETS) job_received;
    @name(".job_aggregated") Counter<bit<32>, job_index_t>(MAX_JOBS, CounterType_t.PACKETS) job_aggregated;
    @name(".job_duplicates") Counter<bit<32>, job_index_t>(MAX_JOBS, CounterType_t.PACKETS) job_duplicates;
    @name(".job_stale")      Counter<bit<32>, job_index_t>(MAX_JOBS, CounterType_t.PACKETS) job_stale;
    SPINA_HOLD_ACTIONS  // the hold: job_held, head_round, hold

    // ------------------------------------------------------------------ slot_round
    @name(".slot_round") Register<bit<32>, copy_index_t>(SLOT_COPIES, 0) slot_round;
    // delta = round - stored (mod 2^32): 0 same, 1 .. 2^31 - 1 newer (the copy takes it),
    // else stale: the same test as p4src's delta >> 31 (a 32-bit difference read as signed:
    // bf-p4c's "uus" comparison).
    RegisterAction<bit<32>, copy_index_t, pred_t>(slot_round) check_round = {
        void apply(inout bit<32> value, out pred_t rv) {
            rv = this.predicate(value == hdr.ina.round, (int<32>)(hdr.ina.round - value) > 0);
            if ((int<32>)(hdr.ina.round - value) > 0) {
                value = hdr.ina.round;
            }
        }
    };

    SPINA_ROLE_ROUND_ACTIONS  // roles' profile: peek_round

    // ------------------------------------------------------------------ slot_rank_round
    @name(".slot_rank_round") Register<bit<32>, rank_index_t>(RANK_CELLS, 0) slot_rank_round;
    // Raised to round + 1 (wrap-around order, as slot_round), never lowered: it runs in
    // slot_round's stage, before staleness is known, so a stale packet must not lower it.
    RegisterAction<bit<32>, rank_index_t, pred_t>(slot_rank_round) mark_rank = {
        void apply(inout bit<32> value, out pred_t rv) {
            rv = this.predicate(value == meta.round_next,
                                (int<32>)(meta.round_next - value) > 0);
            if ((int<32>)(meta.round_next - value) > 0) {
                value = meta.round_next;
            }
        }
    };

    // ------------------------------------------------------------------ slot_length
    @name(".slot_length") Register<bit<32>, copy_index_t>(SLOT_COPIES, 0) slot_length;
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_length) set_length = {
        void apply(inout bit<32> value, out bit<32> rv) {
            value = hdr.ina.length;
            rv = value;
        }
    };
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_length) read_length = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value;
        }
    };

    // ------------------------------------------------------------------ slot_count
    // Each returns (count before this packet) - nworkers: negative while incomplete; -1 when
    // this rank's contribution completes the round.
    @name(".slot_count") Register<bit<32>, copy_index_t>(SLOT_COPIES, 0) slot_count;
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_count) count_first = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = 0 - meta.nworkers;
            value = 1;
        }
    };
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_count) count_rank = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value - meta.nworkers;
            if (value < meta.nworkers) {
                value = value + 1;
            }
        }
    };
    // A duplicate: a flush (count_limit = nworkers) completes an incomplete round; otherwise
    // (count_limit = 0) nothing changes.
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_count) count_duplicate = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value - meta.nworkers;
            if (value < meta.count_limit) {
                value = meta.count_limit;
            }
        }
    };

    SPINA_ROLE_COUNT_ACTIONS  // roles' profile: count_store

    // ------------------------------------------------------------------ OR registers
    // slot_bitmap, slot_present, slot_nonfinite: set on a fresh copy, ORed when added, read
    // otherwise; each returns the copy's value after this packet.
#define SPINA_OR_REGISTER(NAME, INPUT)                                                   \
    @name(SPINA_XSTR(.NAME)) Register<bit<32>, copy_index_t>(SLOT_COPIES, 0) NAME;       \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(NAME) NAME##_set = {                  \
        void apply(inout bit<32> value, out bit<32> rv) {                                \
            value = INPUT;                                                               \
            rv = value;                                                                  \
        }                                                                                \
    };                                                                                   \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(NAME) NAME##_or = {                   \
        void apply(inout bit<32> value, out bit<32> rv) {                                \
            value = value | INPUT;                                                       \
            rv = value;                                                                  \
        }                                                                                \
    };                                                                                   \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(NAME) NAME##_read = {                 \
        void apply(inout bit<32> value, out bit<32> rv) {                                \
            rv = value;                                                                  \
        }                                                                                \
    };
    SPINA_OR_REGISTER(slot_bitmap, SPINA_ROLE_BITMAP_INPUT(meta.rank_bit))
    SPINA_OR_REGISTER(slot_present, hdr.ina.present[31:0])
    SPINA_OR_REGISTER(slot_nonfinite, hdr.ina.nonfinite[31:0])

    // ------------------------------------------------------------------ slot_exponent
    @name(".slot_exponent") Register<bit<16>, copy_index_t>(SLOT_COPIES, 0) slot_exponent;
    RegisterAction<bit<16>, copy_index_t, bit<16>>(slot_exponent) slot_exponent_set = {
        void apply(inout bit<16> value, out bit<16> rv) {
            value = hdr.ina.exponent;
            rv = value;
        }
    };
    RegisterAction<bit<16>, copy_index_t, bit<16>>(slot_exponent) slot_exponent_max = {
        void apply(inout bit<16> value, out bit<16> rv) {
            if ((int<16>)hdr.ina.exponent > (int<16>)value) {
                value = hdr.ina.exponent;
            }
            rv = value;
        }
    };
    RegisterAction<bit<16>, copy_index_t, bit<16>>(slot_exponent) slot_exponent_read = {
        void apply(inout bit<16> value, out bit<16> rv) {
            rv = value;
        }
    };

    // ------------------------------------------------------------------ slot_next_l0
#define SPINA_NEXT_REGISTER(L)                                                                \
    @name(SPINA_XSTR(.slot_next_l##L)) Register<bit<32>, copy_index_t>(SLOT_COPIES, 0)       \
        slot_next_l##L;                                                                       \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_next_l##L) slot_next_l##L##_set = {  \
        void apply(inout bit<32> value, out bit<32> rv) {                                     \
            value = hdr.lane_next.pos;                                                        \
            rv = value;                                                                       \
        }                                                                                     \
    };                                                                                        \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_next_l##L) slot_next_l##L##_min = {  \
        void apply(inout bit<32> value, out bit<32> rv) {                                     \
            if (hdr.lane_next.pos < value) {                                                  \
                value = hdr.lane_next.pos;                                                    \
            }                                                                                 \
            rv = value;                                                                       \
        }                                                                                     \
    };                                                                                        \
    RegisterAction<bit<32>, copy_index_t, bit<32>>(slot_next_l##L) slot_next_l##L##_read = { \
        void apply(inout bit<32> value, out bit<32> rv) {                                     \
            rv = value;                                                                       \
        }                                                                                     \
    };
    FOR_EACH_LANE(SPINA_NEXT_REGISTER)

    // ------------------------------------------------------------------ slot_flags
    @name(".slot_flags") Register<bit<8>, copy_index_t>(SLOT_COPIES, FLAG_LAST) slot_flags;
    RegisterAction<bit<8>, copy_index_t, bit<8>>(slot_flags) slot_flags_set = {
        void apply(inout bit<8> value, out bit<8> rv) {
            value = meta.flag_bits;
            rv = value;
        }
    };
    RegisterAction<bit<8>, copy_index_t, bit<8>>(slot_flags) slot_flags_or = {
        void apply(inout bit<8> value, out bit<8> rv) {
            value = value | meta.flag_bits;
            rv = value;
        }
    };
    RegisterAction<bit<8>, copy_index_t, bit<8>>(slot_flags) slot_flags_read = {
        void apply(inout bit<8> value, out bit<8> rv) {
            rv = value;
        }
    };

    // ------------------------------------------------------------------ slot_values_l0_p<P>
    // The ingress pairs (include/pairs.p4): elements of block_i.
#define SPINA_INGRESS_PAIR(P, LO, HI) \
    SPINA_PAIR(P, LO, HI, hdr.block_i, meta.value_op, meta.read_hi, meta.idx, )
    FOR_EACH_INGRESS_PAIR(SPINA_INGRESS_PAIR)

    // ------------------------------------------------------------------ op tables
    // One table per register (a Tofino table drives one stateful ALU per index), keyed on
    // the op `decide` chose; each action runs one RegisterAction and keeps its answer.
#define SPINA_OP_TABLE(NAME, DEST, KEY, SET, MERGE, READ, IDX)                                     \
    @hidden action NAME##_do_set() { DEST = SET.execute(IDX); }                               \
    @hidden action NAME##_do_merge() { DEST = MERGE.execute(IDX); }                           \
    @hidden action NAME##_do_read() { DEST = READ.execute(IDX); }                             \
    @hidden table NAME##_ops {                                                                \
        key = { KEY: exact; }                                                                 \
        actions = { NAME##_do_set; NAME##_do_merge; NAME##_do_read; @defaultonly NoAction; }  \
        const entries = {                                                                     \
            OP_SET: NAME##_do_set();                                                          \
            OP_MERGE: NAME##_do_merge();                                                      \
            OP_READ: NAME##_do_read();                                                        \
        }                                                                                     \
        const default_action = NoAction();                                                    \
        size = 4;                                                                             \
    }
    SPINA_OP_TABLE(bitmap, hdr.ina.bitmap, meta.bitmap_op,
                   slot_bitmap_set, slot_bitmap_or, slot_bitmap_read, meta.idx)
    SPINA_OP_TABLE(present, hdr.ina.present[31:0], meta.state_op,
                   slot_present_set, slot_present_or, slot_present_read, meta.idx)
    SPINA_OP_TABLE(nonfinite, hdr.ina.nonfinite[31:0], meta.state_op,
                   slot_nonfinite_set, slot_nonfinite_or, slot_nonfinite_read, meta.idx)
    SPINA_OP_TABLE(flags, meta.stored_flags, meta.flags_op,
                   slot_flags_set, slot_flags_or, slot_flags_read, meta.idx)
    SPINA_OP_TABLE(exponent, hdr.ina.exponent, meta.state_op,
                   slot_exponent_set, slot_exponent_max, slot_exponent_read, meta.idx)
    SPINA_OP_TABLE(next_l0, hdr.lane_next.pos, meta.state_op,
                   slot_next_l0_set, slot_next_l0_min, slot_next_l0_read, meta.idx)

#include "decide.p4"

    // The reply leaves from the switch's address to the sender's; egress rewrites the
    // destination of each multicast copy for its worker.
    @hidden action reply_to_sender() {
        mac_addr_t mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        ipv4_addr_t addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = addr;
        bit<16> port = hdr.udp.dst_port;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = port;
        hdr.udp.checksum = 0;  // RFC 768: zero means "no checksum" over IPv4
        hdr.bridge.ipv4_update = 1;
        hdr.bridge.ina_emitted = 1;
        // Round the recirculation port twice more (include/parser.p4); the third pass sends
        // the result to every worker, or back to the sender. In this action: a second table
        // under the same condition writing the bridged flags' byte went a stage later.
        hdr.bridge.to_harvest = 1;
        hdr.bridge.reply_port = ig_intr_md.ingress_port;
    }

    SPINA_ROLE_REPLY_ACTIONS  // roles' profile: result_header, reply_up

    apply {
        job_index_t job = hdr.ina.job[10:0];
        meta.read_hi = 0;
        // decide's defaults (a stale packet), written before the chain so that decide follows
        // slot_count directly.
        meta.kind = KIND_NONE;
        meta.state_op = OP_NONE;
        meta.flags_op = OP_NONE;
        meta.bitmap_op = OP_NONE;
        meta.value_op = OP_NONE;
        if (meta.harvest) {
            if (hdr.harvest.last == 1) {
                // A reply's third pass: block_w holds the egress part at its wire position;
                // send it on (no register is touched).
                hdr.bridge.ina_emitted = 1;
                hdr.bridge.ipv4_update = 1;
                priority_ctl.apply(hdr, ig_tm_md);
                if (hdr.harvest.mcast_grp != 0) {
                    ig_tm_md.mcast_grp_a = hdr.harvest.mcast_grp;  // to every worker
                } else {
                    ig_tm_md.ucast_egress_port = hdr.harvest.port;  // back to the sender
                }
                hdr.harvest.setInvalid();  // after its fields are read (not deparsed onwards)
                return;
            }
            // A reply's second pass: the first chose everything; read the high halves.
            if (hdr.harvest.block == 1) {
                meta.value_op = OP_READ;
            }
            meta.read_hi = 1;
        } else {
            job_received.count(job);
            if (meta.gate == GATE_STALE_EPOCH) {
                job_stale.count(job);
                ig_dprsr_md.drop_ctl = 1;
                return;
            }
            SPINA_HOLD_APPLY  // the hold: a newer round waits, dropped
            SPINA_ROLE_ROUND_CHECK(
            meta.round_pred = check_round.execute(meta.idx);
            meta.rank_pred = mark_rank.execute(meta.rank_idx);)
            if (meta.round_pred == PRED_NONE) {
                job_stale.count(job);
                ig_dprsr_md.drop_ctl = 1;
                return;
            }
            SPINA_ROLE_REPLAY_FIRST  // roles' profile: a leaf's REPLAY at a spine
            if (meta.round_pred == PRED_HI) {
                meta.stored_length = set_length.execute(meta.idx);
                meta.count_delta = count_first.execute(meta.idx);
            } else {
                meta.stored_length = read_length.execute(meta.idx);
                SPINA_ROLE_STORE  // roles' profile: the spine's RESULT at a leaf
                // Equal, so not newer: a duplicate.
                if (meta.rank_pred == PRED_LO SPINA_ROLE_OR_DUP) {
                    meta.count_delta = count_duplicate.execute(meta.idx);
                } else {
                    meta.count_delta = count_rank.execute(meta.idx);
                }
            }
            decide.apply();
        }
        // After the join, one flat sequence: the op tables, the pairs and the reply's header
        // writes, each condition over one table. On Tofino 1 (tables chained by next-table
        // only) bf-p4c places no more of a sequence once a branch nested in it has begun,
        // until that branch is placed: behind the reply's branches (several stages each) the
        // pairs started two stages after decide and ran out of stages (tofino/README.md,
        // "Toward 64"). A harvest or stale packet keeps decide's defaults (KIND_NONE,
        // OP_NONE): flag_input, every op table and every kind test below miss.
        meta.length_diff = meta.stored_length ^ hdr.ina.length;
        meta.flag_bits = 0;
        flag_input.apply();
        // A result's flags: the stored ones with LAST turned the right way up, the program's
        // lane width (every contribution admitted here has it: InaCheck), RESEND when it
        // answers a resend, and the packet's LOSS_TOLERANT (one ALU operation per stage).
        if (meta.kind == KIND_RESEND) {
            meta.flags_xor = FLAG_LAST | LANE_FLAG | FLAG_RESEND;
        } else {
            meta.flags_xor = FLAG_LAST | LANE_FLAG;
        }
        present_ops.apply();
        nonfinite_ops.apply();
        exponent_ops.apply();
        next_l0_ops.apply();
        bitmap_ops.apply();
        flags_ops.apply();

        // The ingress pairs: most of the stateful ALUs left.
        FOR_EACH_INGRESS_PAIR(SPINA_APPLY_PAIR)

        // Every pass that adds or reads pairs crosses egress through this pipe's recirculation
        // port, in one queue: the egress pairs of a slot copy then see the packets in ingress
        // order (a fresh copy's SET before the MERGEs, every MERGE of a round before the reply
        // that reads it). Priority leaves this queue alone. Egress runs block_e's pairs with
        // these ops (block_e right behind the bridged header: egress parses no further).
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ (bit<7>)RECIRC_PORT;
        ig_tm_md.qid = 0;
        hdr.bridge.value_op = meta.value_op;

        // A reply's second pass: round again, the next pass sends it on.
        if (meta.harvest) {
            hdr.bridge.read_hi = 1;
            hdr.bridge.to_harvest = 1;
            hdr.bridge.last = 1;
            hdr.bridge.reply_port = hdr.harvest.port;
            hdr.bridge.mcast_grp = hdr.harvest.mcast_grp;
        }
        if (meta.harvest && hdr.harvest.block == 1) {
            hdr.bridge.block_front = 1;
        }
        if (meta.harvest) {
            hdr.harvest.setInvalid();  // after its fields are read (not deparsed onwards)
        }

        // A first pass (kind set by decide).
        if (meta.kind == KIND_HOLD || meta.kind == KIND_COMPLETE) {
            job_aggregated.count(job);
        }
        if (meta.kind >= KIND_RESEND) {  // RESEND, FLUSH, STATUS
            job_duplicates.count(job);
        }
        if (meta.kind == KIND_HOLD) {
            hdr.bridge.hold_drop = 1;  // egress adds its part, then drops it
        }
        SPINA_ROLE_DROP  // roles' profile: KIND_DROP
        if (meta.kind == KIND_HOLD && hdr.block_e.isValid()) {
            hdr.bridge.block_front = 1;
        }
        if (meta.kind == KIND_STATUS) {
            hdr.ina.msg_type = MSG_STATUS;
            hdr.ina.flags = hdr.ina.flags & ~(FLAG_LAST | FLAG_PARTIAL);
            hdr.ina.present = 0;
            hdr.ina.nonfinite = 0;
            hdr.block_e.setInvalid();
            hdr.block_i.setInvalid();
        }
        // A result: COMPLETE, RESEND, FLUSH.
        SPINA_ROLE_RESULT_HEADER(
        if (meta.kind >= KIND_COMPLETE && meta.kind <= KIND_FLUSH) {
            hdr.ina.msg_type = MSG_RESULT;
            hdr.ina.flags = meta.stored_flags ^ meta.flags_xor;
            hdr.ina.length = meta.stored_length;
        })
        if (meta.kind >= KIND_COMPLETE && meta.kind <= KIND_FLUSH && hdr.ina.present[0:0] == 0) {
            hdr.block_e.setInvalid();
            hdr.block_i.setInvalid();
        }
        if (meta.kind >= KIND_COMPLETE && meta.kind <= KIND_FLUSH && hdr.ina.present[0:0] == 0
                && meta.value_op == OP_READ) {
            hdr.bridge.value_op = OP_NONE;  // no block_e reaches egress to add
        }
        if (meta.kind >= KIND_COMPLETE && meta.kind <= KIND_FLUSH && hdr.ina.present[0:0] == 1
                && meta.value_op == OP_READ) {
            hdr.bridge.zero_front = 1;  // egress reads the low halves with zeros
        }
        if (meta.kind >= KIND_COMPLETE && meta.kind <= KIND_FLUSH && hdr.ina.present[0:0] == 1
                && meta.value_op != OP_READ) {
            hdr.bridge.block_front = 1;  // this packet's own block (SET, MERGE)
        }
        // A reply (a result or a status). Lengths of what leaves: header, one position and
        // the block if it is valid.
        if (meta.kind >= KIND_COMPLETE && hdr.block_i.isValid()) {
            hdr.udp.length = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES + BLOCK_BYTES;
        }
        if (meta.kind >= KIND_COMPLETE && !hdr.block_i.isValid()) {
            hdr.udp.length = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES;
        }
        if (meta.kind >= KIND_COMPLETE) {
            hdr.ipv4.total_len = IPV4_HDR_BYTES + hdr.udp.length;
        }
        if (meta.kind >= KIND_COMPLETE) {
            hdr.ina.flags = hdr.ina.flags | meta.loss_tolerant;
        }
        SPINA_ROLE_REPLY(
        if (meta.kind >= KIND_COMPLETE) {
            reply_to_sender();
        }
        if (meta.kind == KIND_COMPLETE || meta.kind == KIND_FLUSH) {
            hdr.bridge.mcast_grp = meta.adm.mcast_grp;  // else 0, as the bridge starts
        })
    }
}

#endif
