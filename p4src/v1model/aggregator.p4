/* SpINA: the per-packet aggregation of a contribution (softswitch Pipeline.process_into).
 *
 * The slot registers and job counters it reads and writes: v1model/slots.p4.
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
 *   an all-gather packet (MSG_GATHER)     unchanged, multicast; no register touched
 *
 * The fabric roles (v1model/fabric.p4, softswitch/fabric.py): a spine ORs a rack's MISMATCH and
 * PARTIAL flags into the round (meta.fab.carried) and adopts a leaf's REPLAY as the round's
 * result (meta.fab.replay); a leaf sends a round completed here up to the spine (ToSpine)
 * instead of to the rack; the spine's answer at a leaf is FromSpine's, not this control's.
 */
#ifndef SPINA_AGGREGATOR_P4
#define SPINA_AGGREGATOR_P4

control Aggregator(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t std) {
    ToSpine() to_spine_ctl;

    // One element of lane L: a fresh copy starts from 0; this packet's value is added when it
    // carries lane L; the sum goes into the packet when the result leaves with lane L.
    // Narrow lanes: a value is sign-extended into the int32 sum, and the sum leaves in the
    // round's width (out_width), clipped to its range (saturated: job_lane_saturated).
#define SPINA_VALUE_CELL(L, E) {                                        \
        bit<32> v = 0;                                                  \
        if (!reset) { slot_values_l##L##_e##E.read(v, idx); }           \
        if (add_##L) {                                                  \
            if (in_width == FLAG_LANES16) {                             \
                v = v + (bit<32>)(int<32>)(int<16>)hdr.block16[L].e##E; \
            } else if (in_width == FLAG_LANES8) {                       \
                v = v + (bit<32>)(int<32>)(int<8>)hdr.block8[L].e##E;   \
            } else {                                                    \
                v = v + hdr.block[L].e##E;                              \
            }                                                           \
        }                                                               \
        if (reset || add_##L) { slot_values_l##L##_e##E.write(idx, v); } \
        if (out_##L) {                                                  \
            int<32> s = (int<32>)v;                                     \
            if (out_width == FLAG_LANES16) {                            \
                if (s > 32767) { s = 32767; saturated = true; }         \
                else if (s < -32768) { s = -32768; saturated = true; }  \
                hdr.block16[L].e##E = (bit<16>)(bit<32>)s;                    \
            } else if (out_width == FLAG_LANES8) {                      \
                if (s > 127) { s = 127; saturated = true; }             \
                else if (s < -128) { s = -128; saturated = true; }      \
                hdr.block8[L].e##E = (bit<8>)(bit<32>)s;                      \
            } else {                                                    \
                hdr.block[L].e##E = v;                                  \
            }                                                           \
        }                                                               \
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
        if (out_##L) {                                                  \
            if (out_width == FLAG_LANES16) { hdr.block16[L].setValid(); } \
            else if (out_width == FLAG_LANES8) { hdr.block8[L].setValid(); } \
            else { hdr.block[L].setValid(); }                           \
        }                                                               \
        if (reset || add_##L || out_##L) {                              \
            FOR_EACH_ELEM(SPINA_VALUE_CELL, L)                          \
        }                                                               \
        if (!out_##L || out_width != 0) { hdr.block[L].setInvalid(); }  \
        if (!out_##L || out_width != FLAG_LANES16) { hdr.block16[L].setInvalid(); } \
        if (!out_##L || out_width != FLAG_LANES8) { hdr.block8[L].setInvalid(); } \
    }

#define SPINA_DROP_BLOCK(L) hdr.block[L].setInvalid(); hdr.block16[L].setInvalid(); \
                            hdr.block8[L].setInvalid();

    apply {
        bit<32> job = (bit<32>)hdr.ina.job;
        job_received.count(job);
        // idx and rank_bit before the first return (header fields only): after p4c's
        // RemoveReturns a later declaration gives false "may be uninitialized" warnings.
        bit<32> idx = ((bit<32>)hdr.ina.slot << 1) | (hdr.ina.round & 1);
        bit<32> rank_bit = (bit<32>)1 << hdr.ina.rank;
        bit<8> in_flags = hdr.ina.flags;
        bool adopt = false;
        if (hdr.ina.epoch != meta.adm.epoch) {
            job_stale.count(job);
            mark_to_drop(std);
            return;
        }
        if (hdr.ina.msg_type == MSG_GATHER) {
            // All-gather: the packet as it came, to every worker of the job (WorkerRewrite
            // drops the sender's own copy); no register is read or written.
            reply_to_sender(hdr, meta);
            std.mcast_grp = meta.adm.mcast_grp;
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
        adopt = meta.fab.replay && !complete;
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
            // The round's lane width is its first contribution's (docs/bits.md).
            bit<8> sflags = hdr.ina.flags & (FLAG_LAST | FLAGS_LANE_WIDTH);
            // A spine: a rack's mismatch or flush goes into the round it is added to.
            bit<8> carried = meta.fab.carried;
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
                    if (((hdr.ina.flags ^ sflags) & FLAGS_LANE_WIDTH) != 0) {
                        // Another lane width than the round's first: its sum means nothing.
                        sflags = sflags | FLAG_MISMATCH;
                        job_lane_mismatch.count(job);
                    }
                    sflags = sflags | carried;
                    slot_flags.write(idx, sflags);
                } else if (flush) {
                    sflags = sflags | FLAG_PARTIAL;
                    slot_flags.write(idx, sflags);
                }
            }

            // Lanes: positions and values, read in the packet's width, written in the round's.
            bit<8> in_width = in_flags & FLAGS_LANE_WIDTH;
            bit<8> out_width = sflags & FLAGS_LANE_WIDTH;
            bool saturated = false;
            FOR_EACH_LANE(SPINA_LANE)
            if (saturated) {
                job_lane_saturated.count(job);
            }

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

        SPINA_SET_LENGTHS
        reply_to_sender(hdr, meta);
        bool multicast = accumulate || flush || adopt;
        bool went_up;  // a leaf: the rack's partial left for the spine (or was dropped)
        to_spine_ctl.apply(hdr, meta, std, multicast, count, in_flags, went_up);
        if (!went_up) {
            if (multicast || (meta.fab.spine && hdr.ina.msg_type == MSG_STATUS)) {
                // The result, to every worker of the job. A spine's status goes to every leaf
                // too: one that stored the round's result while this spine lost it replays it.
                std.mcast_grp = meta.adm.mcast_grp;
            } else {
                std.egress_spec = std.ingress_port;  // result or status, back to the resender
            }
        }
    }
}

#endif
