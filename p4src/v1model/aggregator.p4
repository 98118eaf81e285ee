/* SpINA: the slot registers and the per-packet aggregation (softswitch Pipeline.process).
 *
 * Per slot and shadow copy, idx = slot * 2 + (round & 1):
 *   slot_round        round tag of the copy: an older round is stale, a newer one resets the
 *                     copy (slots clean themselves; the control plane never clears them)
 *   slot_bitmap       ranks that contributed to this round (duplicates are not added twice)
 *   slot_count        contributions so far; complete at the job's worker count
 *   slot_values_l*_e* one array per lane and element: the int32 sums (wrap-around)
 *   slot_next_l*      one array per lane: minimum of the workers' next block positions
 *   slot_present      OR of the lanes that carried data
 *   slot_nonfinite    OR of the lanes that held NaN/Inf at some worker
 *   slot_exponent     max of the workers' exponents (signed)
 *   slot_length       tensor length of the round's first packet
 *   slot_flags        LAST (AND over contributions), MISMATCH (some length differed)
 *
 * Per slot, both copies' shared state (the hold of a newer round; softswitch/pipeline.py and
 * docs/reliability.md say why):
 *   head_round        newest round started on the slot
 *   head_heard        ranks heard at head_round (any packet of it, or a held newer one)
 *   head_missing      workers not yet heard at head_round (0 after a clear)
 * A round newer than head_round takes the copy of the round before last only when its
 * sender is the last worker missing or none is; otherwise it is held: dropped, job_held.
 *
 * Every register is read and/or written at most once per packet, at one index, with no
 * loop. The order is not a Tofino pipeline's (slot_bitmap's write depends on slot_count,
 * which depends on slot_bitmap's read; slot_flags needs an AND and an OR): tofino/ has the
 * Tofino 1 layout of the same behaviour. Outcomes:
 *   stale (older round or epoch)          drop, job_stale
 *   newer round while a worker is missing drop, job_held (the sender is marked heard)
 *   new contribution, round incomplete    add, drop
 *   new contribution completing the round add, write the sums into the packet, multicast
 *   any packet, round already complete    the stored result, unicast back (flag RESEND)
 *   duplicate flagged PARTIAL, incomplete flush: complete now, flag PARTIAL, multicast
 *   duplicate, round incomplete           STATUS with the stored bitmap, unicast back
 *
 * Two-level aggregation (meta.fab, v1model/fabric.p4; softswitch/fabric.py). A leaf's
 * workers send their rank within the rack (0..nlocal-1), a leaf's partial the rack's index:
 * each switch's ranks and bitmaps count its own workers only.
 *   spine   a partial's MISMATCH and PARTIAL flags are ORed into the round it is added to;
 *           a STATUS goes to every leaf (the job's group); a REPLAY partial (a leaf's stored
 *           result of a round this spine lost in a restart) is written as the round's
 *           result, complete, and multicast
 *   leaf    a round completed (or flushed) here goes up to the slot's spine instead of to
 *           the rack: the result with msg_type CONTRIB, rank = the rack's index; a resend
 *           to a complete round whose spine result is missing sends the partial up again
 *           (RESEND, PARTIAL if the worker asked for a flush) when it comes from the rack's
 *           rank 0 or asks for a flush, others' are dropped
 *   leaf, the spine's answer (from_spine): checked against the copy (epoch, round, count
 *           = nlocal: the partial went up, no result stored yet), its rack bitmap turned
 *           into local ranks (this rack's bit: a RESULT names the ranks in the partial,
 *           slot_bitmap; a STATUS every local rank; no bit: none); a RESULT is stored in
 *           the copy (written, not added; slot_count becomes nlocal + 1) and replicated to
 *           the rack, a STATUS only replicated; another rack's STATUS is dropped, unless
 *           the copy stored the result and the status lacks this rack: then the stored
 *           result goes up, REPLAY
 */
#ifndef SPINA_AGGREGATOR_P4
#define SPINA_AGGREGATOR_P4

control Aggregator(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t std) {
    @name(".job_received")   counter(MAX_JOBS, CounterType.packets) job_received;
    @name(".job_aggregated") counter(MAX_JOBS, CounterType.packets) job_aggregated;
    @name(".job_duplicates") counter(MAX_JOBS, CounterType.packets) job_duplicates;
    @name(".job_stale")      counter(MAX_JOBS, CounterType.packets) job_stale;
    @name(".job_held")       counter(MAX_JOBS, CounterType.packets) job_held;

    @name(".slot_round")     register<bit<32>>(SLOT_COPIES) slot_round;
    @name(".slot_bitmap")    register<bit<32>>(SLOT_COPIES) slot_bitmap;
    @name(".slot_count")     register<bit<32>>(SLOT_COPIES) slot_count;
    @name(".slot_present")   register<bit<64>>(SLOT_COPIES) slot_present;
    @name(".slot_nonfinite") register<bit<64>>(SLOT_COPIES) slot_nonfinite;
    @name(".slot_exponent")  register<bit<16>>(SLOT_COPIES) slot_exponent;
    @name(".slot_length")    register<bit<32>>(SLOT_COPIES) slot_length;
    @name(".slot_flags")     register<bit<8>>(SLOT_COPIES)  slot_flags;
    @name(".head_round")     register<bit<32>>(POOL_SLOTS)  head_round;
    @name(".head_heard")     register<bit<32>>(POOL_SLOTS)  head_heard;
    @name(".head_missing")   register<bit<8>>(POOL_SLOTS)   head_missing;

    // Generated from NLANES and BLOCK_SIZE (v1model/size.p4); global names so that the
    // controller and the Thrift runtime find them as slot_next_l<L>, slot_values_l<L>_e<E>.
#define SPINA_NEXT_REG(L) \
    @name(SPINA_XSTR(.slot_next_l##L)) register<bit<32>>(SLOT_COPIES) slot_next_l##L;
    FOR_EACH_LANE(SPINA_NEXT_REG)

#define SPINA_VALUE_REG(L, E) \
    @name(SPINA_XSTR(.slot_values_l##L##_e##E)) register<bit<32>>(SLOT_COPIES) slot_values_l##L##_e##E;
#define SPINA_LANE_VALUE_REGS(L) FOR_EACH_ELEM(SPINA_VALUE_REG, L)
    FOR_EACH_LANE(SPINA_LANE_VALUE_REGS)

    // The reply leaves from the switch's address to the sender's; egress rewrites the
    // destination of each multicast copy for its worker. @hidden: called from apply only, it is
    // no control-plane action (p4c would otherwise list it in the P4Info).
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
        meta.ipv4_update = true;
        meta.ina_emitted = true;
    }

    // One element of lane L: a fresh copy starts from 0; this packet's value is added when it
    // carries lane L; the sum goes into the packet when the result leaves with lane L.
#define SPINA_VALUE_CELL(L, E) {                                        \
        bit<32> v = 0;                                                  \
        if (!reset) { slot_values_l##L##_e##E.read(v, idx); }           \
        if (add_##L) { v = v + hdr.block[L].e##E; }                     \
        if (reset || add_##L) { slot_values_l##L##_e##E.write(idx, v); } \
        if (out_##L) { hdr.block[L].e##E = v; }                         \
    }

#define SPINA_LANE(L) if (hdr.ina.nlanes > L) {                         \
        bool add_##L = (accumulate || adopt) && hdr.ina.present[L:L] == 1; \
        bool out_##L = send_result && present[L:L] == 1;                       \
        bit<32> next_##L = hdr.lane_next[L].pos;                        \
        if (reset) {                                                    \
            slot_next_l##L.write(idx, next_##L);                        \
        } else {                                                        \
            slot_next_l##L.read(next_##L, idx);                         \
            if (accumulate) {                                           \
                if (hdr.lane_next[L].pos < next_##L) {                  \
                    next_##L = hdr.lane_next[L].pos;                    \
                }                                                       \
                slot_next_l##L.write(idx, next_##L);                    \
            }                                                           \
        }                                                               \
        if (send_result) { hdr.lane_next[L].pos = next_##L; }                  \
        if (out_##L) { hdr.block[L].setValid(); }                       \
        if (reset || add_##L || out_##L) {                              \
            FOR_EACH_ELEM(SPINA_VALUE_CELL, L)                          \
        }                                                               \
        if (!out_##L) { hdr.block[L].setInvalid(); }                    \
    }

#define SPINA_DROP_BLOCK(L) hdr.block[L].setInvalid();

    // The spine's result into lane L of the copy: positions, and the values of a present lane.
#define SPINA_STORE_ELEM(L, E) slot_values_l##L##_e##E.write(idx, hdr.block[L].e##E);
#define SPINA_STORE_LANE(L) if (hdr.ina.nlanes > L) {                   \
        slot_next_l##L.write(idx, hdr.lane_next[L].pos);                \
        if (hdr.ina.present[L:L] == 1) {                                \
            FOR_EACH_ELEM(SPINA_STORE_ELEM, L)                          \
        }                                                               \
    }

    // The stored result of lane L into the packet (a leaf's replay): positions, present values.
#define SPINA_LOAD_ELEM(L, E) slot_values_l##L##_e##E.read(hdr.block[L].e##E, idx);
#define SPINA_LOAD_LANE(L) if (hdr.ina.nlanes > L) {                    \
        slot_next_l##L.read(hdr.lane_next[L].pos, idx);                 \
        if (stored_present[L:L] == 1) {                                 \
            hdr.block[L].setValid();                                    \
            FOR_EACH_ELEM(SPINA_LOAD_ELEM, L)                           \
        }                                                               \
    }

#define SPINA_COUNT_BLOCK(L) if (hdr.block[L].isValid()) { nblocks = nblocks + 1; }

    apply {
        bit<32> job = (bit<32>)hdr.ina.job;
        job_received.count(job);
        // idx and rank_bit before the first return (header fields only): after p4c's
        // RemoveReturns a later declaration gives false "may be uninitialized" warnings.
        bit<32> idx = ((bit<32>)hdr.ina.slot << 1) | (hdr.ina.round & 1);
        bit<32> rank_bit = (bit<32>)1 << hdr.ina.rank;
        bit<8> in_flags = hdr.ina.flags;
        bit<32> held = 0;
        bit<32> nlocal = (bit<32>)meta.fab.nlocal;
        bool adopt = false;
        if (meta.fab.from_spine) {
            // A leaf: the spine's answer for the round this copy holds and sent up.
            bit<32> held_round;
            slot_round.read(held_round, idx);
            if (hdr.ina.epoch != meta.fab.epoch || held_round != hdr.ina.round) {
                job_stale.count(job);
                mark_to_drop(std);
                return;
            }
            slot_count.read(held, idx);
            if (hdr.ina.msg_type == MSG_STATUS && hdr.ina.rank != meta.fab.rack) {
                // Another rack's status (a spine sends its statuses to every leaf). If this
                // leaf stored the round's result and the spine lacks this rack, the spine lost
                // it (a restart) and this rack never sends the round again: the stored result
                // goes back up, REPLAY, and the spine takes it as the round's result. (A
                // status carries no blocks: only the stored present lanes become valid.)
                if (held <= nlocal || (hdr.ina.bitmap >> meta.fab.rack)[0:0] == 1) {
                    mark_to_drop(std);
                    return;
                }
                bit<64> stored_present;
                bit<8> stored_flags;
                slot_present.read(stored_present, idx);
                slot_flags.read(stored_flags, idx);
                hdr.ina.msg_type = MSG_CONTRIB;
                hdr.ina.flags = (stored_flags & FLAGS_RESULT) | FLAG_RESEND | FLAG_REPLAY;
                hdr.ina.rank = meta.fab.rack;
                hdr.ina.present = stored_present;
                slot_bitmap.read(hdr.ina.bitmap, idx);
                slot_nonfinite.read(hdr.ina.nonfinite, idx);
                slot_exponent.read(hdr.ina.exponent, idx);
                slot_length.read(hdr.ina.length, idx);
                FOR_EACH_LANE(SPINA_LOAD_LANE)
                bit<16> nblocks = 0;
                FOR_EACH_LANE(SPINA_COUNT_BLOCK)
                hdr.udp.length = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * (bit<16>)hdr.ina.nlanes
                                 + nblocks * BLOCK_BYTES;
                hdr.ipv4.total_len = IPV4_HDR_BYTES + hdr.udp.length;
                reply_to_sender();
                hdr.ethernet.dst_addr = meta.fab.up_mac;
                hdr.ipv4.dst_addr = meta.fab.up_addr;
                hdr.udp.dst_port = INA_UDP_PORT;
                std.egress_spec = meta.fab.up_port;
                return;
            }
            if (held != nlocal) {  // stored already (a duplicate), or never sent up
                if (held > nlocal) {
                    job_duplicates.count(job);
                } else {
                    job_stale.count(job);
                }
                mark_to_drop(std);
                return;
            }
            // The spine's bitmap names racks, the rack's workers know local ranks. With this
            // rack's bit, a RESULT names the local ranks its partial carried (a flushed rack's
            // partial lacks some), a STATUS every local rank (the rack is done: only other
            // racks can complete the round); without it (the spine flushed the round without
            // this rack's partial), none.
            bit<32> local_ranks = 0;
            if ((hdr.ina.bitmap >> meta.fab.rack)[0:0] == 1) {
                if (hdr.ina.msg_type == MSG_RESULT) {
                    slot_bitmap.read(local_ranks, idx);
                } else {
                    local_ranks = (bit<32>)(((bit<64>)1 << meta.fab.nlocal) - 1);
                }
            }
            hdr.ina.bitmap = local_ranks;
            if (hdr.ina.msg_type == MSG_RESULT) {
                bit<8> rflags = in_flags & FLAGS_RESULT;
                FOR_EACH_LANE(SPINA_STORE_LANE)
                slot_present.write(idx, hdr.ina.present);
                slot_bitmap.write(idx, hdr.ina.bitmap);
                slot_flags.write(idx, rflags);
                slot_count.write(idx, held + 1);
                slot_nonfinite.write(idx, hdr.ina.nonfinite);
                slot_exponent.write(idx, hdr.ina.exponent);
                slot_length.write(idx, hdr.ina.length);
                // To the rack as a completion, not as the answer to a resend.
                hdr.ina.flags = rflags | (in_flags & FLAG_LOSS_TOLERANT);
            }
            reply_to_sender();
            std.mcast_grp = meta.fab.mcast_grp;  // every worker of the rack
            return;
        }
        if (hdr.ina.epoch != meta.adm.epoch) {
            job_stale.count(job);
            mark_to_drop(std);
            return;
        }

        // The hold: the head registers, read once and written at most once, at the slot.
        bit<32> slot = (bit<32>)hdr.ina.slot;
        bit<32> head;
        bit<32> heard;
        bit<8> missing;
        head_round.read(head, slot);
        head_heard.read(heard, slot);
        head_missing.read(missing, slot);
        bit<32> ahead = hdr.ina.round - head;
        bool unheard = (heard & rank_bit) == 0;
        if (ahead == 0 || ahead[31:31] == 1) {  // head_round itself, or an older round
            if (ahead == 0 && unheard && missing != 0) {
                head_heard.write(slot, heard | rank_bit);
                head_missing.write(slot, missing - 1);
            }
        } else if (missing == 0 || (missing == 1 && unheard)) {
            head_round.write(slot, hdr.ina.round);
            head_heard.write(slot, rank_bit);
            head_missing.write(slot, meta.adm.nworkers - 1);
        } else {
            if (unheard) {  // its sender has head_round's result, so the copy's round's
                head_heard.write(slot, heard | rank_bit);
                head_missing.write(slot, missing - 1);
            }
            job_held.count(job);
            mark_to_drop(std);
            return;
        }

        // slot_round: the sign of the 32-bit round difference (serial-number arithmetic).
        bit<32> old_round;
        slot_round.read(old_round, idx);
        bit<32> delta = hdr.ina.round - old_round;
        if (delta[31:31] == 1) {
            job_stale.count(job);
            mark_to_drop(std);
            return;
        }
        bool fresh = delta != 0;
        if (fresh) {
            slot_round.write(idx, hdr.ina.round);
        }

        // slot_bitmap and slot_count: duplicate detection and completion.
        bit<32> old_bitmap = 0;
        bit<32> count = 0;
        if (!fresh) {
            slot_bitmap.read(old_bitmap, idx);
        }
        bool duplicate = (old_bitmap & rank_bit) != 0;
        if (!fresh) {
            slot_count.read(count, idx);
        }
        // Complete before this packet: a resend, or (bounded-loss mode) a late packet of a
        // round completed without it. Either way it gets the stored result and adds nothing.
        bool complete = count >= (bit<32>)meta.adm.nworkers;
        // A flush: a resend flagged PARTIAL asks to complete the round without the missing
        // workers (the P4 program has no timers: the agent whose deadline passed decides).
        // A spine: a leaf's REPLAY is the result of a round this spine lost (a restart), taken
        // as the round's result whoever else was added since: written, not added, complete.
        adopt = meta.fab.spine && (in_flags & FLAG_REPLAY) != 0 && !complete;
        bool flush = duplicate && !complete && !adopt && (hdr.ina.flags & FLAG_PARTIAL) != 0;
        bool accumulate = !duplicate && !complete && !adopt;
        bool reset = fresh || adopt;  // the copy starts from this packet
        // A replay's contributors: every rack for a whole result; for a PARTIAL one only the
        // replaying rack, and only if its stored ranks say it was in (the leaf kept no other
        // rack's bit): no rack is told its blocks were summed when they may not have been.
        bit<32> replayed = (in_flags & FLAG_PARTIAL) == 0 ? ((bit<32>)1 << meta.adm.nworkers) - 1
                           : (hdr.ina.bitmap != 0 ? rank_bit : 32w0);
        if (accumulate) {
            slot_bitmap.write(idx, old_bitmap | rank_bit);
            count = count + 1;
            slot_count.write(idx, count);
        } else if (adopt) {
            slot_bitmap.write(idx, replayed);
            count = (bit<32>)meta.adm.nworkers;
            slot_count.write(idx, count);
        } else {
            job_duplicates.count(job);
            if (flush) {
                count = (bit<32>)meta.adm.nworkers;
                slot_count.write(idx, count);
            }
        }
        bool send_result = count >= (bit<32>)meta.adm.nworkers;

        if (duplicate && !send_result) {
            // STATUS: who has contributed so far; no data, positions as sent.
            hdr.ina.msg_type = MSG_STATUS;
            hdr.ina.flags = hdr.ina.flags & ~(FLAG_LAST | FLAG_PARTIAL);
            hdr.ina.bitmap = old_bitmap;
            hdr.ina.present = 0;
            hdr.ina.nonfinite = 0;
            FOR_EACH_LANE(SPINA_DROP_BLOCK)
        } else {
            // The scalar state of the round.
            bit<64> present = hdr.ina.present;
            bit<64> nonfinite = hdr.ina.nonfinite;
            bit<16> exponent = hdr.ina.exponent;
            bit<32> length = hdr.ina.length;
            bit<8> sflags = hdr.ina.flags & FLAG_LAST;
            // A spine: a rack's mismatch or flush goes into the round it is added to.
            bit<8> carried = meta.fab.spine ? in_flags & FLAGS_CARRIED : 8w0;
            if (reset) {
                sflags = sflags | carried;
                slot_present.write(idx, present);
                slot_nonfinite.write(idx, nonfinite);
                slot_exponent.write(idx, exponent);
                slot_length.write(idx, length);
                slot_flags.write(idx, sflags);
            } else {
                slot_present.read(present, idx);
                slot_nonfinite.read(nonfinite, idx);
                slot_exponent.read(exponent, idx);
                slot_length.read(length, idx);
                slot_flags.read(sflags, idx);
                if (accumulate) {
                    present = present | hdr.ina.present;
                    slot_present.write(idx, present);
                    nonfinite = nonfinite | hdr.ina.nonfinite;
                    slot_nonfinite.write(idx, nonfinite);
                    if ((int<16>)hdr.ina.exponent > (int<16>)exponent) {
                        exponent = hdr.ina.exponent;
                        slot_exponent.write(idx, exponent);
                    }
                    sflags = (sflags & ~FLAG_LAST) | (sflags & hdr.ina.flags & FLAG_LAST);
                    if (hdr.ina.length != length) {
                        sflags = sflags | FLAG_MISMATCH;
                    }
                    sflags = sflags | carried;
                    slot_flags.write(idx, sflags);
                } else if (flush) {
                    sflags = sflags | FLAG_PARTIAL;
                    slot_flags.write(idx, sflags);
                }
            }

            // Lanes: positions and values.
            FOR_EACH_LANE(SPINA_LANE)

            if (accumulate) {
                job_aggregated.count(job);
            }
            if (!send_result) {
                mark_to_drop(std);
                return;
            }
            hdr.ina.msg_type = MSG_RESULT;
            hdr.ina.flags = sflags | (hdr.ina.flags & FLAG_LOSS_TOLERANT)
                            | ((accumulate || flush || adopt) ? 8w0 : FLAG_RESEND);
            hdr.ina.bitmap = accumulate ? (old_bitmap | rank_bit)
                             : (adopt ? replayed : old_bitmap);
            hdr.ina.present = present;
            hdr.ina.nonfinite = nonfinite;
            hdr.ina.exponent = exponent;
            hdr.ina.length = length;
        }

        // Lengths of what leaves: header, positions and the blocks now valid.
        bit<16> nblocks = 0;
        FOR_EACH_LANE(SPINA_COUNT_BLOCK)
        hdr.udp.length = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * (bit<16>)hdr.ina.nlanes
                         + nblocks * BLOCK_BYTES;
        hdr.ipv4.total_len = IPV4_HDR_BYTES + hdr.udp.length;
        reply_to_sender();
        bool multicast = accumulate || flush || adopt;
        if (meta.fab.leaf && hdr.ina.msg_type == MSG_RESULT
                && (multicast || count <= (bit<32>)meta.fab.nlocal)) {
            // A leaf: the rack's round completed (or was flushed) here, or a worker resent a
            // round whose spine result is missing: the rack's partial goes up to the spine.
            hdr.ina.msg_type = MSG_CONTRIB;
            // A resend goes up only from the rack's designated worker (local rank 0) or as
            // a flush request (PARTIAL): H workers resending would
            // cost the spine links H partials. Live: the spine's result is stored nowhere in
            // the rack, so the designated worker waits for it too and resends. The others'
            // resends are dropped, counted once in job_duplicates above, as every resend
            // that adds nothing is (a second count would count one packet twice).
            bool goes_up = multicast || hdr.ina.rank == 0 || (in_flags & FLAG_PARTIAL) != 0;
            if (!multicast) {  // a resend up: PARTIAL only if the worker asks for a flush
                hdr.ina.flags = (hdr.ina.flags & ~(FLAG_PARTIAL | FLAG_RESEND)) | FLAG_RESEND
                                | (in_flags & FLAG_PARTIAL);
            }
            hdr.ina.rank = meta.fab.rack;
            hdr.ethernet.dst_addr = meta.fab.up_mac;
            hdr.ipv4.dst_addr = meta.fab.up_addr;
            hdr.udp.dst_port = INA_UDP_PORT;
            if (meta.fab.up && goes_up) {
                std.egress_spec = meta.fab.up_port;
            } else {
                mark_to_drop(std);  // no spine for this slot, or another worker's resend
            }
        } else if (multicast || (meta.fab.spine && hdr.ina.msg_type == MSG_STATUS)) {
            // The result, to every worker of the job. A spine's status goes to every leaf
            // too: one that stored the round's result while this spine lost it replays it.
            std.mcast_grp = meta.adm.mcast_grp;
        } else {
            std.egress_spec = std.ingress_port;  // result or status, back to the resender
        }
    }
}

#endif
