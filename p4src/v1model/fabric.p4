/* SpINA: the level a switch aggregates a job at, chosen by table entries (docs/scale_out.md;
 * softswitch/fabric.py is the software twin, packet by packet).
 *
 * job_level (job): no entry, the job is flat here (one switch aggregates all its workers);
 *   as_leaf: this switch aggregates one rack of the job (its workers send their rank within
 *   the rack, 0..nlocal-1, so a job has up to 32 racks x 32 workers) and sends each completed round up to
 *   the spine owning the slot, as one contribution of its own (rank = the rack's index), then
 *   stores the spine's result and replicates it to the rack; as_spine: the job's "workers" are
 *   its leaves (admission entries with rank = rack index), and a partial's MISMATCH and PARTIAL
 *   flags are ORed into the round.
 * leaf_upstream (job, slot): at a leaf, the spine owning the slot: its port, MAC and IPv4
 *   address (UDP port INA_UDP_PORT). A result or status for such a slot is the spine's answer
 *   (from_spine) when it comes from that spine; from anywhere else it is unadmitted.
 *
 * Both are looked up before InaCheck (a spine's RESULT/STATUS is well-formed at a leaf); the
 * Aggregator acts on meta.fab (a spine's carried flags and replays), ToSpine sends a leaf's
 * partial up, and FromSpine, instead of the Aggregator, meets the spine's answer at a leaf.
 *
 * Two-level aggregation, per packet (softswitch/fabric.py). A leaf's
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
#ifndef SPINA_FABRIC_P4
#define SPINA_FABRIC_P4

control FabricRoles(in headers_t hdr, inout metadata_t meta) {
    @name(".as_leaf")
    action as_leaf(bit<8> rack, bit<8> nlocal, bit<16> epoch, bit<16> mcast_grp) {
        meta.fab.leaf = true;
        meta.fab.rack = rack;
        meta.fab.nlocal = nlocal;
        meta.fab.epoch = epoch;
        meta.fab.mcast_grp = mcast_grp;
    }

    @name(".as_spine")
    action as_spine() {
        meta.fab.spine = true;
    }

    @name(".job_level")
    table job_level {
        key = {
            hdr.ina.job: exact @name("job");
        }
        actions = {
            as_leaf;
            as_spine;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    @name(".to_spine")
    action to_spine(port_t port, mac_addr_t dst_mac, ipv4_addr_t dst_addr) {
        meta.fab.up = true;
        meta.fab.up_port = port;
        meta.fab.up_mac = dst_mac;
        meta.fab.up_addr = dst_addr;
    }

    // One entry per slot of a leaf job: a leaf's slots are at most the pool's.
    @name(".leaf_upstream")
    table leaf_upstream {
        key = {
            hdr.ina.job:  exact @name("job");
            hdr.ina.slot: exact @name("slot");
        }
        actions = {
            to_spine;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = POOL_SLOTS;
    }

    apply {
        meta.fab.leaf = false;
        meta.fab.spine = false;
        meta.fab.rack = 0;
        meta.fab.nlocal = 0;
        meta.fab.epoch = 0;
        meta.fab.mcast_grp = 0;
        meta.fab.up = false;
        meta.fab.up_port = 0;
        meta.fab.up_mac = 0;
        meta.fab.up_addr = 0;
        meta.fab.from_spine = false;
        meta.fab.carried = 0;
        meta.fab.replay = false;
        if (hdr.ina.isValid()) {
            job_level.apply();
            leaf_upstream.apply();
            meta.fab.from_spine = meta.fab.up && hdr.ina.msg_type != MSG_CONTRIB;
            if (meta.fab.spine) {
                meta.fab.carried = hdr.ina.flags & FLAGS_CARRIED;
                meta.fab.replay = (hdr.ina.flags & FLAG_REPLAY) != 0;
            }
        }
    }
}

// A leaf: a result leaving the Aggregator for the rack's workers goes up to the slot's spine
// instead when the rack's round completed (or was flushed) here, or when a worker resent a
// round whose spine result is missing (softswitch FabricRoles.route_into). `went_up`: this
// control decided where the packet goes (up, or dropped).
control ToSpine(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std,
                in bool multicast, in bit<32> count, in bit<8> in_flags, out bool went_up) {
    apply {
        went_up = meta.fab.leaf && hdr.ina.msg_type == MSG_RESULT
                  && (multicast || count <= (bit<32>)meta.fab.nlocal);
        if (went_up) {
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
        }
    }
}

// A leaf: the spine's answer (a RESULT or STATUS from the slot's spine, meta.fab.from_spine)
// for the round this copy holds and sent up (softswitch FabricRoles._from_spine).
control FromSpine(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
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

    apply {
        bit<32> job = (bit<32>)hdr.ina.job;
        job_received.count(job);
        bit<32> idx = ((bit<32>)hdr.ina.slot << 1) | (hdr.ina.round & 1);
        bit<8> in_flags = hdr.ina.flags;
        bit<32> held = 0;
        bit<32> nlocal = (bit<32>)meta.fab.nlocal;
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
            SPINA_SET_LENGTHS
            reply_to_sender(hdr, meta);
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
        reply_to_sender(hdr, meta);
        std.mcast_grp = meta.fab.mcast_grp;  // every worker of the rack
        return;
    }
}

#endif
